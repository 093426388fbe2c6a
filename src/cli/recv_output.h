// The output file of `pgrelay recv`: buffers whole transactions, writes them, makes them durable.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/result.h"

namespace pgrelay::cli {

// Bytes are appended as they are decoded; mark_boundary() declares everything so far whole (a
// transaction ended). write_out() hands only whole units to the kernel, so a reader of the file
// and a stop in the middle of a transaction never leave half a transaction behind, unless one
// transaction outgrows kMaxPartialBytes: then its beginning is written early to bound memory.
class RecvOutput {
 public:
  static constexpr std::size_t kMaxPartialBytes = 8u << 20;

  // "-" is standard output; otherwise the file is created or appended to (as pg_recvlogical).
  static Result<RecvOutput> open(const std::string& path);

  RecvOutput(RecvOutput&& other) noexcept;
  RecvOutput& operator=(RecvOutput&&) = delete;
  RecvOutput(const RecvOutput&) = delete;
  ~RecvOutput();

  void append(std::string_view bytes) { buffer_.append(bytes); }
  void mark_boundary() {
    boundary_ = buffer_.size();
    partial_written_ = false;
  }

  // Writes the whole units (and an oversized partial one) to the file descriptor.
  Status write_out();
  // write_out(), then fsync when the output is a regular file: after it, every whole unit
  // appended so far is durable.
  Status sync();
  // Forgets what was appended after the last boundary and not yet written. Returns whether
  // part of that unit had already been written (an oversized transaction).
  bool discard_partial();
  // Forgets everything not yet written, whole units included: for a stream that ended before
  // they could be confirmed, which the server therefore sends again.
  void discard_unwritten() {
    buffer_.clear();
    boundary_ = 0;
    partial_written_ = false;
  }

  // Bytes appended and not yet written.
  std::size_t buffered() const { return buffer_.size(); }
  const std::string& path() const { return path_; }

 private:
  RecvOutput(int fd, bool owned, bool regular, std::string path)
      : fd_(fd), owned_(owned), regular_(regular), path_(std::move(path)) {}
  Status write_bytes(std::size_t n);

  int fd_ = -1;
  bool owned_ = false;
  bool regular_ = false;
  std::string path_;
  std::string buffer_;        // not yet written
  std::size_t boundary_ = 0;  // bytes of buffer_ that are whole units
  bool partial_written_ = false;
  bool needs_sync_ = false;
};

}  // namespace pgrelay::cli
