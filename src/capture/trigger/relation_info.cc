// Reads a table's pgoutput Relation (columns, types, replica identity key flags) from the catalog.
#include "capture/trigger/relation_info.h"

#include <charconv>
#include <map>
#include <set>
#include <string>

namespace pgrelay::capture {
namespace {

// Postgres's FirstGenbkiObjectId: pgoutput sends Type records only for types at or above it.
constexpr pgoutput::Oid kFirstGenbkiObjectId = 10000;

template <typename T>
Result<T> parse_int(std::string_view s, const char* what) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) {
    return Error::make(sqlstate::kInternalError,
                       std::string("unexpected ") + what + " from the catalog: " + std::string(s));
  }
  return v;
}

// pgoutput writes "" for pg_catalog.
std::string wire_namespace(std::string_view nsp) {
  return nsp == "pg_catalog" ? std::string() : std::string(nsp);
}

}  // namespace

Result<std::optional<pgoutput::Relation>> load_relation(PgSession& session, pgoutput::Oid oid) {
  auto head = session.exec(
      "SELECT n.nspname, c.relname, c.relreplident::text FROM pg_catalog.pg_class c "
      "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::pg_catalog.oid",
      {std::to_string(oid)});
  if (!head.ok()) return head.error();
  if (head->rows() == 0) return std::optional<pgoutput::Relation>();
  pgoutput::Relation rel;
  rel.oid = oid;
  rel.namespace_name = wire_namespace(head->value(0, 0));
  rel.name = std::string(head->value(0, 1));
  std::string_view ident = head->value(0, 2);
  rel.replica_identity = ident.empty() ? pgoutput::kReplicaIdentityDefault : ident[0];

  auto cols = session.exec(
      "SELECT a.attname, a.atttypid::pg_catalog.int8, a.atttypmod, "
      "  CASE c.relreplident WHEN 'f' THEN true WHEN 'n' THEN false ELSE EXISTS ("
      "    SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid"
      "      AND ((c.relreplident = 'd' AND i.indisprimary)"
      "        OR (c.relreplident = 'i' AND i.indisreplident))"
      "      AND a.attnum = ANY (i.indkey)) END "
      "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
      "WHERE c.oid = $1::pg_catalog.oid AND a.attnum > 0 AND NOT a.attisdropped "
      "  AND a.attgenerated = '' ORDER BY a.attnum",
      {std::to_string(oid)});
  if (!cols.ok()) return cols.error();
  for (int r = 0; r < cols->rows(); ++r) {
    pgoutput::Column col;
    col.name = std::string(cols->value(r, 0));
    auto type_oid = parse_int<std::uint32_t>(cols->value(r, 1), "type OID");
    if (!type_oid.ok()) return type_oid.error();
    auto typmod = parse_int<std::int32_t>(cols->value(r, 2), "type modifier");
    if (!typmod.ok()) return typmod.error();
    col.type_oid = *type_oid;
    col.type_modifier = *typmod;
    col.flags = cols->value(r, 3) == "t" ? pgoutput::kColumnIsKey : 0;
    rel.columns.push_back(std::move(col));
  }
  return std::optional<pgoutput::Relation>(std::move(rel));
}

Result<std::map<pgoutput::Oid, pgoutput::Type>> load_types(PgSession& session,
                                                           const std::set<pgoutput::Oid>& oids) {
  std::map<pgoutput::Oid, pgoutput::Type> out;
  std::string array;
  for (pgoutput::Oid oid : oids) {
    if (oid < kFirstGenbkiObjectId) continue;
    array += (array.empty() ? "" : ",") + std::to_string(oid);
  }
  if (array.empty()) return out;
  // Each wanted type with the first of its domain chain's base types that is no domain.
  auto r = session.exec(
      "WITH RECURSIVE base(want, oid) AS (SELECT w, w FROM pg_catalog.unnest($1::pg_catalog.oid[]) "
      "  AS w UNION ALL SELECT b.want, t.typbasetype FROM pg_catalog.pg_type t "
      "  JOIN base b ON t.oid = b.oid WHERE t.typtype = 'd') "
      "SELECT b.want::pg_catalog.int8::text, n.nspname, t.typname FROM base b "
      "JOIN pg_catalog.pg_type t ON t.oid = b.oid "
      "JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE t.typtype <> 'd'",
      {"{" + array + "}"});
  if (!r.ok()) return r.error();
  for (int i = 0; i < r->rows(); ++i) {
    auto oid = parse_int<std::uint32_t>(r->value(i, 0), "type OID");
    if (!oid.ok()) return oid.error();
    out.insert_or_assign(*oid, pgoutput::Type{std::nullopt, *oid, wire_namespace(r->value(i, 1)),
                                              std::string(r->value(i, 2))});
  }
  return out;
}

}  // namespace pgrelay::capture
