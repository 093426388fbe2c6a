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

#include "pgoutput/publication_catalog.h"
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

Pub pub_of(const pgoutput::CatalogPublication& p) {
  Pub out;
  out.name = p.name;
  out.oid = p.oid;
  out.all_tables = p.all_tables;
  out.via_root = p.via_root;
  if (p.insert) out.operations |= log::kOpInsert;
  if (p.update) out.operations |= log::kOpUpdate;
  if (p.del) out.operations |= log::kOpDelete;
  if (p.truncate) out.operations |= log::kOpTruncate;
  return out;
}

Error no_such_publication(const std::string& name) {
  return Error::make(sqlstate::kUndefinedObject, "publication \"" + name + "\" does not exist",
                     "Create it on the upstream with CREATE PUBLICATION, or fix "
                     "publication_names.");
}

using PubTable = pgoutput::CatalogTable;

std::string qualified(const PubTable& t) {
  return t.schema + "." + t.table;
}

struct FilterLayout {
  pgoutput::Relation relation;  // the columns as a Relation would describe them then
  FilterContext context;
};

// The table's columns as the catalog has them, to check its filters; the same context serves
// binding to the Relations the log holds.
FilterLayout filter_layout(const pgoutput::PublicationCatalog& catalog, pgoutput::Oid oid,
                           const PubTable& table) {
  FilterLayout out;
  out.relation.oid = oid;
  out.relation.namespace_name = table.schema;
  out.relation.name = table.table;
  auto columns = catalog.filter_columns.find(oid);
  if (columns == catalog.filter_columns.end()) return out;
  for (const pgoutput::CatalogFilterColumn& c : columns->second) {
    pgoutput::Column col;
    col.name = c.name;
    col.type_oid = c.type_oid;
    FilterColumn info;
    info.type_name = c.type_name;
    info.collation = c.collation;
    info.deterministic = c.deterministic;
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
Result<std::vector<Pub>> select_publications(
    const std::vector<pgoutput::CatalogPublication>& publications,
    const std::vector<std::string>& names) {
  std::vector<Pub> pubs;
  for (const auto& name : names) {
    auto it = std::find_if(publications.begin(), publications.end(),
                           [&](const pgoutput::CatalogPublication& p) { return p.name == name; });
    if (it == publications.end()) return no_such_publication(name);
    pubs.push_back(pub_of(*it));
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
Result<log::TableRule> table_rule(const pgoutput::PublicationCatalog& catalog, pgoutput::Oid oid,
                                  const RelPubs& rel_pubs) {
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
    const FilterLayout layout = filter_layout(catalog, oid, table);
    // Each publication's filter alone first, so that a refusal names the right one.
    std::vector<std::string> texts;
    for (const auto& [pub, text] : filters[a]) {
      PubTable named = table;
      named.qual = text;
      auto one = make_row_filter({text}, layout.context);
      if (!one.ok()) return unsupported_filter(pub, named, one.error());
      auto bound = (*one)->bind(layout.relation);
      if (!bound.ok()) return unsupported_filter(pub, named, bound.error());
      texts.push_back(text);
    }
    auto combined = make_row_filter(texts, layout.context);
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

using TreeNode = pgoutput::CatalogTreeNode;

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

// Partitions that a publication with publish_via_partition_root publishes as an ancestor:
// their rules become the ancestor's (row filters and column list of the publications that
// publish it so, publish actions of all that publish the partition), with the ancestor's
// Relation to send them as. pg_publication_tables lists such an ancestor, not its partitions,
// so each partition is added by name too.
Status add_partitions_via_root(const pgoutput::PublicationCatalog& catalog,
                               const std::vector<Pub>& pubs,
                               const std::map<pgoutput::Oid, std::vector<PubTable>>& by_table,
                               log::PublicationTables& out) {
  if (std::none_of(pubs.begin(), pubs.end(), [](const Pub& p) { return p.via_root; })) return {};
  const std::set<std::pair<pgoutput::Oid, pgoutput::Oid>> rels(catalog.rels.begin(),
                                                               catalog.rels.end());
  const std::set<std::pair<pgoutput::Oid, pgoutput::Oid>> schemas(catalog.schemas.begin(),
                                                                  catalog.schemas.end());
  std::map<pgoutput::Oid, TreeNode> nodes;
  for (const TreeNode& node : catalog.tree) nodes.emplace(node.oid, node);

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
  for (auto& [oid, as] : ancestors) {
    auto node = nodes.find(oid);
    auto relation = catalog.partitioned.find(oid);
    if (node == nodes.end() || relation == catalog.partitioned.end()) {
      return Error::make(sqlstate::kDataCorrupted,
                         "the publications' catalog has no partitioned table with OID " +
                             std::to_string(oid) + ", which a partition's ancestors name");
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
  // of them (a row filter is parsed and checked once).
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
    // (none for FOR ALL TABLES: then no filter, no list).
    std::vector<PubTable> fallback;
    fallback.reserve(how.pubs.size());
    RelPubs rel_pubs;
    auto listed = by_table.find(how.as);
    for (const Pub* p : how.pubs) {
      const PubTable* row = nullptr;
      if (listed != by_table.end()) {
        for (const PubTable& pt : listed->second) {
          if (pt.pub == p->oid) row = &pt;
        }
      }
      if (row == nullptr) {
        PubTable none;
        none.pub = p->oid;
        none.oid = how.as;
        none.schema = ancestor.schema;
        none.table = ancestor.table;
        fallback.push_back(std::move(none));
        row = &fallback.back();
      }
      rel_pubs.push_back({p, row});
    }
    auto rule = table_rule(catalog, how.as, rel_pubs);
    if (!rule.ok()) return rule.error();
    rule->publish_as = ancestors.at(how.as);
    ancestor_rules.emplace(std::make_pair(how.as, how.pubs), *rule);
    rule->operations = how.operations;
    out.tables[leaf->oid] = std::move(*rule);
    out.names[{leaf->schema, leaf->table}] = leaf->oid;
  }
  return {};
}

// Whether pg_publication_tables lists `t` for a FOR ALL TABLES publication: every table that
// is not a partition, and with publish_via_partition_root the partitioned roots instead of
// their partitions, else the partitions instead of the partitioned tables.
bool all_tables_lists(const Pub& p, const PubTable& t) {
  return p.via_root ? !t.is_partition : !t.partitioned;
}

// pgoutput's get_rel_sync_entry, pgoutput_row_filter_init and pgoutput_column_list_init for
// every table the publications publish (non-partition case: pgrelay captures leaf tables).
// A table only FOR ALL TABLES publications publish has no entry: their actions (all_tables)
// decide it, as an entry without filter or list would.
Result<log::PublicationTables> table_rules(const pgoutput::PublicationCatalog& catalog,
                                           const std::vector<Pub>& pubs) {
  log::PublicationTables out;
  for (const Pub& p : pubs) {
    if (p.all_tables) out.all_tables |= p.operations;
  }
  for (const auto& [pub, nsp] : catalog.schemas) {
    for (const Pub& p : pubs) {
      if (p.oid == pub) out.schemas[catalog.schema_names.at(nsp)] |= p.operations;
    }
  }
  std::map<pgoutput::Oid, std::vector<PubTable>> by_table;
  for (const PubTable& t : catalog.tables) {
    if (std::none_of(pubs.begin(), pubs.end(), [&](const Pub& p) { return p.oid == t.pub; })) {
      continue;
    }
    out.names[{t.schema, t.table}] = t.oid;
    by_table[t.oid].push_back(t);
  }
  for (auto& [oid, entries] : by_table) {
    // The publications publishing this table, in publication_names order; a FOR ALL TABLES
    // one with the row pg_publication_tables has for it (no pg_publication_rel row).
    std::vector<PubTable> all_tables_rows;
    all_tables_rows.reserve(pubs.size());
    RelPubs rel_pubs;
    for (const Pub& p : pubs) {
      if (p.all_tables) {
        if (!all_tables_lists(p, entries.front())) continue;
        PubTable row = entries.front();
        row.pub = p.oid;
        row.via_schema = row.has_rel_row = false;
        row.columns.reset();
        row.list_size = 0;
        row.qual.reset();
        all_tables_rows.push_back(std::move(row));
        rel_pubs.push_back({&p, &all_tables_rows.back()});
        continue;
      }
      for (const PubTable& t : entries) {
        if (t.pub == p.oid) rel_pubs.push_back({&p, &t});
      }
    }
    if (rel_pubs.empty()) continue;
    auto rule = table_rule(catalog, oid, rel_pubs);
    if (!rule.ok()) return rule.error();
    out.tables[oid] = std::move(*rule);
  }
  PGRELAY_TRY(add_partitions_via_root(catalog, pubs, by_table, out));
  return out;
}

// The PostgreSQL 15 view of `names`: per table, what pgoutput decides.
Result<log::ViewOptions> view_of(const pgoutput::PublicationCatalog& catalog,
                                 const std::vector<std::string>& names, bool messages) {
  auto pubs = select_publications(catalog.publications, names);
  if (!pubs.ok()) return pubs.error();
  auto rules = table_rules(catalog, *pubs);
  if (!rules.ok()) return rules.error();
  log::ViewOptions view;
  view.publications = std::move(*rules);
  view.operations = log::kAllOperations & ~log::kOpMessage;
  if (messages) view.operations |= log::kOpMessage;
  return view;
}

Result<pgoutput::PublicationCatalog> read_catalog(PGconn* conn) {
  auto text = read_publication_catalog_text(conn);
  if (!text.ok()) return text.error();
  return pgoutput::parse_publication_catalog(*text);
}

}  // namespace

Result<std::string> read_publication_catalog_text(PGconn* conn) {
  const std::string sql = pgoutput::publication_catalog_query("ARRAY[]::text[]");
  auto res = query(conn, sql.c_str(), nullptr);
  if (!res.ok()) return res.error();
  if (PQntuples(res->get()) != 1) {
    return Error::make(sqlstate::kInternalError, "the publications' catalog query returned " +
                                                     std::to_string(PQntuples(res->get())) +
                                                     " rows");
  }
  return std::string(PQgetvalue(res->get(), 0, 0));
}

namespace {

// ---- before PostgreSQL 15: publications by table name ----

Result<std::vector<Pub>> load_publications_before_15(PGconn* conn,
                                                     const std::vector<std::string>& names,
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
  std::vector<pgoutput::CatalogPublication> rows;
  for (int row = 0; row < PQntuples(res->get()); ++row) {
    auto flag = [&](int col) { return PQgetvalue(res->get(), row, col)[0] == 't'; };
    pgoutput::CatalogPublication p;
    p.name = PQgetvalue(res->get(), row, 0);
    p.all_tables = flag(1);
    p.insert = flag(2);
    p.update = flag(3);
    p.del = flag(4);
    p.truncate = flag(5);
    p.oid = static_cast<pgoutput::Oid>(std::stoul(PQgetvalue(res->get(), row, 6)));
    p.via_root = flag(7);
    rows.push_back(std::move(p));
  }
  return select_publications(rows, names);
}

// The tables of `pubs` by name, as a TableFilter: what they publish now.
Result<log::ViewOptions> view_before_15(PGconn* conn, const std::vector<Pub>& pubs,
                                        const std::string& array, bool messages) {
  log::ViewOptions view;
  view.operations = messages ? log::kOpMessage : 0;
  bool all_tables = false;
  for (const Pub& p : pubs) {
    all_tables |= p.all_tables;
    view.operations |= p.operations;
  }
  if (all_tables) return view;
  log::TableFilter filter;
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

Result<log::ViewOptions> load_view(PGconn* conn, const std::vector<std::string>& names,
                                   bool messages, bool refuse_via_root) {
  if (PQserverVersion(conn) >= 150000) {
    auto catalog = read_catalog(conn);
    if (!catalog.ok()) return catalog.error();
    return view_of(*catalog, names, messages);
  }
  const std::string array = text_array(names);
  auto pubs = load_publications_before_15(conn, names, array);
  if (!pubs.ok()) return pubs.error();
  if (refuse_via_root) PGRELAY_TRY(refuse_via_root_before_15(conn, array));
  return view_before_15(conn, *pubs, array, messages);
}

}  // namespace

Result<log::ViewOptions> load_publication_view(PGconn* conn, const std::vector<std::string>& names,
                                               bool messages) {
  return load_view(conn, names, messages, /*refuse_via_root=*/true);
}

Result<log::ViewOptions> publication_view_at(std::string_view catalog,
                                             const std::vector<std::string>& names, bool messages) {
  auto parsed = pgoutput::parse_publication_catalog(catalog);
  if (!parsed.ok()) return parsed.error();
  return view_of(*parsed, names, messages);
}

Result<log::ViewOptions> load_publication_rules(PGconn* conn,
                                                const std::vector<std::string>& names) {
  return load_view(conn, names, /*messages=*/false, /*refuse_via_root=*/false);
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

}  // namespace pgrelay::server
