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

Result<QueryResult> PgSession::exec_prepared(const std::string& name, const std::string& sql,
                                             const Params& params, bool binary_result) {
  if (!prepared_.contains(name)) {
    auto prepared = finish(
        PQprepare(conn_, name.c_str(), sql.c_str(), static_cast<int>(params.size()), nullptr));
    if (!prepared.ok()) return prepared.error();
    prepared_.insert(name);
  }
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
  return finish(PQexecPrepared(conn_, name.c_str(), static_cast<int>(params.size()), values.data(),
                               nullptr, nullptr, binary_result ? 1 : 0));
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
