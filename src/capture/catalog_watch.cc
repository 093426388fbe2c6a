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
//
// $1 is the snapshot of the read the last completed check noted (or NULL). While it is still
// the current one, no transaction that wrote anything has ended since (a transaction ending
// moves xmax past its xid or drops it from the running ones), so the catalogs are as they were
// and the fingerprint, whose scans cost 17.8 ms with 2,000 tables, is not read (the InitPlan
// of the CASE's other branch is evaluated only when that branch is taken).
constexpr const char* kFingerprintSql = R"sql(
WITH head AS (SELECT pg_catalog.pg_current_snapshot()::text AS snap)
SELECT h.snap, CASE WHEN h.snap OPERATOR(pg_catalog.=) $1 THEN NULL ELSE (
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
    FROM rows) END
FROM head h
)sql";

}  // namespace

Result<bool> CatalogWatch::due(PgSession& session) {
  Params noted_snapshot{noted_ ? std::optional<std::string>(noted_->snapshot) : std::nullopt};
  auto r = session.exec_prepared("pgrelay_catalog_watch", kFingerprintSql, noted_snapshot);
  if (!r.ok()) return r.error();
  Read read{std::string(r->value(0, 0)), std::string(r->value(0, 1)), Clock::now()};
  // No fingerprint: the snapshot is the noted one, and so are the catalogs.
  if (r->is_null(0, 1) && noted_) read.fingerprint = noted_->fingerprint;
  const bool changed =
      !noted_ || noted_->fingerprint != read.fingerprint || read.at - noted_->at >= recheck_;
  if (changed) {
    ++checks_;
  } else {
    // The catalogs in this snapshot are the ones the last check saw: compare later reads with
    // it, so that an upstream that went idle after writes skips the fingerprint again.
    noted_->snapshot = read.snapshot;
  }
  read_ = std::move(read);
  return changed;
}

void CatalogWatch::done() {
  if (read_) noted_ = read_;
}

}  // namespace pgrelay::capture
