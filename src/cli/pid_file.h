// DATA/pgrelay.pid: one pgrelay per data dir, and how other commands find the running one.
//
// The file holds the server's pid on line 1 and, once clients can connect, the ready URL on
// line 2 (it may carry the upstream password: mode 0600). The server holds an exclusive flock
// on it for as long as it runs; a reader that can take a shared lock knows it is stale.
#pragma once

#include <optional>
#include <string>

#include "base/result.h"

namespace pgrelay::cli {

class PidFile {
 public:
  // Creates DATA_DIR and locks DATA_DIR/pgrelay.pid; 55006 naming the running pid if another
  // pgrelay holds it.
  static Result<PidFile> acquire(const std::string& data_dir);
  PidFile(PidFile&& other) noexcept;
  PidFile& operator=(PidFile&&) = delete;
  ~PidFile();  // removes the file and releases the lock

  // Adds the ready URL (line 2).
  Status publish_url(const std::string& url);
  // Adds the admin page's URL (line 3), for commands such as `pgrelay restore` that act on it.
  Status publish_admin_url(const std::string& admin_url);

 private:
  PidFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  Status rewrite() const;
  std::string path_;
  int fd_ = -1;
  std::string url_;
  std::string admin_url_;
};

struct RunningServer {
  long pid = 0;
  std::string url;        // empty until the server is ready
  std::string admin_url;  // empty without an admin page
};
// The server running on DATA_DIR, or nullopt when none is.
std::optional<RunningServer> find_running_server(const std::string& data_dir);

}  // namespace pgrelay::cli
