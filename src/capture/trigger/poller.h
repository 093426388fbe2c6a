// Trigger capture's poller: moves committed transactions from the change table into the log.
//
// Each poll reads, in one REPEATABLE READ transaction with snapshot S_k, the rows of the
// transactions visible in S_k but not in the previous snapshot S_{k-1}, so a transaction that
// took its sequence values early and committed late is neither lost nor read twice. Transactions
// are ordered by their last sequence value, rows by sequence (a row holding a chunk of a
// statement's changes gives them in their order). The batch and a checkpoint holding
// S_k are appended to the log in one atomic append; only then are the rows deleted upstream.
// After a crash the poller resumes from the checkpoint: rows still upstream whose transactions
// are visible in it are old, not new, and are only deleted.
//
// Memory stays bounded however much a poll finds: its rows stream in one at a time (a chunk is
// at most 1 MiB of row text, or one row; a large transaction spills while it is built), and
// once the finished entries pass a budget
// (PollerOptions::batch_entries, batch_bytes) they are appended as a part, with a partial
// checkpoint: S_k, S_{k-1} and the log order of the last transaction in the part. The log then
// holds what S_{k-1} sees plus what is new in S_k up to that order; after a crash (or an error)
// the next poll reads the rest of S_k, in S_k, before any later snapshot. Rows are released
// only for complete snapshots.
//
// Rows are decoded with the layout version they were stamped with (see installer.h); a Relation
// goes before a table's first change in each transaction and again when the layout changes.
// Logical messages: transactional ones are changes of their transaction; a non-transactional
// one becomes its own log entry, ordered by its own sequence value among the transactions
// (pgoutput sends it when it is written, not when its transaction commits). LogicalMessage::lsn
// is the message's LSN in the log (exact while the poller is the log's only appender).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "base/result.h"
#include "capture/trigger/pg_session.h"
#include "log/change_log.h"
#include "log/transaction_builder.h"

namespace pgrelay::capture {

using wire::Lsn;

struct PollerOptions {
  std::string conninfo;
  std::string schema = "_pgrelay";
  // Where transactions too large for memory are spilled while assembled.
  std::string spill_dir;
  // A poll appends its finished entries in parts of about this many, or of this many bytes (in
  // memory, or in spill files it holds open), so that a backlog of any size is never held
  // whole (see the top of this file).
  std::size_t batch_entries = 10000;
  std::size_t batch_bytes = 8ull << 20;
  // capture() deletes the rows of the last persisted snapshot in its own statement at most this
  // often. A statement that deletes commits with a wait for the upstream's WAL flush, which
  // the poll after it waits for: at 1000 tx/s nearly every poll released, each adding an
  // upstream fdatasync beside the writers' own (trigger capture, bench/replication.sh at
  // 1000 tx/s: a poll took 0.70 ms at p50 releasing every time, 0.43 ms every 50 ms).
  // The change table keeps about this long of captured rows; zero releases at every capture().
  std::chrono::microseconds release_interval{10'000};
};

struct PollStats {
  std::size_t transactions = 0;
  std::size_t rows = 0;
  // Rows of tables dropped since (their Relation is gone) or deletes without an old tuple.
  std::size_t skipped_rows = 0;
  std::size_t messages = 0;  // non-transactional message entries
  // Whether the poll re-ran after syncing layouts because a row did not fit its layout.
  bool synced_layouts = false;
  // Rows that fit no recorded layout even after that sync (without an event trigger, a table
  // altered twice between syncs with a row written in between): left out and reported.
  std::size_t undecodable_rows = 0;
  Lsn base;              // first LSN the log assigned, invalid when nothing was appended
  std::string snapshot;  // S_k
  Lsn upstream_lsn;      // pg_current_wal_insert_lsn() at S_k
  Lsn last_lsn;          // commit LSN of the last entry appended, invalid when none
  // The commit time of the last transaction appended (microseconds since 2000-01-01; 0 when
  // none): the upstream's with commit_timestamps(), otherwise the poll's.
  std::int64_t last_commit_time = 0;
  // The poll's statement failed to end (its release did not commit, or the connection broke)
  // after its rows were in the log: the poll's entries stand, and the next poll releases.
  std::optional<Error> end_error;
};

// The capture state persisted in checkpoint entries.
struct CheckpointState {
  std::string snapshot;  // pg_snapshot text "xmin:xmax:xip,..."
  Lsn upstream_lsn;
  // Set when the log holds only part of `snapshot`: what `previous` (S_{k-1}, empty before the
  // first poll) sees, and the transactions new in `snapshot` up to log order `through`.
  std::optional<std::int64_t> through;
  std::string previous;
};
Bytes encode_checkpoint(const CheckpointState& state);
Result<CheckpointState> decode_checkpoint(ByteView data);

class TriggerPoller {
 public:
  // Connects and resumes from log.last_checkpoint(); the log must outlive the poller.
  static Result<std::unique_ptr<TriggerPoller>> open(PollerOptions options, log::ChangeLog& log);

  ~TriggerPoller();
  TriggerPoller(const TriggerPoller&) = delete;
  TriggerPoller& operator=(const TriggerPoller&) = delete;

  // capture() then release().
  Result<PollStats> poll();
  // Appends the transactions new since the last poll, with a checkpoint, in one append. It is
  // one statement, one round trip: the upstream rows previous captures left for release() are
  // deleted by it too once release_interval has passed since the last release, so a poller
  // that only captures keeps the change table small.
  Result<PollStats> capture();
  // Like capture(), but in the snapshot exported as `snapshot_name` (pg_export_snapshot(), taken
  // after the last poll and still held open by its exporter) instead of a new one: exactly the
  // transactions visible in it are in the log afterwards, later ones come with later polls.
  Result<PollStats> capture_in_snapshot(const std::string& snapshot_name);
  // Deletes the upstream rows of transactions visible in the last persisted snapshot, once the
  // log has made it durable (it waits for that).
  Status release();

  // Whether commit times come from pg_xact_commit_timestamp (track_commit_timestamp = on);
  // otherwise each transaction gets the time of the poll that found it.
  bool commit_timestamps() const { return commit_timestamps_; }
  const std::string& last_snapshot() const { return prev_snapshot_; }
  // Whether the log holds only part of a poll's snapshot: the next poll reads the rest first.
  bool partly_captured() const { return partial_.has_value(); }
  PgSession& session() { return *session_; }

 private:
  struct LayoutCache;
  TriggerPoller(PollerOptions options, log::ChangeLog& log, std::unique_ptr<PgSession> session);

  Result<PollStats> capture_with_sync(const std::string& snapshot_name);
  // How one attempt at a capture ended; only kDone appended anything.
  enum class Attempt {
    kDone,
    kStaleLayouts,  // a row's layout version is not cached (with stale_is_miss)
    kMismatch,      // a row fits none of its table's recorded layouts (without skip_unfit)
  };
  // One attempt, its figures in *stats. With skip_unfit, rows that fit no layout are counted in
  // undecodable_rows and left out.
  Result<Attempt> capture_once(const std::string& snapshot_name, bool stale_is_miss,
                               bool skip_unfit, PollStats* stats);
  // Reads every recorded layout version, and the Type records their columns need.
  Status reload_layouts();

  // S_k's head and the change rows new in it, in log order, as they arrive; with `releasing`,
  // the same statement deletes the rows of the persisted snapshot (see release()). While a
  // snapshot is partly appended, its rest instead.
  Result<std::unique_ptr<RowStream>> read_changes(bool releasing);
  // Appends `built` (LSNs relative to `predicted`) and a checkpoint of `state`, in one batch.
  Result<Lsn> append_with_checkpoint(std::vector<log::BuiltEntry>& built, std::uint64_t end,
                                     const CheckpointState& state, Lsn predicted,
                                     std::int64_t time);
  // The condition selecting the rows release() deletes; appends its parameters.
  std::string released_rows(Params& params) const;
  // Records that release() (or read_changes(true)) deleted them.
  void released();
  // Waits until the log has made the last complete snapshot appended durable, which makes it
  // the persisted snapshot whose rows may be released.
  Status settle();

  PollerOptions options_;
  log::ChangeLog& log_;
  std::unique_ptr<PgSession> session_;
  std::string changes_table_;  // quoted schema.changes
  std::string layouts_table_;  // quoted schema.layouts
  bool commit_timestamps_ = false;
  std::string prev_snapshot_;       // S_{k-1}; empty before the first poll ever
  std::string persisted_snapshot_;  // snapshot of the last durable checkpoint in the log
  bool release_pending_ = false;
  // A poll returns once its batch is written, and reads the next one while the log's sync
  // thread makes it durable (its entries are shown to readers then): the last complete snapshot
  // appended, and the log's end after it, until settle() sees it durable.
  struct Unsettled {
    std::string snapshot;
    Lsn end;
  };
  std::optional<Unsettled> unsettled_;
  // The persisted snapshot of the last release; empty until one ran in this process.
  std::string released_floor_;
  std::chrono::steady_clock::time_point released_at_;
  // The snapshot the log holds part of, and how far (see the top of this file).
  struct Partial {
    std::string snapshot;
    Lsn upstream_lsn;
    std::int64_t through = 0;
  };
  std::optional<Partial> partial_;
  log::SchemaCatalog catalog_;
  // The layout version whose Relation catalog_ holds, per table.
  std::map<std::uint32_t, std::int32_t> catalog_layouts_;
  std::unique_ptr<LayoutCache> layout_cache_;
};

}  // namespace pgrelay::capture
