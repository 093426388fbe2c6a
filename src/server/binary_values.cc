// Turns the text values of pgoutput changes into their types' binary send format, through the
// upstream's own input and send functions (pgoutput's binary mode).
#include "server/binary_values.h"

#include <libpq-fe.h>

#include <memory>

namespace pgrelay::server {
namespace {

using ResultPtr = std::unique_ptr<PGresult, decltype(&PQclear)>;

// The upstream's error as it gave it (its SQLSTATE and message), saying where it came from.
Error upstream_error(PGconn* conn, const PGresult* res, const char* doing) {
  const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  const char* primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  std::string message = primary ? primary : PQerrorMessage(conn);
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  return Error::make(
      state ? state : sqlstate::kConnectionFailure, std::move(message), {},
      std::string("pgrelay was ") + doing + " on the upstream for a stream in binary mode.");
}

Status add_tuple(pgoutput::Tuple& tuple, const std::vector<pgoutput::Oid>* columns,
                 pgoutput::Oid relation, std::vector<TextValueRef>& out) {
  if (columns == nullptr) {
    return Error::make(sqlstate::kInternalError,
                       "no Relation before a change of relation " + std::to_string(relation));
  }
  if (tuple.columns.size() > columns->size()) {
    return Error::make(sqlstate::kInternalError,
                       "a change of relation " + std::to_string(relation) + " has " +
                           std::to_string(tuple.columns.size()) + " columns, its Relation " +
                           std::to_string(columns->size()));
  }
  for (std::size_t i = 0; i < tuple.columns.size(); ++i) {
    pgoutput::TupleValue& v = tuple.columns[i];
    if (v.kind == pgoutput::ValueKind::kText) out.push_back({(*columns)[i], &v});
  }
  return {};
}

}  // namespace

Result<std::vector<TextValueRef>> collect_text_values(std::vector<pgoutput::Message*>& messages,
                                                      RelationTypes& types) {
  std::vector<TextValueRef> out;
  auto columns_of = [&](pgoutput::Oid oid) -> const std::vector<pgoutput::Oid>* {
    auto it = types.find(oid);
    return it == types.end() ? nullptr : &it->second;
  };
  for (pgoutput::Message* m : messages) {
    if (auto* rel = std::get_if<pgoutput::Relation>(m)) {
      std::vector<pgoutput::Oid>& cols = types[rel->oid];
      cols.clear();
      for (const auto& c : rel->columns) cols.push_back(c.type_oid);
    } else if (auto* ins = std::get_if<pgoutput::Insert>(m)) {
      PGRELAY_TRY(add_tuple(ins->new_tuple, columns_of(ins->relation_oid), ins->relation_oid, out));
    } else if (auto* upd = std::get_if<pgoutput::Update>(m)) {
      if (upd->old) {
        PGRELAY_TRY(
            add_tuple(upd->old->tuple, columns_of(upd->relation_oid), upd->relation_oid, out));
      }
      PGRELAY_TRY(add_tuple(upd->new_tuple, columns_of(upd->relation_oid), upd->relation_oid, out));
    } else if (auto* del = std::get_if<pgoutput::Delete>(m)) {
      PGRELAY_TRY(add_tuple(del->old.tuple, columns_of(del->relation_oid), del->relation_oid, out));
    }
  }
  return out;
}

std::string conversion_query(std::size_t values) {
  std::string sql = "SELECT ";
  for (std::size_t i = 1; i <= values; ++i) {
    if (i > 1) sql += ", ";
    sql += '$' + std::to_string(i);
  }
  return sql;
}

std::string conversion_conninfo(const std::string& conninfo) {
  // What Postgres's own subscribers ask for (libpqwalreceiver) and capture's triggers pin:
  // text in these styles reads back as the value it was printed from. TimeZone and
  // lc_monetary stay the role's, as the triggers' are (the server's reset values).
  // xmloption content reads documents and fragments alike.
  return conninfo +
         " options='-c DateStyle=ISO,MDY -c IntervalStyle=postgres -c extra_float_digits=3"
         " -c bytea_output=hex -c xmloption=content'"
         " application_name='pgrelay binary values'";
}

std::size_t BinaryConverter::conversions() const {
  std::lock_guard lock(mu_);
  return conversions_;
}

bool BinaryConverter::has_send(const std::string& conninfo, pgoutput::Oid type) const {
  std::lock_guard lock(mu_);
  auto it = has_send_.find({conninfo, type});
  return it != has_send_.end() && it->second;
}

Status BinaryConverter::learn_types(PGconn* conn, const std::string& conninfo,
                                    const std::vector<TextValueRef>& values) {
  std::string unknown;  // an oid[] literal
  {
    std::lock_guard lock(mu_);
    std::map<pgoutput::Oid, bool> seen;
    for (const auto& v : values) {
      if (has_send_.contains({conninfo, v.type}) || !seen.emplace(v.type, true).second) continue;
      unknown += (unknown.empty() ? "{" : ",") + std::to_string(v.type);
    }
  }
  if (unknown.empty()) return {};
  unknown += '}';
  const char* params[1] = {unknown.c_str()};
  ResultPtr res(
      PQexecParams(conn,
                   "SELECT t.oid::pg_catalog.int8, t.typsend <> 0 FROM pg_catalog.pg_type "
                   "t WHERE t.oid = ANY ($1::pg_catalog.oid[])",
                   1, nullptr, params, nullptr, nullptr, 0),
      &PQclear);
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    return upstream_error(conn, res.get(), "looking up column types");
  }
  std::lock_guard lock(mu_);
  for (int row = 0; row < PQntuples(res.get()); ++row) {
    auto oid = static_cast<pgoutput::Oid>(std::stoull(PQgetvalue(res.get(), row, 0)));
    has_send_[{conninfo, oid}] = PQgetvalue(res.get(), row, 1)[0] == 't';
  }
  for (const auto& v : values) {
    if (!has_send_.contains({conninfo, v.type})) {
      return Error::make(sqlstate::kUndefinedObject,
                         "type with OID " + std::to_string(v.type) + " does not exist",
                         "A value's type was dropped upstream after the value was logged; "
                         "stream it without binary 'true'.",
                         "pgrelay converts logged text values through the upstream's types for a "
                         "stream in binary mode.");
    }
  }
  return {};
}

Status BinaryConverter::convert_chunk(PGconn* conn, const std::vector<const TextValueRef*>& chunk) {
  std::vector<Oid> types;
  std::vector<const char*> params;
  types.reserve(chunk.size());
  params.reserve(chunk.size());
  for (const TextValueRef* v : chunk) {
    types.push_back(v->type);
    params.push_back(v->value->bytes.c_str());
  }
  const std::string sql = conversion_query(chunk.size());
  ResultPtr res(PQexecParams(conn, sql.c_str(), static_cast<int>(chunk.size()), types.data(),
                             params.data(), nullptr, nullptr, /*resultFormat=*/1),
                &PQclear);
  {
    std::lock_guard lock(mu_);
    ++conversions_;
  }
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    return upstream_error(conn, res.get(), "converting text values to binary");
  }
  if (PQntuples(res.get()) != 1 || PQnfields(res.get()) != static_cast<int>(chunk.size())) {
    return Error::make(sqlstate::kInternalError,
                       "the upstream answered a value conversion with an unexpected shape");
  }
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    const int col = static_cast<int>(i);
    if (PQgetisnull(res.get(), 0, col)) {
      return Error::make(sqlstate::kInternalError, "the upstream read a logged value of type " +
                                                       std::to_string(chunk[i]->type) + " as NULL");
    }
    chunk[i]->value->kind = pgoutput::ValueKind::kBinary;
    chunk[i]->value->bytes.assign(PQgetvalue(res.get(), 0, col),
                                  static_cast<std::size_t>(PQgetlength(res.get(), 0, col)));
  }
  return {};
}

Status BinaryConverter::convert(const std::string& conninfo,
                                const std::vector<TextValueRef>& values) {
  if (values.empty()) return {};
  auto lease = connections_.acquire(conversion_conninfo(conninfo));
  if (!lease.ok()) return lease.error();
  PGconn* conn = lease->get();
  PGRELAY_TRY(learn_types(conn, conninfo, values));
  std::vector<const TextValueRef*> chunk;
  chunk.reserve(std::min(values.size(), kMaxValuesPerQuery));
  for (const auto& v : values) {
    // Postgres's rule (logicalrep_write_tuple): binary when the type has a send function.
    // A value already binary was converted by an earlier try that failed later on.
    if (v.value->kind == pgoutput::ValueKind::kBinary || !has_send(conninfo, v.type)) continue;
    chunk.push_back(&v);
    if (chunk.size() == kMaxValuesPerQuery) {
      PGRELAY_TRY(convert_chunk(conn, chunk));
      chunk.clear();
    }
  }
  if (!chunk.empty()) PGRELAY_TRY(convert_chunk(conn, chunk));
  return {};
}

}  // namespace pgrelay::server
