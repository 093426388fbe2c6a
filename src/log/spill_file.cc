// Spill files in segment layout: writing data as records, reading it back, rewinding.
#include "log/spill_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace pgrelay::log {

namespace {

// Writeback of a spill file is started every this many bytes, so that the log's fdatasync
// before it links the file in finds little left to write.
constexpr std::uint64_t kWritebackInterval = 8ull << 20;

}  // namespace

Status read_spill_data(int fd, std::uint64_t data_start, std::uint64_t offset,
                       std::span<std::uint8_t> out, const std::string& name) {
  std::size_t done = 0;
  while (done < out.size()) {
    const std::uint64_t at = offset + done;
    const std::uint64_t record = at / kMaxRecordPayload;
    const std::uint64_t within = at % kMaxRecordPayload;
    const std::size_t n = static_cast<std::size_t>(
        std::min<std::uint64_t>(kMaxRecordPayload - within, out.size() - done));
    const std::uint64_t file_offset =
        data_start + record * (kRecordHeaderSize + kMaxRecordPayload) + kRecordHeaderSize + within;
    PGRELAY_TRY(pread_all(fd, file_offset, out.data() + done, n, name));
    done += n;
  }
  return {};
}

// --- SpillFile ---

Status SpillFile::read(std::uint64_t offset, std::span<std::uint8_t> out) const {
  if (offset > data_size_ || out.size() > data_size_ - offset) {
    return Error::make(sqlstate::kInternalError, "read past the end of spill file \"" + name_ +
                                                     "\": offset " + std::to_string(offset) + ", " +
                                                     std::to_string(out.size()) + " bytes, size " +
                                                     std::to_string(data_size_));
  }
  return read_spill_data(file_.get(), spill_data_start(meta_size_), offset, out, name_);
}

std::optional<SegmentImage> SpillFile::segment_image() const {
  if (!linkable_) return std::nullopt;
  SegmentImage image;
  image.fd = file_.get();
  image.meta_size = meta_size_;
  image.data_size = data_size_;
  const std::uint64_t records = data_size_ == 0 ? 0 : (data_size_ - 1) / kMaxRecordPayload + 1;
  image.file_size = spill_data_start(meta_size_) + records * kRecordHeaderSize + data_size_;
  return image;
}

// --- SpillWriter ---

SpillWriter::SpillWriter(FileHandle file, std::string name, std::size_t meta_size, bool linkable)
    : file_(std::move(file)),
      name_(std::move(name)),
      meta_size_(meta_size),
      linkable_(linkable),
      writeback_from_(spill_data_start(meta_size)) {}

Result<SpillWriter> SpillWriter::create(const std::string& dir, const std::string& label,
                                        std::size_t meta_size) {
  PGRELAY_TRY(ensure_directory(dir));
  const std::string path = dir + "/" + label;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  std::string name;
  bool linkable = fd >= 0;
  if (fd >= 0) {
    name = path + " (unnamed temporary file)";
  } else if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) {
    // File systems without O_TMPFILE: a named file, unlinked at once.
    std::string named = path + ".XXXXXX";
    fd = ::mkostemp(named.data(), O_CLOEXEC);
    if (fd < 0) return io_error("create spill file", named, errno);
    if (::unlink(named.c_str()) != 0) {
      int err = errno;
      ::close(fd);
      return io_error("unlink spill file", named, err);
    }
    name = named + " (unlinked)";
  } else {
    return io_error("create spill file", path, errno);
  }
  FileHandle file(fd);
  // The segment header and the FIRST record are written by the log; data starts after them.
  if (::lseek(fd, static_cast<off_t>(spill_data_start(meta_size)), SEEK_SET) < 0) {
    return io_error("seek in spill file", name, errno);
  }
  return SpillWriter(std::move(file), std::move(name), meta_size, linkable);
}

Result<FileHandle> SpillWriter::reopen_for_reading() const {
  const int fd = ::fcntl(file_.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return io_error("duplicate the descriptor of spill file", name_, errno);
  return FileHandle(fd);
}

Status SpillWriter::write_record(RecordType type, std::uint8_t flags, ByteView payload) {
  ByteWriter record;
  append_record(type, flags, payload, record);
  PGRELAY_TRY(write_all(file_.get(), record.bytes(), name_));
  const std::uint64_t end = record_offset(records_) + record.size();
  if (end - writeback_from_ >= kWritebackInterval) {
    // Starts writeback without waiting for it; failures show up in the log's fdatasync.
    (void)::sync_file_range(file_.get(), static_cast<off_t>(writeback_from_),
                            static_cast<off_t>(end - writeback_from_), SYNC_FILE_RANGE_WRITE);
    writeback_from_ = end;
  }
  return {};
}

Status SpillWriter::write(ByteView data) {
  while (!data.empty()) {
    // A full tail becomes a MIDDLE record only now that more data follows it.
    if (tail_.size() == kMaxRecordPayload) {
      PGRELAY_TRY(write_record(RecordType::kMiddle, 0, tail_));
      ++records_;
      tail_.clear();
    }
    if (tail_.empty() && data.size() > kMaxRecordPayload) {
      PGRELAY_TRY(write_record(RecordType::kMiddle, 0, data.subspan(0, kMaxRecordPayload)));
      ++records_;
      data = data.subspan(kMaxRecordPayload);
      continue;
    }
    const std::size_t n = std::min(kMaxRecordPayload - tail_.size(), data.size());
    tail_.insert(tail_.end(), data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n));
    data = data.subspan(n);
  }
  return {};
}

Status SpillWriter::rewind(std::uint64_t size) {
  if (size > this->size()) {
    return Error::make(sqlstate::kInternalError, "cannot rewind spill file \"" + name_ + "\" to " +
                                                     std::to_string(size) + " bytes: it holds " +
                                                     std::to_string(this->size()));
  }
  const std::uint64_t in_records = records_ * kMaxRecordPayload;
  if (size > in_records || (size == in_records && records_ == 0)) {
    tail_.resize(static_cast<std::size_t>(size - in_records));
    return {};
  }
  // The new end lies in the records: the record holding its last byte becomes the tail again.
  const std::uint64_t keep = spill_data_kept_in_records(size) / kMaxRecordPayload;
  const std::size_t tail = static_cast<std::size_t>(size - keep * kMaxRecordPayload);
  tail_.resize(tail);
  if (tail > 0) {
    PGRELAY_TRY(
        pread_all(file_.get(), record_offset(keep) + kRecordHeaderSize, tail_.data(), tail, name_));
  }
  const std::uint64_t end = record_offset(keep);
  if (::ftruncate(file_.get(), static_cast<off_t>(end)) != 0 ||
      ::lseek(file_.get(), static_cast<off_t>(end), SEEK_SET) < 0) {
    return io_error("truncate spill file", name_, errno);
  }
  records_ = keep;
  writeback_from_ = std::min(writeback_from_, end);
  return {};
}

Result<std::unique_ptr<SpillFile>> SpillWriter::finish() {
  const std::uint64_t data_size = size();
  if (!tail_.empty()) PGRELAY_TRY(write_record(RecordType::kLast, kEndOfBatch, tail_));
  Bytes().swap(tail_);
  records_ = 0;
  return std::unique_ptr<SpillFile>(
      new SpillFile(std::move(file_), std::move(name_), data_size, meta_size_, linkable_));
}

}  // namespace pgrelay::log
