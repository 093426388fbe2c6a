// The upstream catalog rows a pgoutput view of publications is decided from: the one query that
// reads them (PostgreSQL 15 and later) as JSON text, and that text parsed.
//
// One query serves both places it is read: a walsender reads the publications as they are now
// (at START_REPLICATION), and capture's marker function runs the same query inside the
// transaction that changed them and logs its answer, so that a walsender reaching that point
// of the log later (a consumer catching up) judges the changes after it by the publications as
// they stood then, as Postgres's historic catalog snapshots do, not as they are when it reads.
//
// The rows are those of every publication except pgrelay's own. Publications FOR ALL TABLES
// list no tables here (pg_publication_tables would list every table): what they publish
// follows from their flags.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "pgoutput/messages.h"

namespace pgrelay::pgoutput {

// The query, one row and one text column: the catalog as JSON. `own_names` is an SQL
// expression of type text[] naming the publications to leave out (pgrelay's own).
std::string publication_catalog_query(const std::string& own_names);

struct CatalogPublication {
  Oid oid = 0;
  std::string name;
  bool all_tables = false;
  bool insert = false, update = false, del = false, truncate = false;
  bool via_root = false;  // publish_via_partition_root
  bool operator==(const CatalogPublication&) const = default;
};

// A (publication, table) row of pg_publication_tables, for a publication not FOR ALL TABLES,
// with its pg_publication_rel row when it has one.
struct CatalogTable {
  Oid pub = 0;
  Oid oid = 0;
  std::string schema, table;
  int natts = 0;              // pg_class.relnatts: dropped and generated columns included
  bool partitioned = false;   // relkind 'p'
  bool is_partition = false;  // relispartition
  bool via_schema = false;    // the publication holds the table's schema
  bool has_rel_row = false;
  std::optional<std::vector<std::string>> columns;  // prattrs by name in attnum order
  int list_size = 0;                                // cardinality(prattrs)
  std::optional<std::string> qual;                  // pg_get_expr(prqual, prrelid)
  bool operator==(const CatalogTable&) const = default;
};

// A column of a table with a row filter, as the filter is checked and bound.
struct CatalogFilterColumn {
  std::string name;
  Oid type_oid = 0;
  std::string type_name;  // format_type
  std::string collation;  // empty: none
  bool deterministic = true;
  bool operator==(const CatalogFilterColumn&) const = default;
};

// A partition or partitioned table, with its ancestors from its parent up to the root.
struct CatalogTreeNode {
  Oid oid = 0;
  bool partitioned = false;
  Oid namespace_oid = 0;
  std::string schema, table;
  std::vector<Oid> ancestors;
  bool operator==(const CatalogTreeNode&) const = default;
};

struct PublicationCatalog {
  std::vector<CatalogPublication> publications;
  std::vector<std::pair<Oid, Oid>> rels;     // pg_publication_rel (prpubid, prrelid)
  std::vector<std::pair<Oid, Oid>> schemas;  // pg_publication_namespace (pnpubid, pnnspid)
  std::map<Oid, std::string> schema_names;   // of the schemas above
  std::vector<CatalogTable> tables;
  // Live, non-generated columns in attribute order of the tables a row filter is on.
  std::map<Oid, std::vector<CatalogFilterColumn>> filter_columns;
  // Only when a publication publishes via the root: every partition tree, and every
  // partitioned table as a Relation message would describe it (key columns flagged).
  std::vector<CatalogTreeNode> tree;
  std::map<Oid, Relation> partitioned;
  bool operator==(const PublicationCatalog&) const = default;
};

// Parses the query's answer; XX001 for text it did not write.
Result<PublicationCatalog> parse_publication_catalog(std::string_view json);

}  // namespace pgrelay::pgoutput
