// pgrelay's private PostgreSQL: found, initialized on first run, started, supervised, stopped.
#include "upstream/embedded_postgres.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/thread_name.h"

namespace pgrelay::upstream {
namespace fs = std::filesystem;
namespace {

constexpr int kPort = 5432;  // only names the socket file: the socket directory is private
constexpr auto kStartTimeout = std::chrono::seconds(120);
constexpr auto kStopTimeout = std::chrono::seconds(60);

// Runs a shell command line and returns its first line of output ("" on failure).
std::string first_output_line(const std::string& command) {
  std::string line;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    std::array<char, 512> buffer{};
    if (std::fgets(buffer.data(), buffer.size(), pipe)) line = buffer.data();
    ::pclose(pipe);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool is_server_bin_dir(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "postgres", ec) &&
         fs::is_regular_file(dir / "initdb", ec) && ::access((dir / "postgres").c_str(), X_OK) == 0;
}

// "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> 15.
int server_major_version(const fs::path& dir) {
  std::string line = first_output_line(shell_quote((dir / "postgres").string()) + " --version");
  auto paren = line.find(')');
  if (paren == std::string::npos) return 0;
  return std::atoi(line.c_str() + paren + 1);
}

// A libpq conninfo value, quoted.
std::string conninfo_value(const std::string& value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

// Whether `user` may search (x) every directory from / down to and including `dir`, by the
// mode bits (ACLs are not consulted).
bool can_traverse(const fs::path& dir, const OsUser& user) {
  fs::path path;
  for (const auto& part : dir) {
    path /= part;
    struct stat info;
    if (::stat(path.c_str(), &info) != 0) return true;  // created later by us, for the user
    mode_t bit = S_IXOTH;
    if (info.st_uid == user.uid) {
      bit = S_IXUSR;
    } else if (info.st_gid == user.gid || std::find(user.groups.begin(), user.groups.end(),
                                                    info.st_gid) != user.groups.end()) {
      bit = S_IXGRP;
    }
    if ((info.st_mode & bit) == 0) return false;
  }
  return true;
}

std::string hex_id(const std::string& text) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016zx", std::hash<std::string>{}(text));
  return buffer;
}

Status make_private_dir(const fs::path& dir, const OsUser& owner) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return Error::make(sqlstate::kIoError,
                       "could not create directory \"" + dir.string() + "\": " + ec.message());
  }
  if (::chmod(dir.c_str(), 0700) != 0 ||
      (::geteuid() == 0 && ::chown(dir.c_str(), owner.uid, owner.gid) != 0)) {
    return Error::make(sqlstate::kIoError, "could not give directory \"" + dir.string() +
                                               "\" to user " + owner.name + ": " +
                                               std::strerror(errno));
  }
  return Status::ok_status();
}

std::string tail_of_file(const std::string& path, std::size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += all[i] + "\n";
  }
  if (!out.empty()) out.pop_back();
  return out;
}

bool process_alive(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

// Whether `pid` is a postmaster of `cluster_dir` (its command line names the directory).
bool is_postmaster_of(pid_t pid, const std::string& cluster_dir) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  return cmdline.find("postgres") != std::string::npos &&
         cmdline.find(" " + cluster_dir + " ") != std::string::npos;
}

}  // namespace

Result<PostgresInstall> find_postgres_install(const std::string& hint) {
  std::vector<fs::path> candidates;
  if (!hint.empty()) {
    if (!is_server_bin_dir(hint)) {
      return Error::make("58P01",
                         "no PostgreSQL server programs (postgres, initdb) in \"" + hint + "\"",
                         "Point --pg-bin at the bin directory of a PostgreSQL installation, e.g. "
                         "/usr/lib/postgresql/15/bin.");
    }
    candidates.emplace_back(hint);
  }
  if (std::string bindir = first_output_line("pg_config --bindir 2>/dev/null"); !bindir.empty()) {
    candidates.emplace_back(bindir);
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream entries(path);
    for (std::string entry; std::getline(entries, entry, ':');) candidates.emplace_back(entry);
  }
  // Debian and Ubuntu keep server programs off PATH, one directory per major version: take
  // the newest.
  std::vector<std::pair<int, fs::path>> versioned;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    int major = std::atoi(entry.path().filename().c_str());
    if (major > 0) versioned.emplace_back(major, entry.path() / "bin");
  }
  std::sort(versioned.rbegin(), versioned.rend());
  for (const auto& [major, dir] : versioned) candidates.push_back(dir);

  for (const auto& dir : candidates) {
    if (!is_server_bin_dir(dir)) continue;
    int major = server_major_version(dir);
    if (major == 0) continue;
    return PostgresInstall{dir.string(), major};
  }
  return Error::make("58P01", "no PostgreSQL server found for pgrelay's private instance",
                     "Install one (apt-get install postgresql-15), point --pg-bin at its bin "
                     "directory, or serve an existing server with --upstream URL.");
}

Result<std::unique_ptr<EmbeddedPostgres>> EmbeddedPostgres::start(EmbeddedOptions options) {
  std::unique_ptr<EmbeddedPostgres> pg(new EmbeddedPostgres());
  pg->options_ = std::move(options);
  if (auto prepared = pg->prepare(); !prepared.ok()) return prepared.error();
  if (auto initialized = pg->initialize_cluster(); !initialized.ok()) {
    return initialized.error();
  }
  if (auto written = pg->write_settings(); !written.ok()) return written.error();

  EmbeddedPostgres* self = pg.get();
  pg->supervisor_ = start_named_thread("pg-supervisor", [self] { self->supervise(); });
  std::unique_lock lock(pg->mu_);
  pg->cv_.wait(lock, [&] { return pg->started_ || pg->start_error_.has_value(); });
  if (pg->start_error_) {
    Error error = *pg->start_error_;
    lock.unlock();
    pg->stop();
    return error;
  }
  return pg;
}

EmbeddedPostgres::~EmbeddedPostgres() {
  stop();
}

void EmbeddedPostgres::event(const std::string& text) const {
  if (options_.on_event) options_.on_event(text);
}

Status EmbeddedPostgres::prepare() {
  auto found = find_postgres_install(options_.bin_dir);
  if (!found.ok()) return found.error();
  install_ = *found;

  if (::geteuid() == 0) {
    // postgres refuses to run as root: run it as an unprivileged user.
    std::string name = options_.run_as;
    if (name.empty()) name = OsUser::lookup("postgres").ok() ? "postgres" : "nobody";
    auto user = OsUser::lookup(name);
    if (!user.ok()) return user.error();
    if (user->uid == 0) {
      return Error::make(sqlstate::kInvalidParameterValue,
                         "PostgreSQL cannot run as root (--run-as " + name + ")",
                         "Name an unprivileged OS user with --run-as.");
    }
    run_as_ = *user;
    owner_ = *user;
  } else {
    owner_ = OsUser::current();
  }

  std::error_code ec;
  fs::path data = fs::weakly_canonical(fs::absolute(options_.data_dir), ec);
  if (ec) data = fs::absolute(options_.data_dir);
  fs::create_directories(data, ec);
  if (ec) {
    return Error::make(sqlstate::kIoError, "could not create data directory \"" + data.string() +
                                               "\": " + ec.message());
  }
  fs::path link = data / "pg";
  if (fs::is_symlink(link, ec)) {
    fs::path target = fs::read_symlink(link, ec);
    cluster_dir_ = (target.is_absolute() ? target : data / target).lexically_normal().string();
  } else if (!fs::exists(link, ec) && run_as_ && !can_traverse(data, owner_)) {
    // The OS user cannot reach DATA: keep the cluster where it can, linked from DATA/pg.
    fs::path home = fs::path("/var/lib/pgrelay/clusters") / hex_id(data.string());
    fs::create_directories(home.parent_path(), ec);
    fs::create_symlink(home, link, ec);
    if (ec) {
      return Error::make(sqlstate::kIoError, "could not link \"" + link.string() + "\" to \"" +
                                                 home.string() + "\": " + ec.message());
    }
    event("OS user " + owner_.name + " cannot enter " + data.string() +
          "; the private PostgreSQL cluster lives in " + home.string() + " (linked from " +
          link.string() + ")");
    cluster_dir_ = home.string();
  } else {
    cluster_dir_ = link.string();
  }
  // A Unix socket path holds at most 107 bytes; a deep data dir gets a socket dir in /tmp.
  socket_dir_ = cluster_dir_;
  if (socket_dir_.size() + std::strlen("/.s.PGSQL.5432.lock") > 100) {
    socket_dir_ = "/tmp/pgrelay-" + hex_id(cluster_dir_);
    PGRELAY_TRY(make_private_dir(socket_dir_, owner_));
  }
  log_path_ = cluster_dir_ + "/postgresql.log";
  return Status::ok_status();
}

Status EmbeddedPostgres::initialize_cluster() {
  std::error_code ec;
  fs::path cluster = cluster_dir_;
  if (fs::exists(cluster / "PG_VERSION", ec)) {
    std::ifstream in(cluster / "PG_VERSION");
    int version = 0;
    in >> version;
    if (version != install_.major_version) {
      return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                         "the private cluster in \"" + cluster_dir_ + "\" was made by PostgreSQL " +
                             std::to_string(version) + ", but the server found is PostgreSQL " +
                             std::to_string(install_.major_version) + " (" + install_.bin_dir + ")",
                         "Point --pg-bin at /usr/lib/postgresql/" + std::to_string(version) +
                             "/bin, or move the directory away to start afresh.");
    }
    return Status::ok_status();
  }
  if (fs::exists(cluster, ec) && !fs::is_empty(cluster, ec)) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "\"" + cluster_dir_ + "\" exists but holds no PostgreSQL cluster",
                       "Move it away (pgrelay keeps its private PostgreSQL there).");
  }
  // initdb into a scratch directory renamed into place when complete: a run killed during
  // initdb leaves no half-made cluster behind.
  fs::path scratch = cluster_dir_ + ".initdb";
  fs::remove_all(scratch, ec);
  PGRELAY_TRY(make_private_dir(scratch, owner_));
  std::string initdb_log = cluster_dir_ + ".initdb.log";
  event("initializing a private PostgreSQL " + std::to_string(install_.major_version) +
        " cluster in " + cluster_dir_);
  ChildSpec initdb;
  initdb.argv = {install_.bin_dir + "/initdb",
                 "-D",
                 scratch.string(),
                 "-U",
                 options_.superuser,
                 "--encoding=UTF8",
                 "--no-locale",
                 "--auth-local=trust",
                 "--auth-host=reject",
                 "--no-sync"};
  initdb.run_as = run_as_;
  initdb.output_path = initdb_log;
  if (auto ran = run_child(initdb); !ran.ok()) {
    Error error = ran.error();
    error.message = "initdb failed: " + error.message;
    error.detail = tail_of_file(initdb_log, 5);
    error.hint = "Read " + initdb_log + "; remove " + scratch.string() + " to retry.";
    return error;
  }
  // The cluster includes pgrelay's settings file, rewritten at every start.
  {
    std::ofstream conf(scratch / "postgresql.conf", std::ios::app);
    conf << "\n# pgrelay's settings for its private instance (rewritten at every start; "
            "ALTER SYSTEM overrides them)\ninclude 'pgrelay.conf'\n";
    if (!conf) {
      return Error::make(sqlstate::kIoError,
                         "could not write " + (scratch / "postgresql.conf").string());
    }
  }
  // initdb ran without fsync (seconds faster); one syncfs makes the cluster durable.
  if (int fd = ::open(scratch.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    ::syncfs(fd);
    ::close(fd);
  }
  if (fs::exists(cluster, ec)) fs::remove(cluster, ec);  // the empty directory, if any
  fs::rename(scratch, cluster, ec);
  if (ec) {
    return Error::make(sqlstate::kIoError, "could not move the new cluster into \"" + cluster_dir_ +
                                               "\": " + ec.message());
  }
  fs::remove(initdb_log, ec);
  return Status::ok_status();
}

Status EmbeddedPostgres::write_settings() {
  fs::path path = fs::path(cluster_dir_) / "pgrelay.conf";
  std::string text =
      "# Written by pgrelay at every start of its private instance. Use ALTER SYSTEM (or\n"
      "# postgresql.auto.conf) for settings of your own: they take precedence.\n"
      "listen_addresses = ''                # Unix socket only: clients come through pgrelay\n"
      "port = " +
      std::to_string(kPort) +
      "\n"
      "unix_socket_directories = " +
      conninfo_value(socket_dir_) +
      "\n"
      "unix_socket_permissions = 0700\n"
      "max_connections = 200               # zero-cache and friends open many\n"
      "shared_buffers = 128MB\n"
      "max_prepared_transactions = 0       # lets capture wake on NOTIFY\n"
      "track_commit_timestamp = on         # trigger capture sends each commit's own time\n"
      "wal_level = " +
      std::string(options_.logical_decoding ? "logical" : "replica") +
      "\n"
      "logging_collector = off\n"
      "log_line_prefix = '%m [%p] %q%u@%d '\n";
  fs::path scratch = path.string() + ".tmp";
  {
    std::ofstream out(scratch, std::ios::trunc);
    out << text;
    if (!out) return Error::make(sqlstate::kIoError, "could not write " + scratch.string());
  }
  if (::geteuid() == 0 && ::chown(scratch.c_str(), owner_.uid, owner_.gid) != 0) {
    return Error::make(sqlstate::kIoError, "could not give " + scratch.string() + " to user " +
                                               owner_.name + ": " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(scratch, path, ec);
  if (ec) return Error::make(sqlstate::kIoError, "could not write " + path.string());
  return Status::ok_status();
}

void EmbeddedPostgres::clean_stale_postmaster() {
  fs::path pidfile = fs::path(cluster_dir_) / "postmaster.pid";
  std::ifstream in(pidfile);
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 0) return;
  in.close();
  if (process_alive(pid) && is_postmaster_of(pid, cluster_dir_)) {
    // Left by an earlier run (we hold the data dir's lock, so no pgrelay owns it).
    event("stopping a PostgreSQL left running by an earlier pgrelay (pid " + std::to_string(pid) +
          ")");
    for (int sig : {SIGINT, SIGQUIT, SIGKILL}) {
      ::kill(pid, sig);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      while (process_alive(pid) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!process_alive(pid)) break;
    }
  }
  // postgres checks a stale postmaster.pid itself, but a recycled pid (common in containers)
  // makes it refuse to start; the file is known stale here.
  if (!process_alive(pid) || !is_postmaster_of(pid, cluster_dir_)) {
    std::error_code ec;
    fs::remove(pidfile, ec);
  }
}

Result<pid_t> EmbeddedPostgres::launch() {
  ChildSpec spec;
  spec.argv = {install_.bin_dir + "/postgres", "-D", cluster_dir_};
  spec.run_as = run_as_;
  spec.output_path = log_path_;
  spec.parent_death_signal = SIGQUIT;
  return spawn_child(spec);
}

Status EmbeddedPostgres::wait_until_ready(pid_t pid) {
  std::string conninfo = this->conninfo("postgres") + " connect_timeout=5";
  auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return Error::make(
          sqlstate::kSystemError,
          "the private PostgreSQL " + describe_wait_status(status) + " while starting",
          "Read " + log_path_ + ".", tail_of_file(log_path_, 5));
    }
    if (PQping(conninfo.c_str()) == PQPING_OK) return Status::ok_status();
    {
      std::unique_lock lock(mu_);
      if (stopping_) return Error::make(sqlstate::kSystemError, "stopped while starting");
      if (std::chrono::steady_clock::now() >= deadline) {
        return Error::make(sqlstate::kSystemError,
                           "the private PostgreSQL did not accept connections within " +
                               std::to_string(kStartTimeout.count()) + " s",
                           "Read " + log_path_ + ".", tail_of_file(log_path_, 5));
      }
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
}

void EmbeddedPostgres::supervise() {
  auto backoff = std::chrono::seconds(1);
  for (;;) {
    clean_stale_postmaster();
    auto launched_at = std::chrono::steady_clock::now();
    auto pid = launch();
    if (pid.ok()) {
      std::lock_guard lock(mu_);
      pid_ = *pid;
    }
    Status ready = pid.ok() ? wait_until_ready(*pid) : Status(pid.error());
    {
      std::lock_guard lock(mu_);
      if (!started_) {
        if (ready.ok()) {
          started_ = true;
        } else {
          start_error_ = ready.error();
        }
        cv_.notify_all();
      }
    }
    if (!pid.ok()) {
      event("could not start the private PostgreSQL: " + pid.error().message);
    } else {
      if (!ready.ok() && process_alive(*pid)) ::kill(*pid, SIGQUIT);
      int status = wait_child(*pid);
      std::lock_guard lock(mu_);
      pid_ = 0;
      cv_.notify_all();
      if (stopping_ || start_error_) return;
      event("the private PostgreSQL " + describe_wait_status(status) + "; restarting in " +
            std::to_string(backoff.count()) + " s (see " + log_path_ + ")");
    }
    std::unique_lock lock(mu_);
    if (start_error_) return;
    ++restarts_;
    if (std::chrono::steady_clock::now() - launched_at > std::chrono::seconds(60)) {
      backoff = std::chrono::seconds(1);  // it had been up a while: not a crash loop
    }
    if (cv_.wait_for(lock, backoff, [&] { return stopping_; })) return;
    backoff = std::min(backoff * 2, std::chrono::seconds(30));
  }
}

void EmbeddedPostgres::stop() {
  std::unique_lock lock(mu_);
  if (!supervisor_.joinable()) return;
  stopping_ = true;
  if (pid_ != 0) ::kill(pid_, SIGINT);  // fast shutdown: disconnect clients, checkpoint
  cv_.notify_all();
  if (!cv_.wait_for(lock, kStopTimeout, [&] { return pid_ == 0; })) {
    event("the private PostgreSQL did not stop within " + std::to_string(kStopTimeout.count()) +
          " s; immediate shutdown");
    ::kill(pid_, SIGQUIT);
  }
  lock.unlock();
  supervisor_.join();
}

int EmbeddedPostgres::restarts() const {
  std::lock_guard lock(mu_);
  return restarts_;
}

std::string EmbeddedPostgres::conninfo(const std::string& database) const {
  return "host=" + conninfo_value(socket_dir_) + " port=" + std::to_string(kPort) +
         " user=" + conninfo_value(options_.superuser) + " dbname=" + conninfo_value(database);
}

Status EmbeddedPostgres::ensure_database(const std::string& name) {
  PGconn* conn = PQconnectdb(conninfo("postgres").c_str());
  auto finish = [&] { PQfinish(conn); };
  if (PQstatus(conn) != CONNECTION_OK) {
    Error error = Error::make(
        sqlstate::kConnectionException,
        std::string("could not connect to the private PostgreSQL: ") + PQerrorMessage(conn));
    finish();
    return error;
  }
  const char* params[] = {name.c_str()};
  PGresult* found = PQexecParams(conn, "SELECT 1 FROM pg_database WHERE datname = $1", 1, nullptr,
                                 params, nullptr, nullptr, 0);
  bool exists = PQresultStatus(found) == PGRES_TUPLES_OK && PQntuples(found) == 1;
  PQclear(found);
  if (!exists) {
    char* ident = PQescapeIdentifier(conn, name.c_str(), name.size());
    std::string sql = std::string("CREATE DATABASE ") + (ident ? ident : "\"\"");
    PQfreemem(ident);
    PGresult* created = PQexec(conn, sql.c_str());
    const char* code = PQresultErrorField(created, PG_DIAG_SQLSTATE);
    bool ok = PQresultStatus(created) == PGRES_COMMAND_OK ||
              (code && std::string(code) == "42P04");  // created meanwhile
    if (!ok) {
      Error error =
          Error::make(sqlstate::kInvalidParameterValue, "could not create database \"" + name +
                                                            "\": " + PQresultErrorMessage(created));
      PQclear(created);
      finish();
      return error;
    }
    PQclear(created);
    event("created database \"" + name + "\"");
  }
  finish();
  return Status::ok_status();
}

}  // namespace pgrelay::upstream
