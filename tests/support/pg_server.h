// A throwaway PostgreSQL 15 server for tests: initdb in a temp dir, start, SQL helpers, stop and
// delete.
#pragma once

#include <libpq-fe.h>

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pgrelay::test {

// Thrown by the helpers below; gtest reports it (with the server's message) as a test failure.
class PgError : public std::runtime_error {
 public:
  PgError(std::string message, std::string sqlstate = {})
      : std::runtime_error(std::move(message)), sqlstate_(std::move(sqlstate)) {}
  // Empty when the error did not come from the server.
  const std::string& sqlstate() const { return sqlstate_; }

 private:
  std::string sqlstate_;
};

using Row = std::vector<std::optional<std::string>>;  // nullopt is SQL NULL
using Rows = std::vector<Row>;

// One libpq connection that throws PgError on failure.
class PgConnection {
 public:
  // Connects with a libpq conninfo string or URI; throws PgError with libpq's message on failure.
  explicit PgConnection(const std::string& conninfo);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;
  PgConnection(PgConnection&& other) noexcept;
  PgConnection& operator=(PgConnection&& other) noexcept;

  // Runs one or more ';'-separated statements; returns the rows of the last one as text.
  Rows exec(const std::string& sql);
  // The single value of a one-row, one-column result (throws if the shape differs or it is NULL).
  std::string scalar(const std::string& sql);

  PGconn* raw() const { return conn_; }

 private:
  PGconn* conn_ = nullptr;
};

// Server settings and pg_hba.conf lines applied before the first start.
struct PgServerOptions {
  // postgresql.conf settings; defaults suit logical replication tests. Values are written as-is,
  // so quote strings the way postgresql.conf wants ("'on'" is not needed for booleans).
  std::map<std::string, std::string> settings = default_settings();
  // pg_hba.conf lines placed before initdb's trust lines (first match wins).
  std::vector<std::string> hba_lines;

  static std::map<std::string, std::string> default_settings();
};

// Starts PostgreSQL 15 in the constructor and stops it (and deletes its files) in the destructor.
// A watchdog process also cleans up if the test process dies without running the destructor.
// Internal admin connections use the unix socket as superuser `postgres`; hba lines added by
// tests never apply to them.
class PgServer {
 public:
  // Throws PgError (with the server log when start fails, or naming the Debian package
  // postgresql-15 when the binaries are missing).
  explicit PgServer(PgServerOptions options = {});
  ~PgServer();
  PgServer(const PgServer&) = delete;
  PgServer& operator=(const PgServer&) = delete;

  int port() const { return port_; }
  // The TCP address the server listens on.
  std::string host() const { return "127.0.0.1"; }
  const std::string& socket_dir() const { return socket_dir_; }
  const std::string& data_dir() const { return data_dir_; }

  // libpq keyword/value string for TCP: "host=127.0.0.1 port=N dbname=D user=U" plus `extra`
  // (e.g. "replication=database password=x").
  std::string conninfo(const std::string& db = "postgres", const std::string& user = "postgres",
                       const std::string& extra = {}) const;
  // postgresql://user@127.0.0.1:N/db
  std::string uri(const std::string& db = "postgres", const std::string& user = "postgres") const;

  // Runs SQL as superuser on `db` over the unix socket (one cached connection per database).
  Rows exec(const std::string& sql, const std::string& db = "postgres");
  std::string scalar(const std::string& sql, const std::string& db = "postgres");
  // A fresh superuser connection over the unix socket (with optional extra conninfo).
  PgConnection connect_admin(const std::string& db = "postgres", const std::string& extra = {});

  // Prepends lines to pg_hba.conf (after the admin line) and reloads; returns once new
  // connections see the change.
  void add_hba_lines(const std::vector<std::string>& lines);
  // CREATE ROLE name LOGIN [PASSWORD 'password'] <attributes>, e.g. attributes = "REPLICATION".
  // password_encryption decides SCRAM or md5 (PG15 default: scram-sha-256).
  void create_role(const std::string& name, const std::optional<std::string>& password,
                   const std::string& attributes = {});

  // The server log so far (for diagnostics).
  std::string log() const;

 private:
  void init_cluster();
  void write_hba();
  void start();
  void stop() noexcept;
  void wait_for_reload(int generation);

  PgServerOptions options_;
  std::string bindir_;
  std::string base_dir_;  // temp dir holding everything below; removed by the destructor
  std::string data_dir_;
  std::string socket_dir_;
  std::string log_path_;
  int port_ = 0;
  bool running_ = false;
  int reload_generation_ = 0;
  std::vector<std::string> extra_hba_;
  int watchdog_pipe_ = -1;  // write end; its closing tells the watchdog to clean up
  int watchdog_pid_ = -1;
  std::map<std::string, std::unique_ptr<PgConnection>> admin_;
};

// Quotes a string as an SQL literal ('it''s').
std::string sql_literal(std::string_view s);
// Quotes an identifier ("a""b").
std::string sql_identifier(std::string_view s);

}  // namespace pgrelay::test
