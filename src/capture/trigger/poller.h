// Trigger capture's poller: moves committed transactions from the change table into the log.
//
// Each poll reads, in one REPEATABLE READ transaction with snapshot S_k, the rows of the
// transactions visible in S_k but not in the previous snapshot S_{k-1}, so a transaction that
// took its sequence values early and committed late is neither lost nor read twice. Transactions
// are ordered by their last sequence value, rows by sequence. The batch and a checkpoint holding
// S_k are appended to the log in one atomic append; only then are the rows deleted upstream.
// After a crash the poller resumes from the checkpoint: rows still upstream whose transactions
// are visible in it are old, not new, and are only deleted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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
};

struct PollStats {
  std::size_t transactions = 0;
  std::size_t rows = 0;
  // Rows of tables dropped since (their Relation is gone) or deletes without an old tuple.
  std::size_t skipped_rows = 0;
  Lsn base;              // first LSN the log assigned, invalid when nothing was appended
  std::string snapshot;  // S_k
  Lsn upstream_lsn;      // pg_current_wal_lsn() at S_k
};

// The capture state persisted in checkpoint entries.
struct CheckpointState {
  std::string snapshot;  // pg_snapshot text "xmin:xmax:xip,..."
  Lsn upstream_lsn;
};
Bytes encode_checkpoint(const CheckpointState& state);
Result<CheckpointState> decode_checkpoint(ByteView data);

class TriggerPoller {
 public:
  // Connects and resumes from log.last_checkpoint(); the log must outlive the poller.
  static Result<std::unique_ptr<TriggerPoller>> open(PollerOptions options, log::ChangeLog& log);

  // capture() then release().
  Result<PollStats> poll();
  // Appends the transactions new since the last poll, with a checkpoint, in one append.
  Result<PollStats> capture();
  // Deletes the upstream rows of transactions visible in the last persisted snapshot.
  Status release();

  // Whether commit times come from pg_xact_commit_timestamp (track_commit_timestamp = on);
  // otherwise each transaction gets the time of the poll that found it.
  bool commit_timestamps() const { return commit_timestamps_; }
  const std::string& last_snapshot() const { return prev_snapshot_; }

 private:
  TriggerPoller(PollerOptions options, log::ChangeLog& log, std::unique_ptr<PgSession> session)
      : options_(std::move(options)), log_(log), session_(std::move(session)) {}

  PollerOptions options_;
  log::ChangeLog& log_;
  std::unique_ptr<PgSession> session_;
  std::string changes_table_;  // quoted schema.changes
  bool commit_timestamps_ = false;
  std::string prev_snapshot_;       // S_{k-1}; empty before the first poll ever
  std::string persisted_snapshot_;  // snapshot of the last checkpoint in the log
  bool release_pending_ = false;
  log::SchemaCatalog catalog_;
};

}  // namespace pgrelay::capture
