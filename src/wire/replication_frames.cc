// Streaming-replication payloads in CopyData: XLogData, keepalive, standby reply, feedback.
#include "wire/replication_frames.h"

#include <limits>
#include <string>

#include "wire/messages.h"

namespace pgrelay::wire {
namespace {

using Int64Limits = std::numeric_limits<std::int64_t>;

// Fixed sizes after the type byte (walprotocol / protocol-replication docs).
constexpr std::size_t kXLogDataHeader = 8 + 8 + 8;
constexpr std::size_t kKeepaliveSize = 8 + 8 + 1;

Error wrong_type(char expected, std::uint8_t got) {
  return Error::protocol("expected replication message type " + describe_tag(expected) + ", got " +
                         describe_tag(static_cast<char>(got)));
}

// Reads and checks the type byte; an empty payload is a truncated message.
Status expect_type(ByteReader& r, char expected, std::string_view what) {
  const std::uint8_t type = r.u8();
  if (!r.ok()) return detail::insufficient_data(what);
  if (type != static_cast<std::uint8_t>(expected)) return wrong_type(expected, type);
  return {};
}

}  // namespace

std::int64_t unix_micros_to_pg(std::int64_t unix_micros) {
  if (unix_micros < Int64Limits::min() + kPostgresEpochUnixMicros) return Int64Limits::min();
  return unix_micros - kPostgresEpochUnixMicros;
}

std::int64_t pg_to_unix_micros(std::int64_t pg_micros) {
  if (pg_micros > Int64Limits::max() - kPostgresEpochUnixMicros) return Int64Limits::max();
  return pg_micros + kPostgresEpochUnixMicros;
}

std::int64_t to_pg_timestamp(std::chrono::system_clock::time_point t) {
  const auto micros = std::chrono::floor<std::chrono::microseconds>(t.time_since_epoch());
  return unix_micros_to_pg(micros.count());
}

std::chrono::system_clock::time_point from_pg_timestamp(std::int64_t pg_micros) {
  using Clock = std::chrono::system_clock;
  // The clock's own range (±292 years of nanoseconds on Linux) is narrower than Postgres's.
  const std::int64_t max_micros =
      std::chrono::floor<std::chrono::microseconds>(Clock::duration::max()).count();
  const std::int64_t min_micros =
      std::chrono::ceil<std::chrono::microseconds>(Clock::duration::min()).count();
  const std::int64_t unix_micros = pg_to_unix_micros(pg_micros);
  if (unix_micros > max_micros) return Clock::time_point::max();
  if (unix_micros < min_micros) return Clock::time_point::min();
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(unix_micros)));
}

Bytes encode(const XLogData& m) {
  Bytes buf;
  buf.reserve(1 + kXLogDataHeader + m.data.size());
  ByteWriter w(std::move(buf));
  w.u8(XLogData::kType);
  w.u64(m.wal_start.value());
  w.u64(m.wal_end.value());
  w.i64(m.send_time);
  w.raw(m.data);
  return std::move(w).take();
}

void append_xlog_data_frame(Bytes& out, Lsn wal_start, Lsn wal_end, std::int64_t send_time,
                            ByteView data) {
  ByteWriter w(std::move(out));
  append_frame_header(w, CopyData::kTag, kXLogDataFrameHeader - 5 + data.size());
  w.u8(XLogData::kType);
  w.u64(wal_start.value());
  w.u64(wal_end.value());
  w.i64(send_time);
  w.raw(data);
  out = std::move(w).take();
}

Bytes encode(const PrimaryKeepalive& m) {
  ByteWriter w;
  w.u8(PrimaryKeepalive::kType);
  w.u64(m.wal_end.value());
  w.i64(m.send_time);
  w.u8(m.reply_requested ? 1 : 0);
  return std::move(w).take();
}

Bytes encode(const StandbyStatusUpdate& m) {
  ByteWriter w;
  w.u8(StandbyStatusUpdate::kType);
  w.u64(m.write.value());
  w.u64(m.flush.value());
  w.u64(m.apply.value());
  w.i64(m.send_time);
  w.u8(m.reply_requested ? 1 : 0);
  return std::move(w).take();
}

Bytes encode(const HotStandbyFeedback& m) {
  ByteWriter w;
  w.u8(HotStandbyFeedback::kType);
  w.i64(m.send_time);
  w.u32(m.xmin);
  w.u32(m.xmin_epoch);
  w.u32(m.catalog_xmin);
  w.u32(m.catalog_xmin_epoch);
  return std::move(w).take();
}

Result<XLogDataView> view_xlog_data(ByteView payload) {
  ByteReader r(payload);
  PGRELAY_TRY(expect_type(r, XLogData::kType, "XLogData"));
  if (r.remaining() < kXLogDataHeader) {
    return Error::protocol("invalid WAL message received from primary");
  }
  XLogDataView m;
  m.wal_start = Lsn(r.u64());
  m.wal_end = Lsn(r.u64());
  m.send_time = r.i64();
  m.data = r.rest();
  return m;
}

Result<XLogData> parse_xlog_data(ByteView payload) {
  auto view = view_xlog_data(payload);
  if (!view.ok()) return view.error();
  return XLogData{view->wal_start, view->wal_end, view->send_time,
                  Bytes(view->data.begin(), view->data.end())};
}

Result<PrimaryKeepalive> parse_primary_keepalive(ByteView payload) {
  ByteReader r(payload);
  PGRELAY_TRY(expect_type(r, PrimaryKeepalive::kType, "PrimaryKeepalive"));
  if (r.remaining() != kKeepaliveSize) {
    return Error::protocol("invalid keepalive message received from primary");
  }
  PrimaryKeepalive m;
  m.wal_end = Lsn(r.u64());
  m.send_time = r.i64();
  m.reply_requested = r.u8() != 0;
  return m;
}

Result<StandbyStatusUpdate> parse_standby_status_update(ByteView payload) {
  ByteReader r(payload);
  PGRELAY_TRY(expect_type(r, StandbyStatusUpdate::kType, "StandbyStatusUpdate"));
  StandbyStatusUpdate m;
  m.write = Lsn(r.u64());
  m.flush = Lsn(r.u64());
  m.apply = Lsn(r.u64());
  m.send_time = r.i64();
  m.reply_requested = r.u8() != 0;
  PGRELAY_TRY(detail::check_complete(r, "StandbyStatusUpdate"));
  return m;
}

Result<HotStandbyFeedback> parse_hot_standby_feedback(ByteView payload) {
  ByteReader r(payload);
  PGRELAY_TRY(expect_type(r, HotStandbyFeedback::kType, "HotStandbyFeedback"));
  HotStandbyFeedback m;
  m.send_time = r.i64();
  m.xmin = r.u32();
  m.xmin_epoch = r.u32();
  m.catalog_xmin = r.u32();
  m.catalog_xmin_epoch = r.u32();
  PGRELAY_TRY(detail::check_complete(r, "HotStandbyFeedback"));
  return m;
}

Result<ServerReplicationFrame> parse_from_server(ByteView payload) {
  if (payload.empty()) return detail::insufficient_data("replication");
  switch (static_cast<char>(payload[0])) {
    case XLogData::kType: {
      auto m = parse_xlog_data(payload);
      if (!m.ok()) return m.error();
      return ServerReplicationFrame(std::move(m).value());
    }
    case PrimaryKeepalive::kType: {
      auto m = parse_primary_keepalive(payload);
      if (!m.ok()) return m.error();
      return ServerReplicationFrame(std::move(m).value());
    }
    default:
      return Error::protocol("invalid replication message type " + std::to_string(payload[0]));
  }
}

Result<ClientReplicationFrame> parse_from_client(ByteView payload) {
  if (payload.empty()) return detail::insufficient_data("replication");
  switch (static_cast<char>(payload[0])) {
    case StandbyStatusUpdate::kType: {
      auto m = parse_standby_status_update(payload);
      if (!m.ok()) return m.error();
      return ClientReplicationFrame(std::move(m).value());
    }
    case HotStandbyFeedback::kType: {
      auto m = parse_hot_standby_feedback(payload);
      if (!m.ok()) return m.error();
      return ClientReplicationFrame(std::move(m).value());
    }
    default:
      return Error::protocol("unexpected message type \"" +
                             std::string(1, static_cast<char>(payload[0])) + "\"");
  }
}

}  // namespace pgrelay::wire
