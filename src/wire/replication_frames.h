// Streaming-replication payloads in CopyData: XLogData, keepalive, standby reply, feedback.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <variant>

#include "base/bytes.h"
#include "base/result.h"
#include "wire/lsn.h"

namespace pgrelay::wire {

// Replication timestamps count microseconds since 2000-01-01 00:00:00 UTC (Postgres's epoch).
inline constexpr std::int64_t kPostgresEpochUnixMicros = 946'684'800'000'000;

// Conversions saturate at the int64 range instead of overflowing.
std::int64_t unix_micros_to_pg(std::int64_t unix_micros);
std::int64_t pg_to_unix_micros(std::int64_t pg_micros);
std::int64_t to_pg_timestamp(std::chrono::system_clock::time_point t);
std::chrono::system_clock::time_point from_pg_timestamp(std::int64_t pg_micros);

// 'w': WAL (or logical decoding output) from the server.
struct XLogData {
  static constexpr char kType = 'w';
  Lsn wal_start;
  Lsn wal_end;
  std::int64_t send_time = 0;
  Bytes data;
  bool operator==(const XLogData&) const = default;
};

// XLogData read in place: `data` points into the parsed payload, so it lives as long as that.
// For readers that decode each message at once and keep nothing, such as a consumer.
struct XLogDataView {
  Lsn wal_start;
  Lsn wal_end;
  std::int64_t send_time = 0;
  ByteView data;
};

// 'k': the server's keepalive.
struct PrimaryKeepalive {
  static constexpr char kType = 'k';
  Lsn wal_end;
  std::int64_t send_time = 0;
  bool reply_requested = false;
  bool operator==(const PrimaryKeepalive&) const = default;
};

// 'r': the client's progress report.
struct StandbyStatusUpdate {
  static constexpr char kType = 'r';
  Lsn write;
  Lsn flush;
  Lsn apply;
  std::int64_t send_time = 0;
  bool reply_requested = false;
  bool operator==(const StandbyStatusUpdate&) const = default;
};

// 'h': the client's hot standby feedback.
struct HotStandbyFeedback {
  static constexpr char kType = 'h';
  std::int64_t send_time = 0;
  std::uint32_t xmin = 0;
  std::uint32_t xmin_epoch = 0;
  std::uint32_t catalog_xmin = 0;
  std::uint32_t catalog_xmin_epoch = 0;
  bool operator==(const HotStandbyFeedback&) const = default;
};

// Builders return the CopyData payload (type byte first); wrap it with encode(CopyData{...}).
Bytes encode(const XLogData& m);
Bytes encode(const PrimaryKeepalive& m);
Bytes encode(const StandbyStatusUpdate& m);
Bytes encode(const HotStandbyFeedback& m);

// An XLogData message framed as the backend's CopyData ('d', length, payload), appended to
// `out` in one step: the framing a walsender sends each pgoutput message in, the same bytes as
// encode(CopyData{encode(XLogData{...})}). The send time sits at a fixed offset in the frame,
// so a frame built once can be stamped each time it is sent.
inline constexpr std::size_t kXLogDataFrameHeader = 1 + 4 + 1 + 8 + 8 + 8;
inline constexpr std::size_t kXLogDataFrameSendTimeOffset = 1 + 4 + 1 + 8 + 8;
void append_xlog_data_frame(Bytes& out, Lsn wal_start, Lsn wal_end, std::int64_t send_time,
                            ByteView data);

// Parsers take the whole CopyData payload, type byte included, and check it.
// A reply-requested byte counts as true when non-zero, as in Postgres.
Result<XLogData> parse_xlog_data(ByteView payload);
Result<XLogDataView> view_xlog_data(ByteView payload);
Result<PrimaryKeepalive> parse_primary_keepalive(ByteView payload);
Result<StandbyStatusUpdate> parse_standby_status_update(ByteView payload);
Result<HotStandbyFeedback> parse_hot_standby_feedback(ByteView payload);

using ServerReplicationFrame = std::variant<XLogData, PrimaryKeepalive>;
using ClientReplicationFrame = std::variant<StandbyStatusUpdate, HotStandbyFeedback>;

// Any other type byte gives 08P01, worded as walreceiver / walsender do.
Result<ServerReplicationFrame> parse_from_server(ByteView payload);
Result<ClientReplicationFrame> parse_from_client(ByteView payload);

}  // namespace pgrelay::wire
