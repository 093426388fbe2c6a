// Reads a pgoutput replication stream with libpq and keeps every XLogData payload verbatim.
#include "replication_recorder.h"

#include <poll.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace pgrelay::test {
namespace {

// Microseconds between the Unix epoch and Postgres's epoch (2000-01-01 UTC).
constexpr std::int64_t kPostgresEpochOffsetUs = 946684800LL * 1000000LL;

std::int64_t now_postgres_us() {
  const auto since_unix = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  return since_unix.count() - kPostgresEpochOffsetUs;
}

std::string describe_result_error(PGconn* conn, PGresult* res) {
  std::string msg = res != nullptr ? PQresultErrorMessage(res) : "";
  if (msg.empty()) msg = PQerrorMessage(conn);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  return msg;
}

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

// True when `message` (a pgoutput message outside a stream block) is our end marker: a
// non-transactional logical message, flags 0, with kEndMarkerPrefix and content `marker`.
bool is_end_marker(ByteView message, const std::string& marker) {
  ByteReader r(message);
  if (r.u8() != 'M') return false;
  const std::uint8_t flags = r.u8();
  r.u64();  // message LSN
  const std::string prefix = r.cstr();
  const std::uint32_t len = r.u32();
  const std::string content = r.string(len);
  return r.ok() && r.at_end() && flags == 0 && prefix == ReplicationRecorder::kEndMarkerPrefix &&
         content == marker;
}

}  // namespace

std::string RecordedStream::option(const std::string& key, const std::string& fallback) const {
  for (const auto& [k, v] : options) {
    if (k == key) return v;
  }
  return fallback;
}

ReplicationRecorder::ReplicationRecorder(PgServer& server, const std::string& db,
                                         std::string slot_name, SlotOptions slot)
    : conn_(server.connect_admin(db, "replication=database")), slot_name_(std::move(slot_name)) {
  // (connect_admin uses the unix socket as superuser: hba lines that tests add never apply.)
  std::string sql = "CREATE_REPLICATION_SLOT " + sql_identifier(slot_name_) +
                    " TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing'";
  if (slot.two_phase) sql += ", TWO_PHASE";
  sql += ")";
  Rows rows = conn_.exec(sql);
  if (rows.size() != 1 || rows[0].size() < 2 || !rows[0][1]) {
    throw PgError("unexpected CREATE_REPLICATION_SLOT result");
  }
  consistent_point_ = *rows[0][1];
}

ReplicationRecorder::~ReplicationRecorder() = default;

std::string ReplicationRecorder::end_marker_sql(const std::string& marker) {
  return std::string("SELECT pg_logical_emit_message(false, ") + sql_literal(kEndMarkerPrefix) +
         ", " + sql_literal(marker) + ")";
}

void ReplicationRecorder::send_standby_status(std::uint64_t lsn) {
  ByteWriter w;
  w.u8('r');
  w.u64(lsn);  // written
  w.u64(lsn);  // flushed
  w.u64(lsn);  // applied
  w.i64(now_postgres_us());
  w.u8(0);  // no reply requested
  const Bytes& b = w.bytes();
  if (PQputCopyData(conn_.raw(), reinterpret_cast<const char*>(b.data()),
                    static_cast<int>(b.size())) != 1 ||
      PQflush(conn_.raw()) != 0) {
    throw PgError(std::string("sending standby status update failed: ") +
                  PQerrorMessage(conn_.raw()));
  }
}

void ReplicationRecorder::start(const std::string& name,
                                std::vector<std::pair<std::string, std::string>> options) {
  if (state_ != State::kIdle) throw PgError("replication already started on slot " + slot_name_);
  stream_ = RecordedStream{};
  stream_.name = name;
  stream_.options = std::move(options);

  std::string sql = "START_REPLICATION SLOT " + sql_identifier(slot_name_) + " LOGICAL 0/0";
  if (!stream_.options.empty()) {
    sql += " (";
    for (std::size_t i = 0; i < stream_.options.size(); ++i) {
      if (i > 0) sql += ", ";
      sql +=
          sql_identifier(stream_.options[i].first) + " " + sql_literal(stream_.options[i].second);
    }
    sql += ")";
  }
  ResultPtr res(PQexec(conn_.raw(), sql.c_str()));
  if (!res || PQresultStatus(res.get()) != PGRES_COPY_BOTH) {
    throw PgError("START_REPLICATION failed: " + describe_result_error(conn_.raw(), res.get()) +
                  "\n  command: " + sql);
  }
  state_ = State::kStreaming;
}

bool ReplicationRecorder::read_one(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    char* buf = nullptr;
    const int n = PQgetCopyData(conn_.raw(), &buf, /*async=*/1);
    if (n > 0) {
      Bytes payload(reinterpret_cast<const std::uint8_t*>(buf),
                    reinterpret_cast<const std::uint8_t*>(buf) + n);
      PQfreemem(buf);
      ByteReader r(payload);
      const std::uint8_t kind = r.u8();
      if (kind == 'w') {
        r.u64();  // walStart
        r.u64();  // walEnd
        r.u64();  // sendTime
        if (!r.ok() || r.at_end()) {
          throw PgError("XLogData of " + std::to_string(payload.size()) + " bytes is too short");
        }
        const std::uint8_t tag = payload[kXLogDataHeaderSize];
        if (tag == 'S') in_stream_block_ = true;
        if (tag == 'E') in_stream_block_ = false;
        stream_.frames.push_back(std::move(payload));
        return true;
      }
      if (kind == 'k') {
        const std::uint64_t wal_end = r.u64();
        r.u64();  // sendTime
        const std::uint8_t reply_requested = r.u8();
        if (!r.ok() || !r.at_end()) throw PgError("malformed primary keepalive message");
        if (reply_requested != 0) send_standby_status(wal_end);
        continue;
      }
      throw PgError("unexpected CopyData message kind '" + std::string(1, static_cast<char>(kind)) +
                    "'");
    }
    if (n == -1) {
      ResultPtr res(PQgetResult(conn_.raw()));
      throw PgError("replication stream ended: " + describe_result_error(conn_.raw(), res.get()));
    }
    if (n == -2) throw PgError(std::string("PQgetCopyData failed: ") + PQerrorMessage(conn_.raw()));

    // n == 0: nothing buffered; wait for the socket until the deadline.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{PQsocket(conn_.raw()), POLLIN, 0};
    const int pr = poll(&pfd, 1, static_cast<int>(left.count()));
    if (pr < 0 && errno != EINTR) throw PgError(std::string("poll: ") + std::strerror(errno));
    if (PQconsumeInput(conn_.raw()) != 1) {
      throw PgError(std::string("reading the replication stream failed: ") +
                    PQerrorMessage(conn_.raw()));
    }
  }
}

void ReplicationRecorder::read_until(const std::function<bool(ByteView message)>& until,
                                     const std::string& what, std::chrono::milliseconds timeout) {
  if (state_ != State::kStreaming) {
    throw PgError("slot " + slot_name_ + " is not streaming (call start() once, before reading)");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (!read_one(deadline)) {
      throw PgError("timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                    what + " on slot " + slot_name_ + " (" + std::to_string(stream_.frames.size()) +
                    " messages received)");
    }
    if (until(stream_.message(stream_.frames.size() - 1))) return;
  }
}

RecordedStream ReplicationRecorder::finish(const std::string& marker,
                                           std::chrono::milliseconds timeout) {
  read_until([&](ByteView message) { return !in_stream_block_ && is_end_marker(message, marker); },
             "the end marker '" + marker + "'", timeout);
  state_ = State::kDone;  // the walsender stays in COPY mode until the connection closes
  return std::move(stream_);
}

RecordedStream ReplicationRecorder::record(const std::string& name,
                                           std::vector<std::pair<std::string, std::string>> options,
                                           const std::string& marker,
                                           std::chrono::milliseconds timeout) {
  start(name, std::move(options));
  return finish(marker, timeout);
}

}  // namespace pgrelay::test
