# `pgrelay dump` and `pgrelay restore` through a running `pgrelay serve`: an exact round trip that leaves pgrelay's and zero's objects out, captured as one transaction.
"""pgrelay dump and pgrelay restore against `pgrelay serve` (trigger capture) on PostgreSQL 15.

The database e2e holds an application (a 20,000-row table with tabs, newlines, backslashes,
unicode, NULLs and bytea; a table of a user-defined enum; a 1 MB large object; a function with
a user trigger and a user event trigger; a publication app_pub) beside stand-ins for
zero-cache's own objects: schemas zt_0 (holding "shardConfig") and zt (holding "permissions"),
an event trigger zt_ddl_0 calling a function of zt_0, publications _zt_metadata_0 and
_zt_public_0. These only stand in for zero-cache's; tests/zero checks the real ones.
  - dump -D DIR writes an archive (no FILE.partial left) holding the application's tables, the
    large object, the user event trigger and app_pub, and nothing of _pgrelay, zt or zt_0;
  - restore -d copy1 into a database created through pgrelay: the rows, the enum values and the
    large object equal the original's exactly; the user trigger, event trigger and publication
    are there; zero's and pgrelay's are not, and the output names what was skipped;
  - the restore reaches a slot made in copy1 before it: all 20,000 rows of items (and the enum
    table's) as inserts in one transaction, with the values the table holds. The slot reads a
    FOR ALL TABLES publication copy1 had before the restore: app_pub comes at the end of the
    restore's transaction, after the rows, and by Postgres's rules does not publish them (a
    native slot of PostgreSQL 15 reading app_pub there fails: publication "app_pub" does not
    exist);
  - restore into e2e itself after rows were deleted and updated: 2 tables replaced, the data
    equals the dump's again, zero's stand-ins are left alone, and a slot made before it
    (reading _zt_public_0, TABLES IN SCHEMA public, which the restore skips) streams the
    changes, then the restore as one transaction of inserts, then a write after it;
  - errors: a file that is no archive (exit 1, the message, DETAIL and HINT), a missing file
    (58P01), a data directory with no pgrelay (08006), an archive path in a missing directory,
    a dump that fails (no such database, or pg_dump failing after writing part of its output)
    leaves an existing FILE byte for byte as it was and no FILE.partial;
  - neither pgrelay's log nor what dump and restore print carries the upstream's password.
"""

import hashlib
import os
import select
import subprocess
import time
from urllib.parse import quote

import psycopg2

from e2e_support import DBNAME, PASSWORD, PG_BIN, expect, expect_eq, main, query_url, with_db
from pgoutput_decode import decode_message
from pgoutput_diff import replication

ROWS = 20000
MOODS = 200
LO_BYTES = 1 << 20
COPY_DB = "copy1"
SLOT = "restore_slot"
COPY_PUB = "copy_all"
E2E_SLOT = "in_place_slot"
DONE = "dump-restore-done"

SCHEMA = r"""
CREATE TABLE items (id int PRIMARY KEY, v text, b bytea);
INSERT INTO items
SELECT g,
       CASE WHEN g % 7 = 0 THEN NULL
            ELSE 'row ' || g || E'\ttab\nnewline\\backslash \\N ü€😀 "q" ''s' || repeat('x', g % 40) END,
       CASE WHEN g % 11 = 0 THEN NULL ELSE decode(md5(g::text), 'hex') || '\x000a5c09ff'::bytea END
FROM generate_series(1, @ROWS@) g;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'ünïcødé');
CREATE TABLE moods (id int PRIMARY KEY, m mood, note text);
INSERT INTO moods SELECT g, (enum_range(NULL::mood))[1 + g % 4], CASE WHEN g % 5 = 0 THEN NULL ELSE 'n' || g END
FROM generate_series(1, @MOODS@) g;
CREATE FUNCTION app_touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE TRIGGER moods_touch BEFORE UPDATE ON moods FOR EACH ROW EXECUTE FUNCTION app_touch();
CREATE FUNCTION app_ddl_note() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN PERFORM 1; END$$;
CREATE EVENT TRIGGER app_ddl ON ddl_command_end EXECUTE FUNCTION app_ddl_note();
CREATE PUBLICATION app_pub FOR TABLE items;
-- Stand-ins for zero-cache's own objects (shard zt_0 of app zt).
CREATE SCHEMA zt_0;
CREATE TABLE zt_0."shardConfig" (lock bool PRIMARY KEY DEFAULT true, "publications" text[]);
INSERT INTO zt_0."shardConfig" VALUES (true, '{_zt_public_0}');
CREATE SCHEMA zt;
CREATE TABLE zt.permissions (lock bool PRIMARY KEY DEFAULT true, permissions jsonb);
INSERT INTO zt.permissions VALUES (true, '{}');
CREATE FUNCTION zt_0.notice_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN PERFORM 1; END$$;
CREATE EVENT TRIGGER zt_ddl_0 ON ddl_command_end EXECUTE FUNCTION zt_0.notice_ddl();
CREATE PUBLICATION _zt_metadata_0 FOR TABLE zt_0."shardConfig";
CREATE PUBLICATION _zt_public_0 FOR TABLES IN SCHEMA public;
"""

ITEMS_MD5 = "SELECT count(*), md5(string_agg(i::text, E'\\n' ORDER BY id)) FROM items i"
MOODS_MD5 = "SELECT count(*), md5(string_agg(m::text, E'\\n' ORDER BY id)) FROM moods m"
ENUM_LABELS = "SELECT array_agg(enumlabel::text ORDER BY enumsortorder) FROM pg_enum WHERE enumtypid = 'mood'::regtype"
LO_MD5 = "SELECT oid::bigint, md5(lo_get(oid)), length(lo_get(oid)) FROM pg_largeobject_metadata ORDER BY oid"
CAPTURE_TRIGGERS = ("SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                    " WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal"
                    " AND t.tgname LIKE '\\_pgrelay%'")
CATALOG = {
    "schemas": "SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace WHERE nspname IN ('zt', 'zt_0', '_pgrelay')",
    "event triggers": "SELECT array_agg(evtname::text ORDER BY evtname) FROM pg_event_trigger",
    "publications": "SELECT array_agg(pubname::text ORDER BY pubname) FROM pg_publication",
    "app_pub tables": "SELECT array_agg(schemaname || '.' || tablename ORDER BY tablename) FROM pg_publication_tables"
                      " WHERE pubname = 'app_pub'",
    "user triggers": "SELECT array_agg(tgname::text ORDER BY tgname) FROM pg_trigger WHERE NOT tgisinternal"
                     " AND tgname NOT LIKE '\\_pgrelay%'",
}


def tools_bin():
    """Where pgrelay dump finds pg_dump without --pg-bin: the newest /usr/lib/postgresql/N/bin
    (an older pg_restore may not read a newer pg_dump's archive); else PG_BIN."""
    versions = []
    for name in os.listdir("/usr/lib/postgresql") if os.path.isdir("/usr/lib/postgresql") else []:
        if name.isdigit() and os.access(os.path.join("/usr/lib/postgresql", name, "bin", "pg_restore"), os.X_OK):
            versions.append(int(name))
    return "/usr/lib/postgresql/%d/bin" % max(versions) if versions else PG_BIN


def md5_file(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def fingerprint(env, db):
    """What must survive the round trip: the rows, the enum, the large object."""
    return {"items": env.db_query(db, ITEMS_MD5)[0], "moods": env.db_query(db, MOODS_MD5)[0],
            "mood labels": env.db_query(db, ENUM_LABELS)[0][0], "large objects": env.db_query(db, LO_MD5)}


def catalog(env, db):
    return {name: env.db_query(db, sql)[0][0] for name, sql in CATALOG.items()}


def read_slot(env, relay, db, slot, publication):
    """Writes a marker message through pgrelay into db, then reads slot (pgoutput v1, through
    pgrelay) up to it: (relation names by OID, the transactions' messages)."""
    c = psycopg2.connect(with_db(relay.url, db))
    try:
        with c.cursor() as cur:
            cur.execute("SELECT pg_logical_emit_message(true, %s, 'end')", (DONE,))
        c.commit()
    finally:
        c.close()
    conn = replication(with_db(relay.url, db))
    messages = []
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False, start_lsn=0,
                              options={"proto_version": "1", "publication_names": publication, "messages": "true"})
        deadline = time.monotonic() + 60
        found = False
        while time.monotonic() < deadline:
            msg = cur.read_message()
            if msg is None:
                select.select([cur], [], [], 0.2)
                continue
            m = decode_message(msg.payload)
            messages.append(m)
            found = found or (m["tag"] == "M" and m["prefix"] == DONE)
            if found and m["tag"] == "C":
                break
        expect(found, "%s reached the message written after the restore" % slot, got=len(messages))
    finally:
        conn.close()
    relations, txs, current = {}, [], None
    for m in messages:
        if m["tag"] == "R":
            relations[m["oid"]] = "%s.%s" % (m["schema"], m["name"])
        elif m["tag"] == "B":
            expect(current is None, "Begin inside a transaction in %s" % slot)
            current = []
        elif m["tag"] == "C":
            expect(current is not None, "Commit without Begin in %s" % slot)
            txs.append(current)
            current = None
        elif m["tag"] != "Y":
            expect(current is not None, "%s message outside a transaction in %s" % (m["tag"], slot))
            current.append(m)
    return relations, txs


def shape(relations, txs):
    """Each transaction as the sorted kinds of change it holds: (tag, table or message prefix)."""
    return [sorted({(m["tag"], relations.get(m.get("relid"), m.get("prefix"))) for m in t}) for t in txs]


def count(relations, tx):
    out = {}
    for m in tx:
        key = (m["tag"], relations.get(m.get("relid"), m.get("prefix")))
        out[key] = out.get(key, 0) + 1
    return out


def body(env):
    env.start_postgres()
    env.db_query(DBNAME, SCHEMA.replace("@ROWS@", str(ROWS)).replace("@MOODS@", str(MOODS)))
    lo_oid = env.db_query(DBNAME, "SELECT lo_from_bytea(0, (SELECT string_agg(decode(md5(g::text), 'hex'), ''::bytea"
                                  " ORDER BY g) FROM generate_series(1, %d) g))" % (LO_BYTES // 16))[0][0]
    relay_dir = os.path.join(env.base, "relay-data")
    relay = env.start_relay(data_dir=relay_dir, extra_args=["--no-tls", "--capture", "trigger"])
    archive = os.path.join(env.base, "app.dump")
    outputs = []  # everything dump and restore printed: none of it may hold the password
    state = {}

    def pgrelay(*args):
        r = subprocess.run([env.pgrelay] + list(args), capture_output=True, text=True, timeout=240, cwd=env.base)
        outputs.append((" ".join(args), r.stdout, r.stderr))
        return r

    def ok(r, what):
        expect(r.returncode == 0, "%s exited %d\n      stdout: %s\n      stderr: %s"
               % (what, r.returncode, r.stdout, r.stderr[-3000:]))
        return r

    def toc(path):
        r = subprocess.run([os.path.join(tools_bin(), "pg_restore"), "-l", path], capture_output=True, text=True,
                           timeout=60)
        expect(r.returncode == 0, "pg_restore -l %s: %s" % (path, r.stderr))
        return [l for l in r.stdout.splitlines() if l and not l.startswith(";")]

    def dump():
        # Capture is under way on e2e (pgrelay's schema, triggers and event trigger are there).
        expect_eq(catalog(env, DBNAME)["schemas"], ["_pgrelay", "zt", "zt_0"], "schemas in e2e before the dump")
        state["original"] = fingerprint(env, DBNAME)
        state["capture triggers"] = env.db_query(DBNAME, CAPTURE_TRIGGERS)[0][0]
        expect(state["capture triggers"] > 0, "pgrelay's capture triggers on items and moods",
               got=state["capture triggers"])
        expect_eq(state["original"]["large objects"][0][0], lo_oid, "the large object in e2e")
        r = ok(pgrelay("dump", "-D", relay_dir, archive), "pgrelay dump")
        expect(r.stdout.startswith("pgrelay dump: wrote %s (" % archive), "dump's report", got=r.stdout)
        expect("left out (pgrelay's and zero-cache's own): schemas _pgrelay, zt, zt_0" in r.stdout,
               "dump names the schemas it left out", got=r.stdout)
        expect(os.path.getsize(archive) > LO_BYTES, "the archive holds at least the large object's bytes",
               got=os.path.getsize(archive))
        expect(not os.path.exists(archive + ".partial"), "no FILE.partial left after the dump")
        lines = toc(archive)
        state["toc"] = lines

        def has(desc, schema, tag):
            return any(" %s %s %s " % (desc, schema, tag) in l + " " for l in lines)

        missing = [e for e in [("TABLE", "public", "items"), ("TABLE DATA", "public", "items"),
                               ("TABLE", "public", "moods"), ("TABLE DATA", "public", "moods"),
                               ("TYPE", "public", "mood"), ("EVENT TRIGGER", "-", "app_ddl"),
                               ("TRIGGER", "public", "moods moods_touch"), ("PUBLICATION", "-", "app_pub"),
                               ("PUBLICATION TABLE", "public", "app_pub items"),
                               ("BLOB", "-", str(lo_oid))] if not has(*e)]
        expect_eq(missing, [], "archive entries missing (pg_restore -l)")
        internal = [l for l in lines if any(" %s " % s in l for s in ("_pgrelay", "zt", "zt_0"))
                    or '"shardConfig"' in l or "notice_ddl" in l]
        expect_eq(internal, [], "archive entries in schemas _pgrelay, zt, zt_0")
        state["dumped"] = md5_file(archive)

    def restore_copy():
        expect("dumped" in state, "the dump succeeded")
        expect_eq(env.relay_query(relay, "CREATE DATABASE %s" % COPY_DB), None, "CREATE DATABASE through pgrelay")
        copy_url = with_db(relay.url, COPY_DB)
        # A publication of the database's own, made before the slot: the restore leaves it be.
        query_url(copy_url, "CREATE PUBLICATION %s FOR ALL TABLES" % COPY_PUB)
        conn = replication(copy_url)
        try:
            conn.cursor().create_replication_slot(SLOT, output_plugin="pgoutput")
        finally:
            conn.close()
        expect_eq(env.relay_query(relay, "SELECT slot_name, database FROM pg_replication_slots"),
                  [(SLOT, COPY_DB)], "the slot made in copy1 before the restore")
        r = ok(pgrelay("restore", "-D", relay_dir, "-d", COPY_DB, archive), "pgrelay restore -d copy1")
        out = r.stdout.splitlines()
        expect_eq(out[0] if out else None,
                  'pgrelay restore: restored %s into database "%s" at 127.0.0.1:%d (2 table(s), 0 of them replaced)'
                  % (archive, COPY_DB, relay.port), "restore's report")
        prefix = "skipped (not the application's): "
        skipped = sorted(l[len(prefix):] for l in out[1:] if l.startswith(prefix))
        expect_eq(len(skipped), len(out) - 1, "restore's output after its report: skipped lines only")
        on_ddl = [l for l in skipped if l.startswith("EVENT TRIGGER _pgrelay_ddl (its function _pgrelay.")]
        expect_eq(skipped, sorted(on_ddl + [
            "%d trigger(s) on tables, calling functions the archive does not hold (pgrelay's trigger capture"
            " installs its own)" % state["capture triggers"],
            "EVENT TRIGGER zt_ddl_0 (its function zt_0.notice_ddl is not in the archive)",
            "PUBLICATION _zt_metadata_0", "PUBLICATION _zt_public_0"]) if len(on_ddl) == 1 else None,
            "what restore says it skipped: pgrelay's triggers and event trigger, zero's event trigger and"
            " publications")
        expect_eq(r.stderr.strip(), "", "restore's stderr (no warning: no zero schemas in copy1)")
        expect_eq(fingerprint(env, COPY_DB), state["original"], "copy1's data against e2e's (rows, enum, large object)")
        got = catalog(env, COPY_DB)
        expect_eq(got["schemas"], ["_pgrelay"], "schemas zt, zt_0 not in copy1 (pgrelay's own capture schema is)")
        expect_eq(got["publications"], ["app_pub", COPY_PUB], "publications in copy1: app_pub and its own, no _zt_*")
        expect_eq(got["app_pub tables"], ["public.items"], "app_pub's table in copy1")
        expect_eq(got["user triggers"], ["moods_touch"], "the user trigger in copy1")
        expect("app_ddl" in got["event triggers"] and "zt_ddl_0" not in got["event triggers"],
               "app_ddl restored, zt_ddl_0 not", got=got["event triggers"])
        state["copied"] = True

    def restore_captured():
        expect(state.get("copied"), "the restore into copy1 succeeded")
        relations, txs = read_slot(env, relay, COPY_DB, SLOT, COPY_PUB)
        expect_eq(shape(relations, txs), [[("I", "public.items"), ("I", "public.moods")], [("M", DONE)]],
                  "transactions in the stream: the restore's inserts in one, then the marker")
        expect_eq(count(relations, txs[0]), {("I", "public.items"): ROWS, ("I", "public.moods"): MOODS},
                  "changes in the restore's transaction")
        inserts = [m["new"] for m in txs[0] if relations[m["relid"]] == "public.items"]
        want = [list(r) for r in env.db_query(COPY_DB, "SELECT i.id::text, i.v, i.b::text FROM items i ORDER BY i.id")]
        got = sorted(inserts, key=lambda v: int(v[0]))
        diff = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        expect(diff is None, "the streamed rows equal copy1's items: first difference",
               got=None if diff is None else got[diff], expected=None if diff is None else want[diff])

    def restore_in_place():
        expect("dumped" in state and "original" in state, "the dump succeeded")
        # _zt_public_0 (TABLES IN SCHEMA public) stands before and after the restore, which skips it.
        conn = replication(relay.url)
        try:
            conn.cursor().create_replication_slot(E2E_SLOT, output_plugin="pgoutput")
        finally:
            conn.close()
        env.db_query(DBNAME, "DELETE FROM items WHERE id %% 3 = 0; UPDATE items SET v = 'changed' WHERE id %% 5 = 1;"
                             " UPDATE moods SET m = 'sad'; SELECT lo_put(%d, 0, 'overwritten')" % lo_oid)
        expect(fingerprint(env, DBNAME) != state["original"], "e2e's data changed before the restore")
        r = ok(pgrelay("restore", "-D", relay_dir, archive), "pgrelay restore into e2e")
        expect_eq(r.stdout.splitlines()[0] if r.stdout else None,
                  'pgrelay restore: restored %s into database "%s" at 127.0.0.1:%d (2 table(s), 2 of them replaced)'
                  % (archive, DBNAME, relay.port), "restore's report")
        # e2e has zero's stand-in schemas and pgrelay serve has no admin page: restore warns.
        expect("zero-cache was not reset" in r.stderr, "restore warns that zero-cache was not reset", got=r.stderr)
        expect_eq(fingerprint(env, DBNAME), state["original"], "e2e's data against the dump's")
        expect_eq(fingerprint(env, DBNAME), fingerprint(env, COPY_DB), "e2e's data against copy1's")
        got = catalog(env, DBNAME)
        expect_eq(got["schemas"], ["_pgrelay", "zt", "zt_0"], "zero's stand-in schemas left alone in e2e")
        expect({"app_pub", "_zt_metadata_0", "_zt_public_0"} <= set(got["publications"]),
               "publications in e2e after the restore", got=got["publications"])
        expect({"app_ddl", "zt_ddl_0"} <= set(got["event triggers"]), "event triggers in e2e after the restore",
               got=got["event triggers"])
        # Capture follows the replaced tables: the restore's transaction and a write after it.
        env.relay_query(relay, "UPDATE items SET v = 'after restore' WHERE id = 1")
        relations, txs = read_slot(env, relay, DBNAME, E2E_SLOT, "_zt_public_0")
        expect_eq(shape(relations, txs), [[("D", "public.items"), ("U", "public.items"), ("U", "public.moods")],
                                          [("I", "public.items"), ("I", "public.moods")],
                                          [("U", "public.items")], [("M", DONE)]],
                  "transactions in e2e's stream: the changes, the restore, an update, the marker")
        deleted = sum(1 for i in range(1, ROWS + 1) if i % 3 == 0)
        updated = sum(1 for i in range(1, ROWS + 1) if i % 5 == 1 and i % 3 != 0)
        expect_eq([count(relations, t) for t in txs[:3]],
                  [{("D", "public.items"): deleted, ("U", "public.items"): updated, ("U", "public.moods"): MOODS},
                   {("I", "public.items"): ROWS, ("I", "public.moods"): MOODS},
                   {("U", "public.items"): 1}], "changes in each transaction")
        expect_eq(txs[2][0]["new"][:2], ["1", "after restore"], "the update after the restore")

    def bad_input():
        text = os.path.join(env.base, "not-an-archive.txt")
        with open(text, "w") as f:
            f.write("this is not a dump\n" * 10)
        r = pgrelay("restore", "-D", relay_dir, "-d", COPY_DB, text)
        expect(r.returncode == 1 and "is not an archive pg_restore can read" in r.stderr and "DETAIL:" in r.stderr
               and "HINT:" in r.stderr, "restore of a text file: exit 1, the message, DETAIL and HINT",
               got=(r.returncode, r.stderr))
        missing = os.path.join(env.base, "no-such.dump")
        r = pgrelay("restore", "-D", relay_dir, missing)
        expect(r.returncode == 1 and "58P01" in r.stderr and "could not read" in r.stderr,
               "restore of a missing file: exit 1, 58P01", got=(r.returncode, r.stderr))
        empty = os.path.join(env.base, "no-relay-here")
        os.mkdir(empty)
        for cmd in ("dump", "restore"):
            r = pgrelay(cmd, "-D", empty, os.path.join(empty, "x.dump"))
            expect(r.returncode == 1 and "08006" in r.stderr and "no pgrelay is running on data directory" in r.stderr,
                   "%s -D with no pgrelay running: exit 1, 08006" % cmd, got=(r.returncode, r.stderr))
        expect_eq(sorted(os.listdir(empty)), [], "nothing written in the directory with no pgrelay")
        nowhere = os.path.join(env.base, "no-such-dir", "x.dump")
        r = pgrelay("dump", "-D", relay_dir, nowhere)
        expect(r.returncode != 0, "dump into a missing directory fails", got=(r.returncode, r.stdout, r.stderr))
        expect(not os.path.exists(os.path.dirname(nowhere)), "no directory created for it")

    def failed_dump_keeps_file():
        expect("dumped" in state, "the dump succeeded")
        before = md5_file(archive)
        r = pgrelay("dump", "-D", relay_dir, "-d", "no_such_db", archive)
        expect(r.returncode != 0 and "no_such_db" in r.stderr,
               "dump of a missing database fails naming it", got=(r.returncode, r.stderr))
        expect_eq(md5_file(archive), before, "FILE after the failed dump (no such database)")
        expect(not os.path.exists(archive + ".partial"), "no FILE.partial after the failed dump")
        # pg_dump failing after it wrote part of its output: FILE stays, .partial goes.
        fake = os.path.join(env.base, "fake-bin")
        os.mkdir(fake)
        with open(os.path.join(fake, "pg_dump"), "w") as f:
            f.write('#!/bin/sh\nfor a; do case "$a" in --file=*) out="${a#--file=}";; esac; done\n'
                    'printf "PGDMP half an archive" > "$out"\necho "pg_dump: error: simulated failure" >&2\nexit 1\n')
        os.chmod(os.path.join(fake, "pg_dump"), 0o755)
        r = pgrelay("dump", "-D", relay_dir, "--pg-bin", fake, archive)
        expect(r.returncode != 0 and "simulated failure" in r.stderr and "pgrelay dump failed" in r.stderr,
               "dump whose pg_dump fails midway", got=(r.returncode, r.stdout, r.stderr))
        expect_eq(md5_file(archive), before, "FILE after pg_dump failed midway")
        expect(not os.path.exists(archive + ".partial"), "no FILE.partial after pg_dump failed midway")

    def no_password():
        secrets = {PASSWORD, quote(PASSWORD, safe="")}
        with open(relay.log_path, "rb") as f:
            log = f.read().decode(errors="replace")
        expect(log.strip() != "", "pgrelay's log is not empty")
        expect_eq([s for s in secrets if s in log], [], "the password in pgrelay's log")
        leaks = [(cmd, s) for cmd, out, err in outputs for s in secrets if s in out or s in err]
        expect(len(outputs) >= 5, "dump and restore ran", got=len(outputs))
        expect_eq(leaks, [], "the password in what pgrelay dump/restore printed")

    env.check("dump: archive holds the application, not pgrelay's or zero's schemas", dump)
    env.check("restore into a new database: exact data, zero's and pgrelay's objects skipped", restore_copy)
    env.check("the restore reaches a slot made before it: %d inserts in one transaction" % ROWS, restore_captured)
    env.check("restore over changed data: 2 tables replaced, data as dumped", restore_in_place)
    env.check("bad input: not an archive, missing file, no pgrelay, missing directory", bad_input)
    env.check("a failed dump leaves FILE as it was", failed_dump_keeps_file)
    env.check("no password in pgrelay's log or dump/restore output", no_password)


if __name__ == "__main__":
    main("dump_restore", body)
