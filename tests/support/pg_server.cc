// Starts, queries and removes a throwaway PostgreSQL 15 cluster for tests.
#include "pg_server.h"

#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

namespace pgrelay::test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDebianBindir = "/usr/lib/postgresql/15/bin";
constexpr int kStartAttempts = 5;
constexpr std::chrono::seconds kReloadTimeout{10};

// The unprivileged account initdb/pg_ctl run as when the test runs as root (Postgres refuses root).
struct RunAs {
  uid_t uid = 0;
  gid_t gid = 0;
};

std::optional<RunAs> postgres_account_if_root() {
  if (geteuid() != 0) return std::nullopt;
  struct passwd* pw = getpwnam("postgres");
  if (pw == nullptr) {
    throw PgError(
        "tests run as root but there is no `postgres` user to run PostgreSQL as; install the "
        "Debian package postgresql-15 (it creates the user) or run the tests as a normal user");
  }
  return RunAs{pw->pw_uid, pw->pw_gid};
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr interleaved
};

std::string join_argv(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += a;
  }
  return s;
}

// Runs argv[0] (an absolute path) with stdin from /dev/null and collects its output. Only
// async-signal-safe calls happen between fork and exec.
CommandResult run_command(const std::vector<std::string>& argv, const std::optional<RunAs>& as,
                          const std::string& cwd) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw PgError(std::string("pipe2: ") + std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    throw PgError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    if (as) {
      gid_t gid = as->gid;
      if (setgroups(1, &gid) != 0 || setgid(as->gid) != 0 || setuid(as->uid) != 0) _exit(126);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  CommandResult result;
  char buf[4096];
  for (;;) {
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n > 0) {
      result.output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    if (result.exit_code == 127) result.output += "\n(could not execute " + argv[0] + ")";
    if (result.exit_code == 126) result.output += "\n(could not switch user or directory)";
  } else {
    result.exit_code = 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  return result;
}

bool is_executable(const std::string& path) {
  return access(path.c_str(), X_OK) == 0;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Every pg_config on PATH, in PATH order.
std::vector<std::string> pg_configs_on_path() {
  std::vector<std::string> found;
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!rest.empty()) {
    const auto colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    if (!dir.empty() && is_executable(dir + "/pg_config")) found.push_back(dir + "/pg_config");
  }
  return found;
}

bool is_postgres15_bindir(const std::string& dir) {
  const std::string postgres = dir + "/postgres";
  if (!is_executable(postgres) || !is_executable(dir + "/initdb") ||
      !is_executable(dir + "/pg_ctl")) {
    return false;
  }
  CommandResult version = run_command({postgres, "--version"}, std::nullopt, {});
  return version.exit_code == 0 && version.output.find(") 15.") != std::string::npos;
}

// $PGRELAY_PG_BINDIR when set (and then only it), else the bindir of a pg_config on PATH that
// reports version 15, else Debian's postgresql-15 location.
std::string find_bindir() {
  if (const char* env = std::getenv("PGRELAY_PG_BINDIR"); env != nullptr && *env != '\0') {
    if (is_postgres15_bindir(env)) return env;
    throw PgError(std::string("PGRELAY_PG_BINDIR=") + env +
                  " does not hold PostgreSQL 15's postgres, initdb and pg_ctl");
  }
  std::vector<std::string> candidates;
  for (const std::string& pg_config : pg_configs_on_path()) {
    CommandResult version = run_command({pg_config, "--version"}, std::nullopt, {});
    if (version.exit_code != 0 || version.output.find("PostgreSQL 15.") == std::string::npos) {
      continue;
    }
    CommandResult bindir = run_command({pg_config, "--bindir"}, std::nullopt, {});
    if (bindir.exit_code == 0) candidates.push_back(trim(bindir.output));
  }
  candidates.emplace_back(kDebianBindir);
  for (const auto& dir : candidates) {
    if (is_postgres15_bindir(dir)) return dir;
  }
  throw PgError(
      "PostgreSQL 15 server binaries not found (looked in `pg_config --bindir` of a version 15 "
      "pg_config on PATH and in " +
      std::string(kDebianBindir) +
      "). Install the Debian package postgresql-15 (apt-get install postgresql-15), or point "
      "PGRELAY_PG_BINDIR at PostgreSQL 15's bin directory");
}

// A port that was free a moment ago; start() retries if someone takes it in between.
int pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw PgError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    close(fd);
    throw PgError(std::string("bind 127.0.0.1:0: ") + std::strerror(err));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rewrites a file in place so it keeps its owner (the postgres user when running as root).
void write_file_in_place(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw PgError("cannot write " + path);
}

void append_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << text;
  out.close();
  if (!out) throw PgError("cannot write " + path);
}

void chown_to(const std::string& path, const std::optional<RunAs>& as) {
  if (as && chown(path.c_str(), as->uid, as->gid) != 0) {
    throw PgError("chown " + path + ": " + std::strerror(errno));
  }
}

// Watchdog: a detached shell that waits for EOF on its stdin (the test process holds the only
// write end) and then stops the postmaster and deletes the directory, so a crashed or killed
// test leaves nothing behind. After a normal shutdown it finds nothing to do.
constexpr const char* kWatchdogScript = R"sh(
while read -r _; do :; done
pidfile="$1/data/postmaster.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL "$pid" 2>/dev/null
  fi
fi
rm -rf "$1"
)sh";

std::pair<int, int> spawn_watchdog(const std::string& dir) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw PgError(std::string("pipe2: ") + std::strerror(errno));
  const std::string sh = "/bin/sh";
  const std::string dash_c = "-c";
  const std::string name = "pgrelay-pg-watchdog";
  std::vector<char*> argv = {const_cast<char*>(sh.c_str()),      const_cast<char*>(dash_c.c_str()),
                             const_cast<char*>(kWatchdogScript), const_cast<char*>(name.c_str()),
                             const_cast<char*>(dir.c_str()),     nullptr};
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw PgError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setsid();  // survive a Ctrl-C aimed at the test's process group
    dup2(fds[0], 0);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[0]);
  return {fds[1], pid};
}

Rows rows_of(PGresult* res) {
  Rows rows;
  const int n = PQntuples(res);
  const int m = PQnfields(res);
  rows.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Row row;
    row.reserve(static_cast<size_t>(m));
    for (int j = 0; j < m; ++j) {
      if (PQgetisnull(res, i, j)) {
        row.emplace_back(std::nullopt);
      } else {
        row.emplace_back(
            std::string(PQgetvalue(res, i, j), static_cast<size_t>(PQgetlength(res, i, j))));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

std::string sql_literal(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  out += '\'';
  // E'' syntax is not needed: standard_conforming_strings is on by default.
  return out;
}

std::string sql_identifier(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

// ---- PgConnection ----

PgConnection::PgConnection(const std::string& conninfo) {
  conn_ = PQconnectdb(conninfo.c_str());
  if (conn_ == nullptr) throw PgError("PQconnectdb returned NULL (out of memory)");
  if (PQstatus(conn_) != CONNECTION_OK) {
    std::string msg = "connection to \"" + conninfo + "\" failed: " + PQerrorMessage(conn_);
    PQfinish(conn_);
    conn_ = nullptr;
    throw PgError(trim(msg));
  }
  // NOTICEs ("truncate cascades to ...") would only clutter test output.
  PQsetNoticeProcessor(
      conn_, [](void*, const char*) {}, nullptr);
}

PgConnection::~PgConnection() {
  if (conn_ != nullptr) PQfinish(conn_);
}

PgConnection::PgConnection(PgConnection&& other) noexcept
    : conn_(std::exchange(other.conn_, nullptr)) {}

PgConnection& PgConnection::operator=(PgConnection&& other) noexcept {
  if (this != &other) {
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = std::exchange(other.conn_, nullptr);
  }
  return *this;
}

Rows PgConnection::exec(const std::string& sql) {
  if (conn_ == nullptr) throw PgError("exec on a closed connection");
  PGresult* res = PQexec(conn_, sql.c_str());
  const ExecStatusType st = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    std::string state;
    std::string msg;
    if (res != nullptr) {
      if (const char* s = PQresultErrorField(res, PG_DIAG_SQLSTATE)) state = s;
      msg = PQresultErrorMessage(res);
    }
    if (msg.empty()) msg = PQerrorMessage(conn_);
    PQclear(res);
    throw PgError(trim(msg) + (state.empty() ? "" : " [SQLSTATE " + state + "]") +
                      "\n  while running: " + sql.substr(0, 500),
                  state);
  }
  Rows rows = rows_of(res);
  PQclear(res);
  return rows;
}

std::string PgConnection::scalar(const std::string& sql) {
  Rows rows = exec(sql);
  if (rows.size() != 1 || rows[0].size() != 1 || !rows[0][0]) {
    throw PgError("expected one non-NULL value from: " + sql);
  }
  return *rows[0][0];
}

// ---- PgServer ----

std::map<std::string, std::string> PgServerOptions::default_settings() {
  return {
      {"wal_level", "logical"},
      {"max_prepared_transactions", "10"},
      {"logical_decoding_work_mem", "64kB"},
      {"max_wal_senders", "20"},
      {"max_replication_slots", "20"},
      {"fsync", "off"},
      {"synchronous_commit", "off"},
      {"full_page_writes", "off"},
      {"shared_buffers", "32MB"},
  };
}

PgServer::PgServer(PgServerOptions options) : options_(std::move(options)) {
  bindir_ = find_bindir();
  const auto as = postgres_account_if_root();

  // /tmp rather than $TMPDIR: the postgres user must reach it, and socket paths must stay short.
  std::string templ = "/tmp/pgrelay-pg-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    throw PgError(std::string("mkdtemp: ") + std::strerror(errno));
  }
  base_dir_ = templ;
  data_dir_ = base_dir_ + "/data";
  socket_dir_ = base_dir_ + "/sock";
  log_path_ = base_dir_ + "/server.log";
  try {
    auto [fd, pid] = spawn_watchdog(base_dir_);
    watchdog_pipe_ = fd;
    watchdog_pid_ = pid;
    if (mkdir(socket_dir_.c_str(), 0700) != 0) {
      throw PgError("mkdir " + socket_dir_ + ": " + std::strerror(errno));
    }
    chown_to(base_dir_, as);
    chown_to(socket_dir_, as);
    init_cluster();
    start();
  } catch (...) {
    stop();
    throw;
  }
}

PgServer::~PgServer() {
  stop();
}

void PgServer::init_cluster() {
  const auto as = postgres_account_if_root();
  const std::vector<std::string> argv = {
      bindir_ + "/initdb", "-D", data_dir_,          "-U", "postgres", "-E", "UTF8", "--locale=C",
      "--auth=trust",      "-N", "--no-instructions"};
  CommandResult r = run_command(argv, as, base_dir_);
  if (r.exit_code != 0) {
    throw PgError(join_argv(argv) + " failed (exit " + std::to_string(r.exit_code) + "):\n" +
                  r.output);
  }

  std::string conf = "\n# pgrelay test settings\n";
  conf += "listen_addresses = '127.0.0.1'\n";
  conf += "unix_socket_directories = '" + socket_dir_ + "'\n";
  for (const auto& [name, value] : options_.settings) conf += name + " = " + value + "\n";
  conf += "pgrelay.reload_generation = 0\n";
  append_file(data_dir_ + "/postgresql.conf", conf);

  extra_hba_ = options_.hba_lines;
  write_hba();
}

void PgServer::write_hba() {
  // initdb's own trust lines stay last; the admin line stays first so helpers always connect.
  static constexpr const char* kInitdbHba = "pg_hba.conf.initdb";
  const std::string path = data_dir_ + "/pg_hba.conf";
  const std::string saved = base_dir_ + "/" + kInitdbHba;
  if (!fs::exists(saved)) fs::copy_file(path, saved);
  std::string text = "# pgrelay test admin connections (unix socket)\nlocal all postgres trust\n";
  if (!extra_hba_.empty()) {
    text += "# added by tests\n";
    for (const auto& line : extra_hba_) text += line + "\n";
  }
  text += read_file(saved);
  write_file_in_place(path, text);
}

void PgServer::start() {
  const auto as = postgres_account_if_root();
  std::string last_log;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    port_ = pick_free_port();
    const std::size_t log_offset = read_file(log_path_).size();
    CommandResult r = run_command({bindir_ + "/pg_ctl", "-D", data_dir_, "-l", log_path_, "-w",
                                   "-t", "60", "-o", "-p " + std::to_string(port_), "start"},
                                  as, base_dir_);
    if (r.exit_code == 0) {
      running_ = true;
      return;
    }
    std::string log = read_file(log_path_);
    last_log = (log_offset <= log.size() ? log.substr(log_offset) : log) + "\n" + r.output;
    const bool port_taken =
        last_log.find("could not bind") != std::string::npos ||
        last_log.find("could not create any TCP/IP sockets") != std::string::npos ||
        last_log.find("Address already in use") != std::string::npos;
    if (!port_taken) break;
  }
  throw PgError("PostgreSQL failed to start; server log:\n" + last_log);
}

void PgServer::stop() noexcept {
  admin_.clear();
  if (running_) {
    try {
      const auto as = postgres_account_if_root();
      CommandResult r = run_command(
          {bindir_ + "/pg_ctl", "-D", data_dir_, "-m", "immediate", "-w", "-t", "60", "stop"}, as,
          base_dir_);
      if (r.exit_code != 0) {
        std::fprintf(stderr, "pgrelay test: pg_ctl stop failed:\n%s\n", r.output.c_str());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pgrelay test: pg_ctl stop failed: %s\n", e.what());
    }
    running_ = false;
  }
  if (!base_dir_.empty()) {
    std::error_code ec;
    // The watchdog still kills a postmaster that pg_ctl failed to stop: leave its pid file then.
    if (!fs::exists(data_dir_ + "/postmaster.pid", ec)) fs::remove_all(base_dir_, ec);
  }
  if (watchdog_pipe_ >= 0) {
    close(watchdog_pipe_);
    watchdog_pipe_ = -1;
  }
  if (watchdog_pid_ > 0) {
    int status = 0;
    while (waitpid(watchdog_pid_, &status, 0) < 0 && errno == EINTR) {
    }
    watchdog_pid_ = -1;
  }
}

std::string PgServer::conninfo(const std::string& db, const std::string& user,
                               const std::string& extra) const {
  std::string s =
      "host=" + host() + " port=" + std::to_string(port_) + " dbname=" + db + " user=" + user;
  if (!extra.empty()) s += " " + extra;
  return s;
}

std::string PgServer::uri(const std::string& db, const std::string& user) const {
  return "postgresql://" + user + "@" + host() + ":" + std::to_string(port_) + "/" + db;
}

PgConnection PgServer::connect_admin(const std::string& db, const std::string& extra) {
  std::string s =
      "host=" + socket_dir_ + " port=" + std::to_string(port_) + " dbname=" + db + " user=postgres";
  if (!extra.empty()) s += " " + extra;
  return PgConnection(s);
}

Rows PgServer::exec(const std::string& sql, const std::string& db) {
  auto& conn = admin_[db];
  if (!conn) conn = std::make_unique<PgConnection>(connect_admin(db));
  return conn->exec(sql);
}

std::string PgServer::scalar(const std::string& sql, const std::string& db) {
  auto& conn = admin_[db];
  if (!conn) conn = std::make_unique<PgConnection>(connect_admin(db));
  return conn->scalar(sql);
}

void PgServer::add_hba_lines(const std::vector<std::string>& lines) {
  extra_hba_.insert(extra_hba_.begin(), lines.begin(), lines.end());
  write_hba();
  const int generation = ++reload_generation_;
  append_file(data_dir_ + "/postgresql.conf",
              "pgrelay.reload_generation = " + std::to_string(generation) + "\n");
  exec("SELECT pg_reload_conf()");
  wait_for_reload(generation);
}

// The postmaster reloads postgresql.conf and then pg_hba.conf in one SIGHUP cycle, and every
// backend forked afterwards inherits both; so a new backend that sees the new generation proves
// that new connections get the new pg_hba.conf.
void PgServer::wait_for_reload(int generation) {
  const auto deadline = std::chrono::steady_clock::now() + kReloadTimeout;
  const std::string want = std::to_string(generation);
  std::string seen;
  while (std::chrono::steady_clock::now() < deadline) {
    PgConnection probe = connect_admin();
    seen = probe.scalar("SELECT current_setting('pgrelay.reload_generation')");
    if (seen == want) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw PgError("server did not reload its configuration within " +
                std::to_string(kReloadTimeout.count()) + "s (generation " + seen + ", want " +
                want + "); log:\n" + log());
}

void PgServer::create_role(const std::string& name, const std::optional<std::string>& password,
                           const std::string& attributes) {
  std::string sql = "CREATE ROLE " + sql_identifier(name) + " LOGIN";
  if (password) sql += " PASSWORD " + sql_literal(*password);
  if (!attributes.empty()) sql += " " + attributes;
  exec(sql);
}

std::string PgServer::log() const {
  return read_file(log_path_);
}

}  // namespace pgrelay::test
