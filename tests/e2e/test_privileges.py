# End-to-end: pgrelay's SQL surface refuses what Postgres refuses, role by role (a matrix).
"""Every function and view pgrelay adds upstream (schema _pgrelay) is either called here, the
same call made three ways and the outcomes compared, or listed as pgrelay's own and proven
closed to other roles. An object in the schema this script does not know fails it, so a new
function cannot escape the matrix.

The three ways, per call and per role:
- native: Postgres 15's built-ins (pg_catalog), straight to the upstream, as the superuser, the
  owner of the captured tables, a REPLICATION role and a plain role;
- direct: pgrelay's objects of the same name in _pgrelay, straight to the upstream, as the same
  four roles (outcomes must equal native's: success, or the same SQLSTATE);
- through pgrelay: pgrelay users with and without the REPLICATION right, whose outcomes must
  equal native's for the REPLICATION role and the plain role (every session through pgrelay
  runs upstream as pgrelay's own role, so pgrelay's user list is what tells them apart).

Run in both capture modes (trigger and native), each against its own database.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import PASSWORD, PG_BIN, SUPERUSER, expect, expect_eq, free_port, main, wait_until  # noqa: E402
from test_native_capture import LOGICAL_CONF  # noqa: E402

import psycopg2  # noqa: E402

ROLE_PASSWORD = "Priv-Matrix-pw7"
ROLES = {"su": SUPERUSER, "owner": "priv_owner", "repl": "priv_repl", "plain": "priv_plain"}
# pgrelay's own users, named as the upstream roles they mirror (a walsender's role in
# pg_stat_replication is the upstream role of its user's name).
RELAY_USERS = {"repl": "priv_repl", "plain": "priv_plain"}

# Each call: (name, SQL with {s} for the schema, {emit} for the emit function, objects covered).
# Values that differ between runs are reduced to booleans so outcomes compare.
CALLS = [
    ("create slot", "SELECT slot_name FROM {s}.pg_create_logical_replication_slot('m_{tag}', 'pgoutput')",
     ["pg_create_logical_replication_slot", "catalog_create_slot_checked", "catalog_create_slot",
      "catalog_caller", "catalog_check_slot_permissions", "relay_create_logical_replication_slot",
      "denied_create_logical_replication_slot"]),
    ("drop slot", "SELECT {s}.pg_drop_replication_slot('victim_{tag}')",
     ["pg_drop_replication_slot", "catalog_drop_slot_checked", "catalog_drop_slot",
      "relay_drop_replication_slot", "denied_drop_replication_slot"]),
    ("terminate another role's walsender", "SELECT {s}.pg_terminate_backend({walsender})",
     ["pg_terminate_backend", "catalog_is_walsender_pid", "catalog_terminate_walsender_checked",
      "catalog_terminate_walsender",
      "catalog_walsender_role", "relay_terminate_backend", "denied_terminate_backend"]),
    ("emit a logical message", "SELECT {emit}(true, 'matrix', 'm') IS NOT NULL", ["emit_message"]),
    ("read the slots", "SELECT count(*) > 0 FROM {s}.pg_replication_slots", ["pg_replication_slots"]),
    ("read walsender details", "SELECT state IS NOT NULL, client_port IS NOT NULL FROM "
                               "{s}.pg_stat_replication WHERE pid = {walsender}",
     ["pg_stat_replication"]),
    ("read a setting", "SELECT setting FROM {s}.pg_settings WHERE name = 'wal_level'", ["pg_settings"]),
    ("current_setting", "SELECT {s}.current_setting('wal_level'), {s}.current_setting('wal_level', true)",
     ["current_setting", "catalog_setting"]),
    ("WAL positions", "SELECT {s}.pg_current_wal_lsn() IS NOT NULL, {s}.pg_current_wal_insert_lsn() "
                      "IS NOT NULL, {s}.pg_current_wal_flush_lsn() IS NOT NULL",
     ["pg_current_wal_lsn", "pg_current_wal_insert_lsn", "pg_current_wal_flush_lsn", "catalog_log_head"]),
    ("published tables", "SELECT count(*) FROM {s}.pg_publication_tables WHERE pubname = 'matrix'",
     ["pg_publication_tables"]),
    ("pg_get_publication_tables", "SELECT count(*) FROM {s}.pg_get_publication_tables('matrix')",
     ["pg_get_publication_tables"]),
    # What pg_dump's sessions read instead of these catalogs (every role may read the catalogs).
    ("pg_dump's catalog reads", "SELECT (SELECT count(*) > 0 FROM {dump}pg_namespace{call} x), "
                                "(SELECT count(*) >= 0 FROM {dump}pg_trigger{call} x), "
                                "(SELECT count(*) >= 0 FROM {dump}pg_event_trigger{call} x), "
                                "(SELECT count(*) > 0 FROM {dump}pg_publication{call} x), "
                                "(SELECT count(*) > 0 FROM {dump}pg_publication_rel{call} x), "
                                "(SELECT count(*) >= 0 FROM {dump}pg_publication_namespace{call} x)",
     ["dump_pg_namespace", "dump_pg_trigger", "dump_pg_event_trigger", "dump_pg_publication",
      "dump_pg_publication_rel", "dump_pg_publication_namespace"]),
]

# pgrelay's own objects: no role but the owner may use them (their callers are pgrelay itself,
# triggers and event triggers, which Postgres runs without an EXECUTE check).
INTERNAL_PREFIXES = ("capture_",)
INTERNAL = {"current_layout", "remove_table", "refresh_table", "wanted_tables", "sync", "truncate_begin",
            "truncate_end",
            "on_ddl", "note_publications", "publications_fingerprint", "publications_catalog", "native_mirror",
            "native_on_ddl",
            "catalog_create_slot", "catalog_drop_slot", "catalog_terminate_walsender",
            "catalog_walsender_role", "relay_create_logical_replication_slot",
            "relay_drop_replication_slot", "relay_terminate_backend"}
# Tables are pgrelay's state: nobody else reads or writes them.


def connect(port, user, db, password=None):
    if password is None:
        password = PASSWORD if user == SUPERUSER else ROLE_PASSWORD
    conn = psycopg2.connect(host="127.0.0.1", port=port, user=user, password=password, dbname=db,
                            sslmode="disable")
    conn.autocommit = True
    return conn


def outcome(conn, sql):
    """'ok:<rows>' or the SQLSTATE."""
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            rows = cur.fetchall() if cur.description else []
        return "ok:%r" % (rows,)
    except psycopg2.Error as e:
        conn.rollback()
        return e.pgcode or "error"


def once(port, user, db, sql):
    """outcome() of one statement on a connection of its own."""
    conn = connect(port, user, db)
    try:
        return outcome(conn, sql)
    finally:
        conn.close()


def hash_password(env, password):
    r = subprocess.run([env.pgrelay, "hash-password"], input=password + "\n", capture_output=True,
                       text=True, timeout=30)
    expect_eq(r.returncode, 0, "pgrelay hash-password exit code (%s)" % r.stderr)
    return r.stdout.strip()


def recvlogical(port, user, password, db, slot, publication):
    """A walsender streaming `slot` as `user`, on Postgres or on pgrelay."""
    url = "postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable" % (user, password, port, db)
    return [os.path.join(PG_BIN, "pg_recvlogical"), "-d", url, "--slot", slot, "--start", "-o",
            "proto_version=1", "-o", "publication_names=" + publication, "-f", "/dev/null"]


def run_mode(env, mode, db, installer=SUPERUSER):
    """The matrix with `mode` capture, pgrelay logging in upstream as `installer`."""
    prefix = mode + (" installed by the table owner" if installer != SUPERUSER else "") + ": "
    env.psql_admin("CREATE DATABASE %s OWNER %s" % (db, ROLES["owner"]), db="postgres")
    env.psql_admin("CREATE TABLE public.items (id int PRIMARY KEY, v text); "
                   "ALTER TABLE public.items OWNER TO %s; "
                   "CREATE PUBLICATION matrix FOR TABLE public.items; "
                   "GRANT ALL ON SCHEMA public TO PUBLIC" % ROLES["owner"], db=db)
    secrets = {k: hash_password(env, ROLE_PASSWORD) for k in RELAY_USERS}
    upstream = env.upstream_url().rsplit("/", 1)[0] + "/" + db
    if installer != SUPERUSER:
        upstream = "postgres://%s:%s@127.0.0.1:%d/%s" % (installer, ROLE_PASSWORD, env.pg_port, db)
    args = ["--capture", mode, "--user", "%s %s replication" % (SUPERUSER, hash_password(env, PASSWORD)),
            "--user", "%s %s replication" % (RELAY_USERS["repl"], secrets["repl"]),
            "--user", "%s %s" % (RELAY_USERS["plain"], secrets["plain"])]
    relay = env.start_relay(data_dir=os.path.join(env.base, "data-" + db), upstream=upstream, extra_args=args)

    walsenders = []
    env.psql_admin("SELECT pg_create_logical_replication_slot('native_w_%s', 'pgoutput')" % db, db=db)
    made = once(relay.port, SUPERUSER, db, "SELECT pg_create_logical_replication_slot('relay_w', 'pgoutput')")
    expect(made.startswith("ok"), "the walsender's slot on pgrelay", got=made)
    seen = {"native": None, "relay": None}

    def start_walsenders():
        """(Re)starts one walsender per side as the REPLICATION role (pgrelay: its replication
        user) and returns their pids, new ones after a termination."""
        for p in walsenders:
            p.kill()
            p.wait()
        walsenders.clear()
        walsenders.append(env.spawn(recvlogical(env.pg_port, ROLES["repl"], ROLE_PASSWORD, db, "native_w_" + db,
                                                "matrix"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        walsenders.append(env.spawn(recvlogical(relay.port, RELAY_USERS["repl"], ROLE_PASSWORD, db, "relay_w",
                                                "matrix"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def pids():
            native = env.direct_query("SELECT pid FROM pg_stat_replication WHERE usename = %s", (ROLES["repl"],))
            via = once(relay.port, SUPERUSER, db,
                       "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_w' AND active")
            if not native or not via.startswith("ok:[("):
                return None
            pair = (native[0][0], int(via[5:].split(",")[0]))
            if pair[0] == seen["native"] or pair[1] == seen["relay"]:
                return None
            return pair
        pair = wait_until(pids, 30, "both walsenders streaming")
        seen["native"], seen["relay"] = pair
        return pair

    def matrix():
        native_pid, relay_pid = start_walsenders()
        table = []
        for name, template, _ in CALLS:
            for key, role in ROLES.items():
                tag = "%s_%s" % (key, db)
                # A slot to drop, made as the superuser each time (natively and in pgrelay).
                env.psql_admin("SELECT pg_create_logical_replication_slot('victim_%s', 'pgoutput')" % tag, db=db)
                for victim in ("victim_%s" % tag, "victim_%s_r" % tag):
                    once(relay.port, SUPERUSER, db, "SELECT pg_create_logical_replication_slot('%s', "
                                                    "'pgoutput')" % victim)
                time.sleep(0.3)  # pgrelay carries the request out on its catalog thread

                native_sql = template.format(s="pg_catalog", emit="pg_catalog.pg_logical_emit_message",
                                             tag=tag, walsender=native_pid, dump="pg_catalog.", call="")
                direct_sql = template.format(s="_pgrelay", emit="_pgrelay.emit_message", tag=tag + "_d",
                                             walsender=relay_pid, dump="_pgrelay.dump_", call="()")
                c = connect(env.pg_port, role, db)
                native_out = outcome(c, native_sql)
                # The direct call drops pgrelay's victim, which exists under the same name.
                direct_out = outcome(c, direct_sql.replace("victim_%s_d" % tag, "victim_%s" % tag))
                c.close()
                table.append((name, key, native_out, direct_out))
                # Through pgrelay, pg_stat_replication shows what the upstream role pgrelay logs
                # in as may see: pgrelay's users have no pg_read_all_stats of their own.
                if key in RELAY_USERS and name != "read walsender details":
                    if name.startswith("terminate"):
                        native_pid, relay_pid = start_walsenders()  # the direct call may have ended it
                    r = connect(relay.port, RELAY_USERS[key], db)
                    relay_sql = template.format(s="pg_catalog", emit="pg_catalog.pg_logical_emit_message",
                                                tag=tag + "_r", walsender=relay_pid, dump="pg_catalog.",
                                                call="")
                    table.append((name, "pgrelay user like " + key, native_out, outcome(r, relay_sql)))
                    r.close()
                # Leave no victim behind for the next round.
                env.psql_admin("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                               "WHERE slot_name LIKE 'victim%%' OR slot_name LIKE 'm\\_%%'", db=db)
                once(relay.port, SUPERUSER, db, "SELECT pg_drop_replication_slot(slot_name) FROM "
                                                "pg_replication_slots WHERE (slot_name LIKE 'victim%' OR "
                                                "slot_name LIKE 'm\\_%') AND NOT active")
                if name.startswith("terminate"):
                    native_pid, relay_pid = start_walsenders()
        for row in table:
            print("    %-36s %-24s postgres=%-18s pgrelay=%s" % row)
        mismatches = []
        for name, who, native_out, other in table:
            same = native_out == other or (native_out.startswith("ok") and other.startswith("ok")
                                            and name in ("create slot", "WAL positions"))
            if not same:
                mismatches.append("%s as %s: Postgres %s, pgrelay %s" % (name, who, native_out, other))
        expect_eq(mismatches, [], "outcomes that differ from Postgres's")
        refused = [row for row in table if row[0] == "drop slot" and row[1] == "plain"]
        expect(refused and refused[0][3] == "42501", "the plain role's drop of a slot is refused (42501)",
               got=refused)

    def hostile_names():
        # A schema, a table and a column whose names would end a quoted identifier or literal and
        # run SQL of their own, put where pgrelay's functions build statements from names
        # (capture's triggers and layouts, native capture's publication mirror, the publication
        # marker): the table is captured like any other and the statement never runs.
        evil = "x\"'; DROP TABLE public.items; --"
        quoted = '"' + evil.replace('"', '""') + '"'
        env.psql_admin("CREATE SCHEMA %s; CREATE TABLE %s.%s (id int PRIMARY KEY, %s text); "
                       "ALTER TABLE %s.%s OWNER TO %s; ALTER SCHEMA %s OWNER TO %s; "
                       "ALTER PUBLICATION matrix ADD TABLE %s.%s"
                       % (quoted, quoted, quoted, quoted, quoted, quoted, ROLES["owner"], quoted,
                          ROLES["owner"], quoted, quoted), db=db)
        slot = "hostile_" + db
        made = once(relay.port, SUPERUSER, db, "SELECT pg_create_logical_replication_slot('%s', 'pgoutput')" % slot)
        expect(made.startswith("ok"), "a slot for the hostile table's changes", got=made)
        time.sleep(1.5)  # the periodic sync catches up where no event trigger runs
        expect(once(env.pg_port, ROLES["owner"], db,
                    "INSERT INTO %s.%s VALUES (1, 'evil-row')" % (quoted, quoted)).startswith("ok"),
               "an insert into the hostile table")
        expect_eq(once(env.pg_port, SUPERUSER, db, "SELECT to_regclass('public.items') IS NOT NULL"),
                  "ok:[(True,)]", "public.items still exists")
        path = os.path.join(env.base, "hostile-%s.out" % db)
        streamer = env.spawn(recvlogical(relay.port, SUPERUSER, PASSWORD, db, slot, "matrix")[:-1] + [path, "-F", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def streamed():
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return False
            return b"evil-row" in data and evil.encode() in data
        try:
            wait_until(streamed, 30, "the hostile table's row, under its name, in the stream")
        finally:
            streamer.kill()
            streamer.wait()
        wait_until(lambda: once(relay.port, SUPERUSER, db, "SELECT pg_drop_replication_slot('%s')" % slot)
                   .startswith("ok"), 10, "the slot dropped")
        env.psql_admin("ALTER PUBLICATION matrix DROP TABLE %s.%s; DROP SCHEMA %s CASCADE"
                       % (quoted, quoted, quoted), db=db)

    def coverage():
        covered = {o for _, _, objects in CALLS for o in objects}
        c = connect(env.pg_port, ROLES["plain"], db)
        with c.cursor() as cur:
            cur.execute("SELECT 'f', p.proname, p.oid::regprocedure::text, "
                        "has_function_privilege(p.oid, 'EXECUTE') FROM pg_proc p "
                        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '_pgrelay' "
                        "UNION ALL SELECT c.relkind::text, c.relname, c.oid::regclass::text, "
                        "has_table_privilege(c.oid, 'SELECT') OR has_table_privilege(c.oid, 'INSERT') "
                        "OR has_table_privilege(c.oid, 'UPDATE') OR has_table_privilege(c.oid, 'DELETE') "
                        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = '_pgrelay' AND c.relkind IN ('r', 'v', 'm', 'p', 'f') ORDER BY 1, 2")
            rows = cur.fetchall()
        c.close()
        expect(rows, "pgrelay's schema holds objects", got=rows)
        unknown, open_internal, open_tables = [], [], []
        for kind, name, ident, usable in rows:
            if kind == "r":
                if usable:
                    open_tables.append(ident)
                continue
            internal = name in INTERNAL or name.startswith(INTERNAL_PREFIXES)
            if internal:
                if usable:
                    open_internal.append(ident)
            elif name not in covered:
                unknown.append(ident)
        expect_eq(unknown, [], "objects in _pgrelay that the matrix does not cover")
        expect_eq(open_internal, [], "pgrelay's own functions that a plain role may execute")
        expect_eq(open_tables, [], "pgrelay's tables that a plain role may read or write")
        # pgrelay doctor lists the same grants, for an audit.
        import json
        r = subprocess.run([env.pgrelay, "doctor", "--json", upstream], capture_output=True, text=True,
                           timeout=60)
        grants = [c for c in json.loads(r.stdout)["checks"] if c["name"] == "grants"]
        expect(grants, "doctor reports a grants check", got=r.stdout[-500:])
        lines = grants[0]["details"]
        expect("_pgrelay.pg_replication_slots: SELECT to PUBLIC" in lines,
               "doctor lists the SELECT on pg_replication_slots granted to PUBLIC", got=lines)
        leaked = [l for l in lines if "catalog_slots" in l or "relay_" in l or "catalog_create_slot(" in l]
        expect_eq(leaked, [], "grants doctor lists on pgrelay's internal objects")

    try:
        env.check(prefix + "the privilege matrix matches Postgres's", matrix)
        env.check(prefix + "every object in _pgrelay is covered, and the internal ones are closed", coverage)
        env.check(prefix + "hostile names reach pgrelay's dynamic SQL only quoted", hostile_names)
    finally:
        for p in walsenders:
            p.kill()


def body(env):
    env.start_postgres(LOGICAL_CONF)
    env.psql_admin("CREATE ROLE %s LOGIN PASSWORD '%s'; CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'; "
                   "CREATE ROLE %s LOGIN PASSWORD '%s'"
                   % (ROLES["owner"], ROLE_PASSWORD, ROLES["repl"], ROLE_PASSWORD, ROLES["plain"],
                      ROLE_PASSWORD))
    run_mode(env, "trigger", "priv_trigger")
    run_mode(env, "native", "priv_native")
    run_mode(env, "trigger", "priv_owned", installer=ROLES["owner"])


if __name__ == "__main__":
    main("privileges", body)
