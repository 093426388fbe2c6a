// Where the upstream is and how to log in: parsed once from a libpq URL or conninfo string.
#include "upstream/upstream_config.h"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "base/strings.h"

namespace pgrelay::upstream {
namespace {

// libpq's conninfo quoting: single quotes, with backslash escaping quotes and backslashes.
std::string quote_conninfo_value(std::string_view value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  out += '\'';
  return out;
}

Result<SslMode> parse_sslmode(std::string_view text) {
  if (text == "disable") return SslMode::kDisable;
  if (text == "allow") return SslMode::kAllow;
  if (text == "prefer") return SslMode::kPrefer;
  if (text == "require") return SslMode::kRequire;
  if (text == "verify-ca") return SslMode::kVerifyCa;
  if (text == "verify-full") return SslMode::kVerifyFull;
  return Error::make(sqlstate::kInvalidParameterValue,
                     "invalid sslmode value: \"" + std::string(text) + "\"",
                     "Use disable, allow, prefer, require, verify-ca or verify-full.");
}

// The libpq parameters UpstreamConfig holds itself.
constexpr std::string_view kHeld[] = {"host",     "hostaddr", "port",    "user",
                                      "password", "dbname",   "sslmode", "sslrootcert"};

// Handed on to pgrelay's libpq connections as given.
constexpr std::string_view kPassedOn[] = {"application_name",
                                          "fallback_application_name",
                                          "connect_timeout",
                                          "options",
                                          "keepalives",
                                          "keepalives_idle",
                                          "keepalives_interval",
                                          "keepalives_count",
                                          "tcp_user_timeout",
                                          "target_session_attrs",
                                          "sslsni",
                                          "sslcompression"};

// A parameter accepted only with the values that describe what pgrelay's own upstream login
// does anyway (it uses channel binding whenever the upstream offers it over TLS, and never
// GSSAPI), then handed on to libpq as well; `refusal` says why other values are refused.
struct ParameterRule {
  std::string_view name;
  std::vector<std::string_view> accepted;
  std::string_view refusal;
};
const ParameterRule kLimited[] = {
    {"channel_binding",
     {"prefer"},
     "pgrelay uses channel binding whenever the upstream offers it over TLS, as "
     "channel_binding=prefer does; it cannot require or refuse it yet."},
    {"gssencmode", {"disable", "prefer"}, "pgrelay does not use GSSAPI encryption."},
};

template <std::size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::ranges::find(names, name) != std::end(names);
}

template <std::size_t N>
std::string joined(const std::string_view (&names)[N]) {
  return join(std::vector<std::string>(std::begin(names), std::end(names)));
}

Error unsupported_parameter(std::string_view shown, std::string_view why,
                            std::string_view instead) {
  return Error::make(
      sqlstate::kFeatureNotSupported,
      "the upstream connection parameter \"" + std::string(shown) + "\" is not supported",
      std::string(why) + " " + std::string(instead) + " pgrelay uses " + joined(kHeld) +
          ", and hands " + joined(kPassedOn) + " on to its own connections.");
}

std::string_view refusal_of(std::string_view name) {
  if (name == "sslcert" || name == "sslkey" || name == "sslpassword") {
    return "Client certificates for the upstream are not supported yet.";
  }
  if (name == "sslcrl" || name == "sslcrldir") {
    return "Certificate revocation lists for the upstream are not supported yet.";
  }
  if (name == "ssl_min_protocol_version" || name == "ssl_max_protocol_version") {
    return "pgrelay's TLS to the upstream does not take a protocol version range yet.";
  }
  if (name == "passfile" || name == "service") {
    return "pgrelay reads no password or service file: give the password in the URL or in "
           "PGPASSWORD.";
  }
  return "pgrelay would not honour it on every connection it makes to the upstream.";
}

}  // namespace

std::string_view to_string(SslMode mode) {
  switch (mode) {
    case SslMode::kDisable:
      return "disable";
    case SslMode::kAllow:
      return "allow";
    case SslMode::kPrefer:
      return "prefer";
    case SslMode::kRequire:
      return "require";
    case SslMode::kVerifyCa:
      return "verify-ca";
    case SslMode::kVerifyFull:
      return "verify-full";
  }
  return "prefer";
}

Result<UpstreamConfig> UpstreamConfig::parse(std::string_view url_or_conninfo) {
  char* err = nullptr;
  std::string text(url_or_conninfo);
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> options(
      PQconninfoParse(text.c_str(), &err), &PQconninfoFree);
  if (!options) {
    std::string message = err ? err : "out of memory";
    if (err) PQfreemem(err);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    return Error::make(sqlstate::kInvalidParameterValue,
                       "invalid upstream connection string: " + message,
                       "Give a URL such as postgres://user:password@host:5432/dbname.");
  }
  // Fill libpq's defaults (environment, local user) for what the string leaves out.
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> defaults(PQconndefaults(),
                                                                        &PQconninfoFree);
  auto lookup = [](const PQconninfoOption* list, std::string_view key) -> std::string {
    for (const PQconninfoOption* o = list; o && o->keyword; ++o) {
      if (key == o->keyword && o->val) return o->val;
    }
    return {};
  };
  auto value = [&](std::string_view key) {
    std::string v = lookup(options.get(), key);
    if (v.empty() && defaults) v = lookup(defaults.get(), key);
    return v;
  };

  UpstreamConfig config;
  config.host = value("host");
  if (config.host.empty()) config.host = value("hostaddr");
  if (config.host.empty()) config.host = "/var/run/postgresql";
  if (config.host.find(',') != std::string::npos) {
    return Error::make(sqlstate::kFeatureNotSupported, "multiple upstream hosts are not supported",
                       "Give pgrelay the address of the primary only.");
  }
  std::string port = value("port");
  if (!port.empty()) {
    int p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p <= 0 || p > 65535) {
      return Error::make(sqlstate::kInvalidParameterValue, "invalid port number: \"" + port + "\"",
                         "Use a port from 1 to 65535.");
    }
    config.port = p;
  }
  config.user = value("user");
  config.password = value("password");
  config.dbname = value("dbname");
  if (config.dbname.empty()) config.dbname = config.user;
  std::string sslmode = value("sslmode");
  if (!sslmode.empty()) {
    auto mode = parse_sslmode(sslmode);
    if (!mode.ok()) return mode.error();
    config.sslmode = *mode;
  }
  config.sslrootcert = lookup(options.get(), "sslrootcert");
  for (const PQconninfoOption* o = options.get(); o && o->keyword; ++o) {
    if (o->val == nullptr || listed(kHeld, o->keyword)) continue;
    const std::string_view name = o->keyword;
    const std::string_view given = o->val;
    bool accepted = listed(kPassedOn, name);
    for (const ParameterRule& rule : kLimited) {
      if (rule.name != name) continue;
      std::string values;
      for (std::string_view v : rule.accepted) {
        accepted |= v == given;
        values += (values.empty() ? "" : " or ") + std::string(name) + "=" + std::string(v);
      }
      if (!accepted) {
        return unsupported_parameter(std::string(name) + "=" + std::string(given), rule.refusal,
                                     "Give " + values + ", or leave it out.");
      }
    }
    if (!accepted) {
      return unsupported_parameter(name, refusal_of(name), "Remove it from the upstream URL.");
    }
    config.libpq_parameters.emplace_back(name, given);
  }
  return config;
}

std::string UpstreamConfig::conninfo(std::string_view database) const {
  std::string out = "host=" + quote_conninfo_value(host) + " port=" + std::to_string(port) +
                    " dbname=" + quote_conninfo_value(database) +
                    " user=" + quote_conninfo_value(user) +
                    " sslmode=" + std::string(to_string(sslmode)) +
                    // pgrelay's own connections say so in the upstream's pg_stat_activity.
                    " fallback_application_name=pgrelay";
  if (!password.empty()) out += " password=" + quote_conninfo_value(password);
  if (!sslrootcert.empty()) out += " sslrootcert=" + quote_conninfo_value(sslrootcert);
  // Last, so that the user's application_name and the like win over pgrelay's.
  for (const auto& [name, value] : libpq_parameters) {
    out += " " + name + "=" + quote_conninfo_value(value);
  }
  return out;
}

std::string UpstreamConfig::describe() const {
  if (is_unix_socket()) return host + "/.s.PGSQL." + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace pgrelay::upstream
