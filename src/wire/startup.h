// Untagged startup packets (StartupMessage, SSL/GSSENC/Cancel requests) and version checks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/backend_messages.h"
#include "wire/messages.h"

namespace pgrelay::wire {

// Request codes sit where a StartupMessage has its protocol version (1234.5678 and up).
inline constexpr std::uint32_t kCancelRequestCode = 80877102;
inline constexpr std::uint32_t kSSLRequestCode = 80877103;
inline constexpr std::uint32_t kGSSENCRequestCode = 80877104;

// The versions a Postgres 15 server accepts (PG_PROTOCOL_EARLIEST / PG_PROTOCOL_LATEST).
inline constexpr ProtocolVersion kEarliestProtocol{3, 0};
inline constexpr ProtocolVersion kLatestProtocol{3, 0};

enum class ReplicationMode {
  kNone,      // a normal backend
  kPhysical,  // replication=true: a walsender not bound to a database
  kLogical,   // replication=database: a walsender for logical decoding
};

struct StartupMessage {
  ProtocolVersion version;
  // Name/value pairs in packet order, "_pq_." protocol options included.
  std::vector<std::pair<std::string, std::string>> parameters;

  // The last value given for name: later duplicates win, as they do in Postgres.
  std::optional<std::string_view> find(std::string_view name) const;
  std::string_view user() const;
  // The database defaults to the user name, as in Postgres.
  std::string_view database() const;
  // Names of the "_pq_."-prefixed protocol options, in packet order.
  std::vector<std::string> protocol_options() const;
  // Interprets "replication" (a boolean, or "database") with Postgres's error for other values.
  Result<ReplicationMode> replication_mode() const;

  bool operator==(const StartupMessage&) const = default;
};

struct SSLRequest {
  bool operator==(const SSLRequest&) const = default;
};

struct GSSENCRequest {
  bool operator==(const GSSENCRequest&) const = default;
};

struct CancelRequest {
  std::int32_t pid = 0;
  std::int32_t secret_key = 0;
  bool operator==(const CancelRequest&) const = default;
};

using StartupPacket = std::variant<StartupMessage, SSLRequest, GSSENCRequest, CancelRequest>;

// Parses the body of an untagged packet (after the length word) with Postgres 15's checks and
// texts (ProcessStartupPacket): 08P01 for bad lengths or layout, 0A000 for a major version other
// than 3, 22023 for a bad "replication" value, 28000 when no user is named. As in Postgres, bytes
// after an SSLRequest or GSSENCRequest code are ignored, and a StartupMessage with minor version
// above 0 is accepted (see needs_protocol_negotiation). An SSLRequest repeated after TLS is set up
// must be refused by the caller: use unsupported_protocol_error(), as Postgres treats it as a
// protocol version then.
Result<StartupPacket> parse_startup_packet(ByteView body);

// Full packets, length word included.
Bytes encode(const StartupMessage& m);
Bytes encode(const SSLRequest& m);
Bytes encode(const GSSENCRequest& m);
Bytes encode(const CancelRequest& m);
Bytes encode(const StartupPacket& m);

// 0A000 "unsupported frontend protocol X.Y: server supports 3.0 to 3.0".
Error unsupported_protocol_error(ProtocolVersion requested);

// True when a 3.x client asked for a newer minor version or sent "_pq_." options: the server must
// then answer NegotiateProtocolVersion before authentication (and may go on with 3.0).
bool needs_protocol_negotiation(const StartupMessage& m);
// The answer Postgres sends: its newest version and the unrecognized "_pq_." option names.
NegotiateProtocolVersion make_negotiate_protocol_version(const StartupMessage& m);

}  // namespace pgrelay::wire
