// A spilled entry's data, written as a log segment of its own so the log can take the file.
//
// A spill file has the layout of a segment that holds its one entry alone:
//
//   segment header | FIRST record: the entry's metadata only |
//   MIDDLE records of exactly kMaxRecordPayload data bytes ... |
//   LAST record: 1..kMaxRecordPayload data bytes, kEndOfBatch
//
// The header and the FIRST record are left as a hole of their final size: only the log knows
// the segment's sequence number, and the entry's LSNs may be chosen at append
// (ChangeLog::append_assigning). When it appends the entry, the log writes both, makes the file
// durable and links it into its directory as the next segment, instead of copying the data
// (which cost most of the time between a large transaction's commit and its first change sent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/bytes.h"
#include "base/result.h"
#include "log/change_log.h"
#include "log/file_util.h"
#include "log/format.h"

namespace pgrelay::log {

// The file offset of the first data record, given the encoded size of the entry's metadata.
inline std::uint64_t spill_data_start(std::size_t meta_size) {
  return kSegmentHeaderSize + kRecordHeaderSize + meta_size;
}

// The data bytes that whole records of a spill file still hold after SpillWriter::rewind(size):
// the record holding the new end goes back to memory, to be written again.
inline std::uint64_t spill_data_kept_in_records(std::uint64_t size) {
  return size == 0 ? 0 : (size - 1) / kMaxRecordPayload * kMaxRecordPayload;
}

// Reads `out.size()` data bytes from data offset `offset` of a spill file (or a segment in its
// layout) whose first data record starts at file offset `data_start`, skipping record headers.
Status read_spill_data(int fd, std::uint64_t data_start, std::uint64_t offset,
                       std::span<std::uint8_t> out, const std::string& name);

// A finished spill file. Its space is given back when this object is destroyed (the file has
// no name), even after a crash, unless the log has linked it in as a segment.
class SpillFile final : public DataSource {
 public:
  std::uint64_t size() const override { return data_size_; }
  // `offset` counts data bytes: the record headers between them are skipped.
  Status read(std::uint64_t offset, std::span<std::uint8_t> out) const override;
  std::optional<SegmentImage> segment_image() const override;
  // The name errors use: the directory and the transaction it was made for.
  const std::string& name() const { return name_; }

 private:
  friend class SpillWriter;
  SpillFile(FileHandle file, std::string name, std::uint64_t data_size, std::size_t meta_size,
            bool linkable)
      : file_(std::move(file)),
        name_(std::move(name)),
        data_size_(data_size),
        meta_size_(meta_size),
        linkable_(linkable) {}

  FileHandle file_;
  std::string name_;
  std::uint64_t data_size_;
  std::size_t meta_size_;
  bool linkable_;  // an unnamed temporary file (O_TMPFILE), which can be given a name
};

// Writes one entry's data into a new spill file in records, keeping the tail that may still
// become the LAST record (1..kMaxRecordPayload bytes) in memory.
class SpillWriter {
 public:
  // Creates the file in `dir` (made 0700 if missing): an unnamed temporary file, or where the
  // file system has no O_TMPFILE a named one, unlinked at once (the log then copies it).
  // `label` names it in errors; `meta_size` is the encoded size of the entry's metadata
  // (encode_entry_meta), which depends only on its origin name.
  static Result<SpillWriter> create(const std::string& dir, const std::string& label,
                                    std::size_t meta_size);
  SpillWriter(SpillWriter&&) = default;
  SpillWriter& operator=(SpillWriter&&) = default;

  Status write(ByteView data);
  // The data bytes in whole records of the file: they stay as they are unless rewound.
  std::uint64_t size_in_records() const { return records_ * kMaxRecordPayload; }
  // Another descriptor of the file, for reading it (pread only) while it is written.
  Result<FileHandle> reopen_for_reading() const;
  std::uint64_t data_start() const { return spill_data_start(meta_size_); }
  const std::string& name() const { return name_; }
  // Drops the data past the first `size` bytes (a subtransaction rolled back).
  Status rewind(std::uint64_t size);
  std::uint64_t size() const { return records_ * kMaxRecordPayload + tail_.size(); }
  std::size_t meta_size() const { return meta_size_; }
  Result<std::unique_ptr<SpillFile>> finish();

 private:
  SpillWriter(FileHandle file, std::string name, std::size_t meta_size, bool linkable);
  Status write_record(RecordType type, std::uint8_t flags, ByteView payload);
  std::uint64_t record_offset(std::uint64_t index) const {
    return spill_data_start(meta_size_) + index * (kRecordHeaderSize + kMaxRecordPayload);
  }

  FileHandle file_;
  std::string name_;
  std::size_t meta_size_ = 0;
  bool linkable_ = false;
  std::uint64_t records_ = 0;         // whole MIDDLE records in the file
  Bytes tail_;                        // data after them; never empty while records_ > 0
  std::uint64_t writeback_from_ = 0;  // file offset from which writeback has not been started
};

}  // namespace pgrelay::log
