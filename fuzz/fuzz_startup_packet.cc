// Fuzzes startup packet parsing: accepted packets re-encode to their bytes and survive framing.
//
// The input is the body of an untagged packet (what follows the length word).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <variant>

#include "base/bytes.h"
#include "wire/backend_messages.h"
#include "wire/frame_reader.h"
#include "wire/startup.h"

namespace {

using namespace pgrelay;
using namespace pgrelay::wire;

void check(bool condition) {
  if (!condition) std::abort();
}

std::uint32_t be32(ByteView b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         b[3];
}

void check_startup_message(const StartupMessage& m, ByteView body) {
  check(m.version.major == 3);
  check(m.version.code() == be32(body));
  check(ProtocolVersion::from_code(m.version.code()) == m.version);
  check(!m.user().empty());
  check(!m.database().empty());
  for (const auto& [name, value] : m.parameters) {
    check(!name.empty());
    check(name.find('\0') == std::string::npos && value.find('\0') == std::string::npos);
  }
  // Every "replication" value was checked while parsing, so the last one is valid.
  check(m.replication_mode().ok());

  const std::vector<std::string> options = m.protocol_options();
  for (const std::string& name : options) check(name.rfind("_pq_.", 0) == 0);
  check(needs_protocol_negotiation(m) == (m.version.minor > 0 || !options.empty()));
  const NegotiateProtocolVersion negotiate = make_negotiate_protocol_version(m);
  check(negotiate.newest == kLatestProtocol && negotiate.unrecognized_options == options);
  const Bytes framed = encode(negotiate);
  check(framed.size() >= 5 && framed[0] == 'v');
  auto parsed = parse_negotiate_protocol_version(ByteView(framed).subspan(5));
  check(parsed.ok() && *parsed == negotiate);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const ByteView body(data, size);
  Result<StartupPacket> packet = parse_startup_packet(body);
  if (!packet.ok()) {
    const std::string& code = packet.error().sqlstate;
    check(code == sqlstate::kProtocolViolation || code == sqlstate::kFeatureNotSupported ||
          code == sqlstate::kInvalidParameterValue || code == sqlstate::kInvalidAuthorization);
    return 0;
  }
  check(size >= 4);

  const Bytes encoded = encode(*packet);
  check(encoded.size() >= 8 && be32(encoded) == encoded.size());
  if (std::holds_alternative<SSLRequest>(*packet) ||
      std::holds_alternative<GSSENCRequest>(*packet)) {
    // Bytes after the request code are ignored, as in Postgres.
    check(encoded.size() == 8 && std::equal(body.begin(), body.begin() + 4, encoded.begin() + 4));
  } else {
    check(encoded.size() == size + 4 && std::equal(body.begin(), body.end(), encoded.begin() + 4));
  }
  if (const auto* m = std::get_if<StartupMessage>(&*packet)) check_startup_message(*m, body);
  if (const auto* c = std::get_if<CancelRequest>(&*packet))
    check(size == 12 && c->pid == static_cast<std::int32_t>(be32(body.subspan(4))));

  // The encoded packet read back through the frame reader parses to the same packet.
  FrameReader reader(FrameReader::Phase::kStartup);
  reader.feed(encoded);
  auto frame = reader.next();
  if (encoded.size() - 4 > reader.limits().max_startup_body) {
    check(!frame.ok() && frame.error().sqlstate == sqlstate::kProtocolViolation);
    return 0;
  }
  check(frame.ok() && frame->has_value() && (*frame)->tag == 0);
  check(reader.buffered() == 0);
  auto again = parse_startup_packet((*frame)->body);
  check(again.ok() && *again == *packet);
  return 0;
}
