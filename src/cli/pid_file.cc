// DATA/pgrelay.pid: one pgrelay per data dir, and how other commands find the running one.
#include "cli/pid_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace pgrelay::cli {
namespace {

std::string pid_path(const std::string& data_dir) {
  return data_dir + "/pgrelay.pid";
}

Status write_all(int fd, const std::string& text) {
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return Error::make(sqlstate::kIoError,
                       std::string("could not write pgrelay.pid: ") + std::strerror(errno));
  }
  return Status::ok_status();
}

}  // namespace

Result<PidFile> PidFile::acquire(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) {
    return Error::make(sqlstate::kIoError,
                       "could not create data directory \"" + data_dir + "\": " + ec.message(),
                       "Choose a writable directory with --data-dir.");
  }
  std::string path = pid_path(data_dir);
  for (;;) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return Error::make(sqlstate::kIoError,
                         "could not open \"" + path + "\": " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      auto running = find_running_server(data_dir);
      std::string who = running ? " (pid " + std::to_string(running->pid) + ")" : "";
      return Error::make(
          sqlstate::kObjectInUse,
          "another pgrelay" + who + " is running on data directory \"" + data_dir + "\"",
          "Stop it, or give this one its own --data-dir.");
    }
    // A server that was exiting may have removed the file between our open and our lock:
    // then we locked an orphan inode and must start over.
    struct stat opened, named;
    if (::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 &&
        opened.st_ino == named.st_ino && opened.st_dev == named.st_dev) {
      PidFile file(path, fd);
      PGRELAY_TRY(write_all(fd, std::to_string(::getpid()) + "\n"));
      return file;
    }
    ::close(fd);
  }
}

PidFile::PidFile(PidFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(other.fd_),
      url_(std::move(other.url_)),
      admin_url_(std::move(other.admin_url_)) {
  other.fd_ = -1;
}

PidFile::~PidFile() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before unlocking: a new server never sees our file unlocked
  ::close(fd_);
}

Status PidFile::publish_url(const std::string& url) {
  url_ = url;
  return rewrite();
}

Status PidFile::publish_admin_url(const std::string& admin_url) {
  admin_url_ = admin_url;
  return rewrite();
}

Status PidFile::rewrite() const {
  return write_all(fd_, std::to_string(::getpid()) + "\n" + url_ + "\n" + admin_url_ + "\n");
}

std::optional<RunningServer> find_running_server(const std::string& data_dir) {
  std::string path = pid_path(data_dir);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  if (!held) return std::nullopt;
  std::ifstream in(path);
  RunningServer server;
  in >> server.pid;
  std::getline(in, server.url);  // rest of line 1
  std::getline(in, server.url);
  std::getline(in, server.admin_url);
  return server;
}

}  // namespace pgrelay::cli
