// Rebuilds a database's change log from the _tx subject of the JetStream stream a pgrelay
// primary publishes: the same entries, at the same LSNs, with the same bytes.
//
// How nothing is lost or doubled:
//  - The follower reads the stream through an ordered consumer, from the sequence after the
//    last one its log's checkpoint names. Entries and the checkpoint that covers them go into
//    the log as one batch, so a crash leaves both or neither: reading resumes exactly there.
//  - An entry the log holds already (commit LSN at or below its head) is skipped: a checkpoint
//    behind its entries, or a stream published again from its start, doubles nothing.
//  - Every entry names the primary's entry before it (Pgrelay-Previous-Lsn). The follower
//    appends one only right after that entry, so transactions the stream no longer holds
//    (its retention removed them before the follower read them) are an error, never a gap.
//  - The log id of every message must be the one the follower's log follows.
// Beside the log it keeps the primary's last server facts (nats/server_facts.h), read from the
// stream when it connects and every `facts_interval`, and kept in a file so that a restart
// without NATS still has them.
// NATS down or slow never stops the server: the follower has its own thread, retries with
// backoff and logs each distinct cause once.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/background_thread.h"
#include "base/logger.h"
#include "base/result.h"
#include "capture/follower/entry_assembler.h"
#include "capture/follower/follower_checkpoint.h"
#include "log/change_log.h"
#include "nats/connection.h"
#include "nats/server_facts.h"
#include "nats/subjects.h"

namespace pgrelay::capture {

struct FollowerOptions {
  nats::ConnectOptions connect;
  std::string stream = "PGRELAY";
  std::string subject_prefix = "pgrelay";
  std::string database;  // whose _tx subject is followed
  // A batch is appended once the follower has caught up with the stream, or at this size.
  std::size_t batch_bytes = 8u << 20;
  std::size_t batch_entries = 1024;
  std::chrono::milliseconds retry_min{250};
  std::chrono::milliseconds retry_max{10000};
  std::chrono::milliseconds facts_interval{30000};
  // Where kFactsFileName keeps the last server facts read; empty: nowhere.
  std::string facts_dir;
};

inline constexpr const char* kFactsFileName = "server_facts.json";

struct FollowerFigures {
  std::string state;                   // "connecting", "following", "retrying", "stopped"
  std::uint64_t applied_seq = 0;       // the stream sequence the log holds everything up to
  wire::Lsn applied_commit_lsn;        // the log's newest entry
  std::uint64_t entries = 0;           // appended since the start
  std::uint64_t pending_messages = 0;  // of the followed subject, not yet read (as last seen)
  std::map<std::string, std::uint64_t> errors;  // by reason
  std::string last_error;
};

class StreamFollower {
 public:
  // Checks that `log` is empty or a follower's (of `options.stream`); `log` and `logger` must
  // outlive the follower.
  static Result<std::unique_ptr<StreamFollower>> make(FollowerOptions options, log::ChangeLog& log,
                                                      Logger& logger);
  ~StreamFollower();
  StreamFollower(const StreamFollower&) = delete;
  StreamFollower& operator=(const StreamFollower&) = delete;

  void start();
  // Stops reading; what was read but not appended is read again at the next start.
  void stop();
  FollowerFigures figures() const;
  // The primary's last server facts read (or kept from before); null: none yet. Shared, not
  // copied: every replication session start reads them, and the catalog may be large.
  std::shared_ptr<const nats::ServerFacts> server_facts() const;

 private:
  StreamFollower(FollowerOptions options, log::ChangeLog& log, Logger& logger,
                 std::optional<FollowerCheckpoint> checkpoint);
  void run();
  // One connection's life: connect, subscribe after the checkpoint, follow until an error;
  // what was read is appended before it returns.
  Status session();
  Status follow(const nats::Connection& connection);
  // Reads the stream's last server facts, keeping them when they are new.
  Status refresh_facts(const nats::Connection& connection);
  // Checks one entry read whole, and adds it to the batch unless the log holds it already.
  Status take(AssembledEntry entry);
  // Appends what was read (entries and the checkpoint after them) as one batch.
  Status flush();
  void count_error(const std::string& reason, const std::string& text);
  // Logs an error once per distinct message, until following works again.
  void report(const Error& error);
  void set_state(const char* state);
  bool stopping() const { return thread_.stopping(); }

  FollowerOptions options_;
  log::ChangeLog& log_;
  Logger& logger_;
  nats::Subjects subjects_;
  std::optional<FollowerCheckpoint> checkpoint_;  // as the log holds it (follower thread)
  // Read, not yet appended (follower thread).
  std::vector<AssembledEntry> batch_;
  std::size_t batch_bytes_ = 0;
  std::uint64_t log_id_ = 0;        // the primary's log this one follows (0: not yet known)
  std::uint64_t read_seq_ = 0;      // the sequence everything read so far is complete up to
  wire::Lsn head_;                  // commit LSN of the newest entry, appended or in batch_
  std::uint64_t logged_start_ = 0;  // where the last "following" line said reading began
  bool warned_no_facts_ = false;    // the stream held no server facts: said once

  BackgroundThread thread_;
  ErrorNews news_;  // which failures to log

  mutable std::mutex mu_;  // what follows
  FollowerFigures figures_;
  std::shared_ptr<const nats::ServerFacts> facts_;
};

}  // namespace pgrelay::capture
