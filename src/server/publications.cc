// Reads publications from the upstream and turns them into the log view a walsender sends.
#include "server/publications.h"

#include <memory>

namespace pgrelay::server {
namespace {

using ResultPtr = std::unique_ptr<PGresult, decltype(&PQclear)>;

// A text[] literal of `names`, every element double-quoted, for a $1::text[] parameter.
std::string text_array(const std::vector<std::string>& names) {
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : names[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

Result<ResultPtr> query(PGconn* conn, const char* sql, const std::string& param) {
  const char* values[1] = {param.c_str()};
  ResultPtr res(PQexecParams(conn, sql, 1, nullptr, values, nullptr, nullptr, 0), &PQclear);
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    const char* state = res ? PQresultErrorField(res.get(), PG_DIAG_SQLSTATE) : nullptr;
    return Error::make(
        state ? state : "08006",
        std::string("could not read publications from the upstream: ") + PQerrorMessage(conn));
  }
  return res;
}

}  // namespace

Result<log::ViewOptions> load_publication_view(PGconn* conn, const std::vector<std::string>& names,
                                               bool messages) {
  std::string array = text_array(names);
  auto pubs = query(conn,
                    "SELECT pubname, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate "
                    "FROM pg_catalog.pg_publication WHERE pubname = ANY($1::text[])",
                    array);
  if (!pubs.ok()) return pubs.error();
  log::ViewOptions view;
  view.operations = messages ? log::kOpMessage : 0;
  bool all_tables = false;
  for (const auto& name : names) {
    bool found = false;
    for (int row = 0; row < PQntuples(pubs->get()); ++row) {
      if (name != PQgetvalue(pubs->get(), row, 0)) continue;
      found = true;
      auto flag = [&](int col) { return PQgetvalue(pubs->get(), row, col)[0] == 't'; };
      all_tables |= flag(1);
      if (flag(2)) view.operations |= log::kOpInsert;
      if (flag(3)) view.operations |= log::kOpUpdate;
      if (flag(4)) view.operations |= log::kOpDelete;
      if (flag(5)) view.operations |= log::kOpTruncate;
    }
    if (!found) {
      return Error::make(sqlstate::kUndefinedObject, "publication \"" + name + "\" does not exist",
                         "Create it on the upstream with CREATE PUBLICATION, or fix "
                         "publication_names.");
    }
  }
  // PG15 row filters and column lists change what pgoutput sends; pgrelay does not evaluate
  // them yet, and sending more than the publication allows would be wrong, so refuse.
  auto narrowed = query(conn,
                        "SELECT p.pubname, c.relname, pr.prqual IS NOT NULL "
                        "FROM pg_catalog.pg_publication_rel pr "
                        "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
                        "JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid "
                        "WHERE p.pubname = ANY($1::text[]) "
                        "AND (pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL) LIMIT 1",
                        array);
  if (!narrowed.ok()) return narrowed.error();
  if (PQntuples(narrowed->get()) > 0) {
    std::string pub = PQgetvalue(narrowed->get(), 0, 0);
    std::string table = PQgetvalue(narrowed->get(), 0, 1);
    bool row_filter = PQgetvalue(narrowed->get(), 0, 2)[0] == 't';
    return Error::make(sqlstate::kFeatureNotSupported,
                       std::string("publication \"") + pub + "\" has a " +
                           (row_filter ? "row filter" : "column list") + " on table \"" + table +
                           "\", which pgrelay does not support yet",
                       "Publish the table without a WHERE clause or column list, and filter in "
                       "the consumer.");
  }
  if (all_tables) return view;

  log::TableFilter filter;
  auto schemas = query(conn,
                       "SELECT n.nspname FROM pg_catalog.pg_publication_namespace pn "
                       "JOIN pg_catalog.pg_publication p ON p.oid = pn.pnpubid "
                       "JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid "
                       "WHERE p.pubname = ANY($1::text[])",
                       array);
  if (!schemas.ok()) return schemas.error();
  for (int row = 0; row < PQntuples(schemas->get()); ++row) {
    filter.add_schema(PQgetvalue(schemas->get(), row, 0));
  }
  auto tables = query(conn,
                      "SELECT DISTINCT schemaname, tablename FROM pg_catalog.pg_publication_tables "
                      "WHERE pubname = ANY($1::text[])",
                      array);
  if (!tables.ok()) return tables.error();
  for (int row = 0; row < PQntuples(tables->get()); ++row) {
    filter.add_table(PQgetvalue(tables->get(), row, 0), PQgetvalue(tables->get(), row, 1));
  }
  view.tables = std::move(filter);
  return view;
}

}  // namespace pgrelay::server
