// Reads publications from the upstream and turns them into the log view a walsender sends.
#include "server/publications.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "server/row_filter.h"

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

// Runs `sql` with one text parameter ($1), or none when `param` is null.
Result<ResultPtr> query(PGconn* conn, const char* sql, const std::string* param) {
  const char* values[1] = {param != nullptr ? param->c_str() : nullptr};
  ResultPtr res(
      PQexecParams(conn, sql, param != nullptr ? 1 : 0, nullptr, values, nullptr, nullptr, 0),
      &PQclear);
  if (!res || PQresultStatus(res.get()) != PGRES_TUPLES_OK) {
    const char* state = res ? PQresultErrorField(res.get(), PG_DIAG_SQLSTATE) : nullptr;
    return Error::make(
        state ? state : "08006",
        std::string("could not read publications from the upstream: ") + PQerrorMessage(conn));
  }
  return res;
}

// One requested publication as pgoutput's Publication struct has it.
struct Pub {
  std::string name;
  bool all_tables = false;
  log::OperationSet operations = 0;
};

// One (publication, table) pair of pg_publication_tables with its pg_publication_rel row.
struct PubTable {
  std::string pub;
  pgoutput::Oid oid = 0;
  std::string schema, table;
  int natts = 0;            // pg_class.relnatts (dropped columns included)
  bool via_schema = false;  // the publication has the table's schema (FOR TABLES IN SCHEMA)
  bool has_rel_row = false;
  std::optional<std::vector<std::string>> columns;  // prattrs, by name in attnum order
  int list_size = 0;
  std::optional<std::string> qual;  // pg_get_expr(prqual, prrelid)
};

std::vector<std::string> parse_text_array(const char* text) {
  // array_agg(name::text) output: {a,"b c"}; elements quoted when needed.
  std::vector<std::string> out;
  std::string_view s(text);
  if (s.size() < 2) return out;
  s = s.substr(1, s.size() - 2);
  std::size_t i = 0;
  while (i < s.size()) {
    std::string item;
    if (s[i] == '"') {
      ++i;
      while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;
        item += s[i++];
      }
      ++i;
    } else {
      while (i < s.size() && s[i] != ',') item += s[i++];
    }
    out.push_back(std::move(item));
    if (i < s.size() && s[i] == ',') ++i;
  }
  return out;
}

std::string qualified(const PubTable& t) {
  return t.schema + "." + t.table;
}

struct FilterDatabase {
  bool collation_is_c = false;
};

Result<FilterDatabase> load_filter_database(PGconn* conn) {
  auto db = query(conn,
                  "SELECT datcollate IN ('C', 'POSIX') AND datlocprovider = 'c' "
                  "FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()",
                  nullptr);
  if (!db.ok()) return db.error();
  FilterDatabase out;
  out.collation_is_c = PQntuples(db->get()) == 1 && PQgetvalue(db->get(), 0, 0)[0] == 't';
  return out;
}

struct FilterLayout {
  pgoutput::Relation relation;  // the columns as a Relation would describe them now
  FilterContext context;
};

// The table's columns now, to check its filters at START_REPLICATION; the same context serves
// binding to the Relations the log holds.
Result<FilterLayout> load_filter_layout(PGconn* conn, pgoutput::Oid oid, const PubTable& table) {
  const std::string oid_text = std::to_string(oid);
  auto cols =
      query(conn,
            "SELECT a.attname, a.atttypid, pg_catalog.format_type(a.atttypid, a.atttypmod), "
            "  COALESCE(co.collname, ''), COALESCE(co.collisdeterministic, true) "
            "FROM pg_catalog.pg_attribute a "
            "LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation "
            "WHERE a.attrelid = $1::pg_catalog.oid AND a.attnum > 0 "
            "  AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            &oid_text);
  if (!cols.ok()) return cols.error();
  FilterLayout out;
  out.relation.oid = oid;
  out.relation.namespace_name = table.schema;
  out.relation.name = table.table;
  for (int row = 0; row < PQntuples(cols->get()); ++row) {
    PGresult* r = cols->get();
    pgoutput::Column col;
    col.name = PQgetvalue(r, row, 0);
    col.type_oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(r, row, 1)));
    FilterColumn info;
    info.type_name = PQgetvalue(r, row, 2);
    info.collation = PQgetvalue(r, row, 3);
    info.deterministic = PQgetvalue(r, row, 4)[0] == 't';
    out.context.columns[col.name] = std::move(info);
    out.relation.columns.push_back(std::move(col));
  }
  return out;
}
Error unsupported_filter(const std::string& pub, const PubTable& t, const Error& why) {
  Error e = Error::make(sqlstate::kFeatureNotSupported,
                        "publication \"" + pub + "\" has a row filter on table \"" + qualified(t) +
                            "\" that pgrelay cannot evaluate: " + why.message,
                        "Simplify the publication's WHERE clause to comparisons of columns with "
                        "constants, or filter in the consumer.");
  e.detail = "The row filter is: " + t.qual.value_or("");
  return e;
}

// The requested publications in publication_names order, as LoadPublications builds the
// list; 42704 'publication "x" does not exist' for a missing one, as pgoutput.
Result<std::vector<Pub>> load_publications(PGconn* conn, const std::vector<std::string>& names,
                                           const std::string& array) {
  auto res = query(conn,
                   "SELECT pubname, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate "
                   "FROM pg_catalog.pg_publication WHERE pubname = ANY($1::text[])",
                   &array);
  if (!res.ok()) return res.error();
  std::vector<Pub> pubs;
  for (const auto& name : names) {
    bool found = false;
    for (int row = 0; row < PQntuples(res->get()); ++row) {
      if (name != PQgetvalue(res->get(), row, 0)) continue;
      found = true;
      auto flag = [&](int col) { return PQgetvalue(res->get(), row, col)[0] == 't'; };
      Pub p;
      p.name = name;
      p.all_tables = flag(1);
      if (flag(2)) p.operations |= log::kOpInsert;
      if (flag(3)) p.operations |= log::kOpUpdate;
      if (flag(4)) p.operations |= log::kOpDelete;
      if (flag(5)) p.operations |= log::kOpTruncate;
      pubs.push_back(std::move(p));
    }
    if (!found) {
      return Error::make(sqlstate::kUndefinedObject, "publication \"" + name + "\" does not exist",
                         "Create it on the upstream with CREATE PUBLICATION, or fix "
                         "publication_names.");
    }
  }
  return pubs;
}

// Refuses the publications whose partitioned tables the capture cannot stream exactly (see
// load_publication_view), 0A000 naming the first such table: a stream that leaves changes out
// is worse than none. Trigger capture sees no write made through a partitioned table (it fires
// no trigger of its partitions). Native capture logs the leaves' changes, which is what a
// publication without publish_via_partition_root sends, also for partitions created or
// attached later; one with it would send them as the root's, which pgrelay does not map yet.
Status refuse_partitioned(PGconn* conn, const std::string& array, PartitionCapture partitions) {
  const int version = PQserverVersion(conn);
  const std::string root =
      version >= 120000
          ? "(SELECT pg_catalog.quote_ident(rn.nspname) || '.' || "
            "pg_catalog.quote_ident(r.relname) "
            "FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace "
            "WHERE r.oid = pg_catalog.pg_partition_root(c.oid))"
          : "NULL::text";
  // Before 13 no publication publishes via the root (nor holds a partitioned table).
  const std::string via_root = version >= 130000 ? "p.pubviaroot" : "false";
  const std::string refused = partitions == PartitionCapture::kLeaves
                                  ? "c.relkind = 'p' AND " + via_root
                                  : "(c.relkind = 'p' OR c.relispartition)";
  const std::string sql =
      "SELECT t.pubname, pg_catalog.quote_ident(t.schemaname) || '.' || "
      "pg_catalog.quote_ident(t.tablename), c.relkind = 'p', " +
      root +
      " FROM pg_catalog.pg_publication_tables t "
      "JOIN pg_catalog.pg_publication p ON p.pubname = t.pubname "
      "JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname "
      "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "
      "WHERE t.pubname = ANY ($1::text[]) AND " +
      refused + " ORDER BY t.pubname, t.schemaname, t.tablename LIMIT 1";
  auto rows = query(conn, sql.c_str(), &array);
  if (!rows.ok()) return rows.error();
  if (PQntuples(rows->get()) == 0) return {};
  PGresult* r = rows->get();
  const std::string pub = PQgetvalue(r, 0, 0);
  const std::string table = PQgetvalue(r, 0, 1);
  const bool partitioned = PQgetvalue(r, 0, 2)[0] == 't';
  const std::string of = PQgetisnull(r, 0, 3) ? "" : PQgetvalue(r, 0, 3);
  const std::string what = partitioned
                               ? "partitioned table " + table
                               : table + (of.empty() ? ", a partition" : ", a partition of " + of);
  if (partitions == PartitionCapture::kLeaves) {
    Error e = Error::make(
        sqlstate::kFeatureNotSupported,
        "publication \"" + pub + "\" publishes " + what +
            " with publish_via_partition_root, which pgrelay cannot stream exactly yet",
        "Stream the partitions instead (ALTER PUBLICATION ... SET (publish_via_partition_root "
        "= false): the changes then come as each partition's, as from the upstream's own "
        "slot), or stream this publication from the upstream's own slot.");
    e.detail =
        "Native capture receives the partitions' changes, but does not yet send them as the "
        "partitioned table's: the stream would leave them out, so pgrelay refuses it.";
    return e;
  }
  Error e = Error::make(
      sqlstate::kFeatureNotSupported,
      "publication \"" + pub + "\" publishes " + what + ", which pgrelay cannot stream exactly yet",
      "Publish only ordinary tables for streams through pgrelay (ALTER PUBLICATION ... DROP "
      "TABLE, or a publication FOR TABLE the others), or capture natively (--capture native), "
      "which streams partitions unless the publication publishes via the root; else stream "
      "partitioned tables from the upstream's own slot. `pgrelay doctor` lists every such "
      "publication.");
  e.detail =
      "Trigger capture does not see writes made through a partitioned table (they fire no "
      "trigger of its partitions): the stream would leave changes out, so pgrelay refuses it.";
  return e;
}

// pgoutput's get_rel_sync_entry, pgoutput_row_filter_init and pgoutput_column_list_init for
// every table the publications publish now (non-partition case: pgrelay captures leaf tables).
Result<log::PublicationTables> load_table_rules(PGconn* conn, const std::vector<Pub>& pubs,
                                                const std::string& array) {
  log::PublicationTables out;
  for (const Pub& p : pubs) {
    if (p.all_tables) out.all_tables |= p.operations;
  }
  auto schemas = query(conn,
                       "SELECT p.pubname, n.nspname FROM pg_catalog.pg_publication_namespace pn "
                       "JOIN pg_catalog.pg_publication p ON p.oid = pn.pnpubid "
                       "JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid "
                       "WHERE p.pubname = ANY($1::text[])",
                       &array);
  if (!schemas.ok()) return schemas.error();
  for (int row = 0; row < PQntuples(schemas->get()); ++row) {
    const std::string pub = PQgetvalue(schemas->get(), row, 0);
    for (const Pub& p : pubs) {
      if (p.name == pub) out.schemas[PQgetvalue(schemas->get(), row, 1)] |= p.operations;
    }
  }
  auto rows = query(
      conn,
      "SELECT t.pubname, c.oid, t.schemaname, t.tablename, c.relnatts, "
      "  EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn "
      "          WHERE pn.pnpubid = p.oid AND pn.pnnspid = c.relnamespace), "
      "  pr.oid IS NOT NULL, pr.prattrs IS NOT NULL, "
      "  (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum) "
      "     FROM pg_catalog.pg_attribute a "
      "    WHERE a.attrelid = c.oid AND a.attnum = ANY (pr.prattrs::pg_catalog.int2[])), "
      "  pg_catalog.cardinality(pr.prattrs::pg_catalog.int2[]), "
      "  pg_catalog.pg_get_expr(pr.prqual, pr.prrelid) "
      "FROM pg_catalog.pg_publication_tables t "
      "JOIN pg_catalog.pg_publication p ON p.pubname = t.pubname "
      "JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname "
      "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "
      "LEFT JOIN pg_catalog.pg_publication_rel pr ON pr.prpubid = p.oid AND pr.prrelid = c.oid "
      "WHERE t.pubname = ANY ($1::text[])",
      &array);
  if (!rows.ok()) return rows.error();
  std::map<pgoutput::Oid, std::vector<PubTable>> by_table;
  for (int row = 0; row < PQntuples(rows->get()); ++row) {
    PGresult* r = rows->get();
    PubTable t;
    t.pub = PQgetvalue(r, row, 0);
    t.oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(r, row, 1)));
    t.schema = PQgetvalue(r, row, 2);
    t.table = PQgetvalue(r, row, 3);
    t.natts = std::atoi(PQgetvalue(r, row, 4));
    t.via_schema = PQgetvalue(r, row, 5)[0] == 't';
    t.has_rel_row = PQgetvalue(r, row, 6)[0] == 't';
    if (PQgetvalue(r, row, 7)[0] == 't') {
      t.columns = PQgetisnull(r, row, 8) ? std::vector<std::string>()
                                         : parse_text_array(PQgetvalue(r, row, 8));
      t.list_size = PQgetisnull(r, row, 9) ? 0 : std::atoi(PQgetvalue(r, row, 9));
    }
    if (!PQgetisnull(r, row, 10)) t.qual = PQgetvalue(r, row, 10);
    out.names[{t.schema, t.table}] = t.oid;
    by_table[t.oid].push_back(std::move(t));
  }

  std::optional<FilterDatabase> database;
  for (auto& [oid, entries] : by_table) {
    // The publications publishing this table, in publication_names order.
    std::vector<std::pair<const Pub*, const PubTable*>> rel_pubs;
    for (const Pub& p : pubs) {
      for (const PubTable& t : entries) {
        if (t.pub == p.name) rel_pubs.push_back({&p, &t});
      }
    }
    if (rel_pubs.empty()) continue;
    log::TableRule rule;
    for (const auto& [p, t] : rel_pubs) rule.operations |= p->operations;
    const PubTable& table = *rel_pubs.front().second;
    constexpr log::OperationSet kDml = log::kOpInsert | log::kOpUpdate | log::kOpDelete;
    if ((rule.operations & kDml) == 0) {
      out.tables[oid] = std::move(rule);
      continue;
    }
    // Row filters: per action, OR of the filters of the publications publishing the action;
    // any such publication without one (FOR ALL TABLES, IN SCHEMA, no WHERE) means none.
    const log::Operation actions[3] = {log::kOpInsert, log::kOpUpdate, log::kOpDelete};
    bool no_filter[3] = {false, false, false};
    std::vector<std::pair<std::string, std::string>> filters[3];  // (publication, expression)
    for (const auto& [p, t] : rel_pubs) {
      const bool pub_no_filter = p->all_tables || t->via_schema || !t->has_rel_row || !t->qual;
      for (int a = 0; a < 3; ++a) {
        if ((p->operations & actions[a]) == 0) continue;
        if (pub_no_filter) {
          no_filter[a] = true;
        } else if (!no_filter[a]) {
          filters[a].push_back({p->name, *t->qual});
        }
      }
    }
    for (int a = 0; a < 3; ++a) {
      if (no_filter[a] || filters[a].empty()) continue;
      if (!database) {
        auto db = load_filter_database(conn);
        if (!db.ok()) return db.error();
        database = std::move(*db);
      }
      auto layout = load_filter_layout(conn, oid, table);
      if (!layout.ok()) return layout.error();
      // Each publication's filter alone first, so that a refusal names the right one.
      std::vector<std::string> texts;
      for (const auto& [pub, text] : filters[a]) {
        PubTable named = table;
        named.qual = text;
        auto one = make_row_filter({text}, layout->context);
        if (!one.ok()) return unsupported_filter(pub, named, one.error());
        auto bound = (*one)->bind(layout->relation);
        if (!bound.ok()) return unsupported_filter(pub, named, bound.error());
        texts.push_back(text);
      }
      auto combined = make_row_filter(texts, layout->context);
      if (!combined.ok()) return combined.error();
      rule.filters[a] = std::move(*combined);
    }
    // Column list: every publication publishing the table must agree (a list naming every
    // attribute, relnatts of them, counts as none).
    bool first = true;
    std::optional<std::vector<std::string>> columns;
    for (const auto& [p, t] : rel_pubs) {
      std::optional<std::vector<std::string>> cols;
      if (!p->all_tables && t->has_rel_row && t->columns && t->list_size != t->natts) {
        cols = t->columns;
      }
      if (first) {
        columns = cols;
        first = false;
      } else if (columns != cols) {
        rule.error = Error::make(sqlstate::kFeatureNotSupported,
                                 "cannot use different column lists for table \"" +
                                     qualified(table) + "\" in different publications");
        break;
      }
    }
    if (!rule.error) rule.columns = std::move(columns);
    out.tables[oid] = std::move(rule);
  }
  return out;
}

// The view of the publications `pubs` (named in the text[] literal `array`).
Result<log::ViewOptions> build_view(PGconn* conn, const std::vector<Pub>& pubs,
                                    const std::string& array, bool messages) {
  log::ViewOptions view;
  view.operations = messages ? log::kOpMessage : 0;
  bool all_tables = false;
  for (const Pub& p : pubs) {
    all_tables |= p.all_tables;
    view.operations |= p.operations;
  }
  if (PQserverVersion(conn) >= 150000) {
    auto rules = load_table_rules(conn, pubs, array);
    if (!rules.ok()) return rules.error();
    view.publications = std::move(*rules);
    view.operations = log::kAllOperations & ~log::kOpMessage;
    if (messages) view.operations |= log::kOpMessage;
    return view;
  }
  if (all_tables) return view;

  log::TableFilter filter;
  auto schemas = query(conn,
                       "SELECT n.nspname FROM pg_catalog.pg_publication_namespace pn "
                       "JOIN pg_catalog.pg_publication p ON p.oid = pn.pnpubid "
                       "JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid "
                       "WHERE p.pubname = ANY($1::text[])",
                       &array);
  if (!schemas.ok()) return schemas.error();
  for (int row = 0; row < PQntuples(schemas->get()); ++row) {
    filter.add_schema(PQgetvalue(schemas->get(), row, 0));
  }
  auto tables = query(conn,
                      "SELECT DISTINCT schemaname, tablename FROM pg_catalog.pg_publication_tables "
                      "WHERE pubname = ANY($1::text[])",
                      &array);
  if (!tables.ok()) return tables.error();
  for (int row = 0; row < PQntuples(tables->get()); ++row) {
    filter.add_table(PQgetvalue(tables->get(), row, 0), PQgetvalue(tables->get(), row, 1));
  }
  view.tables = std::move(filter);
  return view;
}

}  // namespace

Result<log::ViewOptions> load_publication_view(PGconn* conn, const std::vector<std::string>& names,
                                               bool messages, PartitionCapture partitions) {
  const std::string array = text_array(names);
  auto pubs = load_publications(conn, names, array);
  if (!pubs.ok()) return pubs.error();
  PGRELAY_TRY(refuse_partitioned(conn, array, partitions));
  return build_view(conn, *pubs, array, messages);
}

Result<log::ViewOptions> load_publication_rules(PGconn* conn,
                                                const std::vector<std::string>& names) {
  const std::string array = text_array(names);
  auto pubs = load_publications(conn, names, array);
  if (!pubs.ok()) return pubs.error();
  return build_view(conn, *pubs, array, /*messages=*/false);
}

}  // namespace pgrelay::server
