// Installs and removes trigger capture upstream: change table, layouts, functions, triggers.
#include "capture/trigger/installer.h"

#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "capture/publication_marker.h"

namespace pgrelay::capture {
namespace {

// The functions install() creates. @S is the quoted schema, @L the schema as a literal (also the
// NOTIFY channel), @R/@I/@U/@D/@T/@B/@E the quoted trigger names as literals. Every function body
// is dollar-quoted with $fn$ (schema names with $, ' or % are refused, so pasting @S is safe). The
// generated row functions and sync() build their SQL with format('%I'/'%L'), never by pasting
// names.
constexpr std::string_view kFunctions = R"sql(
CREATE OR REPLACE FUNCTION @S.current_layout(p_relid pg_catalog.oid,
    OUT nspname text, OUT relname text, OUT replident "char", OUT names text[],
    OUT types pg_catalog.oid[], OUT typmods int4[], OUT keys bool[], OUT generated bool[],
    OUT toastable bool[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT n.nspname::text, c.relname::text, c.relreplident,
    coalesce(l.names, '{}'), coalesce(l.types, '{}'), coalesce(l.typmods, '{}'),
    coalesce(l.keys, '{}'), coalesce(l.generated, '{}'), coalesce(l.toastable, '{}')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN LATERAL (
    SELECT array_agg(a.attname::text ORDER BY a.attnum) AS names,
      array_agg(a.atttypid ORDER BY a.attnum) AS types,
      array_agg(a.atttypmod ORDER BY a.attnum) AS typmods,
      array_agg(CASE c.relreplident WHEN 'f' THEN true WHEN 'n' THEN false ELSE EXISTS (
          SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
            AND ((c.relreplident = 'd' AND i.indisprimary)
              OR (c.relreplident = 'i' AND i.indisreplident))
            AND a.attnum = ANY (i.indkey)) END ORDER BY a.attnum) AS keys,
      array_agg(a.attgenerated <> '' ORDER BY a.attnum) AS generated,
      array_agg(a.attlen = -1 AND a.attstorage <> 'p' ORDER BY a.attnum) AS toastable
    FROM pg_attribute a
    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) l ON true
  WHERE c.oid = p_relid
$fn$;

CREATE OR REPLACE FUNCTION @S.remove_table(p_relid pg_catalog.oid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $fn$
DECLARE
  tbl text;
BEGIN
  SELECT format('%I.%I', n.nspname, c.relname) INTO tbl FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p_relid;
  IF tbl IS NOT NULL THEN
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @R, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @I, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @U, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @D, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @B, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @T, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @E, tbl);
  END IF;
  EXECUTE format('DROP FUNCTION IF EXISTS @S.%I()', 'capture_' || p_relid);
  DELETE FROM @S.captured WHERE relid = p_relid;
END
$fn$;

-- Records the table's layout if it changed and regenerates its triggers when they were made
-- for another layout version or other operations. Returns the current version (NULL when the
-- table is not captured or no longer exists).
CREATE OR REPLACE FUNCTION @S.refresh_table(p_relid pg_catalog.oid) RETURNS int4
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $fn$
DECLARE
  cap record;
  cur record;
  prev record;
  v int4;
  tbl text;
  fn text;
  body text;
  exact boolean;
  has_key boolean;
  old_kind text;
  unchanged text[] := '{}';
  cols text := '';
  chunk text;
  flush text;
  threshold int4;
  i int4;
  in_tree boolean;
  new_rows text;
  old_rows text;
  each text;
BEGIN
  SELECT * INTO cap FROM @S.captured WHERE relid = p_relid;
  IF NOT FOUND THEN RETURN NULL; END IF;
  SELECT * INTO cur FROM @S.current_layout(p_relid);
  IF cur.nspname IS NULL THEN RETURN NULL; END IF;
  SELECT * INTO prev FROM @S.layouts WHERE relid = p_relid ORDER BY version DESC LIMIT 1;
  IF FOUND AND ROW(prev.nspname, prev.relname, prev.replident, prev.names, prev.types,
                   prev.typmods, prev.keys, prev.generated, prev.toastable)
      IS NOT DISTINCT FROM ROW(cur.nspname, cur.relname, cur.replident, cur.names, cur.types,
                               cur.typmods, cur.keys, cur.generated, cur.toastable) THEN
    v := prev.version;
  ELSE
    -- From a sequence, so a version is never reused, even by a table that gets a dropped
    -- table's OID: the poller caches layouts by (relid, version).
    v := greatest(pg_catalog.nextval('@S.layout_versions'), coalesce(prev.version, 0) + 1);
    INSERT INTO @S.layouts (relid, version, nspname, relname, replident, names, types, typmods,
                            keys, generated, toastable)
    VALUES (p_relid, v, cur.nspname, cur.relname, cur.replident, cur.names, cur.types,
            cur.typmods, cur.keys, cur.generated, cur.toastable);
  END IF;
  -- Row triggers for a table of an inheritance tree, partitions included: a partition's
  -- statement triggers fire only for writes made to it by name, and a parent's transition tables
  -- hold its children's rows too, in its own row type (an UPDATE or DELETE of the parent), where
  -- the children's statement triggers do not fire. Row triggers fire on the table that holds the
  -- row, however the statement named it.
  in_tree := EXISTS (SELECT 1 FROM pg_inherits i
                          WHERE i.inhrelid = p_relid OR i.inhparent = p_relid);
  IF cap.layout = v AND cap.row_level = in_tree THEN RETURN v; END IF;
  IF in_tree THEN
    new_rows := '(SELECT NEW.*)';
    old_rows := '(SELECT OLD.*)';
    each := 'FOR EACH ROW';
  ELSE
    new_rows := 'pgrelay_new';
    old_rows := 'pgrelay_old';
  END IF;

  tbl := format('%I.%I', cur.nspname, cur.relname);
  fn := format('@S.%I', 'capture_' || p_relid);
  exact := EXISTS (SELECT 1 FROM @S.meta WHERE key = 'event_trigger' AND value = 'on');
  threshold := (SELECT value::int4 FROM @S.meta WHERE key = 'toast_threshold');
  has_key := true = ANY (cur.keys);
  old_kind := CASE WHEN cur.replident = 'f' THEN '''O''' WHEN has_key THEN '''K''' END;
  IF exact THEN
    FOR i IN 1 .. coalesce(array_length(cur.names, 1), 0) LOOP
      IF cur.toastable[i] AND NOT cur.generated[i] THEN
        cols := cols || format(', r.%I AS c%s', cur.names[i], i);
        unchanged := unchanged || format(
          'CASE WHEN pg_catalog.pg_column_size(n.c%1$s) >= %2$s AND '
          'ROW(n.c%1$s)::record OPERATOR(pg_catalog.*=) ROW(o.c%1$s)::record THEN %1$s END',
          i, threshold);
      END IF;
    END LOOP;
  END IF;

  -- Statement-level: one call per statement, the rows from its transition tables in the order
  -- they were changed (a partition's triggers are row-level: the same body over one row, NEW
  -- and OLD in place of the transition tables). An UPDATE's old and new transition rows are stored pairwise, so their
  -- positions pair them. The rows are written in chunks, arrays of up to 1,000 rows or 1 MiB of
  -- row text (more only for a single row): a bulk statement then writes one change row,
  -- index entry and sequence value per chunk instead of per row, and its compressed arrays: a
  -- 1M-row INSERT took 3.0x its time without capture row by row, 1.8-2.0x in chunks. v_old, v_new, v_kept: a row's old text, new text and the
  -- positions of its unchanged TOASTed values.
  chunk := E'    FOR v_old, v_new, v_kept IN %1$s LOOP\n'
    || E'      v_width := coalesce(pg_catalog.octet_length(v_old), 0) OPERATOR(pg_catalog.+) '
    || E'coalesce(pg_catalog.octet_length(v_new), 0);\n'
    || E'      IF v_count OPERATOR(pg_catalog.>) 0 AND (v_count OPERATOR(pg_catalog.=) 1000 OR '
    || E'(v_bytes OPERATOR(pg_catalog.+) v_width) OPERATOR(pg_catalog.>) 1048576) THEN\n'
    || E'        %2$s\n'
    || E'        v_olds := NULL; v_news := NULL; v_kepts := NULL; v_count := 0; v_bytes := 0;\n'
    || E'      END IF;\n'
    || E'      v_count := v_count OPERATOR(pg_catalog.+) 1;\n'
    || E'      v_bytes := v_bytes OPERATOR(pg_catalog.+) v_width;\n'
    || E'      %3$s\n'
    || E'    END LOOP;\n'
    || E'    IF v_count OPERATOR(pg_catalog.>) 0 THEN\n'
    || E'      %2$s\n'
    || E'    END IF;';
  flush := 'INSERT INTO @S.changes (rel, op, layout, old_kind, old_rows, new_rows, '
           || 'unchanged_rows) VALUES (TG_RELID, %L, %s, %s, v_olds, v_news, v_kepts);';
  body := E'DECLARE\n  v_old text;\n  v_new text;\n  v_kept text;\n  v_width int8;\n'
    || E'  v_olds text[];\n  v_news text[];\n  v_kepts text[];\n  v_count int4 := 0;\n'
    || E'  v_bytes int8 := 0;\nBEGIN\n  IF TG_OP = ''INSERT'' THEN\n'
    || format(chunk, format('SELECT NULL::text, (r.*)::text, NULL::text FROM %s r', new_rows),
              format(flush, 'I', v, 'NULL'), 'v_news[v_count] := v_new;')
    || E'\n  ELSIF TG_OP = ''UPDATE'' THEN\n'
    || format(chunk,
              format('SELECT %s, n.t, %s FROM (SELECT pg_catalog.row_number() OVER () AS i, '
                     || '(r.*)::text AS t%s FROM %s r) o JOIN (SELECT '
                     || 'pg_catalog.row_number() OVER () AS i, (r.*)::text AS t%s FROM '
                     || '%s r) n ON n.i OPERATOR(pg_catalog.=) o.i ORDER BY n.i',
                     CASE WHEN old_kind IS NULL THEN 'NULL::text' ELSE 'o.t' END,
                     CASE WHEN cardinality(unchanged) = 0 THEN 'NULL::text' ELSE
                       'pg_catalog.array_to_string(pg_catalog.array_remove(ARRAY['
                       || array_to_string(unchanged, ', ') || ']::int2[], NULL), '','')' END,
                     cols, old_rows, cols, new_rows),
              format(flush, 'U', v, coalesce(old_kind, 'NULL')),
              'v_news[v_count] := v_new;'
                || CASE WHEN old_kind IS NULL THEN '' ELSE ' v_olds[v_count] := v_old;' END
                || CASE WHEN cardinality(unchanged) = 0 THEN ''
                   ELSE ' v_kepts[v_count] := v_kept;' END)
    || E'\n  ELSE\n'
    || CASE WHEN old_kind IS NULL THEN '    NULL; -- pgoutput sends no Delete without an old tuple'
       ELSE format(chunk, format('SELECT (r.*)::text, NULL::text, NULL::text FROM %s r', old_rows),
                   format(flush, 'D', v, old_kind), 'v_olds[v_count] := v_old;') END
    || E'\n  END IF;\n  IF EXISTS (SELECT 1 FROM @S.wakeup WHERE armed) THEN\n    '
    || format('PERFORM pg_catalog.pg_notify(%L, '''');', @L)
    || E'\n  END IF;\n  RETURN NULL;\nEND';
  EXECUTE format('CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql '
                 'SECURITY DEFINER %s AS %L', fn,
                 (SELECT value FROM @S.meta WHERE key = 'settings'), body);
  EXECUTE format('REVOKE ALL ON FUNCTION %s() FROM PUBLIC', fn);

  EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @R, tbl);  -- row trigger of version 1
  -- Row triggers of a partition take no transition tables (Postgres allows none there).
  IF cap.ins THEN
    EXECUTE format('CREATE OR REPLACE TRIGGER %s AFTER INSERT ON %s %s EXECUTE FUNCTION %s()',
                   @I, tbl, coalesce(each, 'REFERENCING NEW TABLE AS pgrelay_new FOR EACH '
                                           'STATEMENT'), fn);
  ELSE
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @I, tbl);
  END IF;
  IF cap.upd THEN
    EXECUTE format('CREATE OR REPLACE TRIGGER %s AFTER UPDATE ON %s %s EXECUTE FUNCTION %s()',
                   @U, tbl, coalesce(each, 'REFERENCING OLD TABLE AS pgrelay_old NEW TABLE AS '
                                           'pgrelay_new FOR EACH STATEMENT'), fn);
  ELSE
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @U, tbl);
  END IF;
  IF cap.del AND old_kind IS NOT NULL THEN
    EXECUTE format('CREATE OR REPLACE TRIGGER %s AFTER DELETE ON %s %s EXECUTE FUNCTION %s()',
                   @D, tbl, coalesce(each, 'REFERENCING OLD TABLE AS pgrelay_old FOR EACH '
                                           'STATEMENT'), fn);
  ELSE
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @D, tbl);
  END IF;
  IF cap.trunc THEN
    EXECUTE format('CREATE OR REPLACE TRIGGER %s BEFORE TRUNCATE ON %s FOR EACH STATEMENT '
                   'EXECUTE FUNCTION @S.truncate_begin()', @B, tbl);
    EXECUTE format('CREATE OR REPLACE TRIGGER %s AFTER TRUNCATE ON %s FOR EACH STATEMENT '
                   'EXECUTE FUNCTION @S.capture_truncate(%L)', @T, tbl, v);
    EXECUTE format('CREATE OR REPLACE TRIGGER %s AFTER TRUNCATE ON %s FOR EACH STATEMENT '
                   'EXECUTE FUNCTION @S.truncate_end()', @E, tbl);
  ELSE
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @B, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @T, tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS %s ON %s', @E, tbl);
  END IF;
  UPDATE @S.captured SET layout = v, row_level = in_tree WHERE relid = p_relid;
  RETURN v;
END
$fn$;

-- The tables the sources (publications, or tables named) want captured, with the operations
-- each is published for (one row per source). A partitioned table stands for its leaf
-- partitions, which hold its rows: their row triggers see every write, through the root or
-- not, as the partitions' own changes, which is how logical decoding sees them too.
CREATE OR REPLACE FUNCTION @S.wanted_tables(OUT relid pg_catalog.oid, OUT relkind text,
    OUT nspname text, OUT relname text, OUT pubname text, OUT ins boolean, OUT upd boolean,
    OUT del boolean, OUT trunc boolean)
RETURNS SETOF record LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  WITH listed AS (
    SELECT c.oid AS relid, c.relkind::text AS relkind, n.nspname::text AS nspname,
           c.relname::text AS relname, p.pubname::text AS pubname,
           p.pubinsert AS ins, p.pubupdate AS upd, p.pubdelete AS del, p.pubtruncate AS trunc
    FROM @S.sources s
    JOIN pg_publication p ON p.pubname = s.publication OR s.publication = '*'
    JOIN pg_publication_tables pt ON pt.pubname = p.pubname
    JOIN pg_namespace n ON n.nspname = pt.schemaname
    JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
    WHERE s.publication IS NOT NULL AND pt.schemaname <> @L
    UNION ALL
    SELECT c.oid, c.relkind::text, n.nspname::text, c.relname::text, NULL, true, true, true, true
    FROM @S.sources s
    JOIN pg_class c ON c.oid = s.relid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE s.publication IS NULL
  )
  SELECT * FROM listed WHERE listed.relkind <> 'p'
  UNION ALL
  -- Foreign partitions are left out: neither triggers nor logical decoding see their writes.
  SELECT c.oid, c.relkind::text, n.nspname::text, c.relname::text, w.pubname, w.ins, w.upd,
         w.del, w.trunc
  FROM listed w CROSS JOIN LATERAL pg_partition_tree(w.relid) t
  JOIN pg_class c ON c.oid = t.relid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE w.relkind = 'p' AND t.isleaf AND c.relkind = 'r'
$fn$;

-- Brings the captured tables in line with the sources (configured tables, publications) and
-- the tables' layouts. strict: raise on a table capture cannot handle, instead of skipping it.
CREATE OR REPLACE FUNCTION @S.sync(strict boolean) RETURNS int4
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  r record;
  n int4 := 0;
BEGIN
  LOCK TABLE @S.captured IN EXCLUSIVE MODE;
  FOR r IN
    SELECT w.relid, min(w.relkind) AS relkind, min(w.nspname) AS nspname,
           min(w.relname) AS relname, min(w.pubname) AS pubname, bool_or(w.ins) AS ins,
           bool_or(w.upd) AS upd, bool_or(w.del) AS del, bool_or(w.trunc) AS trunc
    FROM @S.wanted_tables() w GROUP BY w.relid
  LOOP
    IF r.relkind <> 'r' THEN
      IF strict THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
          MESSAGE = format('"%s.%s"%s is not a table', r.nspname, r.relname,
                           CASE WHEN r.pubname IS NULL THEN ''
                           ELSE format(' of publication "%s"', r.pubname) END),
          HINT = 'Trigger capture captures ordinary and partitioned tables.';
      END IF;
      CONTINUE;
    END IF;
    -- Written only when something changed: an idle sync assigns no xid and writes no WAL.
    IF NOT EXISTS (SELECT 1 FROM @S.captured c WHERE c.relid = r.relid) THEN
      INSERT INTO @S.captured (relid, ins, upd, del, trunc, layout)
      VALUES (r.relid, r.ins, r.upd, r.del, r.trunc, 0);
    ELSIF NOT EXISTS (SELECT 1 FROM @S.captured c WHERE c.relid = r.relid
                        AND ROW(c.ins, c.upd, c.del, c.trunc)
                            = ROW(r.ins, r.upd, r.del, r.trunc)) THEN
      UPDATE @S.captured SET ins = r.ins, upd = r.upd, del = r.del, trunc = r.trunc, layout = 0
      WHERE relid = r.relid;
    END IF;
    n := n + 1;
    PERFORM @S.refresh_table(r.relid);
  END LOOP;
  -- Tables no longer wanted (or dropped, or no longer plain, or detached).
  FOR r IN
    SELECT c.relid FROM @S.captured c
    WHERE c.relid NOT IN (SELECT w.relid FROM @S.wanted_tables() w WHERE w.relkind = 'r')
  LOOP
    PERFORM @S.remove_table(r.relid);
  END LOOP;
  -- Layouts no change row needs any more: older versions and those of tables not captured.
  DELETE FROM @S.layouts l
  WHERE (l.version < (SELECT max(m.version) FROM @S.layouts m WHERE m.relid = l.relid)
         OR NOT EXISTS (SELECT 1 FROM @S.captured c WHERE c.relid = l.relid))
    AND NOT EXISTS (SELECT 1 FROM @S.changes x WHERE x.rel = l.relid AND x.layout = l.version);
  RETURN n;
END
$fn$;

-- TRUNCATE statement numbering: BEFORE starts a statement unless one is already starting, the
-- second AFTER trigger ends it. Invoker rights and no SET clause: a function's SET clause would
-- undo the transaction-local settings when it returns.
CREATE OR REPLACE FUNCTION @S.truncate_begin() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF coalesce(pg_catalog.current_setting('pgrelay.truncate_phase', true), '')
      OPERATOR(pg_catalog.<>) 'b' THEN
    PERFORM pg_catalog.set_config('pgrelay.truncate_statement', pg_catalog.int8pl(
      coalesce(nullif(pg_catalog.current_setting('pgrelay.truncate_statement', true),
                                 ''), '0')::pg_catalog.int8, 1)::text, true);
    PERFORM pg_catalog.set_config('pgrelay.truncate_phase', 'b', true);
  END IF;
  RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION @S.truncate_end() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_catalog.set_config('pgrelay.truncate_phase', 'a', true);
  RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION @S.capture_truncate() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  INSERT INTO @S.changes (rel, op, layout, info) VALUES (TG_RELID, 'T', TG_ARGV[0]::int4,
    coalesce(current_setting('pgrelay.truncate_statement', true), '') || ':'
    || coalesce(current_query(), ''));
  IF EXISTS (SELECT 1 FROM @S.wakeup WHERE armed) THEN PERFORM pg_notify(@L, ''); END IF;
  RETURN NULL;
END
$fn$;

-- pg_logical_emit_message for trigger capture. The LSN returned is the upstream's WAL insert
-- position when the message was written: the message reaches the log at a greater LSN (batches
-- are placed at or after the WAL position of the poll that reads them), so "the stream passed
-- the returned LSN" never comes before the message. A non-transactional message becomes visible
-- when the calling transaction commits, and is lost if it rolls back (there are no autonomous
-- transactions without extensions); in autocommit, the usual way to call it, that is at once.
CREATE OR REPLACE FUNCTION @S.emit_message(transactional boolean, prefix text, content bytea)
RETURNS pg_catalog.pg_lsn LANGUAGE plpgsql STRICT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  INSERT INTO @S.changes (rel, op, info, content)
  VALUES (0, CASE WHEN transactional THEN 'M' ELSE 'm' END, prefix, content);
  IF EXISTS (SELECT 1 FROM @S.wakeup WHERE armed) THEN PERFORM pg_notify(@L, ''); END IF;
  RETURN pg_current_wal_insert_lsn();
END
$fn$;

-- The text form sends the text's bytes in the server encoding, as Postgres's does.
CREATE OR REPLACE FUNCTION @S.emit_message(transactional boolean, prefix text, content text)
RETURNS pg_catalog.pg_lsn LANGUAGE sql STRICT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT @S.emit_message($1, $2, convert_to($3, current_setting('server_encoding')))
$fn$;
-- Postgres lets every role call pg_logical_emit_message; so, explicitly, do we (no more: it only
-- records the message).
REVOKE ALL ON FUNCTION @S.emit_message(boolean, text, bytea), @S.emit_message(boolean, text, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @S.emit_message(boolean, text, bytea),
  @S.emit_message(boolean, text, text) TO PUBLIC;

-- Event trigger: follows DDL inside its transaction. Never fails the DDL: on error it warns and
-- leaves the catch-up to the capture service's periodic sync.
CREATE OR REPLACE FUNCTION @S.on_ddl() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF current_setting('pgrelay.in_sync', true) = 'on' THEN RETURN; END IF;
  IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() d
             WHERE d.command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                                     'ALTER TABLE', 'CREATE PUBLICATION', 'ALTER PUBLICATION',
                                     'ALTER SCHEMA', 'CREATE INDEX', 'ALTER INDEX')
                OR (d.classid = 'pg_class'::regclass
                    AND d.objid IN (SELECT relid FROM @S.captured))) THEN
    BEGIN
      PERFORM set_config('pgrelay.in_sync', 'on', true);
      PERFORM @S.sync(false);
      PERFORM set_config('pgrelay.in_sync', 'off', true);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'pgrelay trigger capture could not follow this DDL: %', SQLERRM;
    END;
  END IF;
  -- Any DDL may change what publications say (ALTER PUBLICATION ... DROP TABLE lists no
  -- command above; a rename changes a published name).
  BEGIN
    PERFORM @S.note_publications(true);
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pgrelay could not mark a change of publications: %', SQLERRM;
  END;
END
$fn$;
)sql";

// Functions the capture role keeps to itself.
constexpr std::string_view kPrivateFunctions[] = {
    "current_layout(pg_catalog.oid)",
    "remove_table(pg_catalog.oid)",
    "refresh_table(pg_catalog.oid)",
    "wanted_tables()",
    "sync(boolean)",
    "capture_truncate()",
    "on_ddl()",
    // Trigger functions: Postgres fires them without checking EXECUTE.
    "truncate_begin()",
    "truncate_end()",
};

struct Names {
  std::string schema;   // quoted schema
  std::string literal;  // schema as a literal: the NOTIFY channel
  std::string meta;
  std::string changes;
  std::string captured;
  std::string layouts;
  std::string layout_versions;
  std::string sources;
  std::string wakeup;
  std::string row_trigger;  // version 1's row trigger, dropped on upgrade
  std::string insert_trigger;
  std::string update_trigger;
  std::string delete_trigger;
  std::string trunc_trigger;
  std::string trunc_begin_trigger;
  std::string trunc_end_trigger;
  std::string event_trigger;
  // The quoted trigger names as literals, for format() in generated SQL.
  std::string row_trigger_literal;
  std::string insert_trigger_literal;
  std::string update_trigger_literal;
  std::string delete_trigger_literal;
  std::string trunc_trigger_literal;
  std::string trunc_begin_trigger_literal;
  std::string trunc_end_trigger_literal;
};

Result<Names> make_names(PgSession& s, const std::string& schema) {
  if (schema.empty() || schema.find_first_of("$'%") != std::string::npos) {
    return Error::make(sqlstate::kInvalidParameterValue,
                       "invalid trigger capture schema name \"" + schema + "\"",
                       "The schema name must be non-empty and must not contain $, ' or %.");
  }
  Names n;
  auto q = s.ident(schema);
  if (!q.ok()) return q.error();
  n.schema = *q;
  auto lit = s.literal(schema);
  if (!lit.ok()) return lit.error();
  n.literal = *lit;
  n.meta = n.schema + ".meta";
  n.changes = n.schema + ".changes";
  n.captured = n.schema + ".captured";
  n.layouts = n.schema + ".layouts";
  n.layout_versions = n.schema + ".layout_versions";
  n.sources = n.schema + ".sources";
  n.wakeup = n.schema + ".wakeup";
  for (auto [out, suffix] :
       {std::pair{&n.row_trigger, "_capture"}, std::pair{&n.insert_trigger, "_capture_insert"},
        std::pair{&n.update_trigger, "_capture_update"},
        std::pair{&n.delete_trigger, "_capture_delete"},
        std::pair{&n.trunc_trigger, "_capture_truncate"},
        std::pair{&n.trunc_begin_trigger, "_capture_truncate_begin"},
        std::pair{&n.trunc_end_trigger, "_capture_truncate_end"},
        std::pair{&n.event_trigger, "_ddl"}}) {
    auto t = s.ident(schema + suffix);
    if (!t.ok()) return t.error();
    *out = *t;
  }
  for (auto [out, quoted] : {std::pair{&n.row_trigger_literal, &n.row_trigger},
                             std::pair{&n.insert_trigger_literal, &n.insert_trigger},
                             std::pair{&n.update_trigger_literal, &n.update_trigger},
                             std::pair{&n.delete_trigger_literal, &n.delete_trigger},
                             std::pair{&n.trunc_trigger_literal, &n.trunc_trigger},
                             std::pair{&n.trunc_begin_trigger_literal, &n.trunc_begin_trigger},
                             std::pair{&n.trunc_end_trigger_literal, &n.trunc_end_trigger}}) {
    auto l = s.literal(*quoted);
    if (!l.ok()) return l.error();
    *out = *l;
  }
  return n;
}

std::string replace_all(std::string text, std::string_view from, const std::string& to) {
  for (std::size_t pos = text.find(from); pos != std::string::npos;
       pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

std::string functions_sql(const Names& n) {
  std::string sql(kFunctions);
  sql = replace_all(std::move(sql), "@S", n.schema);
  sql = replace_all(std::move(sql), "@L", n.literal);
  sql = replace_all(std::move(sql), "@R", n.row_trigger_literal);
  sql = replace_all(std::move(sql), "@I", n.insert_trigger_literal);
  sql = replace_all(std::move(sql), "@U", n.update_trigger_literal);
  sql = replace_all(std::move(sql), "@D", n.delete_trigger_literal);
  sql = replace_all(std::move(sql), "@T", n.trunc_trigger_literal);
  sql = replace_all(std::move(sql), "@B", n.trunc_begin_trigger_literal);
  sql = replace_all(std::move(sql), "@E", n.trunc_end_trigger_literal);
  return sql;
}

std::uint32_t to_u32(std::string_view text) {
  std::uint32_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && p == text.data() + text.size() ? v : 0;
}

Result<std::optional<int>> installed_version(PgSession& s, const std::string& schema) {
  auto r = s.exec(
      "SELECT pg_catalog.to_regclass(pg_catalog.quote_ident($1) || '.meta') IS NOT NULL", {schema});
  if (!r.ok()) return r.error();
  if (r->value(0, 0) != "t") return std::optional<int>();
  auto ident = s.ident(schema);
  if (!ident.ok()) return ident.error();
  auto v = s.exec("SELECT value FROM " + *ident + ".meta WHERE key = 'version'");
  if (!v.ok()) return v.error();
  if (v->rows() == 0) return std::optional<int>();
  const std::uint32_t version = to_u32(v->value(0, 0));
  if (version == 0) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "trigger capture in schema \"" + schema + "\" has an unreadable version",
                       "Run uninstall and install again.");
  }
  return std::optional<int>(static_cast<int>(version));
}

Result<std::string> server_default(PgSession& s, const char* name) {
  auto r = s.exec("SELECT reset_val FROM pg_catalog.pg_settings WHERE name = $1", {name});
  if (!r.ok()) return r.error();
  if (r->rows() == 0)
    return Error::make(sqlstate::kUndefinedObject, std::string("no setting ") + name);
  return std::string(r->value(0, 0));
}

// The SET clauses that make values independent of the writer's session: what a walsender
// serving a default subscriber prints.
Result<std::string> output_settings(PgSession& s, const std::string& timezone,
                                    const std::string& lc_monetary) {
  auto tz = s.literal(timezone);
  if (!tz.ok()) return tz.error();
  auto mon = s.literal(lc_monetary);
  if (!mon.ok()) return mon.error();
  return "SET search_path = pg_catalog, pg_temp SET DateStyle = 'ISO, MDY'"
         " SET IntervalStyle = 'postgres' SET extra_float_digits = 3 SET bytea_output = 'hex'"
         " SET TimeZone = " +
         *tz + " SET lc_monetary = " + *mon;
}

Status check_table(PgSession& s, const TableName& t, const std::string& own_schema) {
  if (t.schema == own_schema) {
    // Capturing the change table would make every captured row write another one.
    return Error::make(sqlstate::kInvalidParameterValue,
                       "cannot capture \"" + t.schema + "." + t.name +
                           "\": it is in trigger capture's own schema");
  }
  auto r = s.exec(
      "SELECT c.relkind::text FROM pg_catalog.pg_class c "
      "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = $1 AND c.relname = $2",
      {t.schema, t.name});
  if (!r.ok()) return r.error();
  if (r->rows() == 0) {
    return Error::make("42P01", "relation \"" + t.schema + "." + t.name + "\" does not exist");
  }
  if (r->value(0, 0) != "r" && r->value(0, 0) != "p") {
    return Error::make(sqlstate::kFeatureNotSupported,
                       "\"" + t.schema + "." + t.name + "\" is not a table",
                       "Trigger capture captures ordinary and partitioned tables.");
  }
  return {};
}

Status check_publication(PgSession& s, const std::string& pub) {
  auto p = s.exec("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1", {pub});
  if (!p.ok()) return p.error();
  if (p->rows() == 0) {
    return Error::make(sqlstate::kUndefinedObject, "publication \"" + pub + "\" does not exist");
  }
  return {};
}

// TOAST_TUPLE_THRESHOLD for the server's block size: no inline value is that large.
Result<int> toast_threshold(PgSession& s) {
  auto r = s.exec("SELECT pg_catalog.current_setting('block_size')");
  if (!r.ok()) return r.error();
  const int block = static_cast<int>(to_u32(r->value(0, 0)));
  if (block <= 0) return Error::make(sqlstate::kInternalError, "unexpected block_size");
  // MAXALIGN_DOWN((BLCKSZ - MAXALIGN(SizeOfPageHeaderData + 4 * sizeof(ItemIdData))) / 4)
  return ((block - 40) / 4) & ~7;
}

// Drops the triggers and functions of captured tables (works for every installed version).
Status remove_all_tables(PgSession& s, const Names& n) {
  auto r = s.exec("SELECT relid::pg_catalog.int8 FROM " + n.captured + " ORDER BY relid");
  if (!r.ok()) return r.error();
  for (int i = 0; i < r->rows(); ++i) {
    const std::string oid(r->value(i, 0));
    auto t = s.exec(
        "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = $1::pg_catalog.oid",
        {oid});
    if (!t.ok()) return t.error();
    if (t->rows() > 0) {
      const std::string table(t->value(0, 0));
      for (const std::string* trig :
           {&n.row_trigger, &n.insert_trigger, &n.update_trigger, &n.delete_trigger,
            &n.trunc_trigger, &n.trunc_begin_trigger, &n.trunc_end_trigger}) {
        PGRELAY_TRY(s.run("DROP TRIGGER IF EXISTS " + *trig + " ON " + table));
      }
    }
    PGRELAY_TRY(s.run("DROP FUNCTION IF EXISTS " + n.schema + ".\"capture_" + oid + "\"()"));
  }
  return s.run("DELETE FROM " + n.captured);
}

// Upgrades a phase-1 (version 1) installation: its change table has another shape.
// Runs `ddl` unless `present` (a query of one boolean, $1 the table) says it is done already.
Status upgrade_where_missing(PgSession& s, const std::string& present, const std::string& table,
                             const std::string& ddl) {
  auto done = s.exec(present, {table});
  if (!done.ok()) return done.error();
  if (done->rows() == 1 && done->value(0, 0) == "t") return {};
  return s.run(ddl);
}

Status upgrade_from_v1(PgSession& s, const Names& n) {
  auto left = s.exec("SELECT count(*) FROM " + n.changes);
  if (!left.ok()) return left.error();
  if (left->value(0, 0) != "0") {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "trigger capture version 1 still has captured rows",
                       "Let the version 1 capture drain the change table, then install again.");
  }
  PGRELAY_TRY(remove_all_tables(s, n));
  PGRELAY_TRY(s.run("DROP TABLE " + n.changes + ", " + n.captured));
  return s.run("DROP FUNCTION IF EXISTS " + n.schema + ".capture_truncate()");
}

}  // namespace

Result<InstallReport> install(PgSession& session, const InstallOptions& options) {
  PgSession& s = session;
  auto names = make_names(s, options.schema);
  if (!names.ok()) return names.error();
  const Names& n = *names;
  PgTransaction txn(s);
  PGRELAY_TRY(txn.begin());
  auto version = installed_version(s, options.schema);
  if (!version.ok()) return version.error();
  if (version->has_value() && **version > kInstallVersion) {
    return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                       "trigger capture in schema \"" + options.schema + "\" has version " +
                           std::to_string(**version) + ", newer than this pgrelay's " +
                           std::to_string(kInstallVersion),
                       "Upgrade pgrelay.");
  }

  auto exists =
      s.exec("SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = $1", {options.schema});
  if (!exists.ok()) return exists.error();
  InstallReport report;
  report.created_schema = exists->value(0, 0) == "0";
  // CREATE SCHEMA checks CREATE on the database even when the schema exists: skip it then.
  if (report.created_schema) PGRELAY_TRY(s.run("CREATE SCHEMA " + n.schema));
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.meta +
                    " (key text PRIMARY KEY, value text NOT NULL)"));
  // Serializes concurrent installs of the same schema.
  PGRELAY_TRY(s.run("LOCK TABLE " + n.meta + " IN EXCLUSIVE MODE"));
  if (version->has_value() && **version == 1) PGRELAY_TRY(upgrade_from_v1(s, n));
  PGRELAY_TRY(s.run("INSERT INTO " + n.meta +
                        " (key, value) VALUES ('created_schema', $1) ON CONFLICT (key) DO NOTHING",
                    {report.created_schema ? "true" : "false"}));
  auto created = s.exec("SELECT value FROM " + n.meta + " WHERE key = 'created_schema'");
  if (!created.ok()) return created.error();
  report.created_schema = created->value(0, 0) == "true";
  if (report.created_schema) {
    // Writers call emit_message(); the tables stay private (no grants on them).
    PGRELAY_TRY(s.run("GRANT USAGE ON SCHEMA " + n.schema + " TO PUBLIC"));
  }

  auto su =
      s.exec("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = pg_catalog.current_user()");
  if (!su.ok()) return su.error();
  const bool superuser = su->rows() > 0 && su->value(0, 0) == "t";
  if (options.ddl == DdlTracking::kEventTrigger && !superuser) {
    return Error::make("42501", "permission denied to create an event trigger for capture",
                       "Event triggers need a superuser; use DDL tracking by polling instead.");
  }
  report.event_trigger = options.ddl != DdlTracking::kPolling && superuser;

  auto tz = server_default(s, "TimeZone");
  if (!tz.ok()) return tz.error();
  auto mon = server_default(s, "lc_monetary");
  if (!mon.ok()) return mon.error();
  report.timezone = *tz;
  auto settings = output_settings(s, *tz, *mon);
  if (!settings.ok()) return settings.error();
  auto threshold = toast_threshold(s);
  if (!threshold.ok()) return threshold.error();
  const std::vector<std::pair<std::string, std::string>> meta = {
      {"version", std::to_string(kInstallVersion)},
      {"settings", *settings},
      {"toast_threshold", std::to_string(*threshold)},
      {"event_trigger", report.event_trigger ? "on" : "off"},
  };
  for (const auto& [key, value] : meta) {
    PGRELAY_TRY(s.run("INSERT INTO " + n.meta +
                          " (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET "
                          "value = EXCLUDED.value WHERE " +
                          n.meta + ".value IS DISTINCT FROM EXCLUDED.value",
                      {key, value}));
  }

  // Rows are keyed by the writer's top-level xid; the poller reads by snapshot visibility.
  // op: I U D T, M (transactional message), m (non-transactional message). An I, U or D row
  // holds a chunk of a statement's rows: old_rows, new_rows and unchanged_rows (each row's
  // unchanged positions, comma-separated) pair up by position. old_row, new_row and unchanged
  // hold one row, as version 3 wrote them; the poller still reads such rows after an upgrade.
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.changes +
                    " (xid pg_catalog.xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),"
                    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                    " rel pg_catalog.oid NOT NULL,"
                    " op \"char\" NOT NULL,"
                    " layout int4,"
                    " old_kind \"char\","
                    " old_row text,"
                    " new_row text,"
                    " unchanged int2[],"
                    " info text,"
                    " content bytea)"));
  // Upgrades run only where something is missing: ALTER TABLE (even ADD COLUMN IF NOT EXISTS
  // of columns that exist) and CREATE INDEX (even IF NOT EXISTS) lock the change table first,
  // and every writer of a captured table would then queue behind a transaction still open
  // (a prepared one, say) until it ends.
  PGRELAY_TRY(upgrade_where_missing(
      s,
      "SELECT count(*) = 3 FROM pg_catalog.pg_attribute WHERE attrelid = $1::pg_catalog.regclass "
      "AND attname IN ('old_rows', 'new_rows', 'unchanged_rows') AND NOT attisdropped",
      n.changes,
      "ALTER TABLE " + n.changes +
          " ADD COLUMN IF NOT EXISTS old_rows text[],"
          " ADD COLUMN IF NOT EXISTS new_rows text[],"
          " ADD COLUMN IF NOT EXISTS unchanged_rows text[]"));
  PGRELAY_TRY(upgrade_where_missing(
      s,
      "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = "
      "i.indexrelid WHERE i.indrelid = $1::pg_catalog.regclass AND c.relname = 'changes_xid')",
      n.changes, "CREATE INDEX IF NOT EXISTS changes_xid ON " + n.changes + " (xid)"));
  // Row texts of large values are TOASTed in the change table, compressed in the writer's own
  // statement: lz4 (PostgreSQL 14 and later, when built with it) does that at about twice
  // pglz's speed (300 MiB of 1 MiB values: 0.97 s against 1.79 s to write). Set once; a server
  // without lz4 keeps pglz.
  if (PQserverVersion(s.raw()) >= 140000) {
    auto pglz = s.exec(
        "SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = $1::pg_catalog.regclass "
        "AND attname IN ('old_rows', 'new_rows', 'content') AND attcompression <> 'l'",
        {n.changes});
    if (!pglz.ok()) return pglz.error();
    if (pglz->value(0, 0) != "0") {
      PGRELAY_TRY(s.run("SAVEPOINT pgrelay_lz4"));
      auto set = s.run("ALTER TABLE " + n.changes +
                       " ALTER COLUMN old_rows SET COMPRESSION lz4, ALTER COLUMN new_rows SET "
                       "COMPRESSION lz4, ALTER COLUMN content SET COMPRESSION lz4");
      if (!set.ok() && set.error().sqlstate != sqlstate::kFeatureNotSupported) return set.error();
      PGRELAY_TRY(
          s.run(set.ok() ? "RELEASE SAVEPOINT pgrelay_lz4" : "ROLLBACK TO SAVEPOINT pgrelay_lz4"));
    }
  }
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.captured +
                    " (relid pg_catalog.oid PRIMARY KEY, ins bool NOT NULL, upd bool NOT NULL,"
                    " del bool NOT NULL, trunc bool NOT NULL, layout int4 NOT NULL DEFAULT 0)"));
  // row_level: the table's triggers fire per row, as a partition's must (version 5).
  PGRELAY_TRY(upgrade_where_missing(
      s,
      "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = "
      "$1::pg_catalog.regclass AND attname = 'row_level' AND NOT attisdropped)",
      n.captured,
      "ALTER TABLE " + n.captured +
          " ADD COLUMN IF NOT EXISTS row_level bool NOT NULL DEFAULT false"));
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.layouts +
                    " (relid pg_catalog.oid NOT NULL, version int4 NOT NULL, nspname text NOT NULL,"
                    " relname text NOT NULL, replident \"char\" NOT NULL, names text[] NOT NULL,"
                    " types pg_catalog.oid[] NOT NULL, typmods int4[] NOT NULL,"
                    " keys bool[] NOT NULL, generated bool[] NOT NULL, toastable bool[] NOT NULL,"
                    " PRIMARY KEY (relid, version))"));
  // Issues layout versions (see refresh_table); it starts past the versions that an
  // installation of version 2, which numbered them per table, recorded. Owned by the column,
  // it goes with the table.
  PGRELAY_TRY(s.run("CREATE SEQUENCE IF NOT EXISTS " + n.layout_versions + " AS int4 OWNED BY " +
                    n.layouts + ".version"));
  PGRELAY_TRY(
      s.run("SELECT pg_catalog.setval($1::pg_catalog.regclass, x.m) FROM (SELECT "
            "max(version) AS m FROM " +
                n.layouts + ") x, " + n.layout_versions +
                " q WHERE x.m IS NOT NULL AND (x.m > q.last_value OR NOT q.is_called)",
            {n.layout_versions}));
  PGRELAY_TRY(s.run("CREATE TABLE IF NOT EXISTS " + n.sources +
                    " (publication text, relid pg_catalog.oid,"
                    " UNIQUE NULLS NOT DISTINCT (publication, relid))"));
  // Without a key, a FOR ALL TABLES publication would make DELETE FROM sources fail.
  PGRELAY_TRY(upgrade_where_missing(
      s, "SELECT relreplident = 'f' FROM pg_catalog.pg_class WHERE oid = $1::pg_catalog.regclass",
      n.sources, "ALTER TABLE " + n.sources + " REPLICA IDENTITY FULL"));
  // armed: the capture service is idle and waits for a NOTIFY. While it polls anyway, writers
  // skip pg_notify, whose commit-time lock would serialize their commits. Only the service
  // raises it, and never where transactions can be prepared (NOTIFY forbids PREPARE).
  PGRELAY_TRY(s.run("CREATE UNLOGGED TABLE IF NOT EXISTS " + n.wakeup +
                    " (armed bool NOT NULL DEFAULT false)"));
  PGRELAY_TRY(s.run("INSERT INTO " + n.wakeup +
                    " (armed) SELECT false WHERE NOT EXISTS (SELECT "
                    "FROM " +
                    n.wakeup + ")"));
  PGRELAY_TRY(s.run(functions_sql(n)));
  PGRELAY_TRY(install_publication_marker(s, options.schema, {}));
  for (std::string_view f : kPrivateFunctions) {
    PGRELAY_TRY(
        s.run("REVOKE ALL ON FUNCTION " + n.schema + "." + std::string(f) + " FROM PUBLIC"));
  }

  auto has_event_trigger = s.exec("SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $1",
                                  {options.schema + "_ddl"});
  if (!has_event_trigger.ok()) return has_event_trigger.error();
  if (report.event_trigger && has_event_trigger->rows() == 0) {
    PGRELAY_TRY(s.run("CREATE EVENT TRIGGER " + n.event_trigger +
                      " ON ddl_command_end EXECUTE FUNCTION " + n.schema + ".on_ddl()"));
  } else if (!report.event_trigger && has_event_trigger->rows() > 0) {
    PGRELAY_TRY(s.run("DROP EVENT TRIGGER " + n.event_trigger));
  }

  for (const auto& t : options.tables) PGRELAY_TRY(check_table(s, t, options.schema));
  for (const auto& p : options.publications) PGRELAY_TRY(check_publication(s, p));
  PGRELAY_TRY(s.run("DELETE FROM " + n.sources));
  for (const auto& t : options.tables) {
    // By OID, as a publication holds its tables: a renamed table stays captured.
    PGRELAY_TRY(
        s.run("INSERT INTO " + n.sources +
                  " (relid) SELECT c.oid FROM pg_catalog.pg_class c JOIN "
                  "pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 "
                  "AND c.relname = $2 ON CONFLICT DO NOTHING",
              {t.schema, t.name}));
  }
  for (const auto& p : options.publications) {
    PGRELAY_TRY(s.run(
        "INSERT INTO " + n.sources + " (publication) VALUES ($1) ON CONFLICT DO NOTHING", {p}));
  }
  if (options.all_publications) {
    // '*' stands for every publication, present and future (sync() reads it that way).
    PGRELAY_TRY(
        s.run("INSERT INTO " + n.sources + " (publication) VALUES ('*') ON CONFLICT DO NOTHING"));
  }
  // A version change regenerates every trigger function.
  if (!version->has_value() || **version != kInstallVersion) {
    PGRELAY_TRY(s.run("UPDATE " + n.captured + " SET layout = 0"));
  }
  PGRELAY_TRY(s.run("SELECT set_config('pgrelay.in_sync', 'on', true)"));
  // A table capture cannot take is left out rather than refused: the others still stream.
  auto synced = s.exec("SELECT " + n.schema + ".sync(false)");
  if (!synced.ok()) return synced.error();
  report.captured_tables = static_cast<int>(to_u32(synced->value(0, 0)));
  PGRELAY_TRY(txn.commit());
  return report;
}

Result<int> sync_tables(PgSession& session, const std::string& schema, CatalogWatch* watch) {
  auto names = make_names(session, schema);
  if (!names.ok()) return names.error();
  PgTransaction txn(session);
  PGRELAY_TRY(txn.begin());
  if (watch) {
    auto due = watch->due(session);
    if (!due.ok()) return due.error();
    if (!*due) {
      PGRELAY_TRY(txn.commit());
      return 0;
    }
  }
  // The poller's session, which runs this too, plans without sequential scans (see
  // TriggerPoller::open); the catalog queries of sync() need them. It waits for a lock at most
  // half the server's deadlock_timeout: a sync that regenerates a partition's triggers, then
  // reads its root (the publications fingerprint), can deadlock with an application's DDL that
  // locks them the other way round (DETACH PARTITION), and the deadlock detector would then
  // cancel whichever waited first, the application's statement too. Giving up first leaves
  // the DDL alone; the next sync, a second later, does the work.
  PGRELAY_TRY(session.run(
      "SELECT set_config('pgrelay.in_sync', 'on', true), set_config('enable_seqscan', 'on', "
      "true), set_config('lock_timeout', greatest(1, (pg_catalog.date_part('epoch', "
      "pg_catalog.current_setting('deadlock_timeout')::interval) * 500)::int4)::text, true)"));
  auto r = session.exec("SELECT " + names->schema + ".sync(false)");
  if (!r.ok()) return r.error();
  const int n = static_cast<int>(to_u32(r->value(0, 0)));
  auto noted = note_publications_periodic(session, names->schema);
  if (!noted.ok()) return noted.error();
  PGRELAY_TRY(txn.commit());
  if (watch && *noted) watch->done();
  return n;
}

Status uninstall(PgSession& session, const std::string& schema) {
  PgSession& s = session;
  auto names = make_names(s, schema);
  if (!names.ok()) return names.error();
  const Names& n = *names;
  PgTransaction txn(s);
  PGRELAY_TRY(txn.begin());
  auto version = installed_version(s, schema);
  if (!version.ok()) return version.error();
  if (!version->has_value()) return txn.commit();
  PGRELAY_TRY(s.run("LOCK TABLE " + n.meta + " IN EXCLUSIVE MODE"));
  auto evt =
      s.exec("SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $1", {schema + "_ddl"});
  if (!evt.ok()) return evt.error();
  if (evt->rows() > 0) PGRELAY_TRY(s.run("DROP EVENT TRIGGER " + n.event_trigger));
  PGRELAY_TRY(remove_all_tables(s, n));
  auto created = s.exec("SELECT value FROM " + n.meta + " WHERE key = 'created_schema'");
  if (!created.ok()) return created.error();
  if (created->rows() > 0 && created->value(0, 0) == "true") {
    PGRELAY_TRY(s.run("DROP SCHEMA " + n.schema + " CASCADE"));
  } else {
    auto fns = s.exec(
        "SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p "
        "WHERE p.pronamespace = $1::pg_catalog.regnamespace AND p.proname = ANY ($2::text[])",
        {n.schema,
         "{current_layout,remove_table,refresh_table,wanted_tables,sync,truncate_begin,"
         "truncate_end,capture_truncate,emit_message,on_ddl}"});
    if (!fns.ok()) return fns.error();
    for (int i = 0; i < fns->rows(); ++i) {
      PGRELAY_TRY(s.run("DROP FUNCTION IF EXISTS " + std::string(fns->value(i, 0))));
    }
    PGRELAY_TRY(uninstall_publication_marker(s, schema));
    PGRELAY_TRY(s.run("DROP TABLE IF EXISTS " + n.changes + ", " + n.captured + ", " + n.layouts +
                      ", " + n.sources + ", " + n.wakeup + ", " + n.meta));
  }
  return txn.commit();
}

}  // namespace pgrelay::capture
