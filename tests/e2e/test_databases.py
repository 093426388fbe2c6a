# End-to-end: every database pgrelay serves replicates, or pgrelay says plainly that it does not.
"""Issue #21. Each database pgrelay captures has a change log of its own, and a slot streams
exactly the transactions of the database it was created in. A database that --capture-database
leaves out is still served, but a slot there is refused with SQLSTATE 55000, a message naming the
database and a hint naming the option that would capture it.

Four scenarios, each with every check below: trigger capture and native capture against an
upstream given by URL (trigger on a wal_level=replica cluster, so that `SHOW wal_level` reading
`logical` through pgrelay means something; native on a wal_level=logical one), and the embedded
default (`pgrelay --database app1,app2`) with --capture trigger and --capture native. In each:

- pgrelay started with `--capture-database app1`: CREATE_REPLICATION_SLOT and
  pg_create_logical_replication_slot() in app2 are refused (55000, message, hint), and so is
  START_REPLICATION there of app1's slot (55000; either reason, not captured here or not created
  here, is right); app2 still serves ordinary sessions; app1 captures and streams, and its
  walsender is in pg_stat_replication read in app2 and in the URL's database;
  pg_replication_slots lists app1's slot with its database from app2 and from the URL's database;
  `pgrelay status` (text and --json) lists the captured databases; `pgrelay doctor
  --capture-database app1` (upstream scenarios only: the embedded PostgreSQL is not reachable by
  URL) has a `databases` check naming app1 captured and app2 left out.
- restarted on the same data directory with the default (every database): the databases captured
  before are captured at startup (status says so before any session touches them); then a slot in
  each of app1, app2 and the URL's database, created through pgrelay, while three writers commit
  TRANSACTIONS transactions each (app2's straight to PostgreSQL, the others through pgrelay), each
  transaction inserting two rows with markers naming its database: each slot, streamed while the
  writers run, carries exactly its own database's transactions, all of them, in commit order, and
  none of another database's. Meanwhile `SHOW wal_level` is `logical` in each captured database,
  pg_stat_replication lists all three walsenders from each database, and pg_replication_slots
  lists every slot with its database.
- START_REPLICATION of app1's slot from app2 and from the URL's database is refused (55000).
- databases created while pgrelay runs (app3 by CREATE DATABASE through pgrelay, app4 straight on
  PostgreSQL) get a table, a publication and a slot through pgrelay, and their slots stream.
- DROP DATABASE through pgrelay of a database it captures (app5) is refused as in use (55006)
  while pgrelay has a slot there, as Postgres refuses it; without the slot it drops, status no
  longer lists it, and a database made again under that name is captured afresh and streams.
- kill -9 of pgrelay while app1 and app2 are written to and streamed (each commit confirmed with
  its end LSN): after a restart on the same data directory, each slot streams every transaction
  its database committed (read back from the table itself) after the position its consumer had
  confirmed, exactly once and in order, and nothing of the other database; transactions at or
  before that position may come again, as with PostgreSQL, but (again as with PostgreSQL) none
  that committed before the confirmed_flush_lsn pgrelay shows for the slot after the restart,
  which itself is never past what the consumer confirmed.
- status after that restart lists every captured database.
- restarted with `--capture-database app1,app3 --capture-database app4` (a list, and repeated):
  app2, captured before, is now left out: START_REPLICATION of its own slot there is refused with
  the message and hint, and its slots are still listed with their database; app1 gets a new slot
  that streams, and the slots of app3 and app4 stream on. Status no longer lists app2 among the
  captured databases (pgrelay itself now says it is not captured).

About two minutes with the ASan build.
"""
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import (PASSWORD, SUPERUSER, CheckFailed, Env, expect, expect_eq, free_port, lsn_to_int,  # noqa: E402
                         lsn_to_str, main, wait_until, with_db)
from e2e_support import query_url as query  # noqa: E402
from pgoutput_decode import Session, decode_message  # noqa: E402
from test_doctor import parse as parse_doctor, run_doctor  # noqa: E402
from test_embedded import PrivateRelay, alive  # noqa: E402
from test_native_capture import LOGICAL_CONF  # noqa: E402

import psycopg2  # noqa: E402
from psycopg2.extras import LogicalReplicationConnection  # noqa: E402

TRANSACTIONS = 200         # per writer in the concurrent check
KILL_FIRST_INDEX = 100000  # the kill -9 check's writers number their transactions from here
PUBLICATION = "pub_events"
TABLE_SQL = "CREATE TABLE events (id int PRIMARY KEY, marker text NOT NULL)"


# ---- names and URLs ----

def marker(db, i, half):
    return "%s/%d/%s" % (db, i, half)


def transaction_key(changes):
    """(database, index) of a writer's transaction, or None if it is not shaped like one."""
    if len(changes) != 2 or any(c[0] != "I" or c[1] != "public.events" for c in changes):
        return None
    (id_a, m_a), (id_b, m_b) = changes[0][2], changes[1][2]
    db, _, rest = m_a.rpartition("/")[0].rpartition("/")
    try:
        i = int(rest)
    except ValueError:
        return None
    if [id_a, m_a, id_b, m_b] != [str(2 * i), marker(db, i, "a"), str(2 * i + 1), marker(db, i, "b")]:
        return None
    return db, i


def parse_stream(session, db):
    """A stream's transactions split into db's own [(index, commit_lsn, end_lsn)], those of other
    databases [(database, index)], and any that are no writer's transaction."""
    own, foreign, odd = [], [], []
    for t in session.transactions:
        key = transaction_key(t["changes"])
        if key is None:
            odd.append(t["changes"])
        elif key[0] != db:
            foreign.append(key)
        else:
            own.append((key[1], t.get("commit_lsn"), t.get("end_lsn")))
    return own, foreign, odd


def words(text):
    return set(re.findall(r"[A-Za-z0-9_]+", text))


def duplicates(values):
    seen, twice = set(), []
    for v in values:
        if v in seen:
            twice.append(v)
        seen.add(v)
    return twice


def stream_problems(session, db, expected):
    """What keeps a stream from being exactly `expected` (writer indices of db, commit order)."""
    own, foreign, odd = parse_stream(session, db)
    got = [i for i, _, _ in own]
    problems = {}
    if session.errors:
        problems["pgoutput ordering errors"] = session.errors[:5]
    if foreign:
        problems["transactions of other databases (%d)" % len(foreign)] = foreign[:5]
    if odd:
        problems["transactions that are no writer's (%d)" % len(odd)] = odd[:3]
    if got != list(expected):
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        first = next((n for n, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        problems["own transactions"] = {
            "count": (len(got), len(expected)), "missing": missing[:10], "never written": extra[:10],
            "twice": duplicates(got)[:10], "first difference at": first,
            "got there": got[first:first + 5], "expected there": list(expected)[first:first + 5]}
    commits = [c for _, c, _ in own]
    if any(a >= b for a, b in zip(commits, commits[1:])):
        problems["commit LSNs not strictly increasing"] = [lsn_to_str(c) for c in commits[:10]]
    return problems


def all_of(*checks):
    """Runs every check, then fails with the messages of those that failed, if any."""
    failures = []
    for check in checks:
        try:
            check()
        except CheckFailed as e:
            failures.append(str(e))
    if failures:
        raise CheckFailed("\n".join(failures))


# ---- the replication protocol ----

def replication_connection(url, **kw):
    return psycopg2.connect(url, connection_factory=LogicalReplicationConnection, connect_timeout=10, **kw)


def error_of(fn):
    """The psycopg2 error fn() raised, or None."""
    try:
        fn()
    except psycopg2.Error as e:
        return e
    return None


def create_slot_by_protocol(url, slot):
    conn = replication_connection(url)
    try:
        cur = conn.cursor()
        cur.create_replication_slot(slot, output_plugin="pgoutput")
        return cur.fetchone()
    finally:
        conn.close()


def create_slot_by_function(url, slot):
    return query(url, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def start_replication_error(url, slot, wait=3.0):
    """The error START_REPLICATION of `slot` gets (at once or in the first seconds), or None."""
    conn = replication_connection(url)
    try:
        cur = conn.cursor()
        try:
            cur.start_replication(slot_name=slot, decode=False,
                                  options={"proto_version": "1", "publication_names": PUBLICATION})
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if cur.read_message() is None:
                    select.select([cur], [], [], 0.2)
        except psycopg2.Error as e:
            return e
        return None
    finally:
        conn.close()


def expect_sqlstate(error, what, sqlstate, message=None, hint=None):
    expect(error is not None, "%s to be refused (it succeeded)" % what)
    primary = error.diag.message_primary or ""
    expect_eq(error.pgcode, sqlstate, "the SQLSTATE of %s (error: %s)" % (what, (error.pgerror or str(error)).strip()))
    if message is not None:
        expect(message in primary, "the error of %s says %r" % (what, message), got=primary)
    if hint is not None:
        expect(hint in (error.diag.message_hint or ""), "the hint of %s contains %r" % (what, hint),
               got=error.diag.message_hint)


def expect_not_captured(error, what, db):
    expect_sqlstate(error, what, "55000", 'database "%s" is not captured by pgrelay' % db,
                    "--capture-database %s" % db)


class SlotReader(threading.Thread):
    """Streams one slot (pgoutput v1) in a thread of its own, confirming each commit with its
    end LSN; `reported` is the last position it confirmed (the server may have seen less)."""

    def __init__(self, url, slot, application_name):
        super().__init__(daemon=True)
        self.url = url
        self.slot = slot
        self.application_name = application_name
        self.session = Session()
        self.reported = 0
        self.error = None
        self.streaming = threading.Event()
        self.stop_event = threading.Event()

    def run(self):
        conn = None
        try:
            conn = replication_connection(self.url, application_name=self.application_name)
            cur = conn.cursor()
            cur.start_replication(slot_name=self.slot, decode=False, status_interval=1,
                                  options={"proto_version": "1", "publication_names": PUBLICATION})
            self.streaming.set()
            while not self.stop_event.is_set():
                msg = cur.read_message()
                if msg is None:
                    select.select([cur], [], [], 0.2)
                    continue
                decoded = decode_message(msg.payload)
                self.session.feed(decoded)
                if decoded["tag"] == "C":
                    cur.send_feedback(flush_lsn=decoded["end_lsn"])
                    self.reported = decoded["end_lsn"]
            if self.reported:
                cur.send_feedback(flush_lsn=self.reported, force=True)  # psycopg2 sends it later otherwise
        except Exception as e:  # the check reads it (after a kill -9 it is expected)
            self.error = e
        finally:
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass

    def finish(self, timeout=10):
        self.stop_event.set()
        self.join(timeout)

    def count(self):
        return len(self.session.transactions)


class Writer(threading.Thread):
    """Commits transactions into `events` of one database, each inserting two rows marked with
    the database and the transaction's index, until `count` are committed or it is stopped.
    With `tolerate_errors` it reconnects after a failure (a commit whose answer was lost may or
    may not have happened: the table says)."""

    def __init__(self, connect, db, count=None, first=0, tolerate_errors=False, pause=0.0):
        super().__init__(daemon=True)
        self.pause = pause
        self.connect = connect
        self.db = db
        self.count = count
        self.next = first
        self.tolerate_errors = tolerate_errors
        self.committed = []  # indices whose COMMIT returned, in order
        self.errors = []
        self.stop_event = threading.Event()

    def run(self):
        conn = None
        while not self.stop_event.is_set() and (self.count is None or len(self.committed) < self.count):
            try:
                if conn is None:
                    conn = self.connect()
                    conn.autocommit = False
                i = self.next
                self.next += 1
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO events VALUES (%s, %s), (%s, %s)",
                                (2 * i, marker(self.db, i, "a"), 2 * i + 1, marker(self.db, i, "b")))
                conn.commit()
                self.committed.append(i)
                if self.pause:
                    time.sleep(self.pause)
            except Exception as e:
                self.errors.append(str(e).strip())
                try:
                    if conn is not None:
                        conn.close()
                except Exception:
                    pass
                conn = None
                if not self.tolerate_errors:
                    return
                time.sleep(0.2)
        if conn is not None:
            conn.close()


# ---- pgrelay's commands ----

def status_captured(env, data_dir):
    """The captured databases `pgrelay status` names, as (text, --json), each sorted."""
    r = subprocess.run([env.pgrelay, "status", "--data-dir", data_dir], capture_output=True, text=True, timeout=60)
    expect_eq(r.returncode, 0, "pgrelay status exit code while running (stderr: %s)" % r.stderr.strip()[-400:])
    lines = [l for l in r.stdout.splitlines() if l.startswith("captured databases:")]
    expect(len(lines) == 1, "one line of pgrelay status starts with 'captured databases:'", got=r.stdout)
    text = sorted(n.strip() for n in lines[0].split(":", 1)[1].split(",") if n.strip())
    r = subprocess.run([env.pgrelay, "status", "--data-dir", data_dir, "--json"], capture_output=True, text=True,
                       timeout=60)
    expect_eq(r.returncode, 0, "pgrelay status --json exit code while running (stderr: %s)" % r.stderr.strip()[-400:])
    try:
        report = json.loads(r.stdout)
    except ValueError:
        raise CheckFailed("pgrelay status --json did not print JSON: %r" % r.stdout[-800:])
    expect("captured_databases" in report, "pgrelay status --json has captured_databases", got=sorted(report))
    return text, sorted(report["captured_databases"])


def expect_status_lists(env, data_dir, databases, when):
    text, listed = status_captured(env, data_dir)
    expect_eq(text, sorted(databases), "the captured databases pgrelay status lists %s" % when)
    expect_eq(listed, sorted(databases), "captured_databases of pgrelay status --json %s" % when)


# ---- one pgrelay and its databases ----

class Scenario:
    """One pgrelay (restarted on the same data directory) over one PostgreSQL, and what was
    created through it."""

    def __init__(self, env, name, main_db, data_dir, start, direct_url, doctor_url=None):
        self.env = env
        self.name = name
        self.main_db = main_db        # the database of the upstream URL
        self.data_dir = data_dir
        self._start = start           # (extra args) -> a ready relay
        self._direct_url = direct_url  # (relay, database) -> a conninfo straight to PostgreSQL
        self.doctor_url = doctor_url  # the upstream URL for pgrelay doctor, if there is one
        self.relay = None
        self.slots = {}               # slot -> the database it was created in

    def start(self, extra_args=()):
        self.relay = self._start(list(extra_args))
        return self.relay

    def stop(self):
        code, _ = self.relay.stop(signal.SIGTERM, timeout=60)
        expect_eq(code, 0, "pgrelay's exit code on SIGTERM")

    def url(self, db=None):
        expect(self.relay is not None and self.relay.proc.poll() is None, "a running pgrelay",
               got=self.relay and self.relay.proc.returncode)
        return with_db(self.relay.url, db or self.main_db)

    def direct(self, db):
        return self._direct_url(self.relay, db)

    def direct_connect(self, db):
        return lambda: psycopg2.connect(self.direct(db), connect_timeout=10, options="-c synchronous_commit=on")

    def relay_connect(self, db):
        return lambda: psycopg2.connect(self.url(db), connect_timeout=10)

    def create_table(self, db):
        query(self.url(db), TABLE_SQL + "; CREATE PUBLICATION %s FOR TABLE events" % PUBLICATION)

    def ensure_table(self, db):
        """The table and publication, unless an earlier check (that may have failed) made them."""
        if query(self.url(db), "SELECT count(*) FROM pg_publication WHERE pubname = %s", (PUBLICATION,)) == [(0,)]:
            self.create_table(db)

    def create_slot(self, db, slot, by_function=False):
        if by_function:
            create_slot_by_function(self.url(db), slot)
        else:
            row = create_slot_by_protocol(self.url(db), slot)
            expect(row is not None and row[0] == slot, "CREATE_REPLICATION_SLOT %s answers its row" % slot, got=row)
        self.slots[slot] = db

    def expect_slot_listing(self, dbs):
        """pg_replication_slots through pgrelay, read in each of dbs, lists every slot with its database."""
        expected = sorted(self.slots.items())
        for db in dbs:
            rows = query(self.url(db), "SELECT slot_name::text, database::text FROM pg_replication_slots ORDER BY 1")
            expect_eq(rows, expected, "pg_replication_slots (slot_name, database) read in %s" % db)

    def wait_inactive(self, slot):
        wait_until(lambda: query(self.url(), "SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s",
                                 (slot,)) == [(True,)], 15, "slot %s inactive" % slot)

    def expect_logical(self, db):
        rows = query(self.url(db), "SELECT current_setting('wal_level')")
        expect_eq(rows, [("logical",)], "current_setting('wal_level') in captured database %s" % db)
        conn = psycopg2.connect(self.url(db), connect_timeout=10)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW wal_level")
                expect_eq(cur.fetchall(), [("logical",)], "SHOW wal_level in captured database %s" % db)
        finally:
            conn.close()

    def stream_one(self, db, slot, write, timeout=60, during=None):
        """Streams slot while write() runs; expects exactly the writer indices write() returns.
        during(application name), if given, runs while the stream is still open."""
        reader = SlotReader(self.url(db), slot, "single-" + db)
        reader.start()
        try:
            wait_until(lambda: reader.streaming.is_set() or reader.error, 30, "%s streaming" % slot)
            expect(reader.error is None, "START_REPLICATION of %s" % slot, got=reader.error)
            indices = write()
            wait_until(lambda: reader.count() >= len(indices) or reader.error, timeout,
                       "%d transactions from %s" % (len(indices), slot))
            time.sleep(1.0)  # anything more would arrive now
            if during:
                during(reader.application_name)
        finally:
            reader.finish()
        expect(reader.error is None, "the stream of %s ran without error" % slot, got=reader.error)
        expect_eq(stream_problems(reader.session, db, indices), {},
                  "the stream of %s: exactly database %s's transactions" % (slot, db))


def write_some(connect, db, first, count):
    """Commits `count` writer transactions in db (one connection); returns their indices."""
    w = Writer(connect, db, count=count, first=first)
    w.run()
    expect_eq(w.errors, [], "the writes in %s" % db)
    return w.committed


# ---- the checks ----

def run_scenario(env, sc, mode):
    prefix = sc.name + ": "
    capture = ["--capture", mode]
    main_db = sc.main_db
    state = {}

    def left_out():
        sc.start(capture + ["--capture-database", "app1"])
        state["left_out"] = True
        # The left-out database still serves ordinary sessions.
        sc.create_table("app2")
        expect_eq(query(sc.url("app2"), "SELECT count(*) FROM events"), [(0,)], "a query in app2 through pgrelay")
        sc.create_table("app1")
        sc.create_slot("app1", "r_app1")
        all_of(lambda: expect_not_captured(error_of(lambda: create_slot_by_protocol(sc.url("app2"), "r_app2")),
                                           "CREATE_REPLICATION_SLOT in app2", "app2"),
               lambda: expect_not_captured(error_of(lambda: create_slot_by_function(sc.url("app2"), "r_app2f")),
                                           "pg_create_logical_replication_slot() in app2", "app2"),
               # app1's slot: refused as not captured here or as not created here, both 55000.
               lambda: expect_sqlstate(start_replication_error(sc.url("app2"), "r_app1"),
                                       "START_REPLICATION of app1's slot in app2", "55000"),
               lambda: sc.expect_slot_listing([main_db, "app1", "app2"]))

    def app1_still_works():
        expect(state.get("left_out"), "pgrelay with --capture-database app1 ran")
        sc.expect_logical("app1")

        def walsender_listed_everywhere(name):
            for db in ("app2", main_db):  # app2 is not captured
                rows = query(sc.url(db), "SELECT application_name FROM pg_stat_replication")
                expect_eq([n for (n,) in rows if n == name], [name], "app1's walsender in pg_stat_replication read in %s"
                          % db)
        sc.stream_one("app1", "r_app1", lambda: write_some(sc.relay_connect("app1"), "app1", 0, 5),
                      during=walsender_listed_everywhere)

    def status_left_out():
        expect(sc.relay is not None and sc.relay.proc.poll() is None, "pgrelay with --capture-database app1 runs")
        expect_status_lists(env, sc.data_dir, [main_db, "app1"], "under --capture-database app1")

    def doctor_databases():
        """doctor's databases check, told --capture-database app1: app1 and the URL's database on
        the captured side of its line, app2 on the left-out side ("...; not app2, ...")."""
        code, out, err = run_doctor(env, sc.doctor_url, "--capture-database", "app1")
        checks = parse_doctor(out)
        expect("databases" in checks, "pgrelay doctor reports a check named databases (exit %d, stderr %r)"
               % (code, err[-300:]), got=sorted(checks))
        status, text = checks["databases"]
        expect(status in ("OK", "WARN"), "the databases check is not a failure", got=text)
        captured, _, left_out = text.splitlines()[0].partition("; not ")
        expect({"app1", main_db} <= words(captured) and "app2" not in words(captured) and "app2" in words(left_out),
               "doctor --capture-database app1 names app1 and %s as captured and app2 as left out" % main_db, got=text)

    def restart_captures_again():
        code = sc.relay.stop(signal.SIGTERM, timeout=60)[0] if sc.relay else "it never started"
        sc.start(capture)
        state["restarted"] = True
        expect_eq(code, 0, "the exit code of pgrelay --capture-database app1 on SIGTERM")
        # Before any session touches app1.
        expect_status_lists(env, sc.data_dir, [main_db, "app1"], "right after a restart")

    def three_databases_concurrently():
        expect(state.get("restarted"), "pgrelay restarted with every database admitted")
        for db in (main_db, "app1", "app2"):
            sc.ensure_table(db)
        sc.create_slot(main_db, "s_main")
        sc.create_slot("app1", "s_app1")
        sc.create_slot("app2", "s_app2", by_function=True)
        dbs = [main_db, "app1", "app2"]
        slots = {main_db: "s_main", "app1": "s_app1", "app2": "s_app2"}
        for db in dbs:
            sc.expect_logical(db)
        side = []  # what else is wrong, said after the streams' verdict
        readers = {db: SlotReader(sc.url(db), slots[db], "dbs-" + db) for db in dbs}
        writers = {db: Writer(sc.direct_connect(db) if db == "app2" else sc.relay_connect(db), db,
                              count=TRANSACTIONS, first=1000) for db in dbs}
        try:
            for r in readers.values():
                r.start()
            wait_until(lambda: all(r.streaming.is_set() or r.error for r in readers.values()), 30,
                       "three slots streaming")
            expect_eq({db: repr(r.error) for db, r in readers.items() if r.error}, {}, "START_REPLICATION errors")
            t0 = time.monotonic()
            for w in writers.values():
                w.start()
            for w in writers.values():
                w.join(180)
            print("    %d transactions in each of %s in %.1fs" % (TRANSACTIONS, ", ".join(dbs), time.monotonic() - t0),
                  flush=True)
            expect_eq({db: w.errors[:3] for db, w in writers.items() if w.errors}, {}, "the writers' errors")
            try:
                wait_until(lambda: all(r.count() >= TRANSACTIONS or r.error for r in readers.values()), 120,
                           "%d transactions on each slot" % TRANSACTIONS)
            except CheckFailed:
                pass  # the comparison below says what came
            time.sleep(1.5)  # anything more would arrive now
            # Every walsender, from every database (while all three stream).
            names = sorted("dbs-" + db for db in dbs)
            for db in dbs:
                rows = query(sc.url(db), "SELECT application_name FROM pg_stat_replication")
                listed = sorted(n for (n,) in rows if n.startswith("dbs-"))
                if listed != names:
                    side.append("pg_stat_replication in %s lists %r, expected %r" % (db, listed, names))
        finally:
            for w in writers.values():
                w.stop_event.set()
            for r in readers.values():
                r.finish()
        problems = {}
        for db in dbs:
            r = readers[db]
            p = stream_problems(r.session, db, writers[db].committed)
            if r.error is not None:
                p["stream error"] = repr(r.error)
            if p:
                problems[slots[db]] = p
        expect_eq(problems, {}, "each slot streams exactly its database's %d transactions" % TRANSACTIONS)
        expect_eq(side, [], "the walsenders through pgrelay")
        sc.expect_slot_listing(dbs)

    def other_database_slot_refused():
        expect("s_app1" in sc.slots, "app1's slot exists")
        sc.wait_inactive("s_app1")  # else Postgres's answer would be 55006, the slot in use
        for db in ("app2", main_db):
            expect_sqlstate(start_replication_error(sc.url(db), "s_app1"), "START_REPLICATION of s_app1 in %s" % db,
                            "55000", 'replication slot "s_app1" was not created in this database')
        # Still usable where it belongs.
        sc.stream_one("app1", "s_app1", lambda: write_some(sc.relay_connect("app1"), "app1", 5000, 3))

    def created_while_running():
        expect(sc.relay is not None, "a running pgrelay")
        query(sc.url(), "CREATE DATABASE app3")
        query(sc.direct("postgres"), "CREATE DATABASE app4")
        for db, slot, by_function in (("app3", "s_app3", False), ("app4", "s_app4", True)):
            sc.create_table(db)
            sc.create_slot(db, slot, by_function=by_function)
            sc.expect_logical(db)
        sc.stream_one("app3", "s_app3", lambda: write_some(sc.relay_connect("app3"), "app3", 0, 3))
        sc.stream_one("app4", "s_app4", lambda: write_some(sc.direct_connect("app4"), "app4", 0, 3))
        expect_status_lists(env, sc.data_dir, [main_db, "app1", "app2", "app3", "app4"],
                            "after app3 and app4 were captured")
        state["created"] = True

    def drop_and_recreate():
        # DROP DATABASE through pgrelay of a database it captures: pgrelay lets go of it first
        # (its own connections would keep it in use), unless one of its slots is there, where
        # the drop is refused as in use, as Postgres refuses to drop a database with slots. A
        # database made again under that name is captured afresh by its first session.
        expect(sc.relay is not None, "a running pgrelay")
        captured = [main_db, "app1", "app2", "app3", "app4"]
        query(sc.url(), "CREATE DATABASE app5")
        sc.create_table("app5")
        sc.create_slot("app5", "s_app5")
        refused = error_of(lambda: query(sc.url(), "DROP DATABASE app5"))
        expect(refused is not None and refused.pgcode == "55006",
               "DROP DATABASE app5 with pgrelay's slot s_app5 in it is refused as in use (55006)",
               got=refused and (refused.pgcode, refused.pgerror))
        for round_ in (1, 2):
            conn = replication_connection(sc.url("app5"))
            try:
                conn.cursor().drop_replication_slot("s_app5")
            finally:
                conn.close()
            del sc.slots["s_app5"]
            query(sc.url(), "DROP DATABASE app5")
            expect_eq(query(sc.direct("postgres"), "SELECT count(*) FROM pg_database WHERE datname = 'app5'"),
                      [(0,)], "app5 dropped through pgrelay (round %d)" % round_)
            expect_status_lists(env, sc.data_dir, captured, "after app5 was dropped (round %d)" % round_)
            if round_ == 2:
                break
            query(sc.url(), "CREATE DATABASE app5")
            sc.create_table("app5")
            sc.create_slot("app5", "s_app5")
            sc.stream_one("app5", "s_app5", lambda: write_some(sc.relay_connect("app5"), "app5", 0, 3))
            sc.wait_inactive("s_app5")

    def kill9():
        dbs = ["app1", "app2"]
        slots = {db: "k_" + db for db in dbs}
        for db in dbs:
            sc.ensure_table(db)
            sc.create_slot(db, slots[db])
        writers = {db: Writer(sc.direct_connect(db), db, first=KILL_FIRST_INDEX, tolerate_errors=True,
                             pause=0.002) for db in dbs}
        before = {db: SlotReader(sc.url(db), slots[db], "kill-" + db) for db in dbs}
        after = {}
        try:
            for r in before.values():
                r.start()
            for w in writers.values():
                w.start()
            wait_until(lambda: all(r.count() >= 40 for r in before.values()) or
                       any(r.error for r in before.values()), 60, "40 transactions on each slot before the kill")
            expect_eq({db: repr(r.error) for db, r in before.items() if r.error}, {}, "stream errors before the kill")
            time.sleep(3.0)  # pgrelay persists confirmed positions about every second: let some reach disk
            postmaster = sc.relay.postmaster_pid() if isinstance(sc.relay, PrivateRelay) else None
            sc.relay.proc.kill()
            sc.relay.proc.wait()
            for r in before.values():
                r.join(15)  # the connection is gone: the reader ends with an error
            reported = {db: r.reported for db, r in before.items()}
            if postmaster:  # the private PostgreSQL ends with pgrelay (PR_SET_PDEATHSIG)
                wait_until(lambda: not alive(postmaster), 30, "the private postmaster to end")
            time.sleep(1.0)
            sc.start(capture)
            at_restart = {db: len(w.committed) for db, w in writers.items()}
            wait_until(lambda: all(len(w.committed) >= at_restart[db] + 40 for db, w in writers.items()), 90,
                       "40 more commits in each database after the restart")
        finally:
            for w in writers.values():
                w.stop_event.set()
            for w in writers.values():
                w.join(30)
            for r in before.values():
                r.finish()
        # What the server keeps as confirmed: never past what the consumer said.
        kept = {}
        for db in dbs:
            rows = query(sc.url(db), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                         (slots[db],))
            expect(rows and rows[0][0], "slot %s after the restart" % slots[db], got=rows)
            expect(lsn_to_int(rows[0][0]) <= reported[db], "confirmed_flush_lsn of %s after the restart is at or "
                   "before what its consumer confirmed" % slots[db], got=rows[0][0],
                   expected="<= " + lsn_to_str(reported[db]))
            kept[db] = rows[0][0]
        truth, needed = {}, {}
        for db in dbs:
            rows = query(sc.direct(db), "SELECT id / 2 FROM events WHERE id >= %s AND id %% 2 = 0 ORDER BY id",
                         (2 * KILL_FIRST_INDEX,))
            truth[db] = [i for (i,) in rows]
            lost = sorted(set(writers[db].committed) - set(truth[db]))
            expect_eq(lost[:10], [], "acknowledged commits in %s missing from its table (PostgreSQL lost them?)" % db)
            own, _, _ = parse_stream(before[db].session, db)
            confirmed = {i for i, _, end in own if end is not None and end <= reported[db]}
            needed[db] = [i for i in truth[db] if i not in confirmed]
        try:
            for db in dbs:
                after[db] = SlotReader(sc.url(db), slots[db], "resume-" + db)
                after[db].start()

            def caught_up():
                return all(r.error or {i for i, _, _ in parse_stream(r.session, db)[0]} >= set(needed[db])
                           for db, r in after.items())
            try:
                wait_until(caught_up, 120, "the resumed streams to carry every transaction after the confirmed one")
            except CheckFailed:
                pass  # the comparison below says what is missing
            time.sleep(1.5)
        finally:
            for r in after.values():
                r.finish()
        problems = {}
        for db in dbs:
            p = {}
            pre_own, pre_foreign, pre_odd = parse_stream(before[db].session, db)
            own, foreign, odd = parse_stream(after[db].session, db)
            got = [i for i, _, _ in own]
            if after[db].error is not None:
                p["resumed stream error"] = repr(after[db].error)
            if before[db].session.errors or after[db].session.errors:
                p["pgoutput ordering errors"] = (before[db].session.errors + after[db].session.errors)[:5]
            if pre_foreign or foreign:
                p["transactions of another database"] = (pre_foreign + foreign)[:5]
            if pre_odd or odd:
                p["transactions that are no writer's"] = (pre_odd + odd)[:3]
            never = sorted(set(got + [i for i, _, _ in pre_own]) - set(truth[db]))
            if never:
                p["streamed but not in the table"] = never[:10]
            missing = [i for i in needed[db] if i not in set(got)]
            if missing:
                p["lost (committed after the confirmed position, not streamed after the restart)"] = missing[:10]
            if duplicates(got):
                p["streamed twice after the restart"] = duplicates(got)[:10]
            if got != sorted(got):
                p["out of commit order after the restart"] = got[:20]
            commits = [c for _, c, _ in own]
            if any(a >= b for a, b in zip(commits, commits[1:])):
                p["commit LSNs not increasing after the restart"] = [lsn_to_str(c) for c in commits[:10]]
            # As Postgres: a stream from the slot's confirmed_flush_lsn skips what committed before it.
            early = [(i, lsn_to_str(c)) for i, c, _ in own if c < lsn_to_int(kept[db])]
            if early:
                p["resent although committed before the slot's confirmed_flush_lsn %s (%d)" % (kept[db], len(early))] = \
                    early[:5]
            if p:
                problems[slots[db]] = p
            print("    %s: %d committed, %d streamed before the kill (confirmed to %s, kept %s), %d after the restart"
                  % (db, len(truth[db]), len(pre_own), lsn_to_str(reported[db]), kept[db], len(got)), flush=True)
        expect_eq(problems, {}, "each slot after kill -9 and restart")
        state["killed"] = True

    def status_after_restart():
        expect(state.get("killed"), "the kill -9 check restarted pgrelay")
        expect_status_lists(env, sc.data_dir, [main_db, "app1", "app2", "app3", "app4"],
                            "after the restart that followed kill -9")
        # pgrelay's own upstream connections in a captured database name themselves.
        named = query(sc.direct("postgres"), "SELECT count(*) FROM pg_stat_activity WHERE datname = 'app1' "
                                             "AND application_name = 'pgrelay'")[0][0]
        expect(named >= 2, "pgrelay's connections to app1 in the upstream's pg_stat_activity are named "
               "'pgrelay' (capture and catalog at least)", got=named)

    def left_out_after_capture():
        expect(state.get("killed"), "the kill -9 check restarted pgrelay")
        sc.stop()
        # Comma-separated and repeated: app2 alone is left out.
        sc.start(capture + ["--capture-database", "app1,app3", "--capture-database", "app4"])
        all_of(lambda: expect_not_captured(start_replication_error(sc.url("app2"), "s_app2"),
                                           "START_REPLICATION of app2's own slot once app2 is left out", "app2"),
               lambda: sc.expect_slot_listing([main_db, "app1", "app2"]),
               lambda: (sc.create_slot("app1", "x_app1"),
                        sc.stream_one("app1", "x_app1", lambda: write_some(sc.relay_connect("app1"), "app1", 6000, 3))),
               lambda: sc.stream_one("app3", "s_app3", lambda: write_some(sc.relay_connect("app3"), "app3", 10, 3)),
               lambda: sc.stream_one("app4", "s_app4", lambda: write_some(sc.direct_connect("app4"), "app4", 10, 3)))

    env.check(prefix + "with --capture-database app1, slots in app2 are refused (55000, message, hint)", left_out)
    env.check(prefix + "with --capture-database app1, app1 captures and streams", app1_still_works)
    env.check(prefix + "status lists the captured databases (--capture-database app1)", status_left_out)
    if sc.doctor_url:
        env.check(prefix + "pgrelay doctor's databases check names what is captured and left out", doctor_databases)
    env.check(prefix + "after a restart, databases captured before are captured at startup", restart_captures_again)
    env.check(prefix + "concurrent writers in three databases: each slot streams exactly its own",
              three_databases_concurrently)
    env.check(prefix + "START_REPLICATION of another database's slot is refused (55000)", other_database_slot_refused)
    env.check(prefix + "databases created while pgrelay runs are captured without a restart", created_while_running)
    env.check(prefix + "DROP DATABASE through pgrelay: let go of first, refused with a slot there, recreated "
              "and captured afresh", drop_and_recreate)
    env.check(prefix + "kill -9 while two databases are written: each slot resumes with nothing lost", kill9)
    env.check(prefix + "status after the restart lists every captured database", status_after_restart)
    env.check(prefix + "a database captured before, then left out: its slots are refused, still listed",
              left_out_after_capture)

    def status_after_leaving_out():
        # What pgrelay refuses as "not captured" status must not list as captured.
        expect(sc.relay is not None and sc.relay.proc.poll() is None, "a running pgrelay")
        expect_status_lists(env, sc.data_dir, [main_db, "app1", "app3", "app4"],
                            "with --capture-database app1,app3 --capture-database app4 (app2 left out)")
    env.check(prefix + "status no longer lists a database left out at the last start", status_after_leaving_out)

    def clean_stop():
        sc.stop()
    env.check(prefix + "SIGTERM stops pgrelay", clean_stop)


# ---- the four pgrelays ----

def upstream_scenario(env, pg, mode):
    """pgrelay serve --upstream, over the PostgreSQL of `pg` (an Env), capturing with `mode`."""
    main_db = "main_" + mode
    for db in (main_db, "app1", "app2"):
        pg.psql_admin("CREATE DATABASE %s" % db, db="postgres")
    base = pg.upstream_url().rsplit("/", 1)[0]
    data_dir = os.path.join(env.base, "data-" + mode)

    def start(extra_args):
        return env.start_relay(data_dir=data_dir, port=free_port(), upstream=base + "/" + main_db,
                               extra_args=extra_args)

    def direct_url(_relay, db):
        return "host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable" % (
            pg.pg_port, SUPERUSER, PASSWORD, db)
    return Scenario(env, "upstream/" + mode, main_db, data_dir, start, direct_url, doctor_url=base + "/" + main_db)


def embedded_scenario(env, mode):
    """The embedded default, `pgrelay --database app1,app2 --capture MODE`, in a directory of its own."""
    cwd = tempfile.mkdtemp(prefix="databases-%s-" % mode, dir=env.base)
    os.chmod(cwd, 0o755)

    def start(extra_args):
        relay = PrivateRelay(env, cwd, free_port(), ["--database", "app1,app2"] + extra_args)
        relay.wait_ready(180)
        return relay

    def direct_url(relay, db):
        # Its PostgreSQL listens only on a private socket, which root may enter.
        settings = {}
        with open(os.path.join(relay.cluster_dir(), "pgrelay.conf")) as f:
            for line in f:
                if "=" in line and not line.startswith("#"):
                    key, value = line.split("=", 1)
                    settings[key.strip()] = value.split("#")[0].strip().strip("'")
        return "host=%s port=%s user=postgres dbname=%s" % (settings["unix_socket_directories"], settings["port"], db)
    return Scenario(env, "embedded/" + mode, "postgres", os.path.join(cwd, "pgrelay-data"), start, direct_url)


def body(env):
    env.start_postgres(LOGICAL_CONF)
    replica = Env(env.pgrelay, env.name + "/replica")  # its pgrelays are env's, only its PostgreSQL is its own
    try:
        replica.start_postgres()  # wal_level = replica
        run_scenario(env, upstream_scenario(env, replica, "trigger"), "trigger")
        run_scenario(env, upstream_scenario(env, env, "native"), "native")
        if os.geteuid() == 0:
            run_scenario(env, embedded_scenario(env, "trigger"), "trigger")
            run_scenario(env, embedded_scenario(env, "native"), "native")
        else:
            env.skip("the embedded default", "reaching its private socket directly needs root")
    finally:
        for relay in env.relays:  # before the replica cluster goes
            relay.kill_if_running()
        replica.cleanup()


if __name__ == "__main__":
    main("databases", body)
