// The durable change log: append batches of whole entries, recover on open, serve cursors.
//
// Durability policies (LogOptions::sync):
//  - kFsyncPerCommit: append() returns after fdatasync covered its batch. A sync thread runs
//    fdatasync back to back while there is unsynced data, so every batch written during one
//    fdatasync is covered by the next (group commit). An appender alone (the sync thread idle,
//    no other appender in flight) runs its fdatasync itself, which saves two thread switches.
//    Nothing acknowledged is ever lost.
//  - kInterval: append() returns after write(2); a background thread fsyncs every
//    `sync_interval`, and an appender fsyncs itself once `sync_bytes` are unsynced. A crash of
//    the machine (not of the process: the page cache survives that) can lose at most the last
//    `sync_interval` or `sync_bytes` of acknowledged appends, whichever comes first.
//  - kNone: never fsyncs. For tests and benchmarks only.
// Readers see exactly what the policy has acknowledged, and only whole batches.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/bytes.h"
#include "base/hop_trace.h"
#include "base/result.h"
#include "log/file_util.h"
#include "log/format.h"
#include "log/manifest.h"
#include "log/marks.h"
#include "log/record_reader.h"

namespace pgrelay::log {

enum class SyncPolicy { kFsyncPerCommit, kInterval, kNone };

struct LogOptions {
  std::string dir;
  std::uint64_t segment_size = 64ull << 20;
  SyncPolicy sync = SyncPolicy::kFsyncPerCommit;
  std::chrono::milliseconds sync_interval{100};
  // Longest the sync thread waits for appenders in flight to join a group commit (never more
  // than half the last fdatasync's duration, so the wait costs less than a sync it saves).
  std::chrono::microseconds group_commit_wait{1000};
  std::uint64_t sync_bytes = 8ull << 20;
  // Under kFsyncPerCommit, how long data from append_visible() may wait for its fdatasync while
  // no appender waits for one: its readers do not wait, so one fdatasync per this interval
  // covers it instead of one after another (fdatasync was a quarter of pgrelay's CPU).
  std::chrono::milliseconds visible_sync_delay{20};
  // A sparse index point is recorded at least every this many bytes of a segment.
  std::uint64_t index_interval = 64ull << 10;
  // Per-cursor read buffer; with the writer's batch buffer this bounds the log's memory.
  std::size_t read_buffer = 256ull << 10;
  // For inspection tools: never creates, locks, truncates or writes; reads what is whole.
  // May run beside the pgrelay that owns the log; it sees the log as of open().
  bool read_only = false;
  // When set (`serve --hop-trace`), stamped when entries become visible and durable; capture
  // and walsenders stamp their own hops in the same trace. Outlives the log.
  HopTrace* hop_trace = nullptr;
};

// Entry data already laid out in a file as a segment holding that entry alone (a spill file,
// see spill_file.h), with the segment header and the FIRST record left for the log to write.
struct SegmentImage {
  int fd = -1;  // the file, open for reading and writing, unnamed
  std::uint64_t file_size = 0;
  std::size_t meta_size = 0;  // the encoded metadata its FIRST record has room for
  std::uint64_t data_size = 0;
};

// Entry data too large to hold in memory (a spilled transaction): read piece by piece.
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual std::uint64_t size() const = 0;
  // Fills `out` with the bytes at `offset`; offset + out.size() <= size().
  virtual Status read(std::uint64_t offset, std::span<std::uint8_t> out) const = 0;
  // When set, the log may take the file as a segment of its own instead of copying the data:
  // it writes the segment header and the FIRST record into the hole left for them and links
  // the file into the log directory.
  virtual std::optional<SegmentImage> segment_image() const { return std::nullopt; }
};

// One entry handed to append(): its metadata and its data, in memory or from a source.
struct PendingEntry {
  EntryMeta meta;
  ByteView data;
  const DataSource* source = nullptr;  // when set, used instead of `data`
  // The entry holds a change readers find through marked_entries() (marks.h).
  bool marked = false;

  std::uint64_t data_size() const { return source != nullptr ? source->size() : data.size(); }
};

// A position in the log: (segment, byte offset in it).
struct Position {
  std::uint64_t seq = 0;
  std::uint64_t offset = 0;
  auto operator<=>(const Position&) const = default;
};

struct IndexPoint {
  Lsn lsn;                // commit LSN of the first entry of the batch at `offset`
  std::int64_t time = 0;  // its commit time
  std::uint64_t offset = 0;
};

struct LogStats {
  std::uint64_t entries_appended = 0;
  std::uint64_t bytes_appended = 0;
  std::uint64_t batches_appended = 0;
  std::uint64_t fsyncs = 0;
  std::uint64_t segments = 0;
  std::uint64_t total_bytes = 0;
  Lsn oldest_lsn;  // first retained entry (invalid if empty)
  Lsn newest_lsn;  // last visible entry (invalid if empty)
  std::int64_t newest_time = 0;
  // A torn tail found at open: the written bytes past the last whole batch of the active
  // segment, through its last non-zero byte (zeros past it are preallocated space; see
  // preallocate_file()), discarded or, in read-only mode, ignored; where they start and why
  // they were not whole.
  std::uint64_t recovered_truncated_bytes = 0;
  std::string torn_tail_file;
  std::uint64_t torn_tail_offset = 0;
  std::string torn_tail_reason;
};

// The entries appended as marked from some LSN on (ChangeLog::marked_entries).
struct MarkedEntries {
  // Commit LSNs, ascending: every marked entry the log holds, and perhaps LSNs a crash took
  // the entries of (or an entry since appended unmarked at one): readers check each entry.
  std::vector<Lsn> commit_lsns;
  // Entries up to this LSN were appended before the log kept marks: any of them may be marked
  // without being listed. Invalid when the log kept marks from its start.
  Lsn unmarked_through;
};

class Cursor;

class ChangeLog {
 public:
  // Opens (creating if needed) the log in options.dir, recovering from a crash: a torn or
  // damaged tail of the active segment is truncated back to the last whole batch.
  static Result<std::unique_ptr<ChangeLog>> open(LogOptions options);
  ~ChangeLog();
  ChangeLog(const ChangeLog&) = delete;
  ChangeLog& operator=(const ChangeLog&) = delete;

  // Appends the entries as one atomic batch. Transactions and messages must have strictly
  // increasing commit LSNs (checkpoints are exempt). Returns once durable under the policy.
  Status append(std::span<const PendingEntry> batch);
  // Like append(), but returns (and shows the batch to readers) once it is written, while the
  // sync thread makes it durable as the policy says (kFsyncPerCommit: at once, in the next group
  // commit). Only for sources that can give the same entries again, at the same LSNs, after a
  // crash lost them, and that release their own copy only up to durable_end_lsn(): a reader that
  // saw an entry the crash took sees it again, identical, instead of a gap.
  Status append_visible(std::span<const PendingEntry> batch);
  // The end LSN of the newest entry an fdatasync covered (under kNone: of the newest entry).
  Lsn durable_end_lsn() const;
  // For readers that may hand on only durable entries (the NATS publisher): waits until
  // durable_end_lsn() reaches `end` (an entry already visible), the deadline passes or the log
  // stops; true when it did. Under kFsyncPerCommit the wait counts as an appender's, so the
  // sync thread syncs at once instead of after visible_sync_delay.
  bool wait_durable(Lsn end, std::chrono::steady_clock::time_point deadline);

  // When append_assigning() returns. Its entries are shown to readers once durable either way.
  enum class ReturnWhen {
    kDurable,
    // Once written: under kFsyncPerCommit the sync thread makes the batch durable (at once, not
    // after visible_sync_delay) and shows it then, while the appender goes on, e.g. to read its
    // next batch. It must release its own copy only up to durable_end_lsn() (wait_durable()).
    kWritten,
  };
  // Like append(), but the log chooses the LSNs: the entries' LSNs are offsets relative to the
  // batch, and the log shifts them all by one base = max(`floor`, last end LSN + 1), so that
  // concurrent appenders need not agree on positions and LSNs are never reused. Returns the base.
  Result<Lsn> append_assigning(std::span<PendingEntry> batch, Lsn floor,
                               ReturnWhen when = ReturnWhen::kDurable);

  // A cursor at the first entry whose commit LSN is >= `start` (Postgres's restart rule).
  // Errors if `start` lies in removed segments. The log must outlive its cursors.
  Result<std::unique_ptr<Cursor>> open_cursor(Lsn start);
  // A cursor at the first entry committed at or after `time` (µs since 2000-01-01).
  Result<std::unique_ptr<Cursor>> open_cursor_at_time(std::int64_t time);

  // Deletes sealed segments all of whose entries have commit LSN < `lsn`.
  Status remove_before(Lsn lsn);

  // The data of the most recent checkpoint entry, if any.
  std::optional<Bytes> last_checkpoint() const;
  Lsn last_commit_lsn() const;
  Lsn last_end_lsn() const;
  // A source that reads its upstream in commit order (native capture) notes how far it has read
  // once everything before is appended: every entry appended later commits past `lsn`. Kept in
  // memory only; caught-up readers may report it (as Postgres's walsenders report the WAL they
  // have decoded, which pg_recvlogical --endpos waits for). Wakes the on_visible listeners when
  // it moves.
  void note_read_through(Lsn lsn);
  // What was noted (invalid when nothing was): not the log's end, which an append reaches
  // before its batch is visible to readers.
  Lsn read_through() const;
  std::uint64_t system_id() const { return system_id_; }
  LogStats stats() const;
  const LogOptions& options() const { return options_; }
  // The retained segments, oldest first, with live figures for the active (last) one.
  std::vector<SegmentInfo> segments() const;
  // Highest commit LSN of any removed entry: positions at or below it are gone.
  Lsn removed_through() const;
  // The marked entries with commit LSN >= `start`, as far as appends have reached (an entry
  // is listed before readers see it).
  MarkedEntries marked_entries(Lsn start) const;

  // Registers a function called (from the appending thread, without locks held) whenever new
  // entries become visible; for event loops that cannot block in Cursor::wait.
  void on_visible(std::function<void()> listener);

  // --- for Cursor ---
  Position visible_position() const;
  // Waits until the visible position passes `pos` or the deadline passes; true if it did.
  bool wait_beyond(Position pos, std::chrono::steady_clock::time_point deadline) const;
  // The segment after `seq`, if any.
  std::optional<std::uint64_t> segment_after(std::uint64_t seq) const;
  std::string segment_path(std::uint64_t seq) const;

 private:
  struct ActiveSegment;
  explicit ChangeLog(LogOptions options);
  Status recover();
  Status create_fresh();
  Status scan_active_segment();
  Status roll_segment();
  Status write_manifest_locked();
  struct AppenderGuard;
  Error read_only_error() const;
  // `lock` holds mu_ and `appending` append_mu_ (released once the batch is written).
  // How append_locked() shows a batch to readers and when it returns.
  enum class Publish {
    kWhenDurable,        // shown once durable; returns then (append)
    kWhenDurableNoWait,  // shown once durable; returns once written (ReturnWhen::kWritten)
    kNowSyncLater,       // shown once written; returns then (append_visible)
  };
  Status append_locked(std::span<const PendingEntry> batch, std::unique_lock<std::mutex>& lock,
                       std::unique_lock<std::mutex>& appending,
                       Publish publish = Publish::kWhenDurable);
  // After an fdatasync that covered everything written: synced_ and durable_end_lsn_ catch up.
  void mark_synced_locked();
  // Writes the batch's records at the end of `seg` and notes them in its info and index.
  Status write_batch_locked(ActiveSegment& seg, std::span<const PendingEntry> batch);
  // What write_records() did: on failure the file is cut back to where the batch began, and
  // `unrecoverable` says why when even that failed (the log must then refuse appends).
  struct BatchWrite {
    Status status;
    std::uint64_t bytes = 0;
    std::optional<Error> unrecoverable;
  };
  // Writes the batch's records at the end of `seg`, touching no shared state: the caller holds
  // append_mu_, not necessarily mu_.
  BatchWrite write_records(const ActiveSegment& seg, std::span<const PendingEntry> batch) const;
  // After write_records(): its error (the log refusing appends if unrecoverable), or `seg`
  // grows by what was written and notes the batch in its info and index.
  Status note_written_locked(ActiveSegment& seg, std::span<const PendingEntry> batch,
                             std::uint64_t batch_start, const BatchWrite& written);
  // Before a batch is written: its marked entries go into the marks file.
  Status note_marks_locked(std::span<const PendingEntry> batch);
  // After a batch was appended: the log's newest LSNs, its checkpoint, its counters.
  void note_batch_locked(std::span<const PendingEntry> batch);
  // A new segment file `seq` holding only its header (durable if `sync`), allocated to
  // segment_size when `preallocate` (see preallocate_file()).
  Result<std::unique_ptr<ActiveSegment>> create_segment(std::uint64_t seq, bool sync = true,
                                                        bool preallocate = true) const;
  // Gives back a preallocated segment's space past its data before the manifest seals it:
  // readers of sealed segments take the file's size as their end.
  Status trim_preallocation(ActiveSegment& seg) const;
  // Whether the entry's data is a spill file the log can link in as a segment of its own.
  bool linkable(const PendingEntry& entry) const;
  // Writes the segment header and FIRST record into the entry's spill file, makes it durable
  // and links it into the directory as segment `seg.seq`, filling in `seg`. False when the
  // file cannot be linked here (another file system, no /proc): the entry is then copied.
  Result<bool> link_segment(const PendingEntry& entry, ActiveSegment& seg) const;
  // append() for a batch with linkable entries: each becomes a segment of its own, the other
  // entries go into new segments between them, and one manifest switch makes it all durable.
  Status append_linking_locked(std::span<const PendingEntry> batch);
  Status validate_batch_locked(std::span<const PendingEntry> batch) const;
  Status wait_synced(Position target, std::unique_lock<std::mutex>& lock);
  // Runs one fdatasync of what is written. True when it showed readers entries whose appender
  // did not wait for it (ReturnWhen::kWritten): the caller then calls the visible listeners.
  bool sync_once_locked(std::unique_lock<std::mutex>& lock);
  // Readers see up to `pos`, which ends with the entry ending at `through`.
  void publish_locked(Position pos, Lsn through);
  // An fdatasync covered every entry up to the one ending at `end`.
  void note_durable_locked(Lsn end);
  void notify_listeners();
  void sync_loop();
  std::vector<IndexPoint> load_index(std::uint64_t seq) const;
  // The first retained segment that `reaches` (its last entry is at or past the target), and
  // in it the last index point `before` the target.
  Position seek_first(const std::function<bool(const SegmentInfo&)>& reaches,
                      const std::function<bool(const IndexPoint&)>& before) const;
  Result<Position> seek(Lsn start) const;
  Result<Position> seek_time(std::int64_t time) const;

  LogOptions options_;
  std::uint64_t system_id_ = 0;
  FileHandle dir_lock_;

  // Appenders take append_mu_, then mu_. append_mu_ makes them one at a time from validation
  // to the end of the write, which they do without mu_ (see append_locked); mu_ guards the
  // state readers and the sync thread share, and is only ever held briefly, bar segment rolls.
  std::mutex append_mu_;
  mutable std::mutex mu_;
  mutable std::condition_variable visible_cv_;
  std::condition_variable sync_cv_;    // wakes the sync thread
  std::condition_variable synced_cv_;  // wakes appenders waiting for durability
  Manifest manifest_;
  std::optional<MarkFile> marks_;  // opened with the log
  std::unique_ptr<ActiveSegment> active_;
  Position written_;
  Position synced_;
  Position visible_;
  bool sync_in_progress_ = false;  // an fdatasync runs, on the sync thread or an appender's
  bool sync_requested_ = false;  // an appender waits for the sync thread (interval policy)
  // The sync thread waits for unsynced data. Only then does append_visible() wake it: while it
  // lets append_visible() data gather, a wake-up per batch would only cost a context switch.
  bool sync_idle_ = false;
  // Entries of an appender that did not wait (ReturnWhen::kWritten) are written and not yet
  // shown: the fdatasync that shows them also calls the visible listeners.
  bool unannounced_ = false;
  // Group commit: appenders inside append() (counted before they take the mutex) and the
  // targets of those waiting for an fdatasync. The sync thread briefly waits until every
  // appender in flight waits for data not yet synced, so that one fdatasync covers them all
  // instead of groups alternating in size.
  std::atomic<int> active_appenders_{0};
  // Set while the sync thread waits for those appenders: only then does one leaving append()
  // wake it (otherwise each batch would cost the sync thread a context switch for nothing).
  std::atomic<bool> awaiting_group_{false};
  std::vector<Position> sync_waiters_;  // targets of appenders waiting for an fdatasync
  std::chrono::microseconds last_sync_duration_{0};
  std::optional<Error> failed_;  // set after an fsync failure: the log refuses further appends
  Lsn last_commit_lsn_;
  Lsn last_end_lsn_;
  Lsn durable_end_lsn_;  // last_end_lsn_ as of the last fdatasync
  Lsn read_through_;     // note_read_through()
  std::optional<Bytes> last_checkpoint_;
  // Replaced whole by on_visible(), so that appenders take a reference, not a copy.
  std::shared_ptr<const std::vector<std::function<void()>>> listeners_;
  LogStats counters_;
  std::uint64_t recovered_truncated_bytes_ = 0;
  std::string torn_tail_reason_;

  bool stopping_ = false;
  std::thread sync_thread_;
};

// Reads entries in log order from a start position. Not thread-safe; one per reader.
class Cursor {
 public:
  // The next entry with commit LSN >= the start point, skipping checkpoints and the unread
  // rest of the current entry; nullopt when the reader has caught up with what is visible.
  Result<std::optional<EntryMeta>> next_entry();
  // The next piece of the current entry's data; nullopt when the entry has no more data.
  Result<std::optional<ByteView>> next_data();
  // The whole remaining data of the current entry.
  Result<Bytes> read_data();
  // Blocks until more entries may be visible or the timeout passes; true if something new.
  bool wait(std::chrono::milliseconds timeout);
  // Position after the last entry returned (where a later cursor would resume).
  Position position() const { return pos_; }

 private:
  friend class ChangeLog;
  Cursor(const ChangeLog* log, Lsn start, Position pos);
  Status open_segment(std::uint64_t seq, std::uint64_t offset);
  Error corruption(const std::string& why) const;

  const ChangeLog* log_;
  Lsn start_;
  Position pos_;  // start of the next unread record
  FileHandle file_;
  std::unique_ptr<RecordReader> reader_;
  bool in_entry_ = false;  // data of the current entry not yet fully read
  ByteView pending_data_;  // data carried by the record that started the entry
  bool pending_valid_ = false;
  bool entry_whole_ = false;
  std::int64_t min_time_ = std::numeric_limits<std::int64_t>::min();
};

}  // namespace pgrelay::log
