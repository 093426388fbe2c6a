// A libpq connection for capture: queries with text parameters, results as values, errors as Error.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace pgrelay::capture {

// One result set; values are the bytes libpq returned (text or binary as requested).
class QueryResult {
 public:
  QueryResult() = default;
  explicit QueryResult(PGresult* res) : res_(res, &PQclear) {}

  int rows() const { return res_ ? PQntuples(res_.get()) : 0; }
  int columns() const { return res_ ? PQnfields(res_.get()) : 0; }
  bool is_null(int row, int col) const { return PQgetisnull(res_.get(), row, col) != 0; }
  // The value's bytes (empty for NULL).
  std::string_view value(int row, int col) const {
    return {PQgetvalue(res_.get(), row, col),
            static_cast<std::size_t>(PQgetlength(res_.get(), row, col))};
  }
  std::optional<std::string> get(int row, int col) const {
    if (is_null(row, col)) return std::nullopt;
    return std::string(value(row, col));
  }

 private:
  std::shared_ptr<PGresult> res_;
};

using Params = std::vector<std::optional<std::string>>;  // text parameters; nullopt is NULL

class PgSession;

// The rows of one statement as they arrive (libpq's single-row mode), so memory holds one row
// however many the statement returns. The session runs nothing else while a stream is open;
// destroying it first reads what is left, so the session is ready for its next statement.
class RowStream {
 public:
  ~RowStream();
  RowStream(const RowStream&) = delete;
  RowStream& operator=(const RowStream&) = delete;

  // Moves to the next row: true when there is one (in row(), as row 0), false after the last.
  // The server's error, if the statement fails partway, comes from here.
  Result<bool> next();
  const QueryResult& row() const { return row_; }
  // After next() said false: waits for the end of the statement's implicit transaction. The
  // last row comes before the commit (which, for a statement that wrote, waits for the
  // upstream's WAL flush), so a caller can act on the rows first; a failed commit is reported
  // here. The destructor waits too, and drops that error.
  Status finish();

 private:
  friend class PgSession;
  explicit RowStream(PgSession& session) : session_(session) {}
  // Reads to the end of the pipeline's Sync and leaves pipeline mode; the first error on the
  // way is returned (drain() drops it).
  Status read_to_sync();
  void drain();

  PgSession& session_;
  QueryResult row_;
  bool rows_ended_ = false;  // next() said false
  bool done_ = false;        // libpq has nothing more for this statement
};

class PgSession {
 public:
  // Connects with a libpq conninfo string; 08000 with libpq's message on failure.
  static Result<std::unique_ptr<PgSession>> connect(const std::string& conninfo);
  // The same with replication=database: a walsender connection that takes replication
  // commands (CREATE_REPLICATION_SLOT, START_REPLICATION) beside simple SQL.
  static Result<std::unique_ptr<PgSession>> connect_replication(const std::string& conninfo);
  ~PgSession();
  PgSession(const PgSession&) = delete;
  PgSession& operator=(const PgSession&) = delete;

  // Runs one statement (or, without params, several ';'-separated ones) and returns the result
  // of the last; server errors keep their SQLSTATE, message, detail and hint.
  Result<QueryResult> exec(const std::string& sql, const Params& params = {},
                           bool binary_result = false);
  Status run(const std::string& sql, const Params& params = {});
  // Like exec(), through a statement prepared as `name` on first use and kept for the session:
  // for statements run so often that planning them each time would cost more than running.
  Result<QueryResult> exec_prepared(const std::string& name, const std::string& sql,
                                    const Params& params, bool binary_result = false);

  // Like exec_prepared(), but the rows come one at a time as the server sends them, and the
  // last of them before the statement's implicit transaction ends (RowStream::finish).
  Result<std::unique_ptr<RowStream>> stream_prepared(const std::string& name,
                                                     const std::string& sql, const Params& params,
                                                     bool binary_result = false);

  // Quoted identifier / literal for generated SQL (PQescapeIdentifier / PQescapeLiteral).
  Result<std::string> ident(std::string_view name);
  Result<std::string> literal(std::string_view text);

  PGconn* raw() const { return conn_; }
  // Whether libpq still considers the connection usable (false after the server went away).
  bool connection_ok() const { return PQstatus(conn_) == CONNECTION_OK; }
  // The socket to wait on for notifications.
  int socket() const { return PQsocket(conn_); }
  // Reads what arrived on the socket without blocking and returns how many notifications
  // (LISTEN) it held; 08006 when the connection is gone.
  Result<int> drain_notifications();
  // Statements cancelled because a RowStream was left before its end. Each cancel is a
  // connection of its own to the server, and costs milliseconds: a loop must not make them.
  std::uint64_t cancels_sent() const { return cancels_sent_; }

  // `what` and libpq's last message on this connection, as `sqlstate`.
  Error connection_error(const std::string& what,
                         const char* sqlstate = sqlstate::kConnectionException) const;
  // The server's error in `res` (SQLSTATE, message, detail, hint), or nullopt when it carries
  // no SQLSTATE (libpq's own failures).
  static std::optional<Error> server_error(const PGresult* res);

 private:
  explicit PgSession(PGconn* conn) : conn_(conn) {}
  friend class RowStream;
  static Result<std::unique_ptr<PgSession>> adopt(PGconn* conn);
  Status prepare_once(const std::string& name, const std::string& sql, std::size_t params);
  // Takes ownership of `res`: the result, or its error (SQLSTATE kept).
  Result<QueryResult> finish(PGresult* res);

  PGconn* conn_ = nullptr;
  std::set<std::string> prepared_;
  std::uint64_t cancels_sent_ = 0;
};

// A transaction on a PgSession that rolls back unless committed, so that every error path
// leaves the upstream as it was. A guard that was never begun does nothing.
class PgTransaction {
 public:
  explicit PgTransaction(PgSession& session) : session_(session) {}
  ~PgTransaction() {
    if (open_) (void)session_.run("ROLLBACK");
  }
  PgTransaction(const PgTransaction&) = delete;
  PgTransaction& operator=(const PgTransaction&) = delete;

  Status begin() {
    PGRELAY_TRY(session_.run("BEGIN"));
    open_ = true;
    return {};
  }
  Status commit() {
    open_ = false;
    return session_.run("COMMIT");
  }

 private:
  PgSession& session_;
  bool open_ = false;
};

}  // namespace pgrelay::capture
