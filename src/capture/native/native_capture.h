// Runs native capture: streams pgrelay's upstream slot through pgoutput into the change log.
//
// The upstream's own logical decoding does the hard part: whole transactions in commit order,
// values as pgoutput's text. This service keeps the log's contracts on top of it:
//   - LSNs are the upstream's own (Begin's first change, the commit record, its end), so an LSN
//     a client got from the upstream compares correctly with the stream's;
//   - durable before released: the slot is confirmed only up to what the log made durable, and
//     a restart resumes from the log's end, skipping any transaction already in it, so nothing
//     is lost or appended twice (kill -9 included);
//   - readers see a batch once it is written, before its fdatasync (ChangeLog::append_visible):
//     a crash can only take what the slot has not been told, and the slot gives that back at
//     the same LSNs, so a consumer that saw it sees it again, identical, and skips it by its
//     own confirmed position. This keeps the fdatasync out of commit-to-consumer latency;
//   - transactions read off the socket together are appended as one batch: one fdatasync for
//     all of them, however many arrived while the previous one ran;
//   - a large transaction is taken in while it runs: from a PostgreSQL 14+ upstream the stream
//     asks for protocol 2 with streaming, so the upstream sends a transaction that outgrows its
//     logical_decoding_work_mem in blocks before its commit. Each is built (and spilled) as its
//     blocks arrive, a subtransaction's changes are dropped at its Stream Abort, and the whole
//     is appended at its Stream Commit, in commit order with the rest; an aborted one never
//     reaches the log. Its commit costs then what a small transaction's does, instead of the
//     upstream decoding it all only after the commit.
//
// The capture thread owns the walsender connection and reconnects with backoff when it breaks.
// A second thread keeps pgrelay's publications mirrored (native_setup.h) every
// mirror_interval; with an event trigger that happens in the DDL itself and the interval only
// catches up. It mirrors only when the catalogs it reads changed (capture/catalog_watch.h), and
// at least once a minute.
//
// Consistent points: sync() mirrors the publications, emits a non-transactional logical message
// (prefix kBarrierPrefix) and waits until the capture has read it: every transaction committed
// before the call precedes it in the WAL, so it is then durable in the log. export_snapshot()
// creates a temporary upstream slot that exports a snapshot; Postgres gives that snapshot exactly
// the transactions that commit before the slot's consistent point, which is the split the log's
// restart rule makes, so that point serves as pgrelay's slot's consistent point once the
// capture has passed it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/logger.h"
#include "base/result.h"
#include "capture/native/native_setup.h"
#include "capture/native/reading_loop.h"
#include "capture/native/replication_stream.h"
#include "capture/trigger/capture_service.h"
#include "capture/trigger/pg_session.h"
#include "log/change_log.h"
#include "log/in_progress.h"
#include "log/transaction_builder.h"
#include "pgoutput/decoder.h"

namespace pgrelay::capture {

struct NativeCaptureOptions {
  std::string conninfo;
  std::string schema = "_pgrelay";
  // The permanent upstream slot (created on first start): one per pgrelay data directory.
  std::string slot;
  std::string spill_dir;  // where transactions past the builder's threshold spill
  bool install_on_start = true;
  std::chrono::milliseconds mirror_interval{1000};
  // Longest gap between two status updates to the upstream, and the least between two while
  // the durable position moves: each update wakes the upstream's walsender, which at one per
  // transaction cost the upstream more CPU than the writes did.
  std::chrono::milliseconds status_interval{1000};
  std::chrono::milliseconds report_gap{20};
  std::chrono::milliseconds reconnect_min{100}, reconnect_max{5000};
  // Completed transactions are appended once nothing more is waiting on the socket, or when
  // this many bytes are pending.
  std::size_t batch_bytes = 8ull << 20;
  // Ask a PostgreSQL 14+ upstream to stream large transactions before they commit (see above).
  bool stream_in_progress = true;
  // Where such a transaction is shown to walsenders while it arrives, once it spills (they
  // stream it on to consumers that ask for streaming); null: nowhere. Outlives the capture.
  log::InProgressTransactions* in_progress = nullptr;
  std::chrono::milliseconds sync_timeout{60000};
  // Where errors the capture retries are reported (each new one once); may be null.
  Logger* logger = nullptr;
  // Where the stream is read once connected: this loop (the walsenders' own, reading_loop.h),
  // or, when null, the capture thread. Connecting, reconnecting and stopping stay on the
  // capture thread either way; stop() does not need the loop to run.
  std::shared_ptr<ReadingLoop> loop;
};

// The prefix of sync()'s barrier messages; the capture consumes them, the log never holds one.
inline constexpr const char* kBarrierPrefix = "pgrelay.capture.barrier";

class NativeCapture {
 public:
  // Checks and installs (with install_on_start), creates the upstream slot if missing, and
  // starts streaming before returning, so configuration errors come back here.
  static Result<std::unique_ptr<NativeCapture>> start(NativeCaptureOptions options,
                                                      log::ChangeLog& log);
  ~NativeCapture();
  NativeCapture(const NativeCapture&) = delete;
  NativeCapture& operator=(const NativeCapture&) = delete;

  void stop();  // idempotent
  // The loop (options.loop) no longer runs, or soon will not: the capture thread takes the
  // stream back and reads it itself from now on, so that sync() and export_snapshot() still
  // finish (say, while a server drains its blocking work at shutdown). Any thread.
  void leave_loop();

  // Blocking; see the top of this file.
  Result<ExportedSnapshot> export_snapshot();
  Result<Lsn> sync();

  struct Stats {
    std::uint64_t transactions = 0, rows = 0, batches = 0, reconnects = 0;
    // Periodic mirrors that ran: the others found the catalogs unchanged (see the top).
    std::uint64_t catalog_mirrors = 0;
    // Of `transactions`, those the upstream streamed before they committed.
    std::uint64_t streamed = 0;
    Lsn last_lsn;  // commit LSN of the last transaction appended
    // Its upstream commit time and when it was appended (microseconds since 2000-01-01).
    std::int64_t last_commit_time = 0, last_appended_at = 0;
    Lsn confirmed_lsn;  // what the upstream slot was last told is flushed
    std::string last_error;
  };
  Stats stats() const;
  const NativeSetupReport& setup_report() const { return setup_; }

 private:
  NativeCapture(NativeCaptureOptions options, log::ChangeLog& log);
  Status check_log_is_native();
  // Connects, creates the slot when missing, and starts streaming from the log's end.
  Status connect();
  void run();
  void run_mirror();
  // Reads and handles frames until an error (or stop()).
  Status pump();
  // Whether the stream is to be read on options_.loop (not left).
  bool reads_on_loop() const;
  // Hands the stream to options_.loop until a turn fails (its error), stop() or leave_loop()
  // (ok, the stream intact).
  Status read_on_loop();
  // One turn on the loop's thread (the gate's mutex held).
  ReadingLoop::Next loop_turn();
  // Takes in what the socket holds, up to a turn's share; *more when it stopped short.
  Status take_in_available(bool* more);
  // A frame read: its data handled, or a keepalive answered.
  Status take(const StreamFrame& frame);
  // Nothing more waits on the socket: append what completed, report, note the read position.
  Status on_quiet();
  Status handle(const wire::XLogData& data);
  // The log's hop trace, if any, learns when the upstream sent the commit ending at `end` and
  // when it arrived.
  void stamp_received(const wire::XLogData& data, Lsn end);
  // The messages of streamed (still running) transactions; false when `message` is none.
  Result<bool> handle_streamed(const wire::XLogData& data, pgoutput::Message& message,
                               Lsn last_commit);
  // Adds a finished entry (with its data changes, and whether it arrived streamed) to pending_.
  void queue(log::BuiltEntry entry, std::uint64_t rows, bool streamed);
  // Appends the completed transactions waiting in pending_ and signals a barrier read.
  Status flush_pending();
  Status report_progress();
  // report_progress() when status_interval passed, or report_gap and the log made more durable.
  Status maybe_report_progress();
  // Tells the log how far the upstream has been read (ChangeLog::note_read_through) when
  // nothing read is pending and kReadThroughEvery has passed since the last time.
  void maybe_note_read_through();
  void reset_stream();
  void note_error(const Error& error);
  void sleep_interruptibly(std::chrono::milliseconds duration);

  NativeCaptureOptions options_;
  log::ChangeLog& log_;
  NativeSetupReport setup_;

  // Capture thread state.
  std::unique_ptr<ReplicationStream> stream_;
  log::SchemaCatalog catalog_;
  std::unique_ptr<log::TransactionBuilder> builder_;
  std::optional<pgoutput::Decoder> decoder_;
  log::TransactionHeader open_header_;
  std::vector<log::BuiltEntry> pending_;
  std::uint64_t pending_bytes_ = 0;
  std::uint64_t pending_rows_ = 0;      // data changes in pending_
  std::uint64_t open_rows_ = 0;         // data changes in the open transaction
  std::uint64_t pending_streamed_ = 0;  // transactions in pending_ that arrived streamed
  Lsn appended_end_;  // end LSN of the last entry appended (visible, maybe not durable)
  Lsn reported_;      // the position last confirmed upstream
  // A keepalive's position received outside a transaction: every commit before it has been
  // read, so the slot may be confirmed there once pending_ is durable.
  Lsn stream_position_;
  Lsn pending_barrier_;  // the last barrier read, reached once pending_ is durable

  // A transaction the upstream streams while it runs.
  struct StreamedTransaction {
    log::SchemaCatalog catalog;  // the Relations and Types its blocks sent
    std::unique_ptr<log::TransactionBuilder> builder;
    // Where each subtransaction's changes begin, in order: its Stream Abort drops those and
    // every later one (which are its own or its children's).
    struct Subtransaction {
      pgoutput::Xid xid = 0;
      log::TransactionBuilder::Mark mark;
      std::uint64_t rows = 0;
    };
    std::vector<Subtransaction> subtransactions;
    std::uint64_t rows = 0;
    // The Relations and Types its blocks sent: the upstream takes them as known after the
    // Stream Commit (pgoutput marks them sent), so they join the catalog then.
    std::vector<pgoutput::Oid> sent_relations, sent_types;
    log::InProgressWriter visible;  // its showing to walsenders (options_.in_progress)
  };
  std::map<pgoutput::Xid, std::unique_ptr<StreamedTransaction>> streamed_;
  pgoutput::Xid stream_xid_ = 0;  // the block being read, when in_stream_
  StreamedTransaction* in_stream_ = nullptr;
  std::chrono::steady_clock::time_point last_status_{};
  std::chrono::steady_clock::time_point last_read_through_{};
  bool connected_before_ = false;

  // How the stream passes between the capture thread and the loop's turns: a turn holds the
  // mutex throughout and touches capture thread state only while `owner` is set. The capture
  // thread clears it to take the stream back; turns queued after that find it cleared.
  struct LoopGate {
    std::mutex mu;
    NativeCapture* owner = nullptr;
  };
  std::shared_ptr<LoopGate> gate_ = std::make_shared<LoopGate>();
  bool loop_done_ = false;  // (mu_) a turn gave the stream back, for loop_status_
  Status loop_status_;      // (mu_)
  bool left_loop_ = false;  // (mu_) leave_loop() was called

  std::thread thread_;
  std::thread mirror_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> exports_{0};  // names the temporary slots of export_snapshot()

  mutable std::mutex mu_;
  std::condition_variable cv_;  // barrier progress, stop
  Lsn barrier_reached_;         // the greatest barrier LSN whose predecessors are durable
  Stats stats_;
};

}  // namespace pgrelay::capture
