// Untagged startup packets (StartupMessage, SSL/GSSENC/Cancel requests) and version checks.
#include "wire/startup.h"

#include <cctype>

namespace pgrelay::wire {
namespace {

constexpr std::string_view kProtocolOptionPrefix = "_pq_.";

bool starts_with_ci(std::string_view value, std::string_view word) {
  if (value.size() > word.size()) return false;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != word[i]) return false;
  }
  return true;
}

// Postgres's parse_bool: case-insensitive unique prefixes of true/false/yes/no, "on", "of[f]",
// and exactly "1" or "0".
std::optional<bool> parse_pg_bool(std::string_view v) {
  if (v.empty()) return std::nullopt;
  switch (std::tolower(static_cast<unsigned char>(v[0]))) {
    case 't':
      if (starts_with_ci(v, "true")) return true;
      break;
    case 'f':
      if (starts_with_ci(v, "false")) return false;
      break;
    case 'y':
      if (starts_with_ci(v, "yes")) return true;
      break;
    case 'n':
      if (starts_with_ci(v, "no")) return false;
      break;
    case 'o':
      // "o" alone is ambiguous between on and off.
      if (v.size() >= 2 && starts_with_ci(v, "on")) return true;
      if (v.size() >= 2 && starts_with_ci(v, "off")) return false;
      break;
    case '1':
      if (v.size() == 1) return true;
      break;
    case '0':
      if (v.size() == 1) return false;
      break;
    default:
      break;
  }
  return std::nullopt;
}

Error invalid_startup_length() {
  return Error::protocol("invalid length of startup packet");
}

Error invalid_layout() {
  return Error::protocol("invalid startup packet layout: expected terminator as last byte");
}

Bytes encode_request(std::uint32_t code) {
  detail::MessageWriter mw(0, 4);
  mw.body().u32(code);
  return std::move(mw).finish();
}

}  // namespace

std::optional<std::string_view> StartupMessage::find(std::string_view name) const {
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    if (it->first == name) return std::string_view(it->second);
  }
  return std::nullopt;
}

std::string_view StartupMessage::user() const {
  return find("user").value_or(std::string_view());
}

std::string_view StartupMessage::database() const {
  const std::string_view db = find("database").value_or(std::string_view());
  return db.empty() ? user() : db;
}

std::vector<std::string> StartupMessage::protocol_options() const {
  std::vector<std::string> out;
  for (const auto& [name, value] : parameters) {
    if (name.starts_with(kProtocolOptionPrefix)) out.push_back(name);
  }
  return out;
}

Result<ReplicationMode> StartupMessage::replication_mode() const {
  const auto value = find("replication");
  if (!value) return ReplicationMode::kNone;
  if (*value == "database") return ReplicationMode::kLogical;
  if (auto b = parse_pg_bool(*value))
    return *b ? ReplicationMode::kPhysical : ReplicationMode::kNone;
  return Error::make(sqlstate::kInvalidParameterValue,
                     "invalid value for parameter \"replication\": \"" + std::string(*value) + "\"",
                     "Valid values are: \"false\", 0, \"true\", 1, \"database\".");
}

Error unsupported_protocol_error(ProtocolVersion requested) {
  return Error::make(sqlstate::kFeatureNotSupported,
                     "unsupported frontend protocol " + std::to_string(requested.major) + "." +
                         std::to_string(requested.minor) + ": server supports " +
                         std::to_string(kEarliestProtocol.major) + ".0 to " +
                         std::to_string(kLatestProtocol.major) + "." +
                         std::to_string(kLatestProtocol.minor));
}

Result<StartupPacket> parse_startup_packet(ByteView body) {
  ByteReader r(body);
  const std::uint32_t code = r.u32();
  if (!r.ok()) return invalid_startup_length();

  if (code == kCancelRequestCode) {
    CancelRequest c;
    c.pid = r.i32();
    c.secret_key = r.i32();
    if (!r.ok() || !r.at_end()) return invalid_startup_length();
    return StartupPacket(c);
  }
  if (code == kSSLRequestCode) return StartupPacket(SSLRequest{});
  if (code == kGSSENCRequestCode) return StartupPacket(GSSENCRequest{});

  StartupMessage m;
  m.version = ProtocolVersion::from_code(code);
  if (m.version.major < kEarliestProtocol.major || m.version.major > kLatestProtocol.major) {
    return unsupported_protocol_error(m.version);
  }

  // name\0value\0 pairs, then one terminating \0 that must be the packet's last byte.
  for (;;) {
    std::string name = r.cstr();
    if (!r.ok()) return invalid_layout();
    if (name.empty()) break;
    std::string value = r.cstr();
    if (!r.ok()) return invalid_layout();
    m.parameters.emplace_back(std::move(name), std::move(value));
    if (m.parameters.back().first == "replication") {
      // Checked as soon as it is seen, like Postgres, so this error wins over a layout error.
      auto mode = m.replication_mode();
      if (!mode.ok()) return mode.error();
    }
  }
  if (!r.at_end()) return invalid_layout();

  if (m.user().empty()) {
    return Error::make(sqlstate::kInvalidAuthorization,
                       "no PostgreSQL user name specified in startup packet");
  }
  return StartupPacket(std::move(m));
}

Bytes encode(const StartupMessage& m) {
  std::size_t hint = 5;
  for (const auto& [name, value] : m.parameters) hint += name.size() + value.size() + 2;
  detail::MessageWriter mw(0, hint);
  ByteWriter& w = mw.body();
  w.u32(m.version.code());
  for (const auto& [name, value] : m.parameters) {
    if (name.empty()) continue;  // an empty name would end the list early
    detail::put_cstr(w, name);
    detail::put_cstr(w, value);
  }
  w.u8(0);
  return std::move(mw).finish();
}

Bytes encode(const SSLRequest&) {
  return encode_request(kSSLRequestCode);
}
Bytes encode(const GSSENCRequest&) {
  return encode_request(kGSSENCRequestCode);
}

Bytes encode(const CancelRequest& m) {
  detail::MessageWriter mw(0, 12);
  mw.body().u32(kCancelRequestCode);
  mw.body().i32(m.pid);
  mw.body().i32(m.secret_key);
  return std::move(mw).finish();
}

Bytes encode(const StartupPacket& m) {
  return std::visit([](const auto& x) { return encode(x); }, m);
}

bool needs_protocol_negotiation(const StartupMessage& m) {
  if (m.version.major == kLatestProtocol.major && m.version.minor > kLatestProtocol.minor) {
    return true;
  }
  for (const auto& [name, value] : m.parameters) {
    if (name.starts_with(kProtocolOptionPrefix)) return true;
  }
  return false;
}

NegotiateProtocolVersion make_negotiate_protocol_version(const StartupMessage& m) {
  NegotiateProtocolVersion n;
  n.newest = kLatestProtocol;
  n.unrecognized_options = m.protocol_options();
  return n;
}

}  // namespace pgrelay::wire
