// Records the raw pgoutput XLogData stream of a real Postgres logical slot, for golden tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "pg_server.h"

namespace pgrelay::test {

// Fields of the 25-byte XLogData ('w') header that precedes every pgoutput message.
inline constexpr std::size_t kXLogDataHeaderSize = 25;

struct RecordedStream {
  std::string name;
  // The pgoutput options given to START_REPLICATION, e.g. {"proto_version", "2"}.
  std::vector<std::pair<std::string, std::string>> options;
  // Every XLogData CopyData payload in arrival order: 'w', walStart, walEnd, sendTime, message.
  std::vector<Bytes> frames;

  // The pgoutput message inside frames[i] (after the 25-byte header).
  ByteView message(std::size_t i) const { return ByteView(frames[i]).subspan(kXLogDataHeaderSize); }
  // The option's value, or `fallback` when it was not given.
  std::string option(const std::string& key, const std::string& fallback = {}) const;
};

struct SlotOptions {
  bool two_phase = false;  // CREATE_REPLICATION_SLOT ... (TWO_PHASE)
};

// A replication=database connection owning one temporary pgoutput slot. Typical use: construct
// (creates the slot), start(), run the workload (optionally waiting for messages with
// read_until), emit the end marker, then finish(). record() is start() + finish().
class ReplicationRecorder {
 public:
  // The prefix of the non-transactional logical message that ends a recording.
  static constexpr const char* kEndMarkerPrefix = "pgrelay-golden-end";
  static constexpr std::chrono::milliseconds kDefaultTimeout{20000};

  // Connects to `db` as superuser and creates the temporary slot (dropped at disconnect).
  ReplicationRecorder(PgServer& server, const std::string& db, std::string slot_name,
                      SlotOptions slot = {});
  ~ReplicationRecorder();
  ReplicationRecorder(const ReplicationRecorder&) = delete;
  ReplicationRecorder& operator=(const ReplicationRecorder&) = delete;

  const std::string& slot_name() const { return slot_name_; }
  // The slot's consistent point reported by CREATE_REPLICATION_SLOT.
  const std::string& consistent_point() const { return consistent_point_; }

  // SQL that emits the end marker for `marker` (run it after the workload, in the slot's db).
  static std::string end_marker_sql(const std::string& marker);

  // START_REPLICATION from the slot with `options`; the server streams from then on while the
  // test runs SQL on other connections.
  void start(const std::string& name, std::vector<std::pair<std::string, std::string>> options);
  // Records messages until one satisfies `until` (given the pgoutput message after the XLogData
  // header); throws PgError naming `what` after `timeout`.
  void read_until(const std::function<bool(ByteView message)>& until, const std::string& what,
                  std::chrono::milliseconds timeout = kDefaultTimeout);
  // Records every XLogData payload up to and including the end marker carrying `marker` and
  // returns the whole recording. Throws PgError on a server error or a timeout.
  RecordedStream finish(const std::string& marker,
                        std::chrono::milliseconds timeout = kDefaultTimeout);
  // start() then finish(): for when the workload ran before.
  RecordedStream record(const std::string& name,
                        std::vector<std::pair<std::string, std::string>> options,
                        const std::string& marker,
                        std::chrono::milliseconds timeout = kDefaultTimeout);

 private:
  // Reads one CopyData message (answering keepalives on the way); false at the deadline.
  bool read_one(std::chrono::steady_clock::time_point deadline);
  void send_standby_status(std::uint64_t lsn);

  PgConnection conn_;  // owns the temporary slot: closing it drops the slot
  std::string slot_name_;
  std::string consistent_point_;
  enum class State { kIdle, kStreaming, kDone };
  State state_ = State::kIdle;
  bool in_stream_block_ = false;  // between Stream Start and Stream Stop messages carry an xid
  RecordedStream stream_;
};

}  // namespace pgrelay::test
