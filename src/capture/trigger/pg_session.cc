// A libpq connection for capture: queries with text parameters, results as values, errors as Error.
#include "capture/trigger/pg_session.h"

namespace pgrelay::capture {
namespace {

std::string field(const PGresult* res, int code) {
  const char* v = PQresultErrorField(res, code);
  return v != nullptr ? v : "";
}

std::string trim_newline(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

Result<std::unique_ptr<PgSession>> PgSession::connect(const std::string& conninfo) {
  return adopt(PQconnectdb(conninfo.c_str()));
}

Result<std::unique_ptr<PgSession>> PgSession::connect_replication(const std::string& conninfo) {
  // dbname is expanded as a conninfo string or URL; the later keyword overrides what it set.
  const char* keys[] = {"dbname", "replication", nullptr};
  const char* values[] = {conninfo.c_str(), "database", nullptr};
  return adopt(PQconnectdbParams(keys, values, /*expand_dbname=*/1));
}

Result<std::unique_ptr<PgSession>> PgSession::adopt(PGconn* conn) {
  if (conn == nullptr) {
    return Error::make(sqlstate::kConnectionException, "could not allocate a libpq connection");
  }
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = trim_newline(PQerrorMessage(conn));
    PQfinish(conn);
    return Error::make(sqlstate::kConnectionException, "could not connect to upstream: " + msg);
  }
  // Notices (DROP ... CASCADE lists, "already exists, skipping") are not errors; libpq would
  // print them on stderr.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  // PostgreSQL compiles a plan with LLVM, anew on every execution, once its estimated cost
  // passes jit_above_cost, and the poller's enable_seqscan off puts any scan it cannot avoid (the
  // one-row wakeup table) far above that: measured 17 to 293 ms of JIT on single polls. pgrelay's
  // statements are short and never gain from it. (PostgreSQL 11 brought the setting; a failure
  // leaves the default, which is only slower.)
  if (PQserverVersion(conn) >= 110000) PQclear(PQexec(conn, "SET jit TO off"));
  return std::unique_ptr<PgSession>(new PgSession(conn));
}

PgSession::~PgSession() {
  if (conn_ != nullptr) PQfinish(conn_);
}

Error PgSession::connection_error(const std::string& what, const char* sqlstate) const {
  return Error::make(sqlstate, what + ": " + trim_newline(PQerrorMessage(conn_)));
}

std::optional<Error> PgSession::server_error(const PGresult* res) {
  std::string code = field(res, PG_DIAG_SQLSTATE);
  if (code.empty()) return std::nullopt;
  return Error{code, field(res, PG_DIAG_MESSAGE_PRIMARY), field(res, PG_DIAG_MESSAGE_DETAIL),
               field(res, PG_DIAG_MESSAGE_HINT)};
}

Result<QueryResult> PgSession::exec(const std::string& sql, const Params& params,
                                    bool binary_result) {
  PGresult* res = nullptr;
  if (params.empty() && !binary_result) {
    res = PQexec(conn_, sql.c_str());
  } else {
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
    res = PQexecParams(conn_, sql.c_str(), static_cast<int>(params.size()), nullptr, values.data(),
                       nullptr, nullptr, binary_result ? 1 : 0);
  }
  return finish(res);
}

Status PgSession::prepare_once(const std::string& name, const std::string& sql,
                               std::size_t params) {
  if (prepared_.contains(name)) return {};
  auto prepared =
      finish(PQprepare(conn_, name.c_str(), sql.c_str(), static_cast<int>(params), nullptr));
  if (!prepared.ok()) return prepared.error();
  prepared_.insert(name);
  return {};
}

Result<QueryResult> PgSession::exec_prepared(const std::string& name, const std::string& sql,
                                             const Params& params, bool binary_result) {
  PGRELAY_TRY(prepare_once(name, sql, params.size()));
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  return finish(PQexecPrepared(conn_, name.c_str(), static_cast<int>(params.size()), values.data(),
                               nullptr, nullptr, binary_result ? 1 : 0));
}

Result<std::unique_ptr<RowStream>> PgSession::stream_prepared(const std::string& name,
                                                              const std::string& sql,
                                                              const Params& params,
                                                              bool binary_result) {
  PGRELAY_TRY(prepare_once(name, sql, params.size()));
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  // In pipeline mode, with a Flush between the Execute and the Sync: the server sends the rows
  // once the statement has run, not after the Sync ends its implicit transaction (for a
  // statement that wrote, a commit that waits for the WAL flush).
  if (PQenterPipelineMode(conn_) == 0) return connection_error("could not enter pipeline mode");
  std::unique_ptr<RowStream> stream(new RowStream(*this));
  // On failure the stream, gone, reads what was sent to its end (no cancel: nothing is worth
  // stopping) and leaves pipeline mode.
  auto failed = [&](const char* what) {
    stream->rows_ended_ = true;
    return connection_error(what);
  };
  if (PQsendQueryPrepared(conn_, name.c_str(), static_cast<int>(params.size()), values.data(),
                          nullptr, nullptr, binary_result ? 1 : 0) == 0) {
    return failed("could not send query");
  }
  if (PQsetSingleRowMode(conn_) == 0) {
    // Cannot happen right after a send; the stream still reads the whole result correctly.
    return failed("could not read the result row by row");
  }
  if (PQsendFlushRequest(conn_) == 0 || PQpipelineSync(conn_) == 0) {
    return failed("could not send query");
  }
  return stream;
}

Result<bool> RowStream::next() {
  if (done_ || rows_ended_) return false;
  PGresult* res = PQgetResult(session_.conn_);
  if (res == nullptr) {
    drain();
    return session_.connection_error("query failed");
  }
  const ExecStatusType st = PQresultStatus(res);
  if (st == PGRES_SINGLE_TUPLE) {
    row_ = QueryResult(res);
    return true;
  }
  // The end of the rows (PGRES_TUPLES_OK with none, at CommandComplete; the transaction ends
  // at the Sync that follows) or an error.
  auto ended = session_.finish(res);
  row_ = QueryResult();
  if (!ended.ok()) {
    drain();
    return ended.error();
  }
  rows_ended_ = true;
  return false;
}

Status RowStream::finish() {
  if (done_) return {};
  if (!rows_ended_) {
    return Error::make(sqlstate::kInternalError, "a row stream was finished before its last row");
  }
  return read_to_sync();
}

Status RowStream::read_to_sync() {
  // What is left: the end of the statement's results (NULL), then the Sync's. An error on the
  // way (the commit failed, the connection broke) is the first one kept.
  std::optional<Error> error;
  int ends = 0;  // NULLs in a row: two mean libpq has nothing more (a broken connection)
  while (ends < 2) {
    PGresult* res = PQgetResult(session_.conn_);
    if (res == nullptr) {
      if (PQstatus(session_.conn_) == CONNECTION_BAD) break;
      ++ends;
      continue;
    }
    ends = 0;
    if (PQresultStatus(res) == PGRES_PIPELINE_SYNC) {
      PQclear(res);
      break;
    }
    auto result = session_.finish(res);
    if (!result.ok() && !error) error = result.error();
  }
  done_ = true;
  if (PQexitPipelineMode(session_.conn_) == 0 && !error) {
    error = session_.connection_error("could not leave pipeline mode");
  }
  if (error) return *error;
  return {};
}

void RowStream::drain() {
  (void)read_to_sync();
}

RowStream::~RowStream() {
  if (done_) return;
  if (rows_ended_) {
    drain();  // only the statement's end is left to read: nothing to cancel
    return;
  }
  // Left before its end: the server stops sending the rest rather than the client reading it
  // all for nothing. A cancel that arrives once the statement is over finds the session idle,
  // which ignores it, so the session's next statement is never the one cancelled.
  if (PGcancel* cancel = PQgetCancel(session_.conn_)) {
    char error[256];
    (void)PQcancel(cancel, error, sizeof error);
    ++session_.cancels_sent_;
    PQfreeCancel(cancel);
  }
  drain();
}

Result<QueryResult> PgSession::finish(PGresult* res) {
  if (res == nullptr) return connection_error("query failed");
  QueryResult result(res);
  const ExecStatusType st = PQresultStatus(res);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return result;
  if (auto error = server_error(res)) return *error;
  return connection_error("query failed");
}

Status PgSession::run(const std::string& sql, const Params& params) {
  auto r = exec(sql, params);
  if (!r.ok()) return r.error();
  return {};
}

Result<int> PgSession::drain_notifications() {
  if (PQconsumeInput(conn_) == 0) {
    return Error::make("08006", "upstream connection lost: " + trim_newline(PQerrorMessage(conn_)));
  }
  int n = 0;
  while (PGnotify* note = PQnotifies(conn_)) {
    PQfreemem(note);
    ++n;
  }
  return n;
}

Result<std::string> PgSession::ident(std::string_view name) {
  char* q = PQescapeIdentifier(conn_, name.data(), name.size());
  if (q == nullptr) return connection_error("could not quote identifier");
  std::string out(q);
  PQfreemem(q);
  return out;
}

Result<std::string> PgSession::literal(std::string_view text) {
  char* q = PQescapeLiteral(conn_, text.data(), text.size());
  if (q == nullptr) return connection_error("could not quote literal");
  std::string out(q);
  PQfreemem(q);
  return out;
}

}  // namespace pgrelay::capture
