// The output file of `pgrelay recv`: buffers whole transactions, writes them, makes them durable.
#include "cli/recv_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace pgrelay::cli {

namespace {

Error io_error(const std::string& what, const std::string& path, int err) {
  return Error::make(err == ENOSPC ? sqlstate::kDiskFull : sqlstate::kIoError,
                     "could not " + what + " \"" + path + "\": " + std::strerror(err));
}

}  // namespace

Result<RecvOutput> RecvOutput::open(const std::string& path) {
  int fd = STDOUT_FILENO;
  bool owned = false;
  std::string shown = path;
  if (path == "-") {
    shown = "standard output";
  } else {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return io_error("open output file", path, errno);
    owned = true;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    if (owned) ::close(fd);
    return io_error("stat output file", shown, err);
  }
  // A pipe or a terminal cannot be fsynced; writing it is as far as delivery goes.
  bool regular = S_ISREG(st.st_mode) && ::isatty(fd) == 0;
  return RecvOutput(fd, owned, regular, shown);
}

RecvOutput::RecvOutput(RecvOutput&& other) noexcept
    : fd_(other.fd_),
      owned_(other.owned_),
      regular_(other.regular_),
      path_(std::move(other.path_)),
      buffer_(std::move(other.buffer_)),
      boundary_(other.boundary_),
      partial_written_(other.partial_written_),
      needs_sync_(other.needs_sync_) {
  other.owned_ = false;
  other.fd_ = -1;
}

RecvOutput::~RecvOutput() {
  if (owned_ && fd_ >= 0) ::close(fd_);
}

Status RecvOutput::write_bytes(std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd_, buffer_.data() + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      buffer_.erase(0, done);
      boundary_ -= std::min(boundary_, done);
      return io_error("write to", path_, err);
    }
    done += static_cast<std::size_t>(w);
  }
  buffer_.erase(0, n);
  boundary_ -= std::min(boundary_, n);
  if (n > 0) needs_sync_ = true;
  return {};
}

Status RecvOutput::write_out() {
  if (buffer_.size() - boundary_ > kMaxPartialBytes) {
    partial_written_ = true;
    return write_bytes(buffer_.size());
  }
  return write_bytes(boundary_);
}

Status RecvOutput::sync() {
  PGRELAY_TRY(write_out());
  if (!needs_sync_ || !regular_) return {};
  if (::fsync(fd_) != 0) return io_error("fsync", path_, errno);
  needs_sync_ = false;
  return {};
}

bool RecvOutput::discard_partial() {
  buffer_.resize(boundary_);
  bool written = partial_written_;
  partial_written_ = false;
  return written;
}

}  // namespace pgrelay::cli
