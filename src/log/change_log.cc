// The durable change log: batched appends with group commit, crash recovery, retention.
#include "log/change_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "base/thread_name.h"
#include "log/crc32c.h"
#include "log/record_reader.h"

namespace pgrelay::log {

namespace {

constexpr std::size_t kWriteBufferFlush = 1u << 20;
constexpr const char* kLockName = "LOCK";

std::uint64_t make_system_id() {
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  return (static_cast<std::uint64_t>(tv.tv_sec) << 32) |
         (static_cast<std::uint64_t>(tv.tv_usec) << 12) |
         (static_cast<std::uint64_t>(::getpid()) & 0xFFF);
}

// Parses "XXXXXXXXXXXXXXXX.seg" into its sequence number.
std::optional<std::uint64_t> parse_segment_name(const std::string& name) {
  if (name.size() != 20 || name.substr(16) != ".seg") return std::nullopt;
  std::uint64_t seq = 0;
  for (std::size_t i = 0; i < 16; ++i) {
    char c = name[i];
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) return std::nullopt;
    seq = (seq << 4) | static_cast<std::uint64_t>(d);
  }
  return seq;
}

std::vector<std::uint64_t> list_segment_files(const std::string& dir) {
  std::vector<std::uint64_t> seqs;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return seqs;
  while (struct dirent* e = ::readdir(d)) {
    if (auto seq = parse_segment_name(e->d_name)) seqs.push_back(*seq);
  }
  ::closedir(d);
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

Bytes serialize_index(const std::vector<IndexPoint>& points) {
  ByteWriter w;
  w.u32(static_cast<std::uint32_t>(points.size()));
  for (const auto& p : points) {
    w.u64(p.lsn.value());
    w.i64(p.time);
    w.u64(p.offset);
  }
  w.u32(crc32c(w.bytes()));
  return std::move(w).take();
}

std::optional<std::vector<IndexPoint>> parse_index(ByteView data) {
  if (data.size() < 8) return std::nullopt;
  ByteReader crc_reader(data.subspan(data.size() - 4));
  if (crc32c(data.subspan(0, data.size() - 4)) != crc_reader.u32()) return std::nullopt;
  ByteReader r(data.subspan(0, data.size() - 4));
  std::uint32_t n = r.u32();
  if (r.remaining() != static_cast<std::size_t>(n) * 24) return std::nullopt;
  std::vector<IndexPoint> points(n);
  for (auto& p : points) {
    p.lsn = Lsn(r.u64());
    p.time = r.i64();
    p.offset = r.u64();
  }
  return points;
}

// Notes a transaction or message entry of the batch at `batch_start` in its segment's info and
// sparse index: a batch's first such entry gets an index point once `interval` bytes passed.
void note_in_segment(const EntryMeta& meta, std::uint64_t batch_start, std::uint64_t interval,
                     bool first_of_batch, SegmentInfo& info, std::vector<IndexPoint>& index) {
  if (first_of_batch && (index.empty() || batch_start - index.back().offset >= interval)) {
    index.push_back(IndexPoint{meta.commit_lsn, meta.commit_time, batch_start});
  }
  if (!info.first_lsn.is_valid()) {
    info.first_lsn = meta.commit_lsn;
    info.first_time = meta.commit_time;
  }
  info.last_lsn = meta.commit_lsn;
  info.last_time = meta.commit_time;
}

// What one segment holds, learned by scanning it.
struct SegmentScan {
  std::uint64_t valid_end = kSegmentHeaderSize;  // end of the last whole batch
  SegmentInfo info;
  std::vector<IndexPoint> index;
  std::optional<Bytes> last_checkpoint;
  Lsn last_end;             // highest end LSN of the kept entries
  std::string stop_reason;  // why scanning stopped before the file's end, if it did
};

// Scans a segment's records from the header on, keeping only whole batches.
Result<SegmentScan> scan_segment(int fd, const std::string& path, std::uint64_t size,
                                 std::uint64_t index_interval, std::size_t buffer_size) {
  SegmentScan scan;
  RecordReader reader(fd, path, kSegmentHeaderSize, size, buffer_size);
  struct Pending {
    EntryMeta meta;
    Bytes checkpoint;
  };
  std::vector<Pending> batch;
  bool in_entry = false;
  std::uint64_t batch_start = kSegmentHeaderSize;
  while (true) {
    ParsedRecord rec;
    std::string why;
    Error io;
    RecordStatus status = reader.next(&rec, &why, &io);
    if (status != RecordStatus::kOk) {
      if (!io.message.empty()) return io;
      if (!reader.at_limit())
        scan.stop_reason = why + " at offset " + std::to_string(reader.offset());
      break;
    }
    ByteReader payload(rec.payload);
    bool starts = rec.header.type == RecordType::kFull || rec.header.type == RecordType::kFirst;
    bool ends = rec.header.type == RecordType::kFull || rec.header.type == RecordType::kLast;
    if (starts == in_entry) {
      scan.stop_reason =
          "record out of sequence at offset " + std::to_string(reader.offset() - rec.total_size);
      break;
    }
    if (starts) {
      auto meta = decode_entry_meta(payload);
      if (!meta.ok()) {
        scan.stop_reason = meta.error().message;
        break;
      }
      batch.push_back(Pending{*meta, {}});
    }
    if (batch.back().meta.kind == EntryKind::kCheckpoint) {
      ByteView data = payload.rest();
      batch.back().checkpoint.insert(batch.back().checkpoint.end(), data.begin(), data.end());
    }
    in_entry = !ends;
    if ((rec.header.flags & kEndOfBatch) != 0) {
      if (in_entry) {
        scan.stop_reason = "batch ends inside an entry";
        break;
      }
      bool indexed = false;
      for (auto& p : batch) {
        if (p.meta.kind == EntryKind::kCheckpoint) {
          scan.last_checkpoint = std::move(p.checkpoint);
          scan.last_end = std::max(scan.last_end, p.meta.end_lsn);
          continue;
        }
        note_in_segment(p.meta, batch_start, index_interval, !indexed, scan.info, scan.index);
        indexed = true;
        scan.last_end = std::max({scan.last_end, p.meta.end_lsn, p.meta.commit_lsn});
      }
      batch.clear();
      scan.valid_end = reader.offset();
      batch_start = reader.offset();
    }
  }
  scan.info.bytes = scan.valid_end;
  return scan;
}

}  // namespace

struct ChangeLog::ActiveSegment {
  std::uint64_t seq = 0;
  std::string path;
  FileHandle file;
  std::uint64_t size = 0;  // where its data ends
  // The file is allocated past its data (zeros there), up to segment_size.
  bool preallocated = false;
  SegmentInfo info;
  std::vector<IndexPoint> index;
};

ChangeLog::ChangeLog(LogOptions options) : options_(std::move(options)) {}

ChangeLog::~ChangeLog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  sync_cv_.notify_all();
  synced_cv_.notify_all();
  visible_cv_.notify_all();
  if (sync_thread_.joinable()) sync_thread_.join();
  if (active_ && options_.sync != SyncPolicy::kNone && !failed_) {
    (void)sync_file(active_->file.get(), active_->path);
  }
}

std::string ChangeLog::segment_path(std::uint64_t seq) const {
  return options_.dir + "/" + segment_file_name(seq);
}

Result<std::unique_ptr<ChangeLog>> ChangeLog::open(LogOptions options) {
  if (options.dir.empty()) {
    return Error::make(sqlstate::kInvalidParameterValue, "no log directory given",
                       "Pass --data-dir DIR.");
  }
  if (options.segment_size < 4096) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "log segment size " + std::to_string(options.segment_size) + " is too small",
                       "Use at least 4096 bytes; the default is 64 MiB.");
  }
  std::unique_ptr<ChangeLog> log(new ChangeLog(std::move(options)));
  auto open_marks = [](ChangeLog& opened) -> Status {
    const LogOptions& o = opened.options_;
    auto marks = MarkFile::open(o.dir, opened.last_end_lsn_, opened.manifest_.removed_through,
                                o.read_only, !o.read_only && o.sync != SyncPolicy::kNone);
    if (!marks.ok()) return marks.error();
    opened.marks_ = std::move(*marks);
    return {};
  };
  if (log->options_.read_only) {
    if (!path_exists(log->options_.dir + "/" + kManifestName)) {
      return Error::make(sqlstate::kUndefinedObject,
                         "there is no pgrelay change log in \"" + log->options_.dir + "\"",
                         "Check the --data-dir option: it names the directory pgrelay serve uses.");
    }
    PGRELAY_TRY(log->recover());
    PGRELAY_TRY(open_marks(*log));
    return log;
  }
  PGRELAY_TRY(ensure_directory(log->options_.dir));
  std::string lock_path = log->options_.dir + "/" + kLockName;
  auto lock_file = open_file(lock_path, O_RDWR | O_CREAT, 0600);
  if (!lock_file.ok()) return lock_file.take_error();
  if (::flock(lock_file->get(), LOCK_EX | LOCK_NB) != 0) {
    return Error::make(
        sqlstate::kObjectInUse,
        "log directory \"" + log->options_.dir + "\" is in use by another process",
        "Stop the other pgrelay using this directory, or choose another --data-dir.");
  }
  log->dir_lock_ = std::move(*lock_file);
  if (path_exists(log->options_.dir + "/" + kManifestName)) {
    PGRELAY_TRY(log->recover());
  } else {
    PGRELAY_TRY(log->create_fresh());
  }
  PGRELAY_TRY(open_marks(*log));
  if (log->options_.sync != SyncPolicy::kNone) {
    log->sync_thread_ = start_named_thread("log-sync", [raw = log.get()] { raw->sync_loop(); });
  }
  return log;
}

Status ChangeLog::create_fresh() {
  auto existing = list_segment_files(options_.dir);
  if (!existing.empty()) {
    return Error::make(
        sqlstate::kDataCorrupted,
        "log directory \"" + options_.dir + "\" has segment files but no " + kManifestName,
        "The manifest was deleted. Restore the data directory from a backup, or "
        "remove the *.seg files to start an empty log.");
  }
  manifest_.system_id = make_system_id();
  manifest_.next_seq = 1;
  system_id_ = manifest_.system_id;
  auto first = create_segment(manifest_.next_seq++);
  if (!first.ok()) return first.error();
  active_ = std::move(*first);
  manifest_.segments.push_back(active_->info);
  PGRELAY_TRY(write_manifest_locked());
  written_ = synced_ = visible_ = Position{active_->seq, kSegmentHeaderSize};
  return {};
}

Status ChangeLog::write_manifest_locked() {
  if (!manifest_.segments.empty() && active_) manifest_.segments.back() = active_->info;
  Bytes data = serialize_manifest(manifest_);
  return write_file_atomically(options_.dir, kManifestName, data);
}

Status ChangeLog::recover() {
  std::string manifest_path = options_.dir + "/" + kManifestName;
  auto data = read_whole_file(manifest_path);
  if (!data.ok()) return data.error();
  auto manifest = parse_manifest(*data, manifest_path);
  if (!manifest.ok()) return manifest.error();
  manifest_ = std::move(*manifest);
  system_id_ = manifest_.system_id;
  if (manifest_.segments.empty()) {
    return Error::make(sqlstate::kDataCorrupted,
                       "log manifest \"" + manifest_path + "\" lists no segments",
                       "Restore the data directory from a backup.");
  }
  // Files outside the manifest's range are leftovers of a roll or removal cut short by a crash.
  std::uint64_t first_seq = manifest_.segments.front().seq;
  for (std::uint64_t seq : list_segment_files(options_.dir)) {
    if (options_.read_only) break;
    if (seq >= manifest_.next_seq || seq < first_seq) {
      ::unlink(segment_path(seq).c_str());
      ::unlink((options_.dir + "/" + index_file_name(seq)).c_str());
    }
  }
  for (const auto& s : manifest_.segments) {
    if (!path_exists(segment_path(s.seq))) {
      return Error::make(sqlstate::kDataCorrupted,
                         "log segment \"" + segment_path(s.seq) + "\" is missing",
                         "The file was deleted behind pgrelay's back. Restore the data directory "
                         "from a backup.");
    }
  }
  PGRELAY_TRY(scan_active_segment());
  return {};
}

Status ChangeLog::scan_active_segment() {
  active_ = std::make_unique<ActiveSegment>();
  active_->seq = manifest_.segments.back().seq;
  active_->path = segment_path(active_->seq);
  auto file = open_file(active_->path, options_.read_only ? O_RDONLY : O_RDWR);
  if (!file.ok()) return file.error();
  active_->file = std::move(*file);
  auto size = file_size(active_->file.get(), active_->path);
  if (!size.ok()) return size.error();
  Bytes header(kSegmentHeaderSize);
  if (*size < kSegmentHeaderSize) {
    // A crash while creating the segment cannot leave this (the header is synced before the
    // manifest names the file), so the file was damaged.
    return Error::make(sqlstate::kDataCorrupted,
                       "log segment \"" + active_->path + "\" is shorter than its header",
                       "Restore the data directory from a backup.");
  }
  PGRELAY_TRY(pread_all(active_->file.get(), 0, header.data(), header.size(), active_->path));
  auto seq = decode_segment_header(header, active_->path);
  if (!seq.ok()) return seq.error();
  auto scan = scan_segment(active_->file.get(), active_->path, *size, options_.index_interval,
                           options_.read_buffer);
  if (!scan.ok()) return scan.error();
  // Past the whole batches: zeros where the segment was preallocated, and possibly the torn
  // tail of the batch being written when the process died (nothing in it was acknowledged,
  // because acknowledgement follows the write of the whole batch).
  std::uint64_t written_end = scan->valid_end;
  if (scan->valid_end < *size) {
    auto end = end_of_nonzero(active_->file.get(), scan->valid_end, *size, active_->path);
    if (!end.ok()) return end.error();
    written_end = *end;
  }
  if (written_end > scan->valid_end) {
    recovered_truncated_bytes_ = written_end - scan->valid_end;
    torn_tail_reason_ = scan->stop_reason;
  }
  active_->preallocated = *size > scan->valid_end && written_end == scan->valid_end;
  bool changed = false;  // the file must be synced before anything is appended after it
  if (written_end > scan->valid_end && !options_.read_only) {
    // Truncated rather than zeroed in place: no piece of the torn batch stays in the file.
    if (::ftruncate(active_->file.get(), static_cast<off_t>(scan->valid_end)) != 0) {
      return io_error("truncate torn tail of", active_->path, errno);
    }
    changed = true;
  }
  if (!active_->preallocated && !options_.read_only) {
    active_->preallocated =
        preallocate_file(active_->file.get(), scan->valid_end, options_.segment_size);
    changed = changed || active_->preallocated;
  }
  // One sync for both: a crash before it leaves at worst the torn tail, found again next time.
  // Without a change it still runs unless the policy never syncs: what the last process wrote
  // and had not synced yet when it was killed is in the page cache only, and this log says all
  // it holds is durable (its capture then releases the upstream's copy).
  const bool syncing = options_.sync != SyncPolicy::kNone && !options_.read_only;
  if (changed || syncing) {
    PGRELAY_TRY(sync_file(active_->file.get(), active_->path));
    ++counters_.fsyncs;
  }
  active_->size = scan->valid_end;
  active_->info = scan->info;
  active_->info.seq = active_->seq;
  active_->info.sealed = false;
  active_->index = std::move(scan->index);
  if (::lseek(active_->file.get(), static_cast<off_t>(active_->size), SEEK_SET) < 0) {
    return io_error("seek in", active_->path, errno);
  }
  last_checkpoint_ = std::move(scan->last_checkpoint);
  // The newest commit LSN is in the active segment, else in the newest non-empty sealed one.
  last_commit_lsn_ = active_->info.last_lsn;
  for (auto it = manifest_.segments.rbegin();
       !last_commit_lsn_.is_valid() && it != manifest_.segments.rend(); ++it) {
    last_commit_lsn_ = it->last_lsn;
  }
  if (!last_commit_lsn_.is_valid()) last_commit_lsn_ = manifest_.removed_through;
  // Without entries in the active segment, the end of the newest entry is unknown here; the
  // commit LSN is a safe lower bound (assigned LSNs then still never repeat a commit LSN).
  last_end_lsn_ = std::max(scan->last_end, last_commit_lsn_);
  durable_end_lsn_ = last_end_lsn_;
  written_ = synced_ = visible_ = Position{active_->seq, active_->size};
  return {};
}

Status ChangeLog::validate_batch_locked(std::span<const PendingEntry> batch) const {
  Lsn last = last_commit_lsn_;
  for (const auto& e : batch) {
    if (e.meta.kind == EntryKind::kCheckpoint) continue;
    if (e.meta.commit_lsn <= last) {
      return Error::make(sqlstate::kInternalError, "log append out of order: commit LSN " +
                                                       e.meta.commit_lsn.to_string() +
                                                       " is not after " + last.to_string());
    }
    if (e.meta.end_lsn.is_valid() && e.meta.end_lsn < e.meta.commit_lsn) {
      return Error::make(sqlstate::kInternalError, "log entry end LSN precedes its commit LSN");
    }
    if (e.meta.origin.size() > 0xFFFF) {
      return Error::make(sqlstate::kInternalError, "log entry origin name is too long");
    }
    last = e.meta.commit_lsn;
  }
  return {};
}

Result<std::unique_ptr<ChangeLog::ActiveSegment>> ChangeLog::create_segment(
    std::uint64_t seq, bool sync, bool preallocate) const {
  auto seg = std::make_unique<ActiveSegment>();
  seg->seq = seq;
  seg->path = segment_path(seq);
  // A file of this number can only be a leftover of an append that a crash or an error cut
  // short before the manifest named it.
  auto file = open_file(seg->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (!file.ok()) return file.take_error();
  seg->file = std::move(*file);
  ByteWriter header;
  encode_segment_header(seq, header);
  PGRELAY_TRY(write_all(seg->file.get(), header.bytes(), seg->path));
  seg->preallocated =
      preallocate && preallocate_file(seg->file.get(), kSegmentHeaderSize, options_.segment_size);
  if (sync) PGRELAY_TRY(sync_file(seg->file.get(), seg->path));
  seg->size = kSegmentHeaderSize;
  seg->info.seq = seq;
  seg->info.bytes = kSegmentHeaderSize;
  return seg;
}

Status ChangeLog::trim_preallocation(ActiveSegment& seg) const {
  if (!seg.preallocated) return {};
  if (::ftruncate(seg.file.get(), static_cast<off_t>(seg.size)) != 0) {
    return io_error("give back the preallocated space of", seg.path, errno);
  }
  seg.preallocated = false;
  return {};
}

Status ChangeLog::roll_segment() {
  // Its size becomes durable with the fdatasync below, before the manifest seals it.
  PGRELAY_TRY(trim_preallocation(*active_));
  if (options_.sync != SyncPolicy::kNone) {
    PGRELAY_TRY(sync_file(active_->file.get(), active_->path));
    ++counters_.fsyncs;
  }
  mark_synced_locked();
  publish_locked(written_, last_end_lsn_);
  std::uint64_t old_seq = active_->seq;
  active_->info.sealed = true;
  active_->info.bytes = active_->size;
  std::vector<IndexPoint> old_index = std::move(active_->index);

  auto next = create_segment(manifest_.next_seq);
  if (!next.ok()) return next.error();
  PGRELAY_TRY(sync_directory(options_.dir));

  // The manifest switch makes the roll official; before it, recovery deletes the new file.
  Manifest updated = manifest_;
  updated.segments.back() = active_->info;
  updated.segments.push_back((*next)->info);
  updated.next_seq = (*next)->seq + 1;
  PGRELAY_TRY(write_file_atomically(options_.dir, kManifestName, serialize_manifest(updated)));
  manifest_ = std::move(updated);
  active_ = std::move(*next);
  written_ = synced_ = Position{active_->seq, kSegmentHeaderSize};
  publish_locked(written_, last_end_lsn_);
  // The index speeds up seeks; a missing index file is rebuilt by scanning.
  (void)write_file_atomically(options_.dir, index_file_name(old_seq), serialize_index(old_index));

  // Recovery scans only the active segment, so it must hold the latest checkpoint.
  if (last_checkpoint_) {
    Bytes checkpoint = *last_checkpoint_;
    EntryMeta meta;
    meta.kind = EntryKind::kCheckpoint;
    meta.commit_lsn = last_commit_lsn_;
    meta.end_lsn = last_end_lsn_;  // lets recovery of this segment know the end of the log
    PendingEntry entry{meta, checkpoint};
    PGRELAY_TRY(write_batch_locked(*active_, std::span<const PendingEntry>(&entry, 1)));
    written_ = Position{active_->seq, active_->size};
    if (options_.sync != SyncPolicy::kNone) {
      PGRELAY_TRY(sync_file(active_->file.get(), active_->path));
      ++counters_.fsyncs;
    }
    mark_synced_locked();
    publish_locked(written_, last_end_lsn_);
  }
  return {};
}

Status ChangeLog::write_batch_locked(ActiveSegment& seg, std::span<const PendingEntry> batch) {
  const std::uint64_t start = seg.size;
  return note_written_locked(seg, batch, start, write_records(seg, batch));
}

ChangeLog::BatchWrite ChangeLog::write_records(const ActiveSegment& seg,
                                               std::span<const PendingEntry> batch) const {
  const std::uint64_t batch_start = seg.size;
  BatchWrite result;
  ByteWriter buf;
  auto flush = [&]() -> Status {
    Status st = write_all(seg.file.get(), buf.bytes(), seg.path);
    result.bytes += buf.size();
    buf = ByteWriter();
    return st;
  };
  Bytes piece;  // staging for data read from a DataSource
  // Bytes [offset, offset + n) of an entry's data, from memory or from its source.
  auto data_range = [&](const PendingEntry& e, std::uint64_t offset,
                        std::size_t n) -> Result<ByteView> {
    if (e.source == nullptr) return e.data.subspan(offset, n);
    piece.resize(n);
    Status st = e.source->read(offset, piece);
    if (!st.ok()) return st.error();
    return ByteView(piece);
  };
  Status status;
  for (std::size_t i = 0; i < batch.size() && status.ok(); ++i) {
    const PendingEntry& e = batch[i];
    const std::uint64_t size = e.data_size();
    bool last_entry = i + 1 == batch.size();
    ByteWriter first;
    encode_entry_meta(e.meta, first);
    std::size_t take =
        static_cast<std::size_t>(std::min<std::uint64_t>(kMaxRecordPayload - first.size(), size));
    auto head = data_range(e, 0, take);
    if (!head.ok()) {
      status = head.error();
      break;
    }
    first.raw(*head);
    std::uint64_t done = take;
    bool whole = done == size;
    append_record(whole ? RecordType::kFull : RecordType::kFirst,
                  whole && last_entry ? kEndOfBatch : 0, first.bytes(), buf);
    while (done < size) {
      std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(kMaxRecordPayload, size - done));
      bool last_piece = done + n == size;
      auto part = data_range(e, done, n);
      if (!part.ok()) {
        status = part.error();
        break;
      }
      append_record(last_piece ? RecordType::kLast : RecordType::kMiddle,
                    last_piece && last_entry ? kEndOfBatch : 0, *part, buf);
      done += n;
      if (buf.size() >= kWriteBufferFlush) {
        status = flush();
        if (!status.ok()) break;
      }
    }
    if (status.ok() && buf.size() >= kWriteBufferFlush) status = flush();
  }
  if (status.ok() && buf.size() > 0) status = flush();
  if (!status.ok()) {
    // Take back whatever part of the batch reached the file, so that the log stays appendable
    // (for example once disk space is freed) and never holds a half batch.
    if (::ftruncate(seg.file.get(), static_cast<off_t>(batch_start)) != 0 ||
        ::lseek(seg.file.get(), static_cast<off_t>(batch_start), SEEK_SET) < 0) {
      result.unrecoverable = io_error("truncate a failed write of", seg.path, errno);
    }
    result.status = status;
    result.bytes = 0;
  }
  return result;
}

Status ChangeLog::note_written_locked(ActiveSegment& seg, std::span<const PendingEntry> batch,
                                      std::uint64_t batch_start, const BatchWrite& written) {
  if (written.unrecoverable) failed_ = *written.unrecoverable;
  // A failed write truncated the file back to the batch's start, preallocation included.
  if (!written.status.ok()) seg.preallocated = false;
  PGRELAY_TRY(written.status);
  const std::uint64_t bytes = written.bytes;
  seg.size = batch_start + bytes;
  bool indexed = false;
  for (const auto& e : batch) {
    if (e.meta.kind == EntryKind::kCheckpoint) continue;
    note_in_segment(e.meta, batch_start, options_.index_interval, !indexed, seg.info, seg.index);
    indexed = true;
  }
  seg.info.bytes = seg.size;
  counters_.bytes_appended += bytes;
  return {};
}

Status ChangeLog::note_marks_locked(std::span<const PendingEntry> batch) {
  std::vector<Lsn> marked;
  for (const auto& e : batch) {
    if (e.marked) marked.push_back(e.meta.commit_lsn);
  }
  return marks_->add(marked);
}

void ChangeLog::note_batch_locked(std::span<const PendingEntry> batch) {
  for (const auto& e : batch) {
    if (e.meta.kind == EntryKind::kCheckpoint) {
      if (e.source == nullptr) {
        last_checkpoint_ = Bytes(e.data.begin(), e.data.end());
      } else {
        Bytes data(e.source->size());
        if (e.source->read(0, data).ok()) last_checkpoint_ = std::move(data);
      }
      continue;
    }
    last_commit_lsn_ = e.meta.commit_lsn;
    last_end_lsn_ = std::max(e.meta.end_lsn, e.meta.commit_lsn);
    ++counters_.entries_appended;
  }
  ++counters_.batches_appended;
}

bool ChangeLog::linkable(const PendingEntry& entry) const {
  if (entry.source == nullptr || entry.meta.kind == EntryKind::kCheckpoint) return false;
  auto image = entry.source->segment_image();
  if (!image) return false;
  ByteWriter meta;
  encode_entry_meta(entry.meta, meta);
  // The room left for the metadata depends only on the origin name, known when the spill
  // started; a transaction whose origin came later is copied.
  return meta.size() == image->meta_size;
}

Result<bool> ChangeLog::link_segment(const PendingEntry& entry, ActiveSegment& seg) const {
  const SegmentImage image = *entry.source->segment_image();
  seg.path = segment_path(seg.seq);
  ByteWriter header;
  encode_segment_header(seg.seq, header);
  ByteWriter meta;
  encode_entry_meta(entry.meta, meta);
  const bool whole = image.data_size == 0;
  ByteWriter first;
  append_record(whole ? RecordType::kFull : RecordType::kFirst, whole ? kEndOfBatch : 0,
                meta.bytes(), first);
  PGRELAY_TRY(pwrite_all(image.fd, 0, header.bytes(), seg.path));
  PGRELAY_TRY(pwrite_all(image.fd, kSegmentHeaderSize, first.bytes(), seg.path));
  // Most of the file is on disk already: its writer started writeback as it went.
  if (options_.sync != SyncPolicy::kNone) PGRELAY_TRY(sync_file(image.fd, seg.path));
  // An unnamed temporary file gets its name through /proc (linkat with AT_EMPTY_PATH would
  // need CAP_DAC_READ_SEARCH).
  const std::string proc = "/proc/self/fd/" + std::to_string(image.fd);
  auto link = [&] {
    return ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, seg.path.c_str(), AT_SYMLINK_FOLLOW) == 0;
  };
  // A file of this number is a leftover of an append cut short before the manifest named it.
  bool linked = link() || (errno == EEXIST && ::unlink(seg.path.c_str()) == 0 && link());
  if (!linked) {
    if (errno == EXDEV || errno == ENOENT || errno == EPERM || errno == EACCES ||
        errno == ENOTSUP) {
      return false;
    }
    return io_error("link a spilled transaction into the log as", seg.path, errno);
  }
  seg.size = image.file_size;
  seg.info.seq = seg.seq;
  seg.info.sealed = true;
  seg.info.bytes = image.file_size;
  note_in_segment(entry.meta, kSegmentHeaderSize, options_.index_interval, true, seg.info,
                  seg.index);
  return true;
}

Status ChangeLog::append_linking_locked(std::span<const PendingEntry> batch) {
  const bool syncing = options_.sync != SyncPolicy::kNone;
  // The segments this batch makes, in order; the last one becomes the active segment. Until
  // the manifest names them, recovery deletes them (their numbers are >= its next_seq).
  std::vector<std::unique_ptr<ActiveSegment>> made;
  std::uint64_t next_seq = manifest_.next_seq;
  std::uint64_t fsyncs = 0;
  std::vector<PendingEntry> run;  // entries to copy, since the last linked one

  auto write_run = [&](bool last) -> Status {
    if (run.empty() && !last) return {};
    // The last of these becomes the active segment unallocated, and grows as it is written.
    auto seg = create_segment(next_seq++, /*sync=*/false, /*preallocate=*/false);
    if (!seg.ok()) return seg.error();
    made.push_back(std::move(*seg));
    if (!run.empty()) PGRELAY_TRY(write_batch_locked(*made.back(), run));
    if (syncing) {
      PGRELAY_TRY(sync_file(made.back()->file.get(), made.back()->path));
      ++fsyncs;
    }
    run.clear();
    return {};
  };

  Bytes carried;  // the latest checkpoint, when the new active segment would lack it
  Status status = [&]() -> Status {
    // The active segment is sealed by the manifest below, which then vouches for its bytes.
    PGRELAY_TRY(trim_preallocation(*active_));
    if (syncing) {
      PGRELAY_TRY(sync_file(active_->file.get(), active_->path));
      ++fsyncs;
    }
    Lsn last_commit = last_commit_lsn_;
    Lsn last_end = last_end_lsn_;
    for (const PendingEntry& e : batch) {
      if (e.meta.kind != EntryKind::kCheckpoint) {
        last_commit = e.meta.commit_lsn;
        last_end = std::max(e.meta.end_lsn, e.meta.commit_lsn);
      }
      if (linkable(e)) {
        PGRELAY_TRY(write_run(false));
        auto seg = std::make_unique<ActiveSegment>();
        seg->seq = next_seq;
        auto linked = link_segment(e, *seg);
        if (!linked.ok()) return linked.error();
        if (*linked) {
          ++next_seq;
          made.push_back(std::move(seg));
          continue;
        }
      }
      run.push_back(e);
    }
    // Recovery scans only the active segment, so it must hold the latest checkpoint (with the
    // end of the log as its end LSN).
    const bool run_has_checkpoint = std::any_of(run.begin(), run.end(), [](const PendingEntry& e) {
      return e.meta.kind == EntryKind::kCheckpoint;
    });
    if (!run_has_checkpoint) {
      std::optional<ByteView> checkpoint;
      if (last_checkpoint_) checkpoint = ByteView(*last_checkpoint_);
      const PendingEntry* in_batch = nullptr;
      for (const PendingEntry& e : batch) {
        if (e.meta.kind == EntryKind::kCheckpoint) in_batch = &e;
      }
      if (in_batch != nullptr) {
        carried.resize(in_batch->data_size());
        if (in_batch->source == nullptr) {
          std::copy(in_batch->data.begin(), in_batch->data.end(), carried.begin());
        } else {
          PGRELAY_TRY(in_batch->source->read(0, carried));
        }
        checkpoint = ByteView(carried);
      }
      if (checkpoint) {
        EntryMeta meta;
        meta.kind = EntryKind::kCheckpoint;
        meta.commit_lsn = last_commit;
        meta.end_lsn = last_end;
        run.push_back(PendingEntry{meta, *checkpoint, nullptr});
      }
    }
    PGRELAY_TRY(write_run(true));
    if (syncing) PGRELAY_TRY(sync_directory(options_.dir));
    return {};
  }();
  if (!status.ok()) {
    for (const auto& seg : made) {
      ::unlink(seg->path.c_str());
      ::unlink((options_.dir + "/" + index_file_name(seg->seq)).c_str());
    }
    return status;
  }

  Manifest updated = manifest_;
  active_->info.sealed = true;
  active_->info.bytes = active_->size;
  updated.segments.back() = active_->info;
  for (std::size_t i = 0; i < made.size(); ++i) {
    made[i]->info.sealed = i + 1 < made.size();
    made[i]->info.bytes = made[i]->size;
    updated.segments.push_back(made[i]->info);
  }
  updated.next_seq = next_seq;
  if (Status written =
          write_file_atomically(options_.dir, kManifestName, serialize_manifest(updated));
      !written.ok()) {
    // Whether the new manifest reached the disk is unknown: only recovery can tell.
    failed_ = written.error();
    return written;
  }
  // Sealed segments get their index, as a roll writes it (rebuilding the index of a linked
  // segment would scan the whole file).
  (void)write_file_atomically(options_.dir, index_file_name(active_->seq),
                              serialize_index(active_->index));
  for (std::size_t i = 0; i + 1 < made.size(); ++i) {
    (void)write_file_atomically(options_.dir, index_file_name(made[i]->seq),
                                serialize_index(made[i]->index));
  }
  manifest_ = std::move(updated);
  active_ = std::move(made.back());
  note_batch_locked(batch);
  counters_.fsyncs += fsyncs;
  written_ = Position{active_->seq, active_->size};
  mark_synced_locked();
  publish_locked(written_, last_end_lsn_);
  synced_cv_.notify_all();
  return {};
}

Error ChangeLog::read_only_error() const {
  return Error::make(sqlstate::kFeatureNotSupported,
                     "the change log in \"" + options_.dir + "\" was opened read-only");
}

// Counts an appender in flight for group commit, from before it takes the mutex to its return.
struct ChangeLog::AppenderGuard {
  explicit AppenderGuard(ChangeLog* l) : log(l) { ++log->active_appenders_; }
  ~AppenderGuard() {
    --log->active_appenders_;
    if (log->awaiting_group_.load()) log->sync_cv_.notify_one();
  }
  ChangeLog* log;
};

Status ChangeLog::append(std::span<const PendingEntry> batch) {
  if (batch.empty()) return {};
  if (options_.read_only) return read_only_error();
  AppenderGuard guard(this);
  std::unique_lock appending(append_mu_);
  std::unique_lock lock(mu_);
  PGRELAY_TRY(append_locked(batch, lock, appending));
  lock.unlock();
  notify_listeners();
  return {};
}

Result<Lsn> ChangeLog::append_assigning(std::span<PendingEntry> batch, Lsn floor, ReturnWhen when) {
  if (batch.empty()) return floor;
  if (options_.read_only) return read_only_error();
  AppenderGuard guard(this);
  std::unique_lock appending(append_mu_);
  std::unique_lock lock(mu_);
  Lsn base = std::max(floor, last_end_lsn_ + 1);
  for (auto& e : batch) {
    e.meta.begin_lsn = base + e.meta.begin_lsn.value();
    e.meta.commit_lsn = base + e.meta.commit_lsn.value();
    e.meta.end_lsn = base + e.meta.end_lsn.value();
  }
  const Position visible_before = visible_;
  PGRELAY_TRY(append_locked(
      batch, lock, appending,
      when == ReturnWhen::kWritten ? Publish::kWhenDurableNoWait : Publish::kWhenDurable));
  // Under ReturnWhen::kWritten the batch may not be shown yet: the fdatasync that shows it
  // calls the listeners then. (A roll of the segment, or linking spilled entries, shows it.)
  const bool shown = visible_before < visible_;
  lock.unlock();
  if (shown) notify_listeners();
  return base;
}

Status ChangeLog::append_visible(std::span<const PendingEntry> batch) {
  if (batch.empty()) return {};
  if (options_.read_only) return read_only_error();
  AppenderGuard guard(this);
  std::unique_lock appending(append_mu_);
  std::unique_lock lock(mu_);
  PGRELAY_TRY(append_locked(batch, lock, appending, Publish::kNowSyncLater));
  lock.unlock();
  notify_listeners();
  return {};
}

Lsn ChangeLog::durable_end_lsn() const {
  std::lock_guard lock(mu_);
  return options_.sync == SyncPolicy::kNone ? last_end_lsn_ : durable_end_lsn_;
}

bool ChangeLog::wait_durable(Lsn end, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (options_.sync == SyncPolicy::kNone) return true;
  auto done = [&] { return !(durable_end_lsn_ < end) || failed_.has_value() || stopping_; };
  if (done()) return !(durable_end_lsn_ < end);
  const bool per_commit = options_.sync == SyncPolicy::kFsyncPerCommit;
  const Position target = written_;  // holds the entry: it is visible, so written
  if (per_commit) {
    sync_waiters_.push_back(target);
    sync_cv_.notify_one();
  }
  synced_cv_.wait_until(lock, deadline, done);
  if (per_commit) {
    sync_waiters_.erase(std::find(sync_waiters_.begin(), sync_waiters_.end(), target));
  }
  return !(durable_end_lsn_ < end);
}

void ChangeLog::mark_synced_locked() {
  synced_ = written_;
  note_durable_locked(last_end_lsn_);
}

void ChangeLog::note_durable_locked(Lsn end) {
  durable_end_lsn_ = end;
  if (options_.hop_trace != nullptr && options_.sync != SyncPolicy::kNone) {
    options_.hop_trace->stamp(Hop::kDurable, end.value());
  }
}

Status ChangeLog::append_locked(std::span<const PendingEntry> batch,
                                std::unique_lock<std::mutex>& lock,
                                std::unique_lock<std::mutex>& appending, Publish publish) {
  if (failed_) return *failed_;
  PGRELAY_TRY(validate_batch_locked(batch));
  PGRELAY_TRY(note_marks_locked(batch));
  if (std::any_of(batch.begin(), batch.end(), [&](const PendingEntry& e) { return linkable(e); })) {
    return append_linking_locked(batch);
  }
  std::uint64_t estimate = 0;
  for (const auto& e : batch) estimate += e.data_size() + 64 + e.meta.origin.size();
  if (active_->size > kSegmentHeaderSize && active_->size + estimate > options_.segment_size) {
    Status rolled = roll_segment();
    if (!rolled.ok()) {
      failed_ = rolled.error();
      return rolled;
    }
  }
  // The write runs without mu_: readers (a walsender's event loop) and the sync thread go on
  // meanwhile instead of waiting for it, or for a whole time slice when the writer is
  // preempted. append_mu_, held throughout, keeps active_ and the file's end this appender's.
  ActiveSegment& seg = *active_;
  const std::uint64_t start = seg.size;
  lock.unlock();
  BatchWrite written = write_records(seg, batch);
  lock.lock();
  PGRELAY_TRY(note_written_locked(seg, batch, start, written));
  note_batch_locked(batch);
  written_ = Position{active_->seq, active_->size};
  Position mine = written_;
  // Waiting for durability is not appending: later appenders write meanwhile and share the
  // fdatasync.
  appending.unlock();
  switch (options_.sync) {
    case SyncPolicy::kNone:
      publish_locked(mine, last_end_lsn_);
      break;
    case SyncPolicy::kInterval:
      publish_locked(mine, last_end_lsn_);
      if (written_.seq == synced_.seq && written_.offset - synced_.offset >= options_.sync_bytes) {
        sync_requested_ = true;
        sync_cv_.notify_one();
        PGRELAY_TRY(wait_synced(mine, lock));
      }
      break;
    case SyncPolicy::kFsyncPerCommit:
      if (publish == Publish::kNowSyncLater) {
        publish_locked(mine, last_end_lsn_);
        if (sync_idle_) sync_cv_.notify_one();
        break;
      }
      if (publish == Publish::kWhenDurableNoWait) {
        // Readers wait for it: the sync thread syncs at once (see sync_loop), and calls the
        // listeners.
        unannounced_ = true;
        sync_cv_.notify_one();
        break;
      }
      if (sync_idle_ && !sync_in_progress_ && active_appenders_.load() <= 1) {
        // Alone: nobody to share an fdatasync with, and the sync thread would only be woken to
        // run it and wake this thread back (trigger capture's every poll).
        sync_once_locked(lock);
        if (failed_) return *failed_;
        if (!(synced_ < mine)) break;
      }
      sync_cv_.notify_one();
      PGRELAY_TRY(wait_synced(mine, lock));
      break;
  }
  return {};
}

Status ChangeLog::wait_synced(Position target, std::unique_lock<std::mutex>& lock) {
  sync_waiters_.push_back(target);
  sync_cv_.notify_one();
  synced_cv_.wait(lock, [&] { return !(synced_ < target) || failed_.has_value() || stopping_; });
  sync_waiters_.erase(std::find(sync_waiters_.begin(), sync_waiters_.end(), target));
  if (failed_) return *failed_;
  if (synced_ < target) return Error::make(sqlstate::kInternalError, "the log is shutting down");
  return {};
}

bool ChangeLog::sync_once_locked(std::unique_lock<std::mutex>& lock) {
  sync_in_progress_ = true;
  Position goal = written_;
  const Lsn goal_end = last_end_lsn_;  // written_ and last_end_lsn_ move together, under mu_
  int fd = ::dup(active_->file.get());
  std::string path = active_->path;
  lock.unlock();
  auto started = std::chrono::steady_clock::now();
  Status st = fd >= 0 ? sync_file(fd, path) : io_error("duplicate descriptor of", path, errno);
  auto took = std::chrono::steady_clock::now() - started;
  if (fd >= 0) ::close(fd);
  lock.lock();
  last_sync_duration_ = std::chrono::duration_cast<std::chrono::microseconds>(took);
  sync_in_progress_ = false;
  ++counters_.fsyncs;
  if (!st.ok()) {
    // After a failed fsync the kernel may have dropped dirty pages; what reached the disk is
    // unknown, so the only safe continuation is recovery from the file on restart.
    Error err = st.error();
    err.hint = "Restart pgrelay to recover the log from its last durable state. " + err.hint;
    failed_ = err;
  }
  bool shown = false;  // entries became visible
  if (st.ok() && synced_ < goal) {
    synced_ = goal;
    note_durable_locked(goal_end);
    shown = options_.sync == SyncPolicy::kFsyncPerCommit && visible_ < goal;
    if (shown) publish_locked(goal, goal_end);
  }
  synced_cv_.notify_all();
  // Written meanwhile: the sync thread, which does not start an fdatasync while another runs,
  // takes it from here.
  if (synced_ < written_ && !failed_) sync_cv_.notify_one();
  const bool announce = unannounced_ && shown;
  if (!(visible_ < written_)) unannounced_ = false;
  return announce;
}

// The sync thread. Under kFsyncPerCommit it syncs whenever anything is unsynced: while one
// fdatasync runs, appenders keep writing, and the next fdatasync covers them all. Under
// kInterval it syncs every sync_interval, or at once when an appender passed sync_bytes.
void ChangeLog::sync_loop() {
  std::unique_lock lock(mu_);
  const bool per_commit = options_.sync == SyncPolicy::kFsyncPerCommit;
  while (!stopping_) {
    auto pending = [&] { return synced_ < written_ && !failed_; };
    if (per_commit) {
      sync_idle_ = true;
      sync_cv_.wait(lock, [&] { return stopping_ || (pending() && !sync_in_progress_); });
      sync_idle_ = false;
      // Only append_visible() data unsynced (all written is visible): nobody waits for it, so
      // let more gather.
      auto awaited = [&] { return !sync_waiters_.empty() || visible_ < written_; };
      if (!awaited()) {
        sync_cv_.wait_for(lock, options_.visible_sync_delay,
                          [&] { return stopping_ || awaited(); });
      }
      // Let appenders already inside append() write first, so they share this fdatasync.
      auto group_complete = [&] {
        auto unsynced = std::count_if(sync_waiters_.begin(), sync_waiters_.end(),
                                      [&](Position p) { return synced_ < p; });
        return stopping_ || active_appenders_.load() <= unsynced;
      };
      awaiting_group_ = true;
      if (!group_complete()) {
        auto wait = std::min(options_.group_commit_wait, last_sync_duration_ / 2);
        sync_cv_.wait_for(lock, wait, group_complete);
      }
      awaiting_group_ = false;
    } else {
      sync_cv_.wait_for(lock, options_.sync_interval, [&] { return stopping_ || sync_requested_; });
      sync_requested_ = false;
    }
    if (stopping_) break;
    if (pending() && !sync_in_progress_ && sync_once_locked(lock)) {
      lock.unlock();
      notify_listeners();
      lock.lock();
    }
  }
  synced_cv_.notify_all();
}

void ChangeLog::publish_locked(Position pos, Lsn through) {
  if (visible_ < pos) {
    visible_ = pos;
    visible_cv_.notify_all();
    if (options_.hop_trace != nullptr) {
      options_.hop_trace->stamp(Hop::kAppendVisible, through.value());
    }
  }
}

void ChangeLog::on_visible(std::function<void()> listener) {
  std::lock_guard lock(mu_);
  auto listeners = listeners_ ? std::make_shared<std::vector<std::function<void()>>>(*listeners_)
                              : std::make_shared<std::vector<std::function<void()>>>();
  listeners->push_back(std::move(listener));
  listeners_ = std::move(listeners);
}

void ChangeLog::notify_listeners() {
  std::shared_ptr<const std::vector<std::function<void()>>> listeners;
  {
    std::lock_guard lock(mu_);
    listeners = listeners_;
  }
  if (listeners) {
    for (const auto& f : *listeners) f();
  }
}

Position ChangeLog::visible_position() const {
  std::lock_guard lock(mu_);
  return visible_;
}

bool ChangeLog::wait_beyond(Position pos, std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  return visible_cv_.wait_until(lock, deadline, [&] { return pos < visible_ || stopping_; }) &&
         pos < visible_;
}

std::optional<std::uint64_t> ChangeLog::segment_after(std::uint64_t seq) const {
  std::lock_guard lock(mu_);
  for (const auto& s : manifest_.segments) {
    if (s.seq > seq) return s.seq;
  }
  return std::nullopt;
}

std::optional<Bytes> ChangeLog::last_checkpoint() const {
  std::lock_guard lock(mu_);
  return last_checkpoint_;
}

Lsn ChangeLog::last_commit_lsn() const {
  std::lock_guard lock(mu_);
  return last_commit_lsn_;
}

Lsn ChangeLog::last_end_lsn() const {
  std::lock_guard lock(mu_);
  return last_end_lsn_;
}

void ChangeLog::note_read_through(Lsn lsn) {
  {
    std::lock_guard lock(mu_);
    if (lsn <= std::max(read_through_, last_end_lsn_)) return;
    read_through_ = lsn;
  }
  notify_listeners();
}

Lsn ChangeLog::read_through() const {
  std::lock_guard lock(mu_);
  return read_through_;  // never last_end_lsn_: a durable append is written before readers see it
}

LogStats ChangeLog::stats() const {
  std::lock_guard lock(mu_);
  LogStats s = counters_;
  s.segments = manifest_.segments.size();
  s.total_bytes = 0;
  for (const auto& seg : manifest_.segments) {
    s.total_bytes += seg.seq == active_->seq ? active_->size : seg.bytes;
    if (!s.oldest_lsn.is_valid()) {
      s.oldest_lsn = seg.seq == active_->seq ? active_->info.first_lsn : seg.first_lsn;
    }
  }
  s.newest_lsn = last_commit_lsn_;
  s.newest_time = active_->info.last_time;
  for (auto it = manifest_.segments.rbegin(); s.newest_time == 0 && it != manifest_.segments.rend();
       ++it) {
    s.newest_time = it->last_time;
  }
  s.recovered_truncated_bytes = recovered_truncated_bytes_;
  s.torn_tail_file = recovered_truncated_bytes_ > 0 ? active_->path : "";
  s.torn_tail_offset = recovered_truncated_bytes_ > 0 ? active_->size : 0;
  s.torn_tail_reason = torn_tail_reason_;
  return s;
}

std::vector<SegmentInfo> ChangeLog::segments() const {
  std::lock_guard lock(mu_);
  std::vector<SegmentInfo> list = manifest_.segments;
  list.back() = active_->info;
  return list;
}

Lsn ChangeLog::removed_through() const {
  std::lock_guard lock(mu_);
  return manifest_.removed_through;
}

MarkedEntries ChangeLog::marked_entries(Lsn start) const {
  std::lock_guard lock(mu_);
  return MarkedEntries{marks_->from(start), marks_->unmarked_through()};
}

std::vector<IndexPoint> ChangeLog::load_index(std::uint64_t seq) const {
  std::string path = options_.dir + "/" + index_file_name(seq);
  if (auto data = read_whole_file(path); data.ok()) {
    if (auto points = parse_index(*data)) return std::move(*points);
  }
  // No usable index file: rebuild it by scanning the (sealed, fully valid) segment.
  std::string seg = segment_path(seq);
  auto file = open_file(seg, O_RDONLY);
  if (!file.ok()) return {};
  auto size = file_size(file->get(), seg);
  if (!size.ok()) return {};
  auto scan = scan_segment(file->get(), seg, *size, options_.index_interval, options_.read_buffer);
  if (!scan.ok()) return {};
  return std::move(scan->index);
}

Position ChangeLog::seek_first(const std::function<bool(const SegmentInfo&)>& reaches,
                               const std::function<bool(const IndexPoint&)>& before) const {
  std::vector<SegmentInfo> list;
  std::vector<IndexPoint> active_index;
  {
    std::lock_guard lock(mu_);
    list = manifest_.segments;
    list.back() = active_->info;
    active_index = active_->index;
  }
  for (const auto& s : list) {
    if (!s.last_lsn.is_valid() || !reaches(s)) continue;
    auto index = s.seq == list.back().seq ? active_index : load_index(s.seq);
    // The last index point before the target: every entry before it is before the target too.
    auto it = std::partition_point(index.begin(), index.end(), before);
    if (it == index.begin()) return Position{s.seq, kSegmentHeaderSize};
    return Position{s.seq, std::prev(it)->offset};
  }
  // Nothing retained reaches the target: begin at the visible end; later entries are filtered.
  return visible_position();
}

Result<Position> ChangeLog::seek(Lsn start) const {
  Lsn removed = removed_through();
  if (removed.is_valid() && start <= removed) {
    return Error::make(
        sqlstate::kObjectNotInPrerequisiteState,
        "requested starting point " + start.to_string() + " has already been removed from the log",
        "The oldest retained position is after " + removed.to_string() +
            ". Start from a later LSN, or create a new slot and copy the data again.");
  }
  return seek_first([&](const SegmentInfo& s) { return s.last_lsn >= start; },
                    [&](const IndexPoint& p) { return p.lsn < start; });
}

Result<Position> ChangeLog::seek_time(std::int64_t time) const {
  return seek_first([&](const SegmentInfo& s) { return s.last_time >= time; },
                    [&](const IndexPoint& p) { return p.time < time; });
}

Result<std::unique_ptr<Cursor>> ChangeLog::open_cursor(Lsn start) {
  auto pos = seek(start);
  if (!pos.ok()) return pos.take_error();
  std::unique_ptr<Cursor> cursor(new Cursor(this, start, *pos));
  PGRELAY_TRY(cursor->open_segment(pos->seq, pos->offset));
  return cursor;
}

Result<std::unique_ptr<Cursor>> ChangeLog::open_cursor_at_time(std::int64_t time) {
  auto pos = seek_time(time);
  if (!pos.ok()) return pos.take_error();
  // The seek lands at or before the first entry at `time`; the cursor skips earlier ones.
  std::unique_ptr<Cursor> cursor(new Cursor(this, Lsn(0), *pos));
  PGRELAY_TRY(cursor->open_segment(pos->seq, pos->offset));
  cursor->min_time_ = time;
  return cursor;
}

Status ChangeLog::remove_before(Lsn lsn) {
  if (options_.read_only) return read_only_error();
  std::vector<std::uint64_t> doomed;
  {
    std::lock_guard lock(mu_);
    Manifest updated = manifest_;
    while (updated.segments.size() > 1 && updated.segments.front().sealed &&
           (!updated.segments.front().last_lsn.is_valid() ||
            updated.segments.front().last_lsn < lsn)) {
      const auto& s = updated.segments.front();
      if (s.last_lsn.is_valid() && s.last_lsn > updated.removed_through) {
        updated.removed_through = s.last_lsn;
      }
      doomed.push_back(s.seq);
      updated.segments.erase(updated.segments.begin());
    }
    if (doomed.empty()) return {};
    PGRELAY_TRY(write_file_atomically(options_.dir, kManifestName, serialize_manifest(updated)));
    manifest_ = std::move(updated);
  }
  // The manifest no longer names these files; a crash before the unlinks leaves files that
  // recovery deletes.
  for (std::uint64_t seq : doomed) {
    ::unlink(segment_path(seq).c_str());
    ::unlink((options_.dir + "/" + index_file_name(seq)).c_str());
  }
  return sync_directory(options_.dir);
}

// ---------------------------------------------------------------------------------------------
// Cursor

Cursor::Cursor(const ChangeLog* log, Lsn start, Position pos)
    : log_(log), start_(start), pos_(pos) {}

Status Cursor::open_segment(std::uint64_t seq, std::uint64_t offset) {
  std::string path = log_->segment_path(seq);
  auto file = open_file(path, O_RDONLY);
  if (!file.ok()) return file.error();
  Bytes header(kSegmentHeaderSize);
  PGRELAY_TRY(pread_all(file->get(), 0, header.data(), header.size(), path));
  auto got = decode_segment_header(header, path);
  if (!got.ok()) return got.error();
  file_ = std::move(*file);
  reader_ = std::make_unique<RecordReader>(file_.get(), path, offset, offset,
                                           log_->options().read_buffer);
  pos_ = Position{seq, offset};
  in_entry_ = false;
  pending_valid_ = false;
  return {};
}

Error Cursor::corruption(const std::string& why) const {
  return Error::make(sqlstate::kDataCorrupted,
                     "log segment \"" + reader_->path() + "\" is damaged at offset " +
                         std::to_string(reader_->offset()) + ": " + why,
                     "Restore the data directory from a backup. To serve consumers again without "
                     "it, drop the slots that need this segment and create new ones.");
}

Result<std::optional<EntryMeta>> Cursor::next_entry() {
  // Skip whatever is left of the current entry.
  while (in_entry_) {
    auto piece = next_data();
    if (!piece.ok()) return piece.take_error();
  }
  while (true) {
    if (reader_->at_limit()) {
      Position visible = log_->visible_position();
      if (visible.seq == pos_.seq) {
        reader_->extend_limit(visible.offset);
      } else if (visible.seq > pos_.seq) {
        auto size = file_size(file_.get(), reader_->path());
        if (!size.ok()) return size.take_error();
        reader_->extend_limit(*size);
      }
      if (reader_->at_limit()) {
        if (visible.seq <= pos_.seq) return std::optional<EntryMeta>();
        auto next = log_->segment_after(pos_.seq);
        if (!next) return std::optional<EntryMeta>();
        PGRELAY_TRY(open_segment(*next, kSegmentHeaderSize));
        continue;
      }
    }
    ParsedRecord rec;
    std::string why;
    Error io;
    RecordStatus status = reader_->next(&rec, &why, &io);
    if (status != RecordStatus::kOk) {
      if (!io.message.empty()) return io;
      return corruption(why);
    }
    if (rec.header.type != RecordType::kFull && rec.header.type != RecordType::kFirst) {
      return corruption("entry continuation without a start");
    }
    ByteReader payload(rec.payload);
    auto meta = decode_entry_meta(payload);
    if (!meta.ok()) return corruption(meta.error().message);
    bool whole = rec.header.type == RecordType::kFull;
    bool wanted = meta->kind != EntryKind::kCheckpoint && meta->commit_lsn >= start_ &&
                  meta->commit_time >= min_time_;
    in_entry_ = !whole;
    if (!wanted) {
      pending_valid_ = false;
      while (in_entry_) {
        auto piece = next_data();
        if (!piece.ok()) return piece.take_error();
      }
      pos_.offset = reader_->offset();
      continue;
    }
    pending_data_ = payload.rest();
    pending_valid_ = true;
    entry_whole_ = whole;
    if (whole) pos_.offset = reader_->offset();
    return std::optional<EntryMeta>(std::move(*meta));
  }
}

Result<std::optional<ByteView>> Cursor::next_data() {
  if (pending_valid_) {
    pending_valid_ = false;
    return std::optional<ByteView>(pending_data_);
  }
  if (!in_entry_) return std::optional<ByteView>();
  ParsedRecord rec;
  std::string why;
  Error io;
  // A batch is visible only as a whole, so the rest of an entry is always readable.
  if (reader_->at_limit()) return corruption("entry continues past the visible end");
  RecordStatus status = reader_->next(&rec, &why, &io);
  if (status != RecordStatus::kOk) {
    if (!io.message.empty()) return io;
    return corruption(why);
  }
  if (rec.header.type == RecordType::kLast) {
    in_entry_ = false;
    pos_.offset = reader_->offset();
  } else if (rec.header.type != RecordType::kMiddle) {
    return corruption("entry is missing its last record");
  }
  return std::optional<ByteView>(rec.payload);
}

Result<Bytes> Cursor::read_data() {
  Bytes out;
  while (true) {
    auto piece = next_data();
    if (!piece.ok()) return piece.take_error();
    if (!*piece) return out;
    out.insert(out.end(), (*piece)->begin(), (*piece)->end());
  }
}

bool Cursor::wait(std::chrono::milliseconds timeout) {
  Position mine{pos_.seq, reader_->limit()};
  return log_->wait_beyond(mine, std::chrono::steady_clock::now() + timeout);
}

}  // namespace pgrelay::log
