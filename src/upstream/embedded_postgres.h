// pgrelay's private PostgreSQL: found, initialized on first run, started, supervised, stopped.
//
// The cluster lives in a directory of pgrelay's data dir (DATA/pg) and listens only on a Unix
// socket in a directory only its OS user can enter, so nothing but pgrelay (and root) reaches
// it, with local trust authentication. As root, PostgreSQL runs as an unprivileged OS user
// ("postgres" when it exists, else "nobody"): postgres refuses to run as root. When that user
// cannot reach DATA (e.g. a checkout under /root, mode 0700), the cluster is placed in
// /var/lib/pgrelay/clusters/<id> and DATA/pg is a symlink to it.
//
// The postmaster runs in its own session (a terminal's Ctrl-C reaches pgrelay, which stops it
// after its own clients) and gets SIGQUIT if pgrelay dies (PR_SET_PDEATHSIG), so a kill -9 of
// pgrelay leaves no server behind; a postmaster that survived anyway, or a stale
// postmaster.pid, is cleaned up at the next start. A postmaster that dies is restarted.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "base/child_process.h"

namespace pgrelay::upstream {

struct EmbeddedOptions {
  std::string data_dir;  // pgrelay's data dir; the cluster goes in DATA/pg
  std::string bin_dir;   // empty: found with pg_config, PATH or /usr/lib/postgresql/*/bin
  std::string run_as;    // OS user when pgrelay runs as root; empty: postgres, else nobody
  std::string superuser = "postgres";  // the database superuser initdb creates
  // wal_level = logical instead of replica: for native capture, which decodes the WAL.
  bool logical_decoding = false;
  // Events worth a log line (initdb, restarts, relocation); called from pgrelay's threads.
  std::function<void(const std::string&)> on_event;
};

// Where PostgreSQL's server programs are and which major version they are.
struct PostgresInstall {
  std::string bin_dir;
  int major_version = 0;
};
// `hint` (a directory) is checked first; 58P01 naming the package to install when nothing is
// found.
Result<PostgresInstall> find_postgres_install(const std::string& hint);

class EmbeddedPostgres {
 public:
  // Initializes the cluster if needed, starts the postmaster and waits until it accepts
  // connections.
  static Result<std::unique_ptr<EmbeddedPostgres>> start(EmbeddedOptions options);
  ~EmbeddedPostgres();  // stop()
  EmbeddedPostgres(const EmbeddedPostgres&) = delete;
  EmbeddedPostgres& operator=(const EmbeddedPostgres&) = delete;

  // A libpq conninfo for `database` as the superuser, over the socket.
  std::string conninfo(const std::string& database) const;
  // Creates `name` unless it exists.
  Status ensure_database(const std::string& name);
  // Fast shutdown (clients are disconnected), waiting for the postmaster to exit; after 60 s
  // an immediate shutdown. Idempotent.
  void stop();

  const std::string& cluster_dir() const { return cluster_dir_; }
  const std::string& socket_dir() const { return socket_dir_; }
  const PostgresInstall& install() const { return install_; }
  int restarts() const;

 private:
  EmbeddedPostgres() = default;
  Status prepare();
  Status initialize_cluster();
  Status write_settings();
  void clean_stale_postmaster();
  Result<pid_t> launch();
  Status wait_until_ready(pid_t pid);
  void supervise();
  void event(const std::string& text) const;

  EmbeddedOptions options_;
  PostgresInstall install_;
  std::optional<OsUser> run_as_;  // set when we switch users (pgrelay runs as root)
  OsUser owner_;                  // who owns the cluster's files
  std::string cluster_dir_;
  std::string socket_dir_;
  std::string log_path_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  pid_t pid_ = 0;
  bool stopping_ = false;
  bool started_ = false;
  std::optional<Error> start_error_;
  int restarts_ = 0;
  std::thread supervisor_;
};

}  // namespace pgrelay::upstream
