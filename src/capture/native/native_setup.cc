// What native capture needs upstream: checks, pgrelay's publications and their table mirror.
#include "capture/native/native_setup.h"

#include <string_view>

#include "capture/publication_marker.h"

namespace pgrelay::capture {
namespace {

std::string replace_all(std::string text, std::string_view from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// @S is the quoted schema, @K and @U the two publication names as literals.
constexpr std::string_view kInstallSql = R"sql(
CREATE SCHEMA IF NOT EXISTS @S;

-- pg_logical_emit_message as consumers call it through pgrelay (the catalog rewrite sends their
-- calls here): native capture reads the message back from the upstream's own stream.
CREATE OR REPLACE FUNCTION @S.emit_message(transactional boolean, prefix text, content bytea)
RETURNS pg_catalog.pg_lsn LANGUAGE sql STRICT VOLATILE
SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.pg_logical_emit_message($1, $2, $3)
$fn$;
CREATE OR REPLACE FUNCTION @S.emit_message(transactional boolean, prefix text, content text)
RETURNS pg_catalog.pg_lsn LANGUAGE sql STRICT VOLATILE
SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT pg_catalog.pg_logical_emit_message($1, $2, $3)
$fn$;
-- Every role may call pg_logical_emit_message in Postgres; so, explicitly, these.
REVOKE ALL ON FUNCTION @S.emit_message(boolean, text, bytea), @S.emit_message(boolean, text, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @S.emit_message(boolean, text, bytea),
  @S.emit_message(boolean, text, text) TO PUBLIC;

-- Makes pgrelay's two publications publish exactly the tables every other publication does,
-- each table in the one its replica identity allows (see native_setup.h). Removals run before
-- additions, so a table moving between the two is never in both.
CREATE OR REPLACE FUNCTION @S.native_mirror() RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  r record;
  n integer := 0;
BEGIN
  PERFORM set_config('pgrelay.in_sync', 'on', true);
  FOR r IN
    WITH wanted AS (
      SELECT DISTINCT c.oid AS relid,
             CASE WHEN c.relreplident = 'f'
                    OR (c.relreplident = 'd' AND EXISTS (
                          SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))
                    OR (c.relreplident = 'i' AND EXISTS (
                          SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident))
                  THEN @K ELSE @U END AS pub
      FROM pg_publication_tables t
      JOIN pg_namespace ns ON ns.nspname = t.schemaname
      JOIN pg_class c ON c.relnamespace = ns.oid AND c.relname = t.tablename
      WHERE t.pubname NOT IN (@K, @U) AND t.schemaname <> @N
    ), have AS (
      SELECT pr.prrelid AS relid, p.pubname::text AS pub
      FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
      WHERE p.pubname IN (@K, @U)
    )
    SELECT 'DROP' AS op, h.relid, h.pub FROM have h
    WHERE NOT EXISTS (SELECT 1 FROM wanted w WHERE w.relid = h.relid AND w.pub = h.pub)
    UNION ALL
    SELECT 'ADD', w.relid, w.pub FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM have h WHERE h.relid = w.relid AND h.pub = w.pub)
    ORDER BY 1 DESC
  LOOP
    -- A table dropped since the query above read the catalog has left every publication by
    -- itself (its regclass would print as a bare number, a syntax error that failed the whole
    -- mirror, and with it a CREATE TABLE's own in the event trigger).
    CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = r.relid);
    -- ONLY: an inheritance parent's children are tables of their own here, listed or not.
    EXECUTE format('ALTER PUBLICATION %I %s TABLE ONLY %s', r.pub, r.op, r.relid::regclass);
    n := n + 1;
  END LOOP;
  PERFORM set_config('pgrelay.in_sync', 'off', true);
  RETURN n;
END
$fn$;

-- Event trigger: mirrors DDL inside its own transaction, so a table created and written at once
-- is captured from its first row. Never fails the DDL: on error it warns, and the capture's
-- periodic mirror catches up.
CREATE OR REPLACE FUNCTION @S.native_on_ddl() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  IF current_setting('pgrelay.in_sync', true) = 'on' THEN RETURN; END IF;
  -- By the event's tag: ALTER PUBLICATION ... DROP TABLE collects no command to list.
  IF TG_TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE',
                'CREATE PUBLICATION', 'ALTER PUBLICATION', 'CREATE INDEX', 'ALTER INDEX') THEN
    BEGIN
      PERFORM @S.native_mirror();
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'pgrelay: could not update the capture publications: %', SQLERRM;
    END;
  END IF;
  -- Any DDL may change what publications say (a rename changes a published name).
  BEGIN
    PERFORM @S.note_publications(true);
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'pgrelay could not mark a change of publications: %', SQLERRM;
  END;
END
$fn$;
-- The mirror and its event trigger are pgrelay's own business.
REVOKE ALL ON FUNCTION @S.native_mirror(), @S.native_on_ddl() FROM PUBLIC;
)sql";

Error not_possible(std::string message, std::string hint) {
  return Error::make(sqlstate::kObjectNotInPrerequisiteState, std::move(message), std::move(hint));
}

struct Quoted {
  std::string schema, schema_literal, keyed, keyless, keyed_literal, keyless_literal;
};

Result<Quoted> quote_names(PgSession& s, const std::string& schema) {
  Quoted q;
  const std::pair<std::string*, Result<std::string>> parts[] = {
      {&q.schema, s.ident(schema)},
      {&q.schema_literal, s.literal(schema)},
      {&q.keyed, s.ident(capture_publication(schema))},
      {&q.keyless, s.ident(keyless_capture_publication(schema))},
      {&q.keyed_literal, s.literal(capture_publication(schema))},
      {&q.keyless_literal, s.literal(keyless_capture_publication(schema))},
  };
  for (const auto& [out, quoted] : parts) {
    if (!quoted.ok()) return quoted.error();
    *out = *quoted;
  }
  return q;
}

std::string event_trigger_name(const std::string& schema) {
  return schema + "_native_ddl";
}

}  // namespace

std::string capture_publication(const std::string& schema) {
  return schema + "_capture";
}
std::string keyless_capture_publication(const std::string& schema) {
  return schema + "_capture_keyless";
}

Status check_native_capture_possible(PgSession& s, const std::string& schema) {
  auto facts = s.exec(
      "SELECT current_setting('wal_level'), r.rolreplication OR r.rolsuper, "
      "to_regclass(quote_ident($1) || '.changes') IS NOT NULL "
      "FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
      {schema});
  if (!facts.ok()) return facts.error();
  if (facts->rows() != 1) return not_possible("could not read the upstream role's rights", {});
  if (facts->value(0, 0) != "logical") {
    return not_possible(
        "native capture needs wal_level = logical on the upstream (it is " +
            std::string(facts->value(0, 0)) + ")",
        "Set wal_level = logical in the upstream's postgresql.conf and restart it, or use "
        "--capture trigger, which works at any wal_level.");
  }
  if (facts->value(0, 1) != "t") {
    return not_possible("native capture needs the REPLICATION right for the upstream role",
                        "Run ALTER ROLE ... REPLICATION on the upstream as a superuser, or use "
                        "--capture trigger, which needs no special right.");
  }
  if (facts->value(0, 2) == "t") {
    return not_possible("trigger capture is installed in upstream schema \"" + schema + "\"",
                        "Run `pgrelay capture uninstall` against this upstream before switching "
                        "to native capture, or keep --capture trigger.");
  }
  return {};
}

Result<NativeSetupReport> install_native_capture(PgSession& s, const NativeSetupOptions& options) {
  PGRELAY_TRY(check_native_capture_possible(s, options.schema));
  auto q = quote_names(s, options.schema);
  if (!q.ok()) return q.error();
  std::string sql(kInstallSql);
  sql = replace_all(std::move(sql), "@S", q->schema);
  sql = replace_all(std::move(sql), "@K", q->keyed_literal);
  sql = replace_all(std::move(sql), "@U", q->keyless_literal);
  sql = replace_all(std::move(sql), "@N", q->schema_literal);

  PGRELAY_TRY(s.run("BEGIN"));
  auto rollback = [&](Error error) -> Error {
    (void)s.run("ROLLBACK");
    return error;
  };
  // Two installers at once would race on CREATE PUBLICATION; the lock serializes them.
  if (auto st = s.run("SELECT pg_advisory_xact_lock(hashtext('pgrelay native install'))");
      !st.ok()) {
    return rollback(st.error());
  }
  if (auto st = s.run(sql); !st.ok()) return rollback(st.error());
  if (auto st = install_publication_marker(
          s, options.schema,
          {capture_publication(options.schema), keyless_capture_publication(options.schema)});
      !st.ok()) {
    return rollback(st.error());
  }
  auto existing =
      s.exec("SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ($1, $2)",
             {capture_publication(options.schema), keyless_capture_publication(options.schema)});
  if (!existing.ok()) return rollback(existing.error());
  bool have_keyed = false, have_keyless = false;
  for (int i = 0; i < existing->rows(); ++i) {
    if (existing->value(i, 0) == capture_publication(options.schema))
      have_keyed = true;
    else
      have_keyless = true;
  }
  if (!have_keyed) {
    if (auto st = s.run("CREATE PUBLICATION " + q->keyed +
                        " WITH (publish = 'insert, update, delete, truncate')");
        !st.ok()) {
      return rollback(st.error());
    }
  }
  if (!have_keyless) {
    if (auto st =
            s.run("CREATE PUBLICATION " + q->keyless + " WITH (publish = 'insert, truncate')");
        !st.ok()) {
      return rollback(st.error());
    }
  }
  NativeSetupReport report;
  auto super = s.exec("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user");
  if (!super.ok()) return rollback(super.error());
  if (super->rows() == 1 && super->value(0, 0) == "t") {
    auto name = s.ident(event_trigger_name(options.schema));
    if (!name.ok()) return rollback(name.error());
    auto evt = s.exec("SELECT 1 FROM pg_catalog.pg_event_trigger WHERE evtname = $1",
                      {event_trigger_name(options.schema)});
    if (!evt.ok()) return rollback(evt.error());
    if (evt->rows() == 0) {
      if (auto st = s.run("CREATE EVENT TRIGGER " + *name +
                          " ON ddl_command_end EXECUTE FUNCTION " + q->schema + ".native_on_ddl()");
          !st.ok()) {
        return rollback(st.error());
      }
    }
    report.event_trigger = true;
  }
  auto mirrored = mirror_publications(s, options.schema);
  if (!mirrored.ok()) return rollback(mirrored.error());
  if (auto st = s.run("COMMIT"); !st.ok()) return st.error();
  auto count = s.exec(
      "SELECT count(*) FROM pg_catalog.pg_publication_rel pr "
      "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid WHERE p.pubname IN ($1, $2)",
      {capture_publication(options.schema), keyless_capture_publication(options.schema)});
  if (!count.ok()) return count.error();
  report.captured_tables = std::stoi(std::string(count->value(0, 0)));
  return report;
}

Result<int> mirror_publications(PgSession& s, const std::string& schema, CatalogWatch* watch) {
  auto quoted = s.ident(schema);
  if (!quoted.ok()) return quoted.error();
  PgTransaction txn(s);
  if (watch) {
    PGRELAY_TRY(txn.begin());
    auto due = watch->due(s);
    if (!due.ok()) return due.error();
    if (!*due) {
      PGRELAY_TRY(txn.commit());
      return 0;
    }
  }
  auto changed = s.exec("SELECT " + *quoted + ".native_mirror()");
  if (!changed.ok()) return changed.error();
  auto noted = note_publications_periodic(s, *quoted);
  if (!noted.ok()) return noted.error();
  if (watch) {
    PGRELAY_TRY(txn.commit());
    if (*noted) watch->done();
  }
  return std::stoi(std::string(changed->value(0, 0)));
}

Result<bool> native_capture_installed(PgSession& s, const std::string& schema) {
  auto found = s.exec("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname IN ($1, $2)",
                      {capture_publication(schema), keyless_capture_publication(schema)});
  if (!found.ok()) return found.error();
  return found->rows() > 0;
}

Result<std::vector<std::string>> uninstall_native_capture(PgSession& s, const std::string& schema) {
  auto q = quote_names(s, schema);
  if (!q.ok()) return q.error();
  auto name = s.ident(event_trigger_name(schema));
  if (!name.ok()) return name.error();
  PGRELAY_TRY(s.run("DROP EVENT TRIGGER IF EXISTS " + *name + "; DROP PUBLICATION IF EXISTS " +
                    q->keyed + ", " + q->keyless + "; DROP FUNCTION IF EXISTS " + q->schema +
                    ".native_on_ddl(), " + q->schema + ".native_mirror()"));
  // emit_message and the publication marker are trigger capture's too when it is installed.
  auto trigger = s.exec("SELECT to_regclass(quote_ident($1) || '.changes') IS NOT NULL", {schema});
  if (!trigger.ok()) return trigger.error();
  if (trigger->value(0, 0) != "t") {
    PGRELAY_TRY(uninstall_publication_marker(s, schema));
    PGRELAY_TRY(s.run("DROP FUNCTION IF EXISTS " + q->schema +
                      ".emit_message(boolean, text, bytea), " + q->schema +
                      ".emit_message(boolean, text, text)"));
  }
  // The slots native capture streams, named after their data directories (pgrelay_<digits>);
  // an inactive one would keep the upstream's WAL forever.
  auto dropped = s.exec(
      "SELECT slot_name::text FROM pg_catalog.pg_replication_slots "
      "WHERE slot_name ~ '^pgrelay_[0-9]+$' AND plugin = 'pgoutput' AND NOT active "
      "AND database = current_database() AND pg_catalog.pg_drop_replication_slot(slot_name) "
      "IS NOT NULL");
  if (!dropped.ok()) return dropped.error();
  std::vector<std::string> slots;
  for (int i = 0; i < dropped->rows(); ++i) slots.emplace_back(dropped->value(i, 0));
  return slots;
}

}  // namespace pgrelay::capture
