// The libpq replication connection of `pgrelay recv`: connect, run commands, errors with hints.
#include "cli/recv_connection.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <optional>
#include <vector>

namespace pgrelay::cli {

namespace {

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

bool contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

// Waits until `fd` is ready for `events` or `stop_fd` is readable; false when it was stop_fd.
bool wait_for(int fd, short events, int stop_fd) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (stop_fd >= 0 && (fds[1].revents & POLLIN) != 0) return false;
    return true;  // ready, or an error the caller's next read or libpq reports
  }
}

// Reads a password from the controlling terminal without echo; nullopt when there is none
// or `stop_fd` became readable first.
std::optional<std::string> prompt_password(int stop_fd) {
  int fd = ::open("/dev/tty", O_RDWR | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  static constexpr char kPrompt[] = "Password: ";
  (void)!::write(fd, kPrompt, sizeof kPrompt - 1);
  termios saved{};
  bool restore = ::tcgetattr(fd, &saved) == 0;
  if (restore) {
    termios quiet = saved;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    ::tcsetattr(fd, TCSAFLUSH, &quiet);
  }
  std::string password;
  char c;
  bool got_line = false;
  while (wait_for(fd, POLLIN, stop_fd) && ::read(fd, &c, 1) == 1) {
    if (c == '\n' || c == '\r') {
      got_line = true;
      break;
    }
    password += c;
  }
  if (restore) ::tcsetattr(fd, TCSAFLUSH, &saved);
  (void)!::write(fd, "\n", 1);
  ::close(fd);
  if (!got_line && password.empty()) return std::nullopt;
  return password;
}

// Connects without blocking in libpq, so that `stop_fd` becoming readable (a signal) ends the
// attempt half way; the caller tells that case by readable(stop_fd).
PgConn connect_with(const std::string& target, const std::string* password, int stop_fd) {
  // dbname comes first so that the keywords after it override what the URL says: the
  // connection is always a logical replication one (pg_recvlogical does the same).
  std::vector<const char*> keys = {"dbname", "replication", "fallback_application_name"};
  std::vector<const char*> values = {target.empty() ? nullptr : target.c_str(), "database",
                                     "pgrelay recv"};
  if (password != nullptr) {
    keys.push_back("password");
    values.push_back(password->c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  PgConn conn(PQconnectStartParams(keys.data(), values.data(), 1));
  if (conn == nullptr || PQstatus(conn.get()) == CONNECTION_BAD) return conn;
  PostgresPollingStatusType state = PGRES_POLLING_WRITING;
  while (state != PGRES_POLLING_OK && state != PGRES_POLLING_FAILED) {
    short events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    if (!wait_for(PQsocket(conn.get()), events, stop_fd)) break;  // stopped half way
    state = PQconnectPoll(conn.get());
  }
  return conn;
}

}  // namespace

bool readable(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

void add_fix_hint(Error& error) {
  if (!error.hint.empty()) return;
  const std::string& m = error.message;
  const std::string& code = error.sqlstate;
  if (contains(m, "replication slot") && (code == "42704" || contains(m, "does not exist"))) {
    error.hint =
        "Create the slot with --create-slot (with --if-not-exists to keep it if it exists), "
        "or check its name in pg_replication_slots.";
  } else if (contains(m, "replication slot") &&
             (code == "42710" || contains(m, "already exists"))) {
    error.hint =
        "Leave out --create-slot to stream from the existing slot, add --if-not-exists, or "
        "drop it first with --drop-slot.";
  } else if (contains(m, "replication slot") && (code == "55006" || contains(m, "is active"))) {
    error.hint =
        "Another consumer is streaming from this slot: stop it (pg_stat_replication shows it) "
        "or use another slot.";
  } else if (contains(m, "wal_level")) {
    error.hint =
        "Set wal_level = logical (ALTER SYSTEM SET wal_level = logical) and restart the "
        "server, or run `pgrelay serve` in front of it, which needs no wal_level change.";
  } else if (contains(m, "publication") && (code == "42704" || contains(m, "does not exist"))) {
    error.hint =
        "Create it on the server, e.g. CREATE PUBLICATION name FOR TABLE t1, t2 (or FOR ALL "
        "TABLES), or name an existing one with --publication (see pg_publication).";
  } else if (contains(m, "must be superuser or replication role") ||
             contains(m, "permission denied to start WAL sender")) {
    error.hint =
        "Give the user the REPLICATION attribute: ALTER ROLE name REPLICATION; (as a "
        "superuser).";
  } else if (contains(m, "no pg_hba.conf entry for replication connection")) {
    error.hint =
        "Allow replication connections in pg_hba.conf, e.g. "
        "\"host replication USER ADDRESS/32 scram-sha-256\", then reload the server "
        "(SELECT pg_reload_conf()). Note that \"all\" in the database column does not cover "
        "replication.";
  } else if (contains(m, "no password supplied")) {
    error.hint =
        "Give the password in the URL (postgres://user:password@host/db), in PGPASSWORD or "
        "in ~/.pgpass.";
  } else if (contains(m, "password authentication failed")) {
    error.hint = "Check the password in the URL, PGPASSWORD or ~/.pgpass.";
  } else if (contains(m, "proto_version")) {
    error.hint = "PostgreSQL 15 supports --proto-version 1 to 3; 4 needs PostgreSQL 16 or later.";
  }
}

Result<PgConn> connect_replication(const std::string& target, bool may_prompt, int stop_fd) {
  auto stopped = [&] {
    return Error::make(sqlstate::kQueryCanceled, "stopped by a signal while connecting");
  };
  PgConn conn = connect_with(target, nullptr, stop_fd);
  if (conn == nullptr) {
    return Error::make(sqlstate::kInsufficientResources, "out of memory connecting to the server");
  }
  if (readable(stop_fd)) return stopped();
  if (PQstatus(conn.get()) == CONNECTION_BAD && PQconnectionNeedsPassword(conn.get()) &&
      may_prompt && ::isatty(STDIN_FILENO)) {
    if (auto password = prompt_password(stop_fd)) {
      conn = connect_with(target, &*password, stop_fd);
      if (conn == nullptr) {
        return Error::make(sqlstate::kInsufficientResources,
                           "out of memory connecting to the server");
      }
    }
    if (readable(stop_fd)) return stopped();
  }
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    Error error = Error::make(sqlstate::kConnectionException, trimmed(PQerrorMessage(conn.get())));
    add_fix_hint(error);
    return error;
  }
  return conn;
}

Error error_of(const PGresult* result, std::string_view fallback) {
  Error error;
  auto field = [&](int code) -> std::string {
    const char* v = result != nullptr ? PQresultErrorField(result, code) : nullptr;
    return v != nullptr ? v : "";
  };
  error.sqlstate = field(PG_DIAG_SQLSTATE);
  if (error.sqlstate.empty()) error.sqlstate = sqlstate::kConnectionException;
  error.message = field(PG_DIAG_MESSAGE_PRIMARY);
  if (error.message.empty() && result != nullptr) {
    error.message = trimmed(PQresultErrorMessage(result));
  }
  if (error.message.empty()) error.message = std::string(fallback);
  error.detail = field(PG_DIAG_MESSAGE_DETAIL);
  error.hint = field(PG_DIAG_MESSAGE_HINT);
  add_fix_hint(error);
  return error;
}

Result<PgResult> run_command(PGconn* conn, const std::string& command, ExecStatusType expected) {
  PgResult result(PQexec(conn, command.c_str()));
  if (result == nullptr || PQresultStatus(result.get()) != expected) {
    Error error = error_of(result.get(), trimmed(PQerrorMessage(conn)));
    if (result != nullptr && PQresultStatus(result.get()) != PGRES_FATAL_ERROR &&
        PQresultStatus(result.get()) != PGRES_NONFATAL_ERROR) {
      error.sqlstate = sqlstate::kProtocolViolation;
      error.message = std::string("unexpected result ") +
                      PQresStatus(PQresultStatus(result.get())) + " for command";
    }
    error.detail =
        error.detail.empty() ? "Command: " + command : error.detail + "\nCommand: " + command;
    return error;
  }
  return result;
}

std::string quote_identifier(PGconn* conn, std::string_view name) {
  char* quoted = PQescapeIdentifier(conn, name.data(), name.size());
  if (quoted != nullptr) {
    std::string out(quoted);
    PQfreemem(quoted);
    return out;
  }
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

std::string quote_repl_literal(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + '\'';
}

}  // namespace pgrelay::cli
