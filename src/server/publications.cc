// Reads publications from the upstream and turns them into the log view a walsender sends.
#include "server/publications.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <thread>

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
  pgoutput::Oid oid = 0;
  bool all_tables = false;
  bool via_root = false;  // publish_via_partition_root
  log::OperationSet operations = 0;
};

// One (publication, table) pair of pg_publication_tables with its pg_publication_rel row.
struct PubTable {
  std::string pub;
  pgoutput::Oid oid = 0;
  std::string schema, table;
  int natts = 0;            // pg_class.relnatts: dropped and generated columns included
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
  // Before 13 no publication publishes via the root.
  const std::string sql =
      std::string(
          "SELECT pubname, puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, "
          "oid, ") +
      (PQserverVersion(conn) >= 130000 ? "pubviaroot" : "false") +
      " FROM pg_catalog.pg_publication WHERE pubname = ANY($1::text[])";
  auto res = query(conn, sql.c_str(), &array);
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
      p.oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(res->get(), row, 6)));
      p.via_root = flag(7);
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

// Refuses, before PostgreSQL 15, a publication that publishes a partitioned table via the root
// (publish_via_partition_root), 0A000 naming it: both captures log a partitioned table's
// changes as its leaf partitions', and only from 15 on does the view read publications by OID
// and send partitions' changes as the ancestor's (add_partitions_via_root). A stream that
// leaves changes out is worse than none. Publications of partitions as themselves stream.
Status refuse_via_root_before_15(PGconn* conn, const std::string& array) {
  const int version = PQserverVersion(conn);
  // From 15 on the view maps them; before 13 no publication publishes via the root.
  if (version >= 150000 || version < 130000) return {};
  auto rows =
      query(conn,
            "SELECT t.pubname, pg_catalog.quote_ident(t.schemaname) || '.' || "
            "pg_catalog.quote_ident(t.tablename) "
            "FROM pg_catalog.pg_publication_tables t "
            "JOIN pg_catalog.pg_publication p ON p.pubname = t.pubname "
            "JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname "
            "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "
            "WHERE t.pubname = ANY ($1::text[]) AND c.relkind = 'p' AND p.pubviaroot "
            "ORDER BY t.pubname, t.schemaname, t.tablename LIMIT 1",
            &array);
  if (!rows.ok()) return rows.error();
  if (PQntuples(rows->get()) == 0) return {};
  const std::string pub = PQgetvalue(rows->get(), 0, 0);
  const std::string table = PQgetvalue(rows->get(), 0, 1);
  Error e = Error::make(
      sqlstate::kFeatureNotSupported,
      "publication \"" + pub + "\" publishes partitioned table " + table +
          " with publish_via_partition_root, which pgrelay streams from PostgreSQL 15 on",
      "Stream the partitions instead (ALTER PUBLICATION ... SET (publish_via_partition_root "
      "= false): the changes then come as each partition's, as from the upstream's own "
      "slot), or stream this publication from the upstream's own slot.");
  e.detail =
      "On this upstream (before PostgreSQL 15) pgrelay reads publications by table name "
      "only, and cannot send partitions' changes as the partitioned table's: the stream "
      "would leave them out, so pgrelay refuses it.";
  return e;
}

using RelPubs = std::vector<std::pair<const Pub*, const PubTable*>>;

// pgoutput's publish actions, pgoutput_row_filter_init and pgoutput_column_list_init for the
// table `oid` and the publications publishing it (`rel_pubs`, not empty, in publication_names
// order, each with its pg_publication_tables row of the table).
Result<log::TableRule> table_rule(PGconn* conn, pgoutput::Oid oid, const RelPubs& rel_pubs,
                                  std::optional<FilterDatabase>& database) {
  log::TableRule rule;
  for (const auto& [p, t] : rel_pubs) rule.operations |= p->operations;
  const PubTable& table = *rel_pubs.front().second;
  constexpr log::OperationSet kDml = log::kOpInsert | log::kOpUpdate | log::kOpDelete;
  if ((rule.operations & kDml) == 0) return rule;
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
  // Column list: every publication publishing the table must agree. A list naming as many
  // columns as the table has attributes counts as none, as PostgreSQL 15's
  // pgoutput_column_list_init compares with RelationGetNumberOfAttributes: dropped and
  // generated columns count, so the list of a table that has one stays a list. A column added
  // later makes a list again, and the publications fingerprint marks that change.
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
                               "cannot use different column lists for table \"" + qualified(table) +
                                   "\" in different publications");
      break;
    }
  }
  if (!rule.error) rule.columns = std::move(columns);
  return rule;
}

// A table of the partition trees: a partition or a partitioned table (pg_class.relkind 'r' or
// 'p'), with its ancestors from its parent up to the root.
struct TreeNode {
  pgoutput::Oid oid = 0;
  bool partitioned = false;
  pgoutput::Oid namespace_oid = 0;
  std::string schema, table;
  std::vector<pgoutput::Oid> ancestors;
};

// What pgoutput's get_rel_sync_entry decides for one relation of a partition tree.
struct Publishing {
  pgoutput::Oid as = 0;              // publish_as_relid
  std::size_t level = 0;             // publish_ancestor_level
  std::vector<const Pub*> pubs;      // rel_publications: the publications publishing it as `as`
  log::OperationSet operations = 0;  // pubactions: every publication publishing it
};

// pgoutput's get_rel_sync_entry for `node`, given which relations (prrelid) and schemas each
// publication holds by OID: under which relation each publication publishes it (the topmost
// ancestor it holds, with publish_via_partition_root), keeping the topmost across them.
Publishing resolve_publishing(const TreeNode& node, const std::vector<Pub>& pubs,
                              const std::map<pgoutput::Oid, TreeNode>& nodes,
                              const std::set<std::pair<pgoutput::Oid, pgoutput::Oid>>& rels,
                              const std::set<std::pair<pgoutput::Oid, pgoutput::Oid>>& schemas) {
  auto holds = [&](const Pub& p, pgoutput::Oid rel, pgoutput::Oid nsp) {
    return rels.count({p.oid, rel}) != 0 || schemas.count({p.oid, nsp}) != 0;
  };
  Publishing out;
  out.as = node.oid;
  for (const Pub& p : pubs) {
    bool publish = false;
    pgoutput::Oid pub_relid = node.oid;
    std::size_t level = 0;
    if (p.all_tables) {
      publish = true;
      if (p.via_root && !node.ancestors.empty()) {
        pub_relid = node.ancestors.back();
        level = node.ancestors.size();
      }
    } else {
      // GetTopMostAncestorInPublication: the farthest ancestor the publication holds, listed
      // or through its schema.
      bool ancestor_published = false;
      for (std::size_t i = 0; i < node.ancestors.size(); ++i) {
        const pgoutput::Oid a = node.ancestors[i];
        auto it = nodes.find(a);
        if (!holds(p, a, it != nodes.end() ? it->second.namespace_oid : 0)) continue;
        ancestor_published = true;
        if (p.via_root) {
          pub_relid = a;
          level = i + 1;
        }
      }
      publish = ancestor_published || holds(p, node.oid, node.namespace_oid);
    }
    // A partitioned table's own changes are published only via the root.
    if (!publish || (node.partitioned && !p.via_root)) continue;
    out.operations |= p.operations;
    if (out.level > level) continue;
    if (out.level < level) {
      out.as = pub_relid;
      out.level = level;
      out.pubs.clear();
    }
    out.pubs.push_back(&p);
  }
  return out;
}

// "{1,2,3}" (an oid[] as text) as OIDs.
std::vector<pgoutput::Oid> parse_oid_array(const char* text) {
  std::vector<pgoutput::Oid> out;
  for (const std::string& item : parse_text_array(text)) {
    out.push_back(static_cast<pgoutput::Oid>(std::stoul(item)));
  }
  return out;
}

// An oid[] literal.
std::string oid_array(const std::vector<pgoutput::Oid>& oids) {
  std::string out = "{";
  for (std::size_t i = 0; i < oids.size(); ++i) out += (i ? "," : "") + std::to_string(oids[i]);
  return out + "}";
}

// The Relations of `oids` (partitioned tables) as logicalrep_write_rel describes them: live,
// non-generated columns in attribute order, each flagged when it is in the replica identity.
Result<std::map<pgoutput::Oid, pgoutput::Relation>> load_ancestors(
    PGconn* conn, const std::vector<pgoutput::Oid>& oids) {
  const std::string array = oid_array(oids);
  auto rows = query(
      conn,
      "SELECT c.oid, n.nspname, c.relname, c.relreplident::text, a.attname, a.atttypid, "
      "  a.atttypmod, CASE c.relreplident WHEN 'f' THEN true WHEN 'n' THEN false ELSE EXISTS ("
      "    SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid"
      "      AND ((c.relreplident = 'd' AND i.indisprimary)"
      "        OR (c.relreplident = 'i' AND i.indisreplident))"
      "      AND a.attnum = ANY (i.indkey)) END "
      "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
      "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
      "WHERE c.oid = ANY ($1::pg_catalog.oid[]) AND a.attnum > 0 AND NOT a.attisdropped "
      "  AND a.attgenerated = '' ORDER BY c.oid, a.attnum",
      &array);
  if (!rows.ok()) return rows.error();
  std::map<pgoutput::Oid, pgoutput::Relation> out;
  PGresult* r = rows->get();
  for (int row = 0; row < PQntuples(r); ++row) {
    const auto oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(r, row, 0)));
    pgoutput::Relation& rel = out[oid];
    if (rel.oid == 0) {
      rel.oid = oid;
      const std::string schema = PQgetvalue(r, row, 1);
      rel.namespace_name = schema == "pg_catalog" ? std::string() : schema;
      rel.name = PQgetvalue(r, row, 2);
      rel.replica_identity = PQgetvalue(r, row, 3)[0];
    }
    pgoutput::Column column;
    column.name = PQgetvalue(r, row, 4);
    column.type_oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(r, row, 5)));
    column.type_modifier = std::atoi(PQgetvalue(r, row, 6));
    column.flags = PQgetvalue(r, row, 7)[0] == 't' ? pgoutput::kColumnIsKey : 0;
    rel.columns.push_back(std::move(column));
  }
  return out;
}

// Partitions that a publication with publish_via_partition_root publishes as an ancestor:
// their rules become the ancestor's (row filters and column list of the publications that
// publish it so, publish actions of all that publish the partition), with the ancestor's
// Relation to send them as. pg_publication_tables lists such an ancestor, not its partitions,
// so each partition is added by name too.
Status add_partitions_via_root(PGconn* conn, const std::vector<Pub>& pubs,
                               const std::map<pgoutput::Oid, std::vector<PubTable>>& by_table,
                               std::optional<FilterDatabase>& database,
                               log::PublicationTables& out) {
  std::vector<pgoutput::Oid> pub_oids;
  bool via_root = false;
  for (const Pub& p : pubs) {
    pub_oids.push_back(p.oid);
    via_root |= p.via_root;
  }
  if (!via_root) return {};
  const std::string pub_array = oid_array(pub_oids);
  auto rel_rows = query(conn,
                        "SELECT prpubid, prrelid FROM pg_catalog.pg_publication_rel "
                        "WHERE prpubid = ANY ($1::pg_catalog.oid[])",
                        &pub_array);
  if (!rel_rows.ok()) return rel_rows.error();
  auto schema_rows = query(conn,
                           "SELECT pnpubid, pnnspid FROM pg_catalog.pg_publication_namespace "
                           "WHERE pnpubid = ANY ($1::pg_catalog.oid[])",
                           &pub_array);
  if (!schema_rows.ok()) return schema_rows.error();
  auto pairs = [](PGresult* r) {
    std::set<std::pair<pgoutput::Oid, pgoutput::Oid>> pairs_read;
    for (int row = 0; row < PQntuples(r); ++row) {
      pairs_read.insert({static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(r, row, 0))),
                         static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(r, row, 1)))});
    }
    return pairs_read;
  };
  const auto rels = pairs(rel_rows->get());
  const auto schemas = pairs(schema_rows->get());
  auto tree =
      query(conn,
            "SELECT c.oid, c.relkind = 'p', c.relnamespace, n.nspname, c.relname, "
            "  ARRAY(SELECT a.relid::pg_catalog.oid FROM pg_catalog.pg_partition_ancestors(c.oid) "
            "        WITH ORDINALITY a(relid, i) WHERE a.relid <> c.oid ORDER BY a.i) "
            "FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND (c.relispartition OR c.relkind = 'p')",
            nullptr);
  if (!tree.ok()) return tree.error();
  std::map<pgoutput::Oid, TreeNode> nodes;
  PGresult* t = tree->get();
  for (int row = 0; row < PQntuples(t); ++row) {
    TreeNode node;
    node.oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(t, row, 0)));
    node.partitioned = PQgetvalue(t, row, 1)[0] == 't';
    node.namespace_oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(t, row, 2)));
    node.schema = PQgetvalue(t, row, 3);
    node.table = PQgetvalue(t, row, 4);
    node.ancestors = parse_oid_array(PQgetvalue(t, row, 5));
    nodes.emplace(node.oid, std::move(node));
  }

  // Each partition published as an ancestor, with how.
  std::vector<std::pair<const TreeNode*, Publishing>> moved;
  std::map<pgoutput::Oid, std::shared_ptr<log::PublishedAs>> ancestors;
  for (const auto& [oid, node] : nodes) {
    if (node.partitioned) continue;
    Publishing how = resolve_publishing(node, pubs, nodes, rels, schemas);
    if (how.as == oid) continue;
    ancestors.emplace(how.as, nullptr);
    moved.push_back({&node, std::move(how)});
  }
  if (moved.empty()) return {};
  std::vector<pgoutput::Oid> ancestor_oids;
  for (const auto& [oid, as] : ancestors) ancestor_oids.push_back(oid);
  auto relations = load_ancestors(conn, ancestor_oids);
  if (!relations.ok()) return relations.error();
  for (auto& [oid, as] : ancestors) {
    auto node = nodes.find(oid);
    auto relation = relations->find(oid);
    if (node == nodes.end() || relation == relations->end()) {
      return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                         "partitioned table with OID " + std::to_string(oid) +
                             " changed while its publications were read",
                         "Retry START_REPLICATION.");
    }
    as = std::make_shared<log::PublishedAs>();
    as->relation = relation->second;
    for (const auto& [leaf_oid, leaf] : nodes) {
      if (!leaf.partitioned &&
          std::find(leaf.ancestors.begin(), leaf.ancestors.end(), oid) != leaf.ancestors.end()) {
        ++as->leaves;
      }
    }
    // TRUNCATE of the ancestor: its own entry's actions, published as itself.
    const Publishing own = resolve_publishing(node->second, pubs, nodes, rels, schemas);
    as->truncate = own.as == oid && (own.operations & log::kOpTruncate) != 0;
  }

  // The ancestor's rule for the publications publishing its partitions so, built once for all
  // of them: a row filter costs upstream queries (its layout, the database's collation).
  std::map<std::pair<pgoutput::Oid, std::vector<const Pub*>>, log::TableRule> ancestor_rules;
  for (const auto& [leaf, how] : moved) {
    auto known = ancestor_rules.find({how.as, how.pubs});
    if (known != ancestor_rules.end()) {
      log::TableRule rule = known->second;
      rule.operations = how.operations;
      out.tables[leaf->oid] = std::move(rule);
      out.names[{leaf->schema, leaf->table}] = leaf->oid;
      continue;
    }
    const TreeNode& ancestor = nodes.at(how.as);
    // The pg_publication_tables row of the ancestor for each publication publishing it so
    // (absent only if the catalog changed between the two reads: then no filter, no list).
    std::vector<PubTable> fallback;
    fallback.reserve(how.pubs.size());
    RelPubs rel_pubs;
    auto listed = by_table.find(how.as);
    for (const Pub* p : how.pubs) {
      const PubTable* row = nullptr;
      if (listed != by_table.end()) {
        for (const PubTable& pt : listed->second) {
          if (pt.pub == p->name) row = &pt;
        }
      }
      if (row == nullptr) {
        PubTable none;
        none.pub = p->name;
        none.oid = how.as;
        none.schema = ancestor.schema;
        none.table = ancestor.table;
        fallback.push_back(std::move(none));
        row = &fallback.back();
      }
      rel_pubs.push_back({p, row});
    }
    auto rule = table_rule(conn, how.as, rel_pubs, database);
    if (!rule.ok()) return rule.error();
    rule->publish_as = ancestors.at(how.as);
    ancestor_rules.emplace(std::make_pair(how.as, how.pubs), *rule);
    rule->operations = how.operations;
    out.tables[leaf->oid] = std::move(*rule);
    out.names[{leaf->schema, leaf->table}] = leaf->oid;
  }
  return {};
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
    RelPubs rel_pubs;
    for (const Pub& p : pubs) {
      for (const PubTable& t : entries) {
        if (t.pub == p.name) rel_pubs.push_back({&p, &t});
      }
    }
    if (rel_pubs.empty()) continue;
    auto rule = table_rule(conn, oid, rel_pubs, database);
    if (!rule.ok()) return rule.error();
    out.tables[oid] = std::move(*rule);
  }
  PGRELAY_TRY(add_partitions_via_root(conn, pubs, by_table, database, out));
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
                                               bool messages) {
  const std::string array = text_array(names);
  auto pubs = load_publications(conn, names, array);
  if (!pubs.ok()) return pubs.error();
  PGRELAY_TRY(refuse_via_root_before_15(conn, array));
  return build_view(conn, *pubs, array, messages);
}

Status wait_until_visible(PGconn* conn, std::uint64_t xid, std::chrono::milliseconds limit) {
  const std::string param = std::to_string(xid);
  // pg_xact_status raises 22023 for an xid not assigned yet, which a committed one never is.
  constexpr const char* kSql =
      "SELECT pg_catalog.pg_visible_in_snapshot($1::pg_catalog.xid8, "
      "pg_catalog.pg_current_snapshot()), pg_catalog.pg_xact_status($1::pg_catalog.xid8)";
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    auto res = query(conn, kSql, &param);
    if (!res.ok()) {
      if (res.error().sqlstate == sqlstate::kInvalidParameterValue) return {};
      return res.error();
    }
    if (PQgetvalue(res->get(), 0, 0)[0] == 't') return {};
    if (std::chrono::steady_clock::now() + pause > deadline) {
      return Error::make(
          sqlstate::kObjectNotInPrerequisiteState,
          "the upstream transaction " + param +
              " that changed the publications is committed but still not visible after " +
              std::to_string(limit.count()) + " ms",
          "A synchronous standby that has not confirmed it holds it back (see "
          "synchronous_standby_names and pg_stat_replication on the upstream); connect again "
          "once it is visible (the stream resumes from the slot's confirmed position).");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

Result<log::ViewOptions> load_publication_rules(PGconn* conn,
                                                const std::vector<std::string>& names) {
  const std::string array = text_array(names);
  auto pubs = load_publications(conn, names, array);
  if (!pubs.ok()) return pubs.error();
  return build_view(conn, *pubs, array, /*messages=*/false);
}

}  // namespace pgrelay::server
