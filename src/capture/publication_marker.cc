// Marks changes of the upstream's publications in the captured stream, where walsenders re-read
// them.
#include "capture/publication_marker.h"

#include "log/change_view.h"
#include "pgoutput/publication_catalog.h"

namespace pgrelay::capture {
namespace {

// The fingerprint covers what a walsender reads from publications: their actions, tables (by
// name too: a rename changes which Relations match), row filters, column lists (by name, and
// the table's relnatts, which decides whether a list naming them all is one),
// schemas, and of the partitioned tables they publish (listed, in a schema, or all of them
// under FOR ALL TABLES via the root): the leaf partitions, which a partition created, attached
// or detached changes, and the columns and replica identity, which a partition's changes are
// sent with when published via the root.
std::string fingerprint_function(const std::string& schema, const std::string& own) {
  return "CREATE OR REPLACE FUNCTION " + schema +
         R"sql(.publications_fingerprint() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  -- Partitioned tables a publication lists or holds through a schema, and all of them when a
  -- FOR ALL TABLES publication publishes via the root.
  WITH published_partitioned AS (
    SELECT c.oid, c.relreplident FROM pg_class c
    WHERE c.relkind = 'p'
      AND (EXISTS (SELECT FROM pg_publication_rel r WHERE r.prrelid = c.oid)
           OR EXISTS (SELECT FROM pg_publication_namespace n WHERE n.pnnspid = c.relnamespace)
           OR EXISTS (SELECT FROM pg_publication p WHERE p.puballtables AND p.pubviaroot))
  )
  SELECT md5(coalesce(string_agg(f.x, E'\n' ORDER BY f.x), '')) FROM (
    SELECT format('p|%s|%s|%s|%s|%s|%s|%s|%s', p.oid, p.pubname, p.puballtables, p.pubinsert,
                  p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot)
    FROM pg_publication p WHERE p.pubname::text <> ALL ()sql" +
         own + R"sql()
    UNION ALL
    SELECT format('r|%s|%s|%s|%s|%s|%s', r.prpubid, r.prrelid, r.prrelid::regclass,
                  pg_get_expr(r.prqual, r.prrelid),
                  (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
                   WHERE a.attrelid = r.prrelid AND a.attnum = ANY (r.prattrs)),
                  CASE WHEN r.prattrs IS NOT NULL THEN
                    (SELECT c.relnatts FROM pg_class c WHERE c.oid = r.prrelid) END)
    FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
    WHERE p.pubname::text <> ALL ()sql" +
         own + R"sql()
    UNION ALL
    SELECT format('n|%s|%s', n.pnpubid, n.pnnspid::regnamespace)
    FROM pg_publication_namespace n
    UNION ALL
    SELECT DISTINCT format('l|%s|%s', c.oid, l.relid::regclass)
    FROM published_partitioned c CROSS JOIN LATERAL pg_partition_tree(c.oid) l
    WHERE l.isleaf
    UNION ALL
    SELECT format('c|%s|%s|%s|%s|%s', c.oid, c.oid::regclass, c.relreplident,
                  (SELECT string_agg(format('%s:%s:%s', a.attname, a.atttypid, a.atttypmod), ','
                                     ORDER BY a.attnum)
                   FROM pg_attribute a
                   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                  (SELECT string_agg(format('%s:%s:%s', i.indkey, i.indisprimary, i.indisreplident),
                                     ',' ORDER BY i.indexrelid)
                   FROM pg_index i
                   WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident)))
    FROM published_partitioned c
  ) f(x)
$fn$;
)sql";
}

// The publications' catalog (pgoutput/publication_catalog.h) as the calling transaction sees
// it, or null before PostgreSQL 15, where walsenders read publications by name.
std::string catalog_function(const std::string& schema, const std::string& own, bool have_catalog) {
  return "CREATE OR REPLACE FUNCTION " + schema +
         ".publications_catalog() RETURNS text\n"
         // JIT (a new compilation on each call, see PgSession::adopt) took 102 ms of the
         // catalog's 196 ms; this runs in the writer's transaction on ALTER PUBLICATION and the
         // like. have_catalog means PostgreSQL 15, which has the setting.
         "LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp" +
         (have_catalog ? " SET jit = off" : "") + " AS $fn$\n" +
         (have_catalog ? pgoutput::publication_catalog_query(own) : "SELECT NULL::text") +
         "\n$fn$;\n";
}

// The row lock orders concurrent changes: in READ COMMITTED, SELECT ... FOR UPDATE waits for
// a transaction that is writing the row and then reads the row it wrote, so two transactions
// that reach the same fingerprint write one marker between them, and the catalog, read after
// the lock, is the one in force at this transaction's commit.
//
// The marker's content (UTF-8): this transaction's full xid in decimal, then a newline, the
// catalog the publications had before (empty when unknown: an installation older than the
// catalog column), a newline, and the catalog they have after. Walsenders judge the changes
// logged after the marker by the catalog after it, and a stream that starts before the marker
// judges those before it by the catalog before it (log::ChangeView::publications_change).
std::string note_function(const std::string& schema, const std::string& prefix) {
  return "CREATE OR REPLACE FUNCTION " + schema +
         R"sql(.note_publications(wait boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  f text;
  old_fingerprint text;
  old_catalog text;
  new_catalog text;
BEGIN
  IF wait THEN
    SELECT s.fingerprint, s.catalog INTO old_fingerprint, old_catalog
    FROM )sql" +
         schema + R"sql(.publication_state s FOR UPDATE;
  ELSE
    SELECT s.fingerprint, s.catalog INTO old_fingerprint, old_catalog
    FROM )sql" +
         schema + R"sql(.publication_state s FOR UPDATE SKIP LOCKED;
  END IF;
  IF NOT FOUND THEN RETURN false; END IF;
  -- Read only now, holding the row: a fingerprint read before it could predate a marker another
  -- transaction wrote and committed meanwhile, and storing it would make a later change back to
  -- that state look like no change at all.
  f := )sql" +
         schema + R"sql(.publications_fingerprint();
  IF old_fingerprint IS NOT DISTINCT FROM f THEN RETURN false; END IF;
  new_catalog := )sql" +
         schema + R"sql(.publications_catalog();
  UPDATE )sql" +
         schema + R"sql(.publication_state SET fingerprint = f, catalog = new_catalog;
  PERFORM )sql" +
         schema + ".emit_message(true, " + prefix +
         R"sql(, convert_to(pg_current_xact_id()::text || E'\n' || coalesce(old_catalog, '')
                      || E'\n' || coalesce(new_catalog, ''), 'UTF8'));
  RETURN true;
END
$fn$;
)sql";
}

}  // namespace

Status install_publication_marker(PgSession& s, const std::string& schema,
                                  const std::vector<std::string>& own) {
  auto quoted = s.ident(schema);
  if (!quoted.ok()) return quoted.error();
  auto prefix = s.literal(log::kPublicationsChangedPrefix);
  if (!prefix.ok()) return prefix.error();
  std::string own_array = "ARRAY[";
  for (std::size_t i = 0; i < own.size(); ++i) {
    auto name = s.literal(own[i]);
    if (!name.ok()) return name.error();
    own_array += (i ? ", " : "") + *name;
  }
  own_array += "]::text[]";
  const std::string& q = *quoted;
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + q + ".publication_state (fingerprint text)"));
  PGRELAY_TRY(
      s.run("ALTER TABLE " + q + ".publication_state ADD COLUMN IF NOT EXISTS catalog text"));
  auto version = s.exec("SELECT pg_catalog.current_setting('server_version_num')::int >= 150000");
  if (!version.ok()) return version.error();
  // One row, updated in place: FULL gives it the replica identity that a FOR ALL TABLES
  // publication demands of every table it holds before an UPDATE may run (an ALTER rather than a
  // key in the CREATE, so that installations made before it get it too).
  auto identity = s.exec(
      "SELECT c.relreplident FROM pg_catalog.pg_class c WHERE c.oid = $1::pg_catalog.regclass",
      {q + ".publication_state"});
  if (!identity.ok()) return identity.error();
  if (identity->value(0, 0) != "f") {
    PGRELAY_TRY(s.run("ALTER TABLE " + q + ".publication_state REPLICA IDENTITY FULL"));
  }
  PGRELAY_TRY(s.run(fingerprint_function(q, own_array)));
  PGRELAY_TRY(s.run(catalog_function(q, own_array, version->value(0, 0) == "t")));
  PGRELAY_TRY(s.run(note_function(q, *prefix)));
  PGRELAY_TRY(s.run("REVOKE ALL ON FUNCTION " + q + ".note_publications(boolean), " + q +
                    ".publications_fingerprint(), " + q + ".publications_catalog() FROM PUBLIC"));
  // The publications as they are now need no marker: they are read at START_REPLICATION.
  PGRELAY_TRY(s.run(
      "INSERT INTO " + q + ".publication_state SELECT " + q + ".publications_fingerprint(), " + q +
      ".publications_catalog() WHERE NOT EXISTS (SELECT FROM " + q + ".publication_state)"));
  // An installation older than the catalog column: the catalog now is the one the last marker
  // left only if nothing changed since (else the next check marks the change, with no catalog
  // before it).
  PGRELAY_TRY(s.run("UPDATE " + q + ".publication_state SET catalog = " + q +
                    ".publications_catalog() WHERE catalog IS NULL AND fingerprint = " + q +
                    ".publications_fingerprint()"));
  return {};
}

std::string note_publications_call(const std::string& quoted_schema, bool wait) {
  return quoted_schema + ".note_publications(" + (wait ? "true" : "false") + ")";
}

Result<bool> note_publications_periodic(PgSession& s, const std::string& quoted_schema) {
  // Taken first, the row is ours when note_publications(false) asks for it.
  auto held = s.exec("SELECT FROM " + quoted_schema + ".publication_state FOR UPDATE SKIP LOCKED");
  if (!held.ok()) return held.error();
  PGRELAY_TRY(s.run("SELECT " + note_publications_call(quoted_schema, /*wait=*/false)));
  return held->rows() > 0;
}

Status uninstall_publication_marker(PgSession& s, const std::string& schema) {
  auto quoted = s.ident(schema);
  if (!quoted.ok()) return quoted.error();
  const std::string& q = *quoted;
  return s.run("DROP FUNCTION IF EXISTS " + q + ".note_publications(boolean), " + q +
               ".publications_fingerprint(), " + q +
               ".publications_catalog(); DROP TABLE IF EXISTS " + q + ".publication_state");
}

}  // namespace pgrelay::capture
