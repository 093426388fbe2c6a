// POSIX file operations for the log with errors that name the file and the fix.
#include "log/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace pgrelay::log {

FileHandle& FileHandle::operator=(FileHandle&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

Error io_error(const std::string& what, const std::string& path, int err) {
  std::string hint;
  const char* code = sqlstate::kIoError;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      code = sqlstate::kDiskFull;
      hint = "Free space on the file system holding \"" + path +
             "\" (or move the data directory to a larger one); nothing durable was lost, and "
             "pgrelay continues once space is available.";
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      hint = "Make \"" + path + "\" and its directory writable by the user pgrelay runs as "
             "(for example: chown -R $(id -un) DIR), or choose another --data-dir.";
      break;
    case ENOENT:
      hint = "Check that the data directory exists and was not moved or deleted while pgrelay ran.";
      break;
    default:
      hint = "Check the file system and kernel log (dmesg) for errors.";
  }
  return Error::make(code, "could not " + what + " \"" + path + "\": " + std::strerror(err), hint);
}

Result<FileHandle> open_file(const std::string& path, int flags, int mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return io_error("open file", path, errno);
  return FileHandle(fd);
}

Status write_all(int fd, ByteView data, const std::string& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("write to file", path, errno);
    }
    done += static_cast<std::size_t>(n);
  }
  return {};
}

Status pwrite_all(int fd, std::uint64_t offset, ByteView data, const std::string& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("write to file", path, errno);
    }
    done += static_cast<std::size_t>(n);
  }
  return {};
}

Status pread_all(int fd, std::uint64_t offset, std::uint8_t* out, std::size_t n,
                 const std::string& path) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return io_error("read file", path, errno);
    }
    if (got == 0) {
      return Error::make(sqlstate::kDataCorrupted,
                         "unexpected end of file \"" + path + "\" at offset " +
                             std::to_string(offset + done),
                         "The file was truncated behind pgrelay's back; restore the data "
                         "directory from a backup.");
    }
    done += static_cast<std::size_t>(got);
  }
  return {};
}

Status sync_file(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0) return io_error("fsync file", path, errno);
  return {};
}

Status sync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("open directory", dir, errno);
  FileHandle handle(fd);
  if (::fsync(fd) != 0) return io_error("fsync directory", dir, errno);
  return {};
}

Result<std::uint64_t> file_size(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return io_error("stat file", path, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

bool preallocate_file(int fd, std::uint64_t data_end, std::uint64_t size) {
  if (size <= data_end) return false;
  if (::fallocate(fd, 0, static_cast<off_t>(data_end), static_cast<off_t>(size - data_end)) == 0) {
    return true;
  }
  // A failure may have allocated (and grown the file by) part of the range.
  (void)!::ftruncate(fd, static_cast<off_t>(data_end));
  return false;
}

Result<std::uint64_t> end_of_nonzero(int fd, std::uint64_t from, std::uint64_t to,
                                     const std::string& path) {
  std::uint64_t end = from;
  std::vector<std::uint8_t> chunk(1 << 20);
  std::uint64_t at = from;
  while (at < to) {
    // Allocated space never written is a hole to SEEK_DATA (ext4, xfs), so only what was
    // written is read. Where SEEK_DATA is not known, every byte is data.
    std::uint64_t data_end = to;
    if (const off_t data = ::lseek(fd, static_cast<off_t>(at), SEEK_DATA); data >= 0) {
      at = static_cast<std::uint64_t>(data);
      if (const off_t hole = ::lseek(fd, data, SEEK_HOLE); hole >= 0) {
        data_end = std::min(to, static_cast<std::uint64_t>(hole));
      }
    } else if (errno == ENXIO) {
      break;  // no data from `at` on
    }
    for (; at < data_end;) {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), data_end - at));
      PGRELAY_TRY(pread_all(fd, at, chunk.data(), n, path));
      auto last = std::find_if(chunk.rbegin() + static_cast<std::ptrdiff_t>(chunk.size() - n),
                               chunk.rend(), [](std::uint8_t b) { return b != 0; });
      if (last != chunk.rend()) end = at + static_cast<std::uint64_t>(chunk.rend() - last);
      at += n;
    }
  }
  return end;
}

Result<Bytes> read_whole_file(const std::string& path) {
  auto file = open_file(path, O_RDONLY);
  if (!file.ok()) return file.take_error();
  auto size = file_size(file->get(), path);
  if (!size.ok()) return size.take_error();
  Bytes data(*size);
  if (*size > 0) PGRELAY_TRY(pread_all(file->get(), 0, data.data(), data.size(), path));
  return data;
}

Status write_file_atomically(const std::string& dir, const std::string& name, ByteView data) {
  std::string tmp = dir + "/" + name + ".tmp";
  std::string final_path = dir + "/" + name;
  {
    auto file = open_file(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!file.ok()) return file.error();
    PGRELAY_TRY(write_all(file->get(), data, tmp));
    if (::fsync(file->get()) != 0) return io_error("fsync file", tmp, errno);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return io_error("rename file", tmp, errno);
  }
  return sync_directory(dir);
}

Status ensure_directory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return io_error("create directory", dir, errno);
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return io_error("stat directory", dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return Error::make(sqlstate::kIoError, "\"" + dir + "\" exists but is not a directory",
                       "Choose another --data-dir, or move the file out of the way.");
  }
  return {};
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace pgrelay::log
