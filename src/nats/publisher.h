// Publishes one database's change log to a JetStream stream, exactly once and in commit order.
//
// How it keeps exactly-once and order:
//  - It is the stream's one writer, and each message it publishes carries the stream sequence
//    it must follow (Nats-Expected-Last-Sequence). JetStream stores a message only right after
//    its predecessor, so the stream is always a prefix of the log's message sequence
//    (entry_messages.h), never with a gap, a copy or two messages swapped.
//  - Publishing is asynchronous, with at most `max_pending` acks outstanding. When one fails
//    (a timeout, a leader change, a lost connection), those after it fail too; the publisher
//    waits for what is outstanding, reads the stream's end again (stream_setup.h) and goes on
//    from the message after the last one stored. Msg-Ids let JetStream drop a copy as well.
//  - Only entries an fdatasync covered are published: a crash may take back what was only
//    visible, and what the stream holds it holds for good.
//  - On start it resumes after the stream's last message of this database, read from the
//    stream itself, not from local state that may be behind or lost.
//  - Before the entries, it publishes the upstream's server facts (server_facts.h) when they
//    differ from the stream's last ones, in the same sequence: followers answer sessions
//    with them. Failing to read them is logged and never stops publishing.
// NATS down, slow or misconfigured never blocks capture, pass-through or walsenders: the
// publisher has its own thread, which only reads the log. It retries with backoff and logs
// each distinct cause once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/background_thread.h"
#include "base/logger.h"
#include "base/result.h"
#include "log/change_log.h"
#include "nats/connection.h"
#include "nats/entry_messages.h"
#include "nats/stream_setup.h"
#include "nats/subjects.h"

namespace pgrelay::nats {

struct PublisherOptions {
  ConnectOptions connect;
  std::string stream = "PGRELAY";
  std::string subject_prefix = "pgrelay";
  std::string database;                      // the log's database, in its subjects
  std::string state_dir;                     // where kStateFileName goes; empty: nowhere
  std::int64_t max_pending = 256;            // acks outstanding
  std::chrono::milliseconds ack_wait{5000};  // a publish not acked by then has failed
  std::chrono::milliseconds retry_min{250};
  std::chrono::milliseconds retry_max{10000};
  // Reads the upstream's ParameterStatus values and publications catalog (as_of is the
  // publisher's to set); null: no server facts are published. Called on the publisher's
  // thread, blocking.
  std::function<Result<ServerFacts>()> read_server_facts;
};

// The publisher's state as `pgrelay status` reads it: STATE_DIR/nats.json, rewritten as the
// state changes and at most once a second as publishing goes on.
inline constexpr const char* kStateFileName = "nats.json";

struct PublisherFigures {
  std::string state;               // "connecting", "publishing", "retrying", "stopped"
  wire::Lsn published_commit_lsn;  // the last transaction the stream holds whole
  wire::Lsn published_end_lsn;     // its end: what lag is counted from
  std::uint64_t published_messages = 0;
  std::uint64_t published_transactions = 0;
  std::uint64_t lag_bytes = 0;                  // the log's end past published_end_lsn
  std::map<std::string, std::uint64_t> errors;  // by reason
  std::string last_error;
};

class Publisher {
 public:
  // `log` and `logger` must outlive the publisher.
  Publisher(PublisherOptions options, log::ChangeLog& log, Logger& logger);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  void start();
  // Stops publishing: what is outstanding is given a moment to be acked, then dropped (the
  // next start resumes after what the stream holds).
  void stop();
  PublisherFigures figures() const;

 private:
  struct InFlight {
    wire::Lsn commit_lsn;
    wire::Lsn end_lsn;
    bool last = false;  // its entry's last message
  };
  void run();
  // One connection's life: connect, check the stream, publish until an error or stop().
  Status session();
  // Publishes from the stream's end on; returns on stop() (ok), a failed ack (ok, with
  // broken_ set: the caller reads the end again) or an error.
  Status publish_from(const Connection& connection, const StreamEnd& end);
  // Publishes the server facts unless the stream's last ones say the same (once a session).
  Status publish_server_facts(const Connection& connection);
  // `previous`: the commit LSN of the log's entry before `entry` (invalid: not known).
  Status publish(const Connection& connection, const OutMessage& message,
                 const EntryMessages& entry, wire::Lsn previous);
  // After a failed ack or an error: waits for the acks outstanding, drops what is left.
  void drain(const Connection& connection);
  static void on_ack(jsCtx* js, natsMsg* msg, jsPubAck* ack, jsPubAckErr* error, void* closure);
  void take_ack(const jsPubAck* ack, const jsPubAckErr* error);
  void count_error(const std::string& reason, const std::string& text);
  // Logs an error once per distinct message, until publishing works again.
  void report(const Error& error);
  void set_state(const char* state);
  // Rewrites the state file (publisher thread only); `force` even within the second.
  void write_state(bool force);
  bool stopping() const { return thread_.stopping(); }

  PublisherOptions options_;
  log::ChangeLog& log_;
  Logger& logger_;
  Subjects subjects_;
  std::string log_id_;

  std::atomic<bool> broken_{false};  // an ack failed: the stream's end must be read again
  BackgroundThread thread_;
  ErrorNews news_;  // which failures to log

  mutable std::mutex mu_;  // what follows, shared with nats.c's ack thread
  std::uint64_t expected_last_seq_ = 0;
  std::map<std::uint64_t, InFlight> in_flight_;  // by the stream sequence each must get
  PublisherFigures figures_;
  bool state_dirty_ = false;  // the state changed on nats.c's thread: write the file now
  bool warned_ = false;       // the stream's warnings are logged once
  bool facts_current_ = false;  // the stream holds the server facts this process read
  int facts_failures_ = 0;      // publishing them failed: after 3, they are given up
  std::chrono::steady_clock::time_point state_written_;
};

}  // namespace pgrelay::nats
