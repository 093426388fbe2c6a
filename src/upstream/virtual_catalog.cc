// Installs, feeds and listens to the virtual catalog pgrelay keeps in its upstream schema.
#include "upstream/virtual_catalog.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <utility>

namespace pgrelay::upstream {
namespace {

using Params = std::vector<std::optional<std::string>>;  // text parameters; nullopt is NULL
using ResultPtr = std::unique_ptr<PGresult, decltype(&PQclear)>;

// ---- The installed objects (version 1). @S@ is the quoted schema, @CHANNEL@ the quoted
// NOTIFY channel. Every function pins search_path and qualifies what it uses. ----

constexpr const char* kTablesSql = R"sql(
CREATE TABLE @S@.catalog_meta (key text PRIMARY KEY, value text NOT NULL);

-- pg_replication_slots, PG 15 columns (database comes from datoid, as in Postgres).
CREATE TABLE @S@.catalog_slots (
  slot_name name PRIMARY KEY,
  plugin name,
  slot_type text NOT NULL,
  datoid oid,
  temporary boolean NOT NULL,
  active boolean NOT NULL,
  active_pid integer,
  slot_xmin xid,  -- xmin in the view (a table cannot have that column)
  catalog_xmin xid,
  restart_lsn pg_lsn,
  confirmed_flush_lsn pg_lsn,
  wal_status text,
  safe_wal_size bigint,
  two_phase boolean NOT NULL
);

-- pg_stat_replication, PG 15 columns, plus the slot each walsender streams.
CREATE TABLE @S@.catalog_walsenders (
  pid integer PRIMARY KEY,
  usesysid oid,
  usename name,
  application_name text,
  client_addr inet,
  client_hostname text,
  client_port integer,
  backend_start timestamptz,
  backend_xmin xid,
  state text,
  sent_lsn pg_lsn,
  write_lsn pg_lsn,
  flush_lsn pg_lsn,
  replay_lsn pg_lsn,
  write_lag interval,
  flush_lag interval,
  replay_lag interval,
  sync_priority integer,
  sync_state text,
  reply_time timestamptz,
  slot_name name
);

-- refusal: NULL while pgrelay captures this database; otherwise why slots cannot be made here
-- (SQLSTATE 55000, with its hint), as catalog_create_slot raises it.
CREATE TABLE @S@.catalog_server (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  log_head pg_lsn NOT NULL DEFAULT '0/0',
  refusal text DEFAULT 'pgrelay has not started capturing this database',
  refusal_detail text,
  refusal_hint text DEFAULT 'Retry in a moment; if this persists, pgrelay''s log says why.'
);
INSERT INTO @S@.catalog_server DEFAULT VALUES;

-- setting: pg_settings.setting (base unit); shown: what SHOW and current_setting() print.
CREATE TABLE @S@.catalog_settings (name text PRIMARY KEY, setting text NOT NULL, shown text NOT NULL);
INSERT INTO @S@.catalog_settings VALUES
  ('wal_level', 'logical', 'logical'),
  ('max_replication_slots', '10', '10'),
  ('max_wal_senders', '10', '10'),
  ('wal_sender_timeout', '60000', '1min');

CREATE TABLE @S@.catalog_requests (
  id bigserial PRIMARY KEY,
  kind text NOT NULL CHECK (kind IN ('create_slot', 'drop_slot', 'terminate')),
  slot_name name,
  plugin name,
  temporary boolean NOT NULL DEFAULT false,
  two_phase boolean NOT NULL DEFAULT false,
  pid integer NOT NULL DEFAULT 0,
  lsn pg_lsn,
  backend_pid integer NOT NULL DEFAULT pg_catalog.pg_backend_pid(),
  requested_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
)sql";

constexpr const char* kViewsSql = R"sql(
CREATE VIEW @S@.pg_replication_slots AS
  SELECT l.slot_name, l.plugin, l.slot_type, l.datoid, d.datname AS database, l.temporary,
         l.active, l.active_pid, l.slot_xmin AS xmin, l.catalog_xmin, l.restart_lsn, l.confirmed_flush_lsn,
         l.wal_status, l.safe_wal_size, l.two_phase
    FROM @S@.catalog_slots l
    LEFT JOIN pg_catalog.pg_database d ON l.datoid = d.oid;

-- As Postgres 15 shows it: pid, role and application_name to everyone; the connection columns
-- to roles with the privileges of the walsender's role or of pg_read_all_stats; the replication
-- columns only to the latter (pg_stat_get_wal_senders). current_user is the querying role.
CREATE VIEW @S@.pg_stat_replication AS
  SELECT w.pid, w.usesysid, w.usename, w.application_name,
         CASE WHEN v.conn THEN w.client_addr END AS client_addr,
         CASE WHEN v.conn THEN w.client_hostname END AS client_hostname,
         CASE WHEN v.conn THEN w.client_port END AS client_port,
         CASE WHEN v.conn THEN w.backend_start END AS backend_start,
         CASE WHEN v.conn THEN w.backend_xmin END AS backend_xmin,
         CASE WHEN v.stats THEN w.state END AS state,
         CASE WHEN v.stats THEN w.sent_lsn END AS sent_lsn,
         CASE WHEN v.stats THEN w.write_lsn END AS write_lsn,
         CASE WHEN v.stats THEN w.flush_lsn END AS flush_lsn,
         CASE WHEN v.stats THEN w.replay_lsn END AS replay_lsn,
         CASE WHEN v.stats THEN w.write_lag END AS write_lag,
         CASE WHEN v.stats THEN w.flush_lag END AS flush_lag,
         CASE WHEN v.stats THEN w.replay_lag END AS replay_lag,
         CASE WHEN v.stats THEN w.sync_priority END AS sync_priority,
         CASE WHEN v.stats THEN w.sync_state END AS sync_state,
         CASE WHEN v.stats THEN w.reply_time END AS reply_time
    FROM @S@.catalog_walsenders w
    CROSS JOIN LATERAL (
      SELECT s.stats, s.stats OR (w.usesysid IS NOT NULL AND EXISTS (
               SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = w.usesysid
                 AND pg_catalog.pg_has_role(pg_catalog.current_user(), r.oid, 'USAGE'))) AS conn
      FROM (SELECT pg_catalog.pg_has_role(pg_catalog.current_user(), 'pg_read_all_stats', 'USAGE')
                   AS stats) s) v;

-- Publications as Postgres lists them, without pgrelay's own schema and capture publications:
-- FOR ALL TABLES holds every table, pgrelay's bookkeeping too, and a subscriber would try to
-- copy it.
CREATE VIEW @S@.pg_publication_tables AS
  SELECT t.pubname, t.schemaname, t.tablename, t.attnames, t.rowfilter
    FROM pg_catalog.pg_publication_tables t
   WHERE t.schemaname <> @SL@ AND t.pubname::text <> ALL (@HIDDEN@);

-- What pg_dump reads, for its sessions only: a dump taken through pgrelay leaves pgrelay out and
-- restores anywhere. pgrelay's schema shows under a pg_ name, which pg_dump never dumps (with
-- everything in it: hiding the row instead would leave its objects without a schema); the capture
-- triggers on users' tables, pgrelay's event triggers and native capture's publications are left
-- out. Functions, not views: pg_dump forbids itself non-system views
-- (restrict_nonsystem_relation_kind). Each returns its catalog's columns as this server has
-- them, with tableoid first, as pg_dump reads it.
DO $do$
DECLARE
  r record;
  cols text;
BEGIN
  FOR r IN SELECT * FROM (VALUES
    ('pg_namespace', $q$
      SELECT n.tableoid, n.oid,
             CASE WHEN n.nspname = @SL@ THEN ('pg_pgrelay_' || n.oid::text)::name ELSE n.nspname END,
             n.nspowner, n.nspacl
        FROM pg_catalog.pg_namespace n $q$),
    ('pg_trigger', $q$
      SELECT t.tableoid, t.* FROM pg_catalog.pg_trigger t
       WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n
                           ON n.oid = p.pronamespace WHERE p.oid = t.tgfoid AND n.nspname = @SL@) $q$),
    ('pg_event_trigger', $q$
      SELECT e.tableoid, e.* FROM pg_catalog.pg_event_trigger e
       WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n
                           ON n.oid = p.pronamespace WHERE p.oid = e.evtfoid AND n.nspname = @SL@) $q$),
    ('pg_publication', $q$
      SELECT p.tableoid, p.* FROM pg_catalog.pg_publication p
       WHERE p.pubname::text <> ALL (@HIDDEN@) $q$),
    ('pg_publication_rel', $q$
      SELECT r.tableoid, r.* FROM pg_catalog.pg_publication_rel r
       WHERE r.prpubid NOT IN (SELECT p.oid FROM pg_catalog.pg_publication p
                                WHERE p.pubname::text = ANY (@HIDDEN@)) $q$),
    ('pg_publication_namespace', $q$
      SELECT r.tableoid, r.* FROM pg_catalog.pg_publication_namespace r
       WHERE r.pnpubid NOT IN (SELECT p.oid FROM pg_catalog.pg_publication p
                                WHERE p.pubname::text = ANY (@HIDDEN@)) $q$)
  ) v(catalog, body)
  LOOP
    SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname,
                                                   pg_catalog.format_type(a.atttypid, a.atttypmod)),
                                 ', ' ORDER BY a.attnum)
      INTO cols
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = ('pg_catalog.' || r.catalog)::pg_catalog.regclass
       AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE pg_catalog.format(
      'CREATE FUNCTION %s.%I() RETURNS TABLE (tableoid oid, %s) LANGUAGE sql STABLE '
      'SET search_path = pg_catalog, pg_temp AS %L',
      pg_catalog.quote_ident(@SL@), 'dump_' || r.catalog, cols, r.body);
  END LOOP;
END
$do$;

-- Scalar subqueries rather than a join keep pg_settings' row order.
CREATE VIEW @S@.pg_settings AS
  SELECT s.name,
         COALESCE((SELECT o.setting FROM @S@.catalog_settings o WHERE o.name = s.name), s.setting)
           AS setting,
         s.unit, s.category, s.short_desc, s.extra_desc, s.context, s.vartype, s.source,
         s.min_val, s.max_val, s.enumvals, s.boot_val,
         COALESCE((SELECT o.setting FROM @S@.catalog_settings o WHERE o.name = s.name), s.reset_val)
           AS reset_val,
         s.sourcefile, s.sourceline, s.pending_restart
    FROM pg_catalog.pg_settings s;
)sql";

constexpr const char* kFunctionsSql = R"sql(
-- The readers of pgrelay's settings and log head run as the owner (the tables are private) and
-- leave the rest to the caller's own rights.
CREATE FUNCTION @S@.catalog_setting(text) RETURNS text
  LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT o.shown FROM @S@.catalog_settings o WHERE o.name = pg_catalog.lower($1) $body$;

CREATE FUNCTION @S@.catalog_log_head() RETURNS pg_lsn
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT s.log_head FROM @S@.catalog_server s $body$;

CREATE FUNCTION @S@.current_setting(text) RETURNS text
  LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT COALESCE(@S@.catalog_setting($1), pg_catalog.current_setting($1)) $body$;

CREATE FUNCTION @S@.current_setting(text, boolean) RETURNS text
  LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT COALESCE(@S@.catalog_setting($1), pg_catalog.current_setting($1, $2)) $body$;

CREATE FUNCTION @S@.pg_current_wal_lsn() RETURNS pg_lsn
  LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT GREATEST(pg_catalog.pg_current_wal_lsn(), @S@.catalog_log_head()) $body$;

CREATE FUNCTION @S@.pg_current_wal_insert_lsn() RETURNS pg_lsn
  LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT GREATEST(pg_catalog.pg_current_wal_insert_lsn(), @S@.catalog_log_head()) $body$;

CREATE FUNCTION @S@.pg_current_wal_flush_lsn() RETURNS pg_lsn
  LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT GREATEST(pg_catalog.pg_current_wal_flush_lsn(), @S@.catalog_log_head()) $body$;

-- pg_get_publication_tables without pgrelay's schema and capture publications (see the view).
CREATE FUNCTION @S@.pg_get_publication_tables(pubname text, OUT relid oid, OUT attrs int2vector,
                                              OUT qual pg_node_tree) RETURNS SETOF record
  LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
  AS $body$
    SELECT g.relid, g.attrs, g.qual FROM pg_catalog.pg_get_publication_tables($1) g
      JOIN pg_catalog.pg_class c ON c.oid = g.relid
     WHERE c.relnamespace <> (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = @SL@)
       AND $1 <> ALL (@HIDDEN@)
  $body$;

-- ---- Slots and walsenders. Three layers:
--   catalog_*          the work, as the owner; only the owner may call them.
--   catalog_*_checked  Postgres's privilege checks on the calling role, then the work; PUBLIC.
--   pg_*               Postgres's names and signatures over the checked layer, for sessions
--                      straight to the upstream; PUBLIC.
-- Sessions through pgrelay all run upstream as pgrelay's own role, so there pgrelay's rewrite
-- chooses by the pgrelay user's REPLICATION right: relay_* (the owner's, unchecked) or denied_*
-- (Postgres's refusal).

-- The role Postgres would check: the caller's current_user, which a SECURITY DEFINER function
-- cannot see, so the public functions pass it; believed only when the session's own role could
-- have become it (SET ROLE needs membership), else the session's role itself.
CREATE FUNCTION @S@.catalog_caller(p_claimed name) RETURNS oid
  LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
  AS $body$
    SELECT CASE WHEN p_claimed IS NOT NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                       WHERE r.rolname = p_claimed
                         AND pg_catalog.pg_has_role(pg_catalog.session_user(), r.oid, 'MEMBER'))
                THEN (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = p_claimed)
                ELSE (SELECT r.oid FROM pg_catalog.pg_roles r
                       WHERE r.rolname = pg_catalog.session_user()) END
  $body$;

-- CheckSlotPermissions: superuser or the REPLICATION attribute of the role itself. True, or
-- Postgres's error.
CREATE FUNCTION @S@.catalog_check_slot_permissions(p_role oid) RETURNS boolean
  LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
  AS $body$
BEGIN
  IF NOT COALESCE((SELECT r.rolsuper OR r.rolreplication FROM pg_catalog.pg_roles r
                    WHERE r.oid = p_role), false) THEN
    RAISE EXCEPTION 'must be superuser or replication role to use replication slots'
      USING ERRCODE = '42501';
  END IF;
  RETURN true;
END
$body$;

-- Checks and error texts follow Postgres 15's slot.c / logical.c, in the same order.
CREATE FUNCTION @S@.catalog_create_slot(p_slot_name name, p_plugin name, p_temporary boolean,
                                        p_two_phase boolean) RETURNS pg_lsn
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$
DECLARE
  v_lsn pg_lsn;
  v_max integer;
  v_refusal text;
  v_detail text;
  v_hint text;
BEGIN
  -- Where Postgres checks the requirements of logical decoding (wal_level, the database).
  SELECT s.refusal, s.refusal_detail, s.refusal_hint INTO v_refusal, v_detail, v_hint
    FROM @S@.catalog_server s;
  IF v_refusal IS NOT NULL AND COALESCE(v_detail, '') = '' THEN
    RAISE EXCEPTION '%', v_refusal USING ERRCODE = '55000', HINT = COALESCE(v_hint, '');
  ELSIF v_refusal IS NOT NULL THEN
    RAISE EXCEPTION '%', v_refusal
      USING ERRCODE = '55000', DETAIL = v_detail, HINT = COALESCE(v_hint, '');
  END IF;
  IF pg_catalog.length(p_slot_name) = 0 THEN
    RAISE EXCEPTION 'replication slot name "%" is too short', p_slot_name USING ERRCODE = '42602';
  END IF;
  IF pg_catalog.translate(p_slot_name, 'abcdefghijklmnopqrstuvwxyz0123456789_', '') <> '' THEN
    RAISE EXCEPTION 'replication slot name "%" contains invalid character', p_slot_name
      USING ERRCODE = '42602',
            HINT = 'Replication slot names may only contain lower case letters, numbers, and the underscore character.';
  END IF;
  PERFORM 1 FROM @S@.catalog_slots s WHERE s.slot_name = p_slot_name;
  IF FOUND THEN
    RAISE EXCEPTION 'replication slot "%" already exists', p_slot_name USING ERRCODE = '42710';
  END IF;
  SELECT o.setting::integer INTO v_max FROM @S@.catalog_settings o WHERE o.name = 'max_replication_slots';
  IF (SELECT pg_catalog.count(*) FROM @S@.catalog_slots) >= v_max THEN
    RAISE EXCEPTION 'all replication slots are in use'
      USING ERRCODE = '53400', HINT = 'Free one or increase max_replication_slots.';
  END IF;
  IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
    RAISE EXCEPTION 'cannot create logical replication slot in transaction that has performed writes'
      USING ERRCODE = '25001';
  END IF;
  IF p_plugin <> 'pgoutput' THEN
    RAISE EXCEPTION 'could not access file "%": No such file or directory', p_plugin
      USING ERRCODE = '58P01';
  END IF;
  v_lsn := GREATEST(pg_catalog.pg_current_wal_lsn(), (SELECT log_head FROM @S@.catalog_server));
  INSERT INTO @S@.catalog_slots (slot_name, plugin, slot_type, datoid, temporary, active,
                                 active_pid, slot_xmin, catalog_xmin, restart_lsn, confirmed_flush_lsn,
                                 wal_status, safe_wal_size, two_phase)
    VALUES (p_slot_name, p_plugin, 'logical',
            (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()),
            p_temporary, false, NULL, NULL,
            ((pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text::numeric
              % 4294967296)::text)::xid,
            v_lsn, v_lsn, 'reserved', NULL, p_two_phase)
    ON CONFLICT (slot_name) DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'replication slot "%" already exists', p_slot_name USING ERRCODE = '42710';
  END IF;
  INSERT INTO @S@.catalog_requests (kind, slot_name, plugin, temporary, two_phase, lsn)
    VALUES ('create_slot', p_slot_name, p_plugin, p_temporary, p_two_phase, v_lsn);
  PERFORM pg_catalog.pg_notify(@CHANNEL@, 'create_slot');
  RETURN v_lsn;
END
$body$;

CREATE FUNCTION @S@.catalog_drop_slot(p_slot_name name) RETURNS void
  LANGUAGE plpgsql STRICT VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$
DECLARE
  v_active boolean;
  v_pid integer;
BEGIN
  SELECT s.active, s.active_pid INTO v_active, v_pid
    FROM @S@.catalog_slots s WHERE s.slot_name = p_slot_name FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'replication slot "%" does not exist', p_slot_name USING ERRCODE = '42704';
  END IF;
  IF v_active THEN
    RAISE EXCEPTION 'replication slot "%" is active for PID %', p_slot_name, COALESCE(v_pid, 0)
      USING ERRCODE = '55006';
  END IF;
  DELETE FROM @S@.catalog_slots s WHERE s.slot_name = p_slot_name;
  INSERT INTO @S@.catalog_requests (kind, slot_name) VALUES ('drop_slot', p_slot_name);
  PERFORM pg_catalog.pg_notify(@CHANNEL@, 'drop_slot');
END
$body$;

-- The walsender's role: the upstream role of the same name as the pgrelay user, if any.
CREATE FUNCTION @S@.catalog_walsender_role(p_pid integer) RETURNS oid
  LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT w.usesysid FROM @S@.catalog_walsenders w WHERE w.pid = p_pid $body$;

CREATE FUNCTION @S@.catalog_terminate_walsender(p_pid integer) RETURNS boolean
  LANGUAGE plpgsql STRICT VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM @S@.catalog_walsenders w WHERE w.pid = p_pid)
     AND NOT EXISTS (SELECT 1 FROM @S@.catalog_slots s WHERE s.active AND s.active_pid = p_pid) THEN
    RAISE WARNING 'PID % is not a PostgreSQL backend process', p_pid;
    RETURN false;
  END IF;
  INSERT INTO @S@.catalog_requests (kind, pid) VALUES ('terminate', p_pid);
  PERFORM pg_catalog.pg_notify(@CHANNEL@, 'terminate');
  RETURN true;
END
$body$;

CREATE FUNCTION @S@.catalog_create_slot_checked(p_slot_name name, p_plugin name,
                                                p_temporary boolean, p_two_phase boolean,
                                                p_caller name) RETURNS pg_lsn
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$
BEGIN
  PERFORM @S@.catalog_check_slot_permissions(@S@.catalog_caller(p_caller));
  RETURN @S@.catalog_create_slot(p_slot_name, p_plugin, p_temporary, p_two_phase);
END
$body$;

CREATE FUNCTION @S@.catalog_drop_slot_checked(p_slot_name name, p_caller name) RETURNS void
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$
BEGIN
  PERFORM @S@.catalog_check_slot_permissions(@S@.catalog_caller(p_caller));
  PERFORM @S@.catalog_drop_slot(p_slot_name);
END
$body$;

-- pg_signal_backend's rules (PG 15 messages): a superuser's process only by a superuser; any
-- other by a role with the privileges of its role or of pg_signal_backend.
CREATE FUNCTION @S@.catalog_terminate_walsender_checked(p_pid integer, p_caller name)
  RETURNS boolean
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  AS $body$
DECLARE
  v_caller oid := @S@.catalog_caller(p_caller);
  v_target oid := @S@.catalog_walsender_role(p_pid);
  v_super boolean := COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = v_caller), false);
BEGIN
  IF EXISTS (SELECT 1 FROM @S@.catalog_walsenders w WHERE w.pid = p_pid) THEN
    IF COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = v_target), false)
       AND NOT v_super THEN
      RAISE EXCEPTION 'must be a superuser to terminate superuser process' USING ERRCODE = '42501';
    END IF;
    IF NOT v_super
       AND NOT (v_target IS NOT NULL AND pg_catalog.pg_has_role(v_caller, v_target, 'USAGE'))
       AND NOT pg_catalog.pg_has_role(v_caller, 'pg_signal_backend', 'USAGE') THEN
      RAISE EXCEPTION 'must be a member of the role whose process is being terminated or member of pg_signal_backend'
        USING ERRCODE = '42501';
    END IF;
  END IF;
  RETURN @S@.catalog_terminate_walsender(p_pid);
END
$body$;

-- Postgres's signatures, IN and OUT slot_name included: for sessions straight to the upstream.
CREATE FUNCTION @S@.pg_create_logical_replication_slot(
    IN slot_name name, IN plugin name, IN temporary boolean DEFAULT false,
    IN twophase boolean DEFAULT false, OUT slot_name name, OUT lsn pg_lsn) RETURNS record
  LANGUAGE sql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT $1, @S@.catalog_create_slot_checked($1, $2, $3, $4, pg_catalog.current_user()) $body$;

-- plpgsql, as void results of sql functions read as NULL where Postgres's read as ''.
CREATE FUNCTION @S@.pg_drop_replication_slot(name) RETURNS void
  LANGUAGE plpgsql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ BEGIN PERFORM @S@.catalog_drop_slot_checked($1, pg_catalog.current_user()); END $body$;

-- pg_terminate_backend's arguments: false for an ordinary backend's pid, which Postgres itself
-- signals with the caller's own rights; true for a pgrelay walsender's, whose timeout must not
-- be negative, as Postgres checks.
CREATE FUNCTION @S@.catalog_is_walsender_pid(pid integer, timeout bigint) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
  AS $body$
BEGIN
  IF $1 < 1073741824 THEN
    RETURN false;
  END IF;
  IF $2 < 0 THEN
    RAISE EXCEPTION '"timeout" must not be negative' USING ERRCODE = '22023';
  END IF;
  RETURN true;
END
$body$;

CREATE FUNCTION @S@.pg_terminate_backend(pid integer, timeout bigint DEFAULT 0) RETURNS boolean
  LANGUAGE sql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$
    SELECT CASE WHEN @S@.catalog_is_walsender_pid($1, $2)
                THEN @S@.catalog_terminate_walsender_checked($1, pg_catalog.current_user())
                ELSE pg_catalog.pg_terminate_backend($1, $2) END
  $body$;

-- Through pgrelay, for pgrelay users with the REPLICATION right (pgrelay checked it).
CREATE FUNCTION @S@.relay_create_logical_replication_slot(
    IN slot_name name, IN plugin name, IN temporary boolean DEFAULT false,
    IN twophase boolean DEFAULT false, OUT slot_name name, OUT lsn pg_lsn) RETURNS record
  LANGUAGE sql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT $1, @S@.catalog_create_slot($1, $2, $3, $4) $body$;

CREATE FUNCTION @S@.relay_drop_replication_slot(name) RETURNS void
  LANGUAGE plpgsql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ BEGIN PERFORM @S@.catalog_drop_slot($1); END $body$;

CREATE FUNCTION @S@.relay_terminate_backend(pid integer, timeout bigint DEFAULT 0) RETURNS boolean
  LANGUAGE sql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$
    SELECT CASE WHEN @S@.catalog_is_walsender_pid($1, $2)
                THEN @S@.catalog_terminate_walsender($1)
                ELSE pg_catalog.pg_terminate_backend($1, $2) END
  $body$;

-- Through pgrelay, for pgrelay users without it: Postgres's refusals.
CREATE FUNCTION @S@.denied_create_logical_replication_slot(
    IN slot_name name, IN plugin name, IN temporary boolean DEFAULT false,
    IN twophase boolean DEFAULT false, OUT slot_name name, OUT lsn pg_lsn) RETURNS record
  LANGUAGE sql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ SELECT $1, NULL::pg_lsn WHERE @S@.catalog_check_slot_permissions(NULL) $body$;

CREATE FUNCTION @S@.denied_drop_replication_slot(name) RETURNS void
  LANGUAGE plpgsql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$ BEGIN PERFORM @S@.catalog_check_slot_permissions(NULL); END $body$;

CREATE FUNCTION @S@.denied_terminate_backend(pid integer, timeout bigint DEFAULT 0) RETURNS boolean
  LANGUAGE plpgsql STRICT VOLATILE SET search_path = pg_catalog, pg_temp
  AS $body$
BEGIN
  IF NOT @S@.catalog_is_walsender_pid($1, $2) THEN
    RETURN pg_catalog.pg_terminate_backend($1, $2);
  END IF;
  RAISE EXCEPTION 'must be a member of the role whose process is being terminated or member of pg_signal_backend'
    USING ERRCODE = '42501';
END
$body$;

-- Explicit grants: a function is executable by PUBLIC when created, so take that back from every
-- one, then give PUBLIC what Postgres gives it (the views, the readers, and the functions that
-- check their caller). The catalog_* workers and relay_* functions stay the owner's.
REVOKE ALL ON FUNCTION
  @S@.catalog_setting(text), @S@.catalog_log_head(),
  @S@.current_setting(text), @S@.current_setting(text, boolean),
  @S@.pg_current_wal_lsn(), @S@.pg_current_wal_insert_lsn(), @S@.pg_current_wal_flush_lsn(),
  @S@.pg_get_publication_tables(text),
  @S@.catalog_caller(name), @S@.catalog_check_slot_permissions(oid),
  @S@.catalog_create_slot(name, name, boolean, boolean), @S@.catalog_drop_slot(name),
  @S@.catalog_walsender_role(integer), @S@.catalog_terminate_walsender(integer),
  @S@.catalog_is_walsender_pid(integer, bigint),
  @S@.catalog_create_slot_checked(name, name, boolean, boolean, name),
  @S@.catalog_drop_slot_checked(name, name),
  @S@.catalog_terminate_walsender_checked(integer, name),
  @S@.pg_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.pg_drop_replication_slot(name), @S@.pg_terminate_backend(integer, bigint),
  @S@.relay_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.relay_drop_replication_slot(name), @S@.relay_terminate_backend(integer, bigint),
  @S@.denied_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.denied_drop_replication_slot(name), @S@.denied_terminate_backend(integer, bigint)
  FROM PUBLIC;
REVOKE ALL ON @S@.catalog_meta, @S@.catalog_slots, @S@.catalog_walsenders, @S@.catalog_server,
              @S@.catalog_settings, @S@.catalog_requests FROM PUBLIC;
GRANT USAGE ON SCHEMA @S@ TO PUBLIC;
GRANT SELECT ON @S@.pg_replication_slots, @S@.pg_stat_replication, @S@.pg_settings,
                @S@.pg_publication_tables TO PUBLIC;
GRANT EXECUTE ON FUNCTION
  @S@.catalog_setting(text), @S@.catalog_log_head(),
  @S@.current_setting(text), @S@.current_setting(text, boolean),
  @S@.pg_current_wal_lsn(), @S@.pg_current_wal_insert_lsn(), @S@.pg_current_wal_flush_lsn(),
  @S@.pg_get_publication_tables(text),
  @S@.dump_pg_namespace(), @S@.dump_pg_trigger(), @S@.dump_pg_event_trigger(),
  @S@.dump_pg_publication(), @S@.dump_pg_publication_rel(), @S@.dump_pg_publication_namespace(),
  @S@.catalog_caller(name), @S@.catalog_check_slot_permissions(oid),
  @S@.catalog_is_walsender_pid(integer, bigint),
  @S@.catalog_create_slot_checked(name, name, boolean, boolean, name),
  @S@.catalog_drop_slot_checked(name, name),
  @S@.catalog_terminate_walsender_checked(integer, name),
  @S@.pg_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.pg_drop_replication_slot(name), @S@.pg_terminate_backend(integer, bigint),
  @S@.denied_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.denied_drop_replication_slot(name), @S@.denied_terminate_backend(integer, bigint)
  TO PUBLIC;
)sql";

// Everything install() creates, dependents first.
constexpr const char* kDropSql = R"sql(
DROP VIEW IF EXISTS @S@.pg_replication_slots, @S@.pg_stat_replication, @S@.pg_settings,
  @S@.pg_publication_tables;
DROP FUNCTION IF EXISTS @S@.dump_pg_namespace(), @S@.dump_pg_trigger(), @S@.dump_pg_event_trigger(),
  @S@.dump_pg_publication(), @S@.dump_pg_publication_rel(), @S@.dump_pg_publication_namespace();
DROP FUNCTION IF EXISTS
  @S@.catalog_setting(text), @S@.catalog_log_head(),
  @S@.current_setting(text), @S@.current_setting(text, boolean),
  @S@.pg_current_wal_lsn(), @S@.pg_current_wal_insert_lsn(), @S@.pg_current_wal_flush_lsn(),
  @S@.pg_get_publication_tables(text),
  @S@.pg_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.pg_drop_replication_slot(name), @S@.pg_terminate_backend(integer, bigint),
  @S@.relay_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.relay_drop_replication_slot(name), @S@.relay_terminate_backend(integer, bigint),
  @S@.denied_create_logical_replication_slot(name, name, boolean, boolean),
  @S@.denied_drop_replication_slot(name), @S@.denied_terminate_backend(integer, bigint),
  @S@.catalog_create_slot_checked(name, name, boolean, boolean, name),
  @S@.catalog_drop_slot_checked(name, name),
  @S@.catalog_terminate_walsender_checked(integer, name),
  @S@.catalog_create_slot(name, name, boolean, boolean), @S@.catalog_drop_slot(name),
  @S@.catalog_walsender_role(integer), @S@.catalog_terminate_walsender(integer),
  @S@.catalog_is_walsender_pid(integer, bigint),
  @S@.catalog_caller(name), @S@.catalog_check_slot_permissions(oid);
DROP TABLE IF EXISTS @S@.catalog_slots, @S@.catalog_walsenders, @S@.catalog_server,
  @S@.catalog_settings, @S@.catalog_requests, @S@.catalog_meta;
)sql";

// The values of the placeholders the SQL above uses, already quoted.
struct Placeholders {
  std::string schema;          // @S@: the schema as an identifier
  std::string schema_literal;  // @SL@: the schema as a literal
  std::string channel;         // @CHANNEL@: the NOTIFY channel as a literal
  std::string hidden;          // @HIDDEN@: text[] of the publications pgrelay keeps to itself
};

std::string substitute(std::string_view text, const Placeholders& values) {
  const std::pair<std::string_view, const std::string*> names[] = {
      {"@S@", &values.schema},
      {"@SL@", &values.schema_literal},
      {"@CHANNEL@", &values.channel},
      {"@HIDDEN@", &values.hidden},
  };
  std::string out;
  out.reserve(text.size() + 1024);
  std::size_t pos = 0;
  for (;;) {
    const std::size_t at = text.find('@', pos);
    if (at == std::string_view::npos) break;
    out.append(text.substr(pos, at - pos));
    const auto* match = std::find_if(std::begin(names), std::end(names), [&](const auto& n) {
      return text.substr(at, n.first.size()) == n.first;
    });
    if (match == std::end(names)) {
      out += '@';
      pos = at + 1;
    } else {
      out.append(*match->second);
      pos = at + match->first.size();
    }
  }
  out.append(text.substr(pos));
  return out;
}

Error connection_error(PGconn* conn, const std::string& what) {
  std::string message = PQerrorMessage(conn);
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return Error::make(sqlstate::kConnectionException, what + ": " + message);
}

Error result_error(PGconn* conn, const PGresult* res) {
  const char* code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  const char* primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  if (code == nullptr || primary == nullptr) return connection_error(conn, "upstream query failed");
  const char* detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
  const char* hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
  return Error{code, primary, detail != nullptr ? detail : "", hint != nullptr ? hint : ""};
}

// Runs SQL (several statements when there are no parameters); the last result, or its error.
Result<ResultPtr> exec(PGconn* conn, const std::string& sql, const Params& params = {}) {
  PGresult* raw = nullptr;
  if (params.empty()) {
    raw = PQexec(conn, sql.c_str());
  } else {
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
    raw = PQexecParams(conn, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                       nullptr, nullptr, 0);
  }
  ResultPtr res(raw, &PQclear);
  if (!res) return connection_error(conn, "upstream query failed");
  const ExecStatusType status = PQresultStatus(res.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return result_error(conn, res.get());
  return res;
}

Status run(PGconn* conn, const std::string& sql, const Params& params = {}) {
  auto r = exec(conn, sql, params);
  if (!r.ok()) return r.error();
  return {};
}

Result<std::string> quote_identifier(PGconn* conn, std::string_view name) {
  char* q = PQescapeIdentifier(conn, name.data(), name.size());
  if (q == nullptr) return connection_error(conn, "cannot quote identifier");
  std::string out(q);
  PQfreemem(q);
  return out;
}

Result<std::string> quote_literal(PGconn* conn, std::string_view text) {
  char* q = PQescapeLiteral(conn, text.data(), text.size());
  if (q == nullptr) return connection_error(conn, "cannot quote literal");
  std::string out(q);
  PQfreemem(q);
  return out;
}

// Rolls back unless committed, so a failed step leaves the upstream as it was.
class Transaction {
 public:
  explicit Transaction(PGconn* conn) : conn_(conn) {}
  ~Transaction() {
    if (open_) (void)run(conn_, "ROLLBACK");
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  Status begin() {
    PGRELAY_TRY(run(conn_, "BEGIN"));
    open_ = true;
    return {};
  }
  Status commit() {
    open_ = false;
    return run(conn_, "COMMIT");
  }

 private:
  PGconn* conn_;
  bool open_ = false;
};

std::optional<std::string> text_of(const std::optional<wire::Lsn>& lsn) {
  if (!lsn) return std::nullopt;
  return lsn->to_string();
}
template <typename Int>
std::optional<std::string> text_of(const std::optional<Int>& v) {
  if (!v) return std::nullopt;
  return std::to_string(*v);
}
std::string text_of(bool b) {
  return b ? "t" : "f";
}
std::optional<std::string> text_or_null(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return s;
}
std::string micros_of(std::chrono::system_clock::time_point t) {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count());
}
std::optional<std::string> micros_of(const std::optional<std::chrono::microseconds>& d) {
  if (!d) return std::nullopt;
  return std::to_string(d->count());
}

// The value SHOW prints for a time setting in milliseconds (Postgres picks the largest unit
// that divides it exactly).
std::string shown_milliseconds(std::int64_t ms) {
  if (ms == 0) return "0";
  struct Unit {
    std::int64_t ms;
    const char* name;
  };
  static constexpr Unit kUnits[] = {{86400000, "d"}, {3600000, "h"}, {60000, "min"}, {1000, "s"}};
  for (const Unit& u : kUnits) {
    if (ms % u.ms == 0) return std::to_string(ms / u.ms) + u.name;
  }
  return std::to_string(ms) + "ms";
}

template <typename Int>
Int to_int(std::string_view text) {
  Int v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}

// The placeholders' values for the catalog in `schema`, quoted by the connection.
Result<Placeholders> placeholders_for(PGconn* conn, const std::string& schema,
                                      const std::string& channel) {
  Placeholders p;
  // Native capture's two publications (capture/native/native_setup.h names them so).
  const std::string hidden[] = {schema + "_capture", schema + "_capture_keyless"};
  const std::pair<std::string*, Result<std::string>> parts[] = {
      {&p.schema, quote_identifier(conn, schema)},
      {&p.schema_literal, quote_literal(conn, schema)},
      {&p.channel, quote_literal(conn, channel)},
      {&p.hidden, quote_literal(conn, hidden[0])},
  };
  for (const auto& [out, quoted] : parts) {
    if (!quoted.ok()) return quoted.error();
    *out = *quoted;
  }
  auto second = quote_literal(conn, hidden[1]);
  if (!second.ok()) return second.error();
  p.hidden = "ARRAY[" + p.hidden + ", " + *second + "]::text[]";
  return p;
}

}  // namespace

VirtualCatalog::VirtualCatalog(PGconn* conn, std::string schema, std::string channel)
    : conn_(conn), schema_(std::move(schema)), channel_(std::move(channel)) {}

VirtualCatalog::~VirtualCatalog() {
  PQfinish(conn_);
}

Result<std::unique_ptr<VirtualCatalog>> VirtualCatalog::open(std::string conninfo,
                                                             std::string schema) {
  if (schema.empty() || schema.size() > 46 || schema.find('\0') != std::string::npos) {
    return Error::make(sqlstate::kInvalidName,
                       "invalid schema name for the virtual catalog: \"" + schema + "\"",
                       "Use a non-empty name of at most 46 bytes (the NOTIFY channel adds 17).");
  }
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (conn == nullptr) return Error::make(sqlstate::kConnectionException, "out of memory");
  if (PQstatus(conn) != CONNECTION_OK) {
    Error e = connection_error(conn, "cannot connect to the upstream");
    PQfinish(conn);
    return e;
  }
  // libpq prints what the server sends outside a query (its notices, and the FATAL of a
  // connection it terminates, as DROP DATABASE ... WITH (FORCE) does) on stderr, past the
  // logger; the failure that follows is reported by the statement that meets it.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  std::unique_ptr<VirtualCatalog> catalog(
      new VirtualCatalog(conn, schema, schema + ".catalog_requests"));
  auto channel = quote_identifier(conn, catalog->channel_);
  if (!channel.ok()) return channel.error();
  // Our own statements must not depend on the role's settings. Nor do they gain from JIT, which
  // PostgreSQL (11 and later) would redo on every execution of a plan estimated dear enough.
  PGRELAY_TRY(run(conn, std::string("SET search_path = pg_catalog, pg_temp; "
                                    "SET client_min_messages = warning") +
                            (PQserverVersion(conn) >= 110000 ? "; SET jit = off" : "")));
  PGRELAY_TRY(run(conn, "LISTEN " + *channel));
  return catalog;
}

Status VirtualCatalog::install() {
  auto values = placeholders_for(conn_, schema_, channel_);
  if (!values.ok()) return values.error();
  const std::string* s = &values->schema;

  Transaction tx(conn_);
  PGRELAY_TRY(tx.begin());
  PGRELAY_TRY(run(conn_, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext($1))",
                  {"pgrelay virtual catalog " + schema_}));
  auto schema_exists =
      exec(conn_, "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", {schema_});
  if (!schema_exists.ok()) return schema_exists.error();
  // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema exists.
  if (PQntuples(schema_exists->get()) == 0) PGRELAY_TRY(run(conn_, "CREATE SCHEMA " + *s));

  auto meta = exec(conn_,
                   "SELECT pg_catalog.to_regclass(pg_catalog.quote_ident($1) || '.catalog_meta') "
                   "IS NOT NULL",
                   {schema_});
  if (!meta.ok()) return meta.error();
  if (std::string_view(PQgetvalue(meta->get(), 0, 0)) == "t") {
    auto version = exec(conn_, "SELECT value FROM " + *s + ".catalog_meta WHERE key = 'version'");
    if (!version.ok()) return version.error();
    const int installed =
        PQntuples(version->get()) == 1 ? to_int<int>(PQgetvalue(version->get(), 0, 0)) : 0;
    if (installed == kVersion) return tx.commit();
    if (installed > kVersion) {
      return Error::make(sqlstate::kObjectNotInPrerequisiteState,
                         "the virtual catalog in schema \"" + schema_ + "\" has version " +
                             std::to_string(installed) + ", newer than this pgrelay's " +
                             std::to_string(kVersion),
                         "Upgrade pgrelay, or uninstall the catalog with the newer version.");
    }
  }
  // An older or partial installation: replace it (pgrelay refills the state).
  for (const char* sql : {kDropSql, kTablesSql, kViewsSql, kFunctionsSql}) {
    PGRELAY_TRY(run(conn_, substitute(sql, *values)));
  }
  PGRELAY_TRY(run(conn_, "INSERT INTO " + *s + ".catalog_meta VALUES ('version', $1)",
                  {std::to_string(kVersion)}));
  return tx.commit();
}

Status VirtualCatalog::uninstall() {
  auto values = placeholders_for(conn_, schema_, channel_);
  if (!values.ok()) return values.error();
  const std::string* s = &values->schema;
  Transaction tx(conn_);
  PGRELAY_TRY(tx.begin());
  PGRELAY_TRY(run(conn_, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext($1))",
                  {"pgrelay virtual catalog " + schema_}));
  auto exists = exec(conn_, "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", {schema_});
  if (!exists.ok()) return exists.error();
  if (PQntuples(exists->get()) == 0) return tx.commit();
  PGRELAY_TRY(run(conn_, substitute(kDropSql, *values)));
  // The schema may be shared with trigger capture: drop it only when nothing is left in it.
  auto left = exec(conn_,
                   "SELECT pg_catalog.count(*) FROM pg_catalog.pg_depend d "
                   "JOIN pg_catalog.pg_namespace n ON d.refobjid = n.oid "
                   "WHERE d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass "
                   "AND n.nspname = $1",
                   {schema_});
  if (!left.ok()) return left.error();
  if (std::string_view(PQgetvalue(left->get(), 0, 0)) == "0") {
    PGRELAY_TRY(run(conn_, "DROP SCHEMA " + *s));
  }
  return tx.commit();
}

Status VirtualCatalog::upsert_slot(const SlotRow& slot) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  return run(
      conn_,
      "INSERT INTO " + *s +
          ".catalog_slots (slot_name, plugin, slot_type, datoid, temporary, active, "
          "active_pid, slot_xmin, catalog_xmin, restart_lsn, confirmed_flush_lsn, wal_status, "
          "safe_wal_size, two_phase) "
          "VALUES ($1, $2, $3, (SELECT d.oid FROM pg_catalog.pg_database d "
          "WHERE d.datname = $4), $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) "
          "ON CONFLICT (slot_name) DO UPDATE SET plugin = EXCLUDED.plugin, "
          "slot_type = EXCLUDED.slot_type, datoid = EXCLUDED.datoid, "
          "temporary = EXCLUDED.temporary, active = EXCLUDED.active, "
          "active_pid = EXCLUDED.active_pid, slot_xmin = EXCLUDED.slot_xmin, "
          "catalog_xmin = EXCLUDED.catalog_xmin, restart_lsn = EXCLUDED.restart_lsn, "
          "confirmed_flush_lsn = EXCLUDED.confirmed_flush_lsn, "
          "wal_status = EXCLUDED.wal_status, safe_wal_size = EXCLUDED.safe_wal_size, "
          "two_phase = EXCLUDED.two_phase",
      {slot.slot_name, text_or_null(slot.plugin), slot.slot_type, text_or_null(slot.database),
       text_of(slot.temporary), text_of(slot.active), text_of(slot.active_pid), text_of(slot.xmin),
       text_of(slot.catalog_xmin), text_of(slot.restart_lsn), text_of(slot.confirmed_flush_lsn),
       text_or_null(slot.wal_status), text_of(slot.safe_wal_size), text_of(slot.two_phase)});
}

Status VirtualCatalog::remove_slot(std::string_view slot_name) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  return run(conn_, "DELETE FROM " + *s + ".catalog_slots WHERE slot_name = $1",
             {std::string(slot_name)});
}

Status VirtualCatalog::retain_slots(const std::vector<std::string>& slot_names) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  // A text[] literal: each element double-quoted, with " and \ escaped.
  std::string array = "{";
  for (const auto& name : slot_names) {
    if (array.size() > 1) array += ',';
    array += '"';
    for (char c : name) {
      if (c == '"' || c == '\\') array += '\\';
      array += c;
    }
    array += '"';
  }
  array += '}';
  return run(conn_, "DELETE FROM " + *s + ".catalog_slots WHERE slot_name <> ALL ($1::text[])",
             {array});
}

Status VirtualCatalog::set_walsenders(const std::vector<WalsenderRow>& walsenders) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  const std::string insert =
      "INSERT INTO " + *s +
      ".catalog_walsenders VALUES ($1, (SELECT r.oid FROM pg_catalog.pg_roles r "
      "WHERE r.rolname = $2), $2, $3, $4, $5, $6, "
      "'epoch'::timestamptz + $7::float8 * interval '1 microsecond', $8, $9, $10, $11, $12, $13, "
      "$14::float8 * interval '1 microsecond', $15::float8 * interval '1 microsecond', "
      "$16::float8 * interval '1 microsecond', $17, $18, "
      "'epoch'::timestamptz + $19::float8 * interval '1 microsecond', $20)";
  Transaction tx(conn_);
  PGRELAY_TRY(tx.begin());
  PGRELAY_TRY(run(conn_, "DELETE FROM " + *s + ".catalog_walsenders"));
  for (const WalsenderRow& w : walsenders) {
    std::optional<std::string> reply;
    if (w.reply_time) reply = micros_of(*w.reply_time);
    PGRELAY_TRY(run(conn_, insert,
                    {std::to_string(w.pid),
                     w.usename,
                     w.application_name,
                     w.client_addr,
                     w.client_hostname,
                     text_of(w.client_port),
                     micros_of(w.backend_start),
                     text_of(w.backend_xmin),
                     w.state,
                     text_of(w.sent_lsn),
                     text_of(w.write_lsn),
                     text_of(w.flush_lsn),
                     text_of(w.replay_lsn),
                     micros_of(w.write_lag),
                     micros_of(w.flush_lag),
                     micros_of(w.replay_lag),
                     std::to_string(w.sync_priority),
                     w.sync_state,
                     reply,
                     text_or_null(w.slot_name)}));
  }
  return tx.commit();
}

Status VirtualCatalog::set_capture_refusal(const std::optional<Error>& refusal) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  Transaction tx(conn_);
  PGRELAY_TRY(tx.begin());
  if (refusal) {
    PGRELAY_TRY(run(
        conn_,
        "UPDATE " + *s + ".catalog_server SET refusal = $1, refusal_detail = $2, refusal_hint = $3",
        {refusal->message, refusal->detail, refusal->hint}));
    // Replication does not work here: the upstream's own wal_level is the truth.
    PGRELAY_TRY(run(conn_, "UPDATE " + *s +
                               ".catalog_settings SET setting = pg_catalog.current_setting("
                               "'wal_level'), shown = pg_catalog.current_setting('wal_level') "
                               "WHERE name = 'wal_level'"));
  } else {
    PGRELAY_TRY(run(conn_, "UPDATE " + *s +
                               ".catalog_server SET refusal = NULL, refusal_detail = NULL, "
                               "refusal_hint = NULL"));
    PGRELAY_TRY(run(conn_, "UPDATE " + *s +
                               ".catalog_settings SET setting = 'logical', shown = 'logical' "
                               "WHERE name = 'wal_level'"));
  }
  return tx.commit();
}

Status VirtualCatalog::set_log_head(wire::Lsn head) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  return run(conn_, "UPDATE " + *s + ".catalog_server SET log_head = $1", {head.to_string()});
}

Status VirtualCatalog::set_settings(const CatalogSettings& settings) {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  return run(
      conn_,
      "UPDATE " + *s +
          ".catalog_settings o SET setting = v.setting, shown = v.shown "
          "FROM (VALUES ('max_replication_slots', $1, $1), ('max_wal_senders', $2, $2), "
          "('wal_sender_timeout', $3, $4)) AS v(name, setting, shown) WHERE o.name = v.name",
      {std::to_string(settings.max_replication_slots), std::to_string(settings.max_wal_senders),
       std::to_string(settings.wal_sender_timeout_ms),
       shown_milliseconds(settings.wal_sender_timeout_ms)});
}

Result<std::vector<CatalogRequest>> VirtualCatalog::take_requests() {
  auto s = quote_identifier(conn_, schema_);
  if (!s.ok()) return s.error();
  auto r = exec(conn_, "WITH taken AS (DELETE FROM " + *s +
                           ".catalog_requests RETURNING id, kind, slot_name, plugin, temporary, "
                           "two_phase, pid, lsn, backend_pid) "
                           "SELECT * FROM taken ORDER BY id");
  if (!r.ok()) return r.error();
  PGresult* res = r->get();
  std::vector<CatalogRequest> out;
  for (int row = 0; row < PQntuples(res); ++row) {
    CatalogRequest q;
    q.id = to_int<std::int64_t>(PQgetvalue(res, row, 0));
    const std::string_view kind = PQgetvalue(res, row, 1);
    q.kind = kind == "create_slot" ? CatalogRequest::Kind::kCreateSlot
             : kind == "drop_slot" ? CatalogRequest::Kind::kDropSlot
                                   : CatalogRequest::Kind::kTerminate;
    q.slot_name = PQgetvalue(res, row, 2);
    q.plugin = PQgetvalue(res, row, 3);
    q.temporary = std::string_view(PQgetvalue(res, row, 4)) == "t";
    q.two_phase = std::string_view(PQgetvalue(res, row, 5)) == "t";
    q.pid = to_int<std::int32_t>(PQgetvalue(res, row, 6));
    if (!PQgetisnull(res, row, 7))
      q.lsn = wire::Lsn::parse(PQgetvalue(res, row, 7)).value_or(wire::Lsn());
    q.backend_pid = to_int<std::int32_t>(PQgetvalue(res, row, 8));
    out.push_back(std::move(q));
  }
  return out;
}

Result<bool> VirtualCatalog::wait_for_requests(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (PQconsumeInput(conn_) == 0) return connection_error(conn_, "lost the upstream connection");
    bool notified = false;
    while (PGnotify* n = PQnotifies(conn_)) {
      notified = notified || channel_ == n->relname;
      PQfreemem(n);
    }
    if (notified) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{PQsocket(conn_), POLLIN, 0};
    if (p.fd < 0) return connection_error(conn_, "lost the upstream connection");
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) {
      return Error::make(sqlstate::kIoError, "poll on the upstream connection failed");
    }
  }
}

}  // namespace pgrelay::upstream
