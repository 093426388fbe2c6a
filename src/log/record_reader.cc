// Sequential, buffered reading of verified records from one segment file.
#include "log/record_reader.h"

#include <algorithm>
#include <cstring>

#include "log/file_util.h"

namespace pgrelay::log {

RecordReader::RecordReader(int fd, std::string path, std::uint64_t start, std::uint64_t limit,
                           std::size_t buffer_size)
    : fd_(fd), path_(std::move(path)), offset_(start), limit_(limit), buf_(buffer_size) {}

bool RecordReader::fill(std::size_t need, Error* io_error) {
  std::size_t have = end_ - pos_;
  if (have >= need) return true;
  std::uint64_t available = limit_ - offset_;
  if (available < need) need = static_cast<std::size_t>(available);
  if (have >= need) return true;
  // Slide unconsumed bytes to the front; grow only for a record larger than the buffer.
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, have);
    pos_ = 0;
    end_ = have;
  }
  if (buf_.size() < need) buf_.resize(need);
  std::size_t want = std::min<std::uint64_t>(buf_.size() - end_, available - have);
  Status st = pread_all(fd_, offset_ + have, buf_.data() + end_, want, path_);
  if (!st.ok()) {
    *io_error = st.error();
    return false;
  }
  end_ += want;
  return true;
}

RecordStatus RecordReader::next(ParsedRecord* record, std::string* why, Error* io_error) {
  if (offset_ >= limit_) {
    *why = "end of readable data";
    return RecordStatus::kIncomplete;
  }
  if (!fill(kRecordHeaderSize, io_error)) return RecordStatus::kCorrupt;
  ByteView view(buf_.data() + pos_, end_ - pos_);
  if (view.size() >= kRecordHeaderSize) {
    ByteReader r(view);
    r.u32();
    std::uint32_t length = r.u32();
    if (length <= kMaxRecordPayload + 4096) {
      if (!fill(kRecordHeaderSize + length, io_error)) return RecordStatus::kCorrupt;
      view = ByteView(buf_.data() + pos_, end_ - pos_);
    }
  }
  RecordStatus status = parse_record(view, record, why);
  if (status == RecordStatus::kOk) {
    pos_ += record->total_size;
    offset_ += record->total_size;
  }
  return status;
}

}  // namespace pgrelay::log
