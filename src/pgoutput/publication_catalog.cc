// The upstream catalog rows a pgoutput view of publications is decided from: the one query that
// reads them (PostgreSQL 15 and later) as JSON text, and that text parsed.
#include "pgoutput/publication_catalog.h"

#include <cstdint>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace pgrelay::pgoutput {
namespace {

using Json = nlohmann::json;

// Every row is a JSON array of its columns; OIDs go out as int8 so that they are numbers.
constexpr const char* kQueryHead = R"sql(WITH pub AS (
  SELECT * FROM pg_catalog.pg_publication WHERE pubname::text <> ALL ()sql";

constexpr const char* kQueryBody = R"sql()
), via_root AS (SELECT EXISTS (SELECT FROM pub WHERE pub.pubviaroot) AS wanted)
SELECT pg_catalog.json_build_object(
  'version', 1,
  'publications', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
             p.oid::pg_catalog.int8, p.pubname::text, p.puballtables, p.pubinsert, p.pubupdate,
             p.pubdelete, p.pubtruncate, p.pubviaroot) ORDER BY p.oid)
    FROM pub p),
  'rels', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
             r.prpubid::pg_catalog.int8, r.prrelid::pg_catalog.int8) ORDER BY r.prpubid, r.prrelid)
    FROM pg_catalog.pg_publication_rel r JOIN pub p ON p.oid = r.prpubid),
  'schemas', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
             s.pnpubid::pg_catalog.int8, s.pnnspid::pg_catalog.int8, n.nspname::text)
             ORDER BY s.pnpubid, s.pnnspid)
    FROM pg_catalog.pg_publication_namespace s JOIN pub p ON p.oid = s.pnpubid
    JOIN pg_catalog.pg_namespace n ON n.oid = s.pnnspid),
  'tables', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
             p.oid::pg_catalog.int8, c.oid::pg_catalog.int8, t.schemaname::text,
             t.tablename::text, c.relnatts, c.relkind = 'p', c.relispartition,
             EXISTS (SELECT FROM pg_catalog.pg_publication_namespace pn
                     WHERE pn.pnpubid = p.oid AND pn.pnnspid = c.relnamespace),
             pr.oid IS NOT NULL, pr.prattrs IS NOT NULL,
             (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum)
              FROM pg_catalog.pg_attribute a
              WHERE a.attrelid = c.oid AND a.attnum = ANY (pr.prattrs::pg_catalog.int2[])),
             pg_catalog.cardinality(pr.prattrs::pg_catalog.int2[]),
             pg_catalog.pg_get_expr(pr.prqual, pr.prrelid)) ORDER BY p.oid, c.oid)
    FROM pg_catalog.pg_publication_tables t
    JOIN pub p ON p.pubname = t.pubname AND NOT p.puballtables
    JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
    JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
    LEFT JOIN pg_catalog.pg_publication_rel pr ON pr.prpubid = p.oid AND pr.prrelid = c.oid),
  'filter_columns', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(f.relid::pg_catalog.int8, (
             SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
                      a.attname::text, a.atttypid::pg_catalog.int8,
                      pg_catalog.format_type(a.atttypid, a.atttypmod),
                      COALESCE(co.collname::text, ''), COALESCE(co.collisdeterministic, true))
                      ORDER BY a.attnum)
             FROM pg_catalog.pg_attribute a
             LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
             WHERE a.attrelid = f.relid AND a.attnum > 0 AND NOT a.attisdropped
               AND a.attgenerated = '')) ORDER BY f.relid)
    FROM (SELECT DISTINCT r.prrelid AS relid FROM pg_catalog.pg_publication_rel r
          JOIN pub p ON p.oid = r.prpubid WHERE r.prqual IS NOT NULL) f),
  'tree', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
             c.oid::pg_catalog.int8, c.relkind = 'p', c.relnamespace::pg_catalog.int8,
             n.nspname::text, c.relname::text,
             ARRAY(SELECT a.relid::pg_catalog.int8
                   FROM pg_catalog.pg_partition_ancestors(c.oid) WITH ORDINALITY a(relid, i)
                   WHERE a.relid <> c.oid ORDER BY a.i)) ORDER BY c.oid)
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE (SELECT wanted FROM via_root) AND c.relkind IN ('r', 'p')
      AND (c.relispartition OR c.relkind = 'p')),
  'partitioned', (
    SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
             c.oid::pg_catalog.int8, n.nspname::text, c.relname::text, c.relreplident::text, (
             SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
                      a.attname::text, a.atttypid::pg_catalog.int8, a.atttypmod,
                      CASE c.relreplident WHEN 'f' THEN true WHEN 'n' THEN false ELSE EXISTS (
                        SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid
                          AND ((c.relreplident = 'd' AND i.indisprimary)
                            OR (c.relreplident = 'i' AND i.indisreplident))
                          AND a.attnum = ANY (i.indkey)) END) ORDER BY a.attnum)
             FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
               AND a.attgenerated = '')) ORDER BY c.oid)
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE (SELECT wanted FROM via_root) AND c.relkind = 'p')
)::text)sql";

Error malformed(const std::string& why) {
  return Error::make(sqlstate::kDataCorrupted, "malformed publication catalog: " + why);
}

// An aggregate's rows: an array, or none (json_agg of no rows is null).
const Json& rows(const Json& value) {
  static const Json kNone = Json::array();
  return value.is_null() ? kNone : value;
}

const Json& rows_of(const Json& doc, const char* key) {
  return rows(doc.at(key));
}

// An integer in T's range; anything else (a float, out of range) is text we did not write.
template <typename T>
T integer(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(v);
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
        (v < 0 || static_cast<std::uint64_t>(v) <=
                      static_cast<std::uint64_t>(std::numeric_limits<T>::max()))) {
      return static_cast<T>(v);
    }
  }
  throw std::invalid_argument("expected an integer in range, got " + value.dump());
}

Oid oid_at(const Json& row, std::size_t i) {
  return integer<Oid>(row.at(i));
}

std::optional<std::string> optional_text(const Json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<std::string>();
}

PublicationCatalog parse(const Json& doc) {
  if (!doc.is_object() || doc.value("version", Json()) != Json(1)) {
    throw std::invalid_argument("not version 1");
  }
  PublicationCatalog out;
  for (const Json& r : rows_of(doc, "publications")) {
    CatalogPublication p;
    p.oid = oid_at(r, 0);
    p.name = r.at(1).get<std::string>();
    p.all_tables = r.at(2).get<bool>();
    p.insert = r.at(3).get<bool>();
    p.update = r.at(4).get<bool>();
    p.del = r.at(5).get<bool>();
    p.truncate = r.at(6).get<bool>();
    p.via_root = r.at(7).get<bool>();
    out.publications.push_back(std::move(p));
  }
  for (const Json& r : rows_of(doc, "rels")) out.rels.emplace_back(oid_at(r, 0), oid_at(r, 1));
  for (const Json& r : rows_of(doc, "schemas")) {
    out.schemas.emplace_back(oid_at(r, 0), oid_at(r, 1));
    out.schema_names[oid_at(r, 1)] = r.at(2).get<std::string>();
  }
  for (const Json& r : rows_of(doc, "tables")) {
    CatalogTable t;
    t.pub = oid_at(r, 0);
    t.oid = oid_at(r, 1);
    t.schema = r.at(2).get<std::string>();
    t.table = r.at(3).get<std::string>();
    t.natts = integer<int>(r.at(4));
    t.partitioned = r.at(5).get<bool>();
    t.is_partition = r.at(6).get<bool>();
    t.via_schema = r.at(7).get<bool>();
    t.has_rel_row = r.at(8).get<bool>();
    if (r.at(9).get<bool>()) {
      t.columns = r.at(10).is_null() ? std::vector<std::string>()
                                     : r.at(10).get<std::vector<std::string>>();
      t.list_size = r.at(11).is_null() ? 0 : integer<int>(r.at(11));
    }
    t.qual = optional_text(r.at(12));
    out.tables.push_back(std::move(t));
  }
  for (const Json& r : rows_of(doc, "filter_columns")) {
    std::vector<CatalogFilterColumn>& columns = out.filter_columns[oid_at(r, 0)];
    for (const Json& c : rows(r.at(1))) {
      CatalogFilterColumn column;
      column.name = c.at(0).get<std::string>();
      column.type_oid = oid_at(c, 1);
      column.type_name = c.at(2).get<std::string>();
      column.collation = c.at(3).get<std::string>();
      column.deterministic = c.at(4).get<bool>();
      columns.push_back(std::move(column));
    }
  }
  for (const Json& r : rows_of(doc, "tree")) {
    CatalogTreeNode node;
    node.oid = oid_at(r, 0);
    node.partitioned = r.at(1).get<bool>();
    node.namespace_oid = oid_at(r, 2);
    node.schema = r.at(3).get<std::string>();
    node.table = r.at(4).get<std::string>();
    for (const Json& a : rows(r.at(5))) node.ancestors.push_back(integer<Oid>(a));
    out.tree.push_back(std::move(node));
  }
  for (const Json& r : rows_of(doc, "partitioned")) {
    Relation rel;
    rel.oid = oid_at(r, 0);
    const std::string schema = r.at(1).get<std::string>();
    rel.namespace_name = schema == "pg_catalog" ? std::string() : schema;
    rel.name = r.at(2).get<std::string>();
    const std::string identity = r.at(3).get<std::string>();
    if (identity.size() != 1) throw std::invalid_argument("replica identity");
    rel.replica_identity = identity[0];
    for (const Json& c : rows(r.at(4))) {
      Column column;
      column.name = c.at(0).get<std::string>();
      column.type_oid = oid_at(c, 1);
      column.type_modifier = integer<std::int32_t>(c.at(2));
      column.flags = c.at(3).get<bool>() ? kColumnIsKey : 0;
      rel.columns.push_back(std::move(column));
    }
    out.partitioned.emplace(rel.oid, std::move(rel));
  }
  return out;
}

}  // namespace

std::string publication_catalog_query(const std::string& own_names) {
  return std::string(kQueryHead) + own_names + kQueryBody;
}

Result<PublicationCatalog> parse_publication_catalog(std::string_view json) {
  try {
    return parse(Json::parse(json));
  } catch (const std::exception& e) {
    return malformed(e.what());
  }
}

}  // namespace pgrelay::pgoutput
