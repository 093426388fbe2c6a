// Sequential, buffered reading of verified records from one segment file.
#pragma once

#include <cstdint>
#include <string>

#include "base/bytes.h"
#include "log/format.h"

namespace pgrelay::log {

class RecordReader {
 public:
  // Reads records of the file `fd` (named `path` in errors) from `start` up to `limit`.
  RecordReader(int fd, std::string path, std::uint64_t start, std::uint64_t limit,
               std::size_t buffer_size);

  // kOk: `*record` is valid until the next call and offset() has moved past it.
  // kIncomplete at offset() == limit(): no more records. Otherwise the record at offset() is cut
  // short (kIncomplete) or damaged (kCorrupt), `*why` says how, and offset() stays on it.
  // An I/O error is reported as kCorrupt with `*io_error` set.
  RecordStatus next(ParsedRecord* record, std::string* why, Error* io_error);

  std::uint64_t offset() const { return offset_; }
  std::uint64_t limit() const { return limit_; }
  bool at_limit() const { return offset_ >= limit_; }
  // Allows reading further (the visible end of the active segment moved).
  void extend_limit(std::uint64_t limit) { limit_ = limit; }
  const std::string& path() const { return path_; }

 private:
  bool fill(std::size_t need, Error* io_error);

  int fd_;
  std::string path_;
  std::uint64_t offset_;  // file offset of buf_[pos_]
  std::uint64_t limit_;
  Bytes buf_;
  std::size_t pos_ = 0;  // first unconsumed byte in buf_
  std::size_t end_ = 0;  // end of valid bytes in buf_
};

}  // namespace pgrelay::log
