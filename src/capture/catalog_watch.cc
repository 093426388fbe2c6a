// Tells a periodic catalog check whether the catalog rows it reads changed since it last ran.
#include "capture/catalog_watch.h"

namespace pgrelay::capture {
namespace {

// xmin has no cast to a number but through text. Only tables (ordinary and partitioned) from
// FirstNormalObjectId (16384) on count, with their user columns and their indexes: the
// system's own relations are thousands of pg_attribute rows that no check reads, and an index's
// or TOAST table's own rows say nothing a pg_index row does not. Temporary tables are left out
// with their columns and indexes (no publication or capture holds one): applications that make
// them all the time would otherwise make every check run.
constexpr const char* kFingerprintSql = R"sql(
WITH tables AS (
  SELECT c.oid, c.xmin FROM pg_catalog.pg_class c
  WHERE c.oid OPERATOR(pg_catalog.>=) 16384 AND c.relkind IN ('r', 'p')
    AND c.relpersistence OPERATOR(pg_catalog.<>) 't'
), rows(x) AS (
  SELECT t.xmin::text::int8 FROM tables t
  UNION ALL
  SELECT a.xmin::text::int8 FROM tables t JOIN pg_catalog.pg_attribute a
    ON a.attrelid OPERATOR(pg_catalog.=) t.oid AND a.attnum OPERATOR(pg_catalog.>) 0
  UNION ALL
  SELECT i.xmin::text::int8 FROM tables t JOIN pg_catalog.pg_index i
    ON i.indrelid OPERATOR(pg_catalog.=) t.oid
  UNION ALL
  SELECT n.xmin::text::int8 FROM pg_catalog.pg_namespace n
  UNION ALL
  SELECT h.xmin::text::int8 FROM pg_catalog.pg_inherits h
  UNION ALL
  SELECT p.xmin::text::int8 FROM pg_catalog.pg_publication p
  UNION ALL
  SELECT pr.xmin::text::int8 FROM pg_catalog.pg_publication_rel pr
  UNION ALL
  SELECT pn.xmin::text::int8 FROM pg_catalog.pg_publication_namespace pn
)
SELECT pg_catalog.concat_ws(':', pg_catalog.count(*), pg_catalog.sum(x),
                            pg_catalog.sum(pg_catalog.hashint8(x)))
FROM rows
)sql";

}  // namespace

Result<bool> CatalogWatch::due(PgSession& session) {
  auto r = session.exec_prepared("pgrelay_catalog_watch", kFingerprintSql, {});
  if (!r.ok()) return r.error();
  read_ = std::string(r->value(0, 0));
  read_at_ = Clock::now();
  const bool changed = !noted_ || *noted_ != *read_ || read_at_ - noted_at_ >= recheck_;
  if (changed) ++checks_;
  return changed;
}

void CatalogWatch::done() {
  if (!read_) return;
  noted_ = read_;
  noted_at_ = read_at_;
}

}  // namespace pgrelay::capture
