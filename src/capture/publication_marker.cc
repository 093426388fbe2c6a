// Marks changes of the upstream's publications in the captured stream, where walsenders re-read
// them.
#include "capture/publication_marker.h"

#include "log/change_view.h"

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

// READ COMMITTED re-checks the WHERE clause after waiting for a concurrent writer of the row, so
// two transactions that reach the same fingerprint write one marker between them. The marker
// names its transaction (the full xid, in decimal): walsenders read the publications again only
// once it is visible (log::ChangeView::publications_changed_by).
std::string note_function(const std::string& schema, const std::string& prefix) {
  return "CREATE OR REPLACE FUNCTION " + schema +
         R"sql(.note_publications(wait boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  f text := )sql" +
         schema + R"sql(.publications_fingerprint();
BEGIN
  IF wait THEN
    UPDATE )sql" +
         schema + R"sql(.publication_state SET fingerprint = f
    WHERE fingerprint IS DISTINCT FROM f;
  ELSE
    UPDATE )sql" +
         schema + R"sql(.publication_state s SET fingerprint = f
    WHERE s.fingerprint IS DISTINCT FROM f AND s.ctid = ANY (ARRAY(
      SELECT l.ctid FROM )sql" +
         schema + R"sql(.publication_state l FOR UPDATE SKIP LOCKED));
  END IF;
  IF NOT FOUND THEN RETURN false; END IF;
  PERFORM )sql" +
         schema + ".emit_message(true, " + prefix +
         R"sql(, convert_to(pg_current_xact_id()::text, 'UTF8'));
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
  PGRELAY_TRY(s.run(note_function(q, *prefix)));
  PGRELAY_TRY(s.run("REVOKE ALL ON FUNCTION " + q + ".note_publications(boolean), " + q +
                    ".publications_fingerprint() FROM PUBLIC"));
  // The publications as they are now need no marker: they are read at START_REPLICATION.
  PGRELAY_TRY(s.run("INSERT INTO " + q + ".publication_state SELECT " + q +
                    ".publications_fingerprint() WHERE NOT EXISTS (SELECT FROM " + q +
                    ".publication_state)"));
  return {};
}

std::string note_publications_call(const std::string& quoted_schema, bool wait) {
  return quoted_schema + ".note_publications(" + (wait ? "true" : "false") + ")";
}

Status uninstall_publication_marker(PgSession& s, const std::string& schema) {
  auto quoted = s.ident(schema);
  if (!quoted.ok()) return quoted.error();
  const std::string& q = *quoted;
  return s.run("DROP FUNCTION IF EXISTS " + q + ".note_publications(boolean), " + q +
               ".publications_fingerprint(); DROP TABLE IF EXISTS " + q + ".publication_state");
}

}  // namespace pgrelay::capture
