# `pgrelay serve --capture native` against a wal_level=logical upstream, with real clients.
"""pgrelay streams its own upstream slot (pgoutput) into its log; consumers connect to pgrelay.

Checks: pg_recvlogical (changes, logical messages written upstream and through pgrelay, resume),
psycopg2's exported snapshot as a consistent copy point under concurrent writes, tables added
to publications after start, publication changes whose commits a synchronous standby holds
invisible (and an upstream restart meanwhile), pg_recvlogical --endpos on an idle and on a busy
upstream, a table without replica identity in an insert-only publication, --capture auto's
choice and the refusal of a trigger-captured data directory, and a restart.
"""
import os
import re
import select
import signal
import subprocess
import threading
import time

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import PG_BIN, CheckFailed, Env, expect, expect_eq, free_port, lsn_to_int, lsn_to_str, main, wait_until
from pgoutput_decode import Session, decode_message, decode_recvlogical, session_of

LOGICAL_CONF = "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int);
CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2));
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE TABLE ignored (id int PRIMARY KEY, v text);
CREATE PUBLICATION pub_nat FOR TABLE items, accounts;
CREATE TABLE stock (id int PRIMARY KEY, v int NOT NULL);
CREATE PUBLICATION pub_stock FOR TABLE stock;
CREATE TABLE seed (id int PRIMARY KEY);
CREATE PUBLICATION pub_late FOR TABLE seed;
CREATE TABLE nokey (a int, b text);
CREATE PUBLICATION pub_ins FOR TABLE nokey WITH (publish = 'insert');
"""

# Each step: (where, SQL statements of one transaction or None for a rollback marker, expected).
# `where` is "up" (straight to the upstream) or "relay" (a pass-through session through pgrelay).
# `expected` lists what the stream must show for it: transactions as lists of changes; a
# non-transactional message is an entry of its own, before the transaction that emitted it.
WORKLOAD_1 = [
    ("up", ["INSERT INTO items VALUES (1, 'apple', 5), (2, E'it''s a \"pear\"', 7)"],
     [[("I", "public.items", ["1", "apple", "5"]), ("I", "public.items", ["2", "it's a \"pear\"", "7"])]]),
    ("up", ["UPDATE items SET qty = qty + 1 WHERE id = 1", "INSERT INTO accounts VALUES (1, 'ann', 10.50)",
            "INSERT INTO ignored VALUES (1, 'not published')"],
     [[("U", "public.items", None, None, ["1", "apple", "6"]), ("I", "public.accounts", ["1", "ann", "10.50"])]]),
    ("up", ["INSERT INTO ignored VALUES (2, 'only unpublished')"], []),
    ("relay", ["UPDATE accounts SET balance = balance - 0.25 WHERE id = 1", "DELETE FROM items WHERE id = 2"],
     [[("U", "public.accounts", "O", ["1", "ann", "10.50"], ["1", "ann", "10.25"]),
       ("D", "public.items", "K", ["2", None, None])]]),
    ("up", ["TRUNCATE accounts"], [[("T", ["public.accounts"], 0)]]),
    ("up", ["SELECT pg_logical_emit_message(false, 'e2e', 'direct upstream')"], [[("M", "e2e", b"direct upstream")]]),
    ("relay", ["SELECT pg_logical_emit_message(false, 'e2e', 'through pgrelay')"],
     [[("M", "e2e", b"through pgrelay")]]),
    # Mixing both kinds in one transaction: the non-transactional message is decoded at once,
    # so it streams before the transaction that emitted it (which streams at its commit).
    ("relay", ["INSERT INTO items VALUES (3, 'relay txn', 1)",
               "SELECT pg_logical_emit_message(true, 'e2e', 'txn via pgrelay')",
               "SELECT pg_logical_emit_message(false, 'e2e', 'nt in txn via pgrelay')"],
     [[("M", "e2e", b"nt in txn via pgrelay")],
      [("I", "public.items", ["3", "relay txn", "1"]), ("M", "e2e", b"txn via pgrelay")]]),
    ("up", ["INSERT INTO items VALUES (4, 'upstream txn', 2)",
            "SELECT pg_logical_emit_message(false, 'e2e', 'nt in txn upstream')",
            "SELECT pg_logical_emit_message(true, 'e2e', 'txn upstream')",
            "UPDATE items SET id = 40 WHERE id = 4"],
     [[("M", "e2e", b"nt in txn upstream")],
      [("I", "public.items", ["4", "upstream txn", "2"]), ("M", "e2e", b"txn upstream"),
       ("U", "public.items", "K", ["4", None, None], ["40", "upstream txn", "2"])]]),
]
# A rolled-back transaction: its rows never stream, its non-transactional message does.
ROLLBACK_STEP = ("relay", ["INSERT INTO items VALUES (999, 'rolled back', 0)",
                           "SELECT pg_logical_emit_message(false, 'e2e', 'nt in rolled back')"],
                 [[("M", "e2e", b"nt in rolled back")]])

WORKLOAD_2 = [  # written while no consumer streams
    ("up", ["INSERT INTO items VALUES (30, 'after stop', 1)"], [[("I", "public.items", ["30", "after stop", "1"])]]),
    ("relay", ["SELECT pg_logical_emit_message(false, 'e2e', 'while stopped')"], [[("M", "e2e", b"while stopped")]]),
    ("up", ["UPDATE items SET qty = NULL WHERE id = 30", "INSERT INTO accounts VALUES (2, 'bob', -3.00)"],
     [[("U", "public.items", None, None, ["30", "after stop", None]), ("I", "public.accounts", ["2", "bob", "-3.00"])]]),
]
WORKLOAD_3 = [  # written while the resumed consumer streams
    ("up", ["DELETE FROM accounts WHERE id = 2"], [[("D", "public.accounts", "O", ["2", "bob", "-3.00"])]]),
]
WORKLOAD_DOWN = [  # written while pgrelay is stopped
    ("up", ["INSERT INTO items VALUES (50, 'pgrelay down', 5)"], [[("I", "public.items", ["50", "pgrelay down", "5"])]]),
    ("up", ["SELECT pg_logical_emit_message(false, 'e2e', 'pgrelay down')", "DELETE FROM items WHERE id = 30"],
     [[("M", "e2e", b"pgrelay down")], [("D", "public.items", "K", ["30", None, None])]]),
]
WORKLOAD_UP_AGAIN = [  # written after the restart
    ("up", ["INSERT INTO items VALUES (51, 'restarted', 6)"], [[("I", "public.items", ["51", "restarted", "6"])]]),
]


def run_workload(env, relay, workload):
    for where, statements, _ in workload:
        conn = env.direct(autocommit=False) if where == "up" else env.relay_conn(relay)
        try:
            with conn.cursor() as cur:
                for sql in statements:
                    cur.execute(sql)
            conn.commit()
        finally:
            conn.close()


def run_rollback(env, relay, step):
    where, statements, _ = step
    conn = env.direct(autocommit=False) if where == "up" else env.relay_conn(relay)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
        conn.rollback()
    finally:
        conn.close()


def expected_of(workload):
    return [changes for _, _, entries in workload for changes in entries]


def relay_log(relay):
    with open(relay.log_path, "rb") as f:
        return f.read().decode(errors="replace")


def recvlogical(relay, slot, *args):
    return [os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", slot] + list(args)


def create_slot(relay, slot):
    r = subprocess.run(recvlogical(relay, slot, "--create-slot", "-P", "pgoutput"), capture_output=True, text=True,
                       timeout=60)
    expect(r.returncode == 0, "pg_recvlogical --create-slot %s exited %d: %s" % (slot, r.returncode, r.stderr))


class Streamer:
    """One pg_recvlogical --start process writing to its own file."""

    def __init__(self, env, relay, slot, publications, path):
        self.path = path
        self.err_path = path + ".stderr"
        self.err = open(self.err_path, "wb")
        args = recvlogical(relay, slot, "--start", "-o", "proto_version=1", "-o", "publication_names=" + publications,
                           "-o", "messages=true", "-f", path, "-F", "1", "-s", "1", "--no-loop", "-v")
        self.proc = env.spawn(args, stdout=subprocess.DEVNULL, stderr=self.err)

    def messages(self, partial=True):
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        return decode_recvlogical(data, allow_partial=partial)

    def session(self):
        return session_of(self.messages())

    def wait_entries(self, n, timeout=30):
        """Waits for n stream entries (transactions and non-transactional messages); on a timeout
        the caller's comparison shows what did arrive."""
        def enough():
            expect(self.proc.poll() is None, "pg_recvlogical exited early (%r): %s" % (
                self.proc.returncode, self.stderr()))
            return len(self.session().transactions) >= n
        try:
            wait_until(enough, timeout, "%d entries from pg_recvlogical" % n)
        except CheckFailed:
            if self.proc.poll() is not None:
                raise

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "hung"

    def stderr(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode(errors="replace")


def wait_confirmed(env, relay, slot, lsn, what):
    """Waits until pgrelay's slot is confirmed at or past lsn (pg_recvlogical feeds back every second)."""
    seen = {}

    def confirmed():
        rows = env.relay_query(relay, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,))
        seen["rows"] = rows
        return rows and rows[0][0] and lsn_to_int(rows[0][0]) >= lsn
    try:
        wait_until(confirmed, 10, what)
    except Exception:
        expect(False, what, got=seen.get("rows"), expected=">= %s" % lsn_to_str(lsn))


def stream_exactly(env, relay, slot, publications, path, expected, write=None, settle=1.0):
    """Streams the slot, runs write(), and checks the stream is exactly `expected`; stops it.

    Returns the session (its last end LSN confirmed to the slot before stopping).
    """
    s = Streamer(env, relay, slot, publications, path)
    try:
        if write:
            write()
        s.wait_entries(len(expected))
        time.sleep(settle)  # anything extra (a duplicate, a rolled-back row) would arrive now
        session = s.session()
        expect_eq(session.errors, [], "pgoutput ordering rules in the stream of %s" % slot)
        expect_eq(session.changes(), expected, "the stream of slot %s: exactly the expected entries, in order" % slot)
        ends = [t["end_lsn"] for t in session.transactions if "end_lsn" in t]
        commits = [t["commit_lsn"] for t in session.transactions if "commit_lsn" in t]
        expect(all(a < b for a, b in zip(commits, commits[1:])), "commit LSNs strictly increase",
               got=[lsn_to_str(c) for c in commits])
        # The consumer confirms the last thing it received, a non-transactional message after the
        # last commit included: until it has, a resume rightly sends that message again.
        last = max(ends + [t["lsn"] for t in session.transactions if t.get("non_transactional")],
                   default=None)
        if last is not None:
            wait_confirmed(env, relay, slot, last, "slot %s confirmed past the last entry it got" % slot)
    finally:
        code = s.stop()
    expect_eq(code, 0, "pg_recvlogical exit code after SIGINT (stderr: %s)" % s.stderr()[-600:])
    expect_eq(session_of(s.messages(partial=False)).changes(), expected, "nothing more arrived before the stop")
    return session


class Consumer:
    """A psycopg2 replication stream read with read_message()."""

    def __init__(self, url, slot, publications, start_lsn=0):
        self.conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection)
        self.cur = self.conn.cursor()
        self.cur.start_replication(slot_name=slot, decode=False, start_lsn=start_lsn, status_interval=1,
                                   options={"proto_version": "1", "publication_names": publications})
        self.session = Session()

    def pump(self, until, timeout, what):
        deadline = time.monotonic() + timeout
        while not until():
            expect(time.monotonic() < deadline, "timed out after %ss waiting for %s; have %d transactions" % (
                timeout, what, len(self.session.transactions)))
            msg = self.cur.read_message()
            if msg is None:
                select.select([self.cur], [], [], 0.2)
                continue
            decoded = decode_message(msg.payload)
            self.session.feed(decoded)
            if decoded["tag"] == "C":
                self.cur.send_feedback(flush_lsn=msg.data_start)

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


class Writer(threading.Thread):
    """Writes to `stock` upstream without pause: inserts, updates, key changes, deletes."""

    def __init__(self, env):
        super().__init__(daemon=True)
        self.env = env
        self.stop_event = threading.Event()
        self.commits = 0
        self.error = None

    def run(self):
        try:
            conn = self.env.direct(autocommit=False)
            with conn.cursor() as cur:
                i = 0
                while not self.stop_event.is_set():
                    i += 1
                    cur.execute("INSERT INTO stock VALUES (%s, %s)", (i, i))
                    cur.execute("UPDATE stock SET v = v + 1 WHERE id = %s", (i - 3,))
                    if i % 5 == 0:
                        cur.execute("UPDATE stock SET id = id + 1000000 WHERE id = %s", (i - 4,))
                    if i % 3 == 0:
                        cur.execute("DELETE FROM stock WHERE id = %s", (i - 7,))
                    conn.commit()
                    self.commits += 1
                    time.sleep(0.002)
            conn.close()
        except Exception as e:  # reported by the check
            self.error = repr(e)


def apply_change(table, change, problems):
    """Applies one pgoutput change to {id: row}; records a missing or doubled row in problems."""
    kind = change[0]
    if kind == "I":
        key = change[2][0]
        if key in table:
            problems.append("insert of id %s, already present (applied twice?)" % key)
        table[key] = tuple(change[2])
    elif kind == "U":
        _, _, old_kind, old, new = change
        key = old[0] if old_kind else new[0]
        if key not in table:
            problems.append("update of id %s, which the copy plus stream does not have (missed)" % key)
        table.pop(key, None)
        if new[0] in table:
            problems.append("update to id %s, already present" % new[0])
        table[new[0]] = tuple(new)
    elif kind == "D":
        key = change[3][0]
        if key not in table:
            problems.append("delete of id %s, which the copy plus stream does not have" % key)
        table.pop(key, None)
    elif kind == "T":
        table.clear()


def body(env):
    env.start_postgres(LOGICAL_CONF)
    env.psql_admin(SCHEMA)
    data_dir = os.path.join(env.base, "relay-data")
    t0 = time.monotonic()
    hop_trace = os.path.join(env.base, "hop-trace.txt")
    started_us = int(time.time() * 1e6)
    relay = env.start_relay(data_dir=data_dir, extra_args=["--capture", "native", "--hop-trace", hop_trace])
    print("    pgrelay --capture native ready in %.1fs" % (time.monotonic() - t0), flush=True)
    state = {"relay": relay}

    def setup():
        log = relay_log(relay)
        expect("starting native capture" in log, "stderr says native capture started", got=log[-1500:])
        expect("installing trigger capture" not in log, "no trigger capture with --capture native")
        slots = env.direct_query("SELECT slot_name, plugin, slot_type, temporary FROM pg_replication_slots"
                                 " WHERE slot_name LIKE 'pgrelay\\_%%'")
        expect(len(slots) == 1 and re.match(r"^pgrelay_\d+$", slots[0][0]) and slots[0][1:] == ("pgoutput", "logical",
                                                                                                  False),
               "one permanent upstream slot pgrelay_<system id>", got=slots)
        state["upstream_slot"] = slots[0][0]
        pubs = env.direct_query("SELECT pubname, tablename FROM pg_publication_tables"
                                " WHERE pubname LIKE '\\_pgrelay%%' ORDER BY 1, 2")
        expect_eq(pubs, [("_pgrelay_capture", "accounts"), ("_pgrelay_capture", "items"),
                         ("_pgrelay_capture", "seed"), ("_pgrelay_capture", "stock"),
                         ("_pgrelay_capture_keyless", "nokey")],
                  "pgrelay's publications mirror every other publication's tables, split by replica identity")
        triggers = env.direct_query("SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                                    " WHERE c.relname IN ('items', 'accounts', 'stock', 'nokey') AND NOT t.tgisinternal")
        expect_eq(triggers[0][0], 0, "no capture triggers on the published tables")

    def recvlogical_stream():
        create_slot(relay, "nat_slot")

        def write():
            time.sleep(0.5)  # START_REPLICATION is under way; changes are in the slot either way
            run_workload(env, relay, WORKLOAD_1)
            run_rollback(env, relay, ROLLBACK_STEP)
        expected = expected_of(WORKLOAD_1) + ROLLBACK_STEP[2]
        stream_exactly(env, relay, "nat_slot", "pub_nat", os.path.join(env.base, "s1.bin"), expected, write)
        state["streamed"] = True

    def recvlogical_resume():
        expect(state.get("streamed"), "the first stream succeeded")
        run_workload(env, relay, WORKLOAD_2)
        stream_exactly(env, relay, "nat_slot", "pub_nat", os.path.join(env.base, "s2.bin"),
                       expected_of(WORKLOAD_2) + expected_of(WORKLOAD_3),
                       lambda: (time.sleep(0.5), run_workload(env, relay, WORKLOAD_3)))
        state["resumed"] = True

    def snapshot_copy_and_stream():
        writer = Writer(env)
        writer.start()
        try:
            wait_until(lambda: writer.commits >= 50 or writer.error, 20, "the writer's first commits")
            conn = psycopg2.connect(relay.url, connection_factory=LogicalReplicationConnection)
            try:
                cur = conn.cursor()
                cur.create_replication_slot("snap_slot", output_plugin="pgoutput")
                row = cur.fetchone()
                expect(row is not None and row[0] == "snap_slot" and row[2] and row[3] == "pgoutput",
                       "CREATE_REPLICATION_SLOT (slot, consistent point, snapshot, plugin)", got=row)
                consistent_point = lsn_to_int(row[1])
                # The exported snapshot is valid while the replication connection stays idle.
                copy_conn = env.relay_conn(relay)
                with copy_conn.cursor() as c:
                    c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    c.execute("SET TRANSACTION SNAPSHOT %s", (row[2],))
                    c.execute("SELECT id, v FROM stock")
                    copied = {str(i): (str(i), str(v)) for i, v in c.fetchall()}
                    c.execute("COMMIT")
                copy_conn.close()
            finally:
                conn.close()
            commits_at_copy = writer.commits
            wait_until(lambda: writer.commits >= commits_at_copy + 100 or writer.error, 20, "100 more commits")
        finally:
            writer.stop_event.set()
            writer.join(10)
        expect(writer.error is None, "the writer ran without error", got=writer.error)
        expect(len(copied) > 10, "the snapshot copy holds the writer's early rows", got=len(copied))
        env.direct_query("INSERT INTO stock VALUES (-1, -1)")  # the end marker
        final = {str(i): (str(i), str(v)) for i, v in env.direct_query("SELECT id, v FROM stock")}

        c = Consumer(relay.url, "snap_slot", "pub_stock", start_lsn=consistent_point)
        try:
            c.pump(lambda: any(ch[0] == "I" and ch[2][0] == "-1" for t in c.session.transactions
                               for ch in t["changes"]), 60, "the end marker")
        finally:
            c.close()
        expect_eq(c.session.errors, [], "pgoutput ordering rules")
        first = c.session.transactions[0]["commit_lsn"]
        expect(first >= consistent_point, "the first streamed commit is at or after the consistent point",
               got=lsn_to_str(first), expected=">= " + lsn_to_str(consistent_point))
        table, problems = dict(copied), []
        for t in c.session.transactions:
            for ch in t["changes"]:
                apply_change(table, ch, problems)
        expect_eq(problems[:10], [], "applying the stream onto the snapshot copy (first problems)")
        missing = sorted(set(final) - set(table), key=int)[:10]
        extra = sorted(set(table) - set(final), key=int)[:10]
        differ = sorted((k for k in final if k in table and table[k] != final[k]), key=int)[:10]
        expect_eq({"missing": missing, "extra": extra, "differ": differ}, {"missing": [], "extra": [], "differ": []},
                  "snapshot copy + stream == the upstream table (%d rows, %d copied, %d streamed transactions)"
                  % (len(final), len(copied), len(c.session.transactions)))
        expect(len(c.session.transactions) >= 100, "the stream carried the writes made after the snapshot",
               got=len(c.session.transactions))
        print("    snapshot: %d rows copied, %d transactions streamed, %d rows at the end"
              % (len(copied), len(c.session.transactions), len(final)), flush=True)

    # The consumer starts after the DDL (publication_filter_test follows ALTER PUBLICATION in a
    # running stream); the slot exists before it, so the rows written right after the DDL must
    # be in the log, captured through pgrelay's mirrored publications.
    def late_tables():
        create_slot(relay, "late_slot")

        def write():
            up = env.direct()
            with up.cursor() as cur:
                cur.execute("CREATE TABLE late1 (id int PRIMARY KEY, v text)")
                cur.execute("ALTER PUBLICATION pub_late ADD TABLE late1")
                cur.execute("INSERT INTO late1 VALUES (1, 'right away'), (2, 'x')")
                cur.execute("UPDATE late1 SET v = 'y' WHERE id = 2")
            up.close()
            up = env.direct(autocommit=False)
            with up.cursor() as cur:  # created and published in one transaction, written in the next
                cur.execute("CREATE TABLE late2 (k text PRIMARY KEY)")
                cur.execute("ALTER PUBLICATION pub_late ADD TABLE late2")
                up.commit()
                cur.execute("INSERT INTO late2 VALUES ('a')")
                up.commit()
            up.close()
            # Through pgrelay's pass-through too.
            run_workload(env, relay, [("relay", ["CREATE TABLE late3 (id int PRIMARY KEY)",
                                                 "ALTER PUBLICATION pub_late ADD TABLE late3"], None),
                                      ("relay", ["INSERT INTO late3 VALUES (7)"], None)])
        expected = [[("I", "public.late1", ["1", "right away"]), ("I", "public.late1", ["2", "x"])],
                    [("U", "public.late1", None, None, ["2", "y"])],
                    [("I", "public.late2", ["a"])],
                    [("I", "public.late3", ["7"])]]
        write()
        stream_exactly(env, relay, "late_slot", "pub_late", os.path.join(env.base, "s3.bin"), expected)

    # A transaction's commit reaches logical decoding before it becomes visible to other
    # sessions: the committing backend leaves the proc array after its commit record is flushed,
    # and after a synchronous standby confirms it. A stream that re-reads the publications where
    # capture marked their change must read them as that transaction left them. Here a
    # synchronous standby of the test's own (a logical slot it confirms by hand) holds each
    # commit invisible while pgrelay has long captured it.
    def publications_visible_late():
        env.psql_admin("CREATE TABLE vis_a (id int PRIMARY KEY); CREATE TABLE vis_b (id int PRIMARY KEY);"
                       " CREATE TABLE vis_c (id int PRIMARY KEY);"
                       " CREATE PUBLICATION pub_vis FOR TABLE vis_a, vis_c;")
        env.direct_query("SELECT pg_create_logical_replication_slot('vis_standby', 'pgoutput')")
        create_slot(relay, "vis_slot")
        c = Consumer(relay.url, "vis_slot", "pub_vis")
        standby = psycopg2.connect(env.upstream_url() + "?application_name=vis_standby&sslmode=disable",
                                   connection_factory=LogicalReplicationConnection)
        standby_cur = standby.cursor()
        standby_cur.start_replication(slot_name="vis_standby", decode=False, status_interval=3600,
                                      options={"proto_version": "1", "publication_names": "pub_vis"})

        def confirm_standby():  # what the upstream has flushed: the commits waiting for it go on
            lsn = lsn_to_int(env.direct_query("SELECT pg_current_wal_flush_lsn()::text")[0][0])
            standby_cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, reply=True, force=True)
        confirm_standby()  # a standby that never confirmed is no candidate
        env.direct_query("ALTER SYSTEM SET synchronous_standby_names = 'vis_standby'")
        env.direct_query("SELECT pg_reload_conf()")
        writer_done = threading.Event()
        failure, commits = [], []

        def write():
            try:
                up = env.direct(autocommit=False)
                with up.cursor() as cur:
                    # (the test cluster runs with synchronous_commit off)
                    cur.execute("SET application_name = 'vis_writer'; SET synchronous_commit = on")
                    for statements in [["ALTER PUBLICATION pub_vis ADD TABLE vis_b", "INSERT INTO vis_b VALUES (1)"],
                                       ["INSERT INTO vis_b VALUES (2)"],
                                       ["ALTER PUBLICATION pub_vis DROP TABLE vis_a", "INSERT INTO vis_a VALUES (3)"],
                                       # A new table under a published one's name is not published.
                                       ["DROP TABLE vis_c", "CREATE TABLE vis_c (id int PRIMARY KEY)",
                                        "INSERT INTO vis_c VALUES (4)"],
                                       ["INSERT INTO vis_c VALUES (5)", "INSERT INTO vis_b VALUES (6)"]]:
                        for sql in statements:
                            cur.execute(sql)
                        up.commit()
                        commits.append(statements)
                up.close()
            except Exception as e:  # reported by the main thread
                failure.append(e)
            finally:
                writer_done.set()
        try:
            wait_until(lambda: env.direct_query("SELECT sync_state FROM pg_stat_replication"
                                                " WHERE application_name = 'vis_standby'") == [("sync",)], 10,
                       "the test's slot as the synchronous standby")
            writer = threading.Thread(target=write)
            writer.start()
            released = 0
            while not writer_done.is_set():
                waiting = env.direct_query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'vis_writer'"
                                           " AND wait_event = 'SyncRep'")
                if not waiting:
                    time.sleep(0.02)
                    continue
                time.sleep(0.5)  # pgrelay has the commit, the upstream does not show it yet
                confirm_standby()
                released += 1
                wait_until(lambda: writer_done.is_set() or len(commits) == released, 10, "the commit released")
            writer.join(10)
            expect_eq(failure, [], "the writer's transactions")
            expect_eq(released, 5, "each of the five commits waited for the standby")
            # The upstream restarts while the stream waits for a change to become visible: the
            # stream carries on in the same session once it is back (the commit is durable).
            outcome = []

            def held():
                up = env.direct(autocommit=False)
                try:
                    with up.cursor() as cur:
                        cur.execute("SET application_name = 'vis_writer'; SET synchronous_commit = on")
                        cur.execute("ALTER PUBLICATION pub_vis ADD TABLE vis_a")
                        cur.execute("INSERT INTO vis_a VALUES (7)")
                        up.commit()
                    outcome.append("committed")
                except psycopg2.Error as e:  # the shutdown ends the wait and the session
                    outcome.append(type(e).__name__)
            writer = threading.Thread(target=held)
            writer.start()
            wait_until(lambda: env.direct_query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'vis_writer'"
                                                " AND wait_event = 'SyncRep'"), 10, "the last commit held")
            time.sleep(0.5)
            env.direct_query("ALTER SYSTEM RESET synchronous_standby_names")  # read at the start
            standby.close()  # a shutdown waits for every logical walsender's consumer to confirm
            env.restart_postgres()
            writer.join(30)
            expect(outcome and outcome[0] != "committed", "the held commit's session ended with the shutdown",
                   got=outcome)
            env.direct_query("INSERT INTO vis_b VALUES (8)")
            try:
                c.pump(lambda: len(c.session.transactions) >= 5, 40, "the five published transactions")
            except CheckFailed:
                pass  # the comparison below shows what did arrive
            quiet_until = time.monotonic() + 1.5  # anything a stale view let through arrives now
            c.pump(lambda: time.monotonic() > quiet_until, 10, "the stream to settle")
        finally:
            env.direct_query("ALTER SYSTEM RESET synchronous_standby_names")
            env.direct_query("SELECT pg_reload_conf()")
            c.close()
            standby.close()
            wait_until(lambda: env.direct_query("SELECT pg_drop_replication_slot('vis_standby')") is not None, 10,
                       "dropping the test's standby slot")
        expect_eq(c.session.errors, [], "pgoutput ordering rules in the stream of vis_slot")
        expect_eq(c.session.changes(), [[("I", "public.vis_b", ["1"])], [("I", "public.vis_b", ["2"])],
                                        [("I", "public.vis_b", ["6"])], [("I", "public.vis_a", ["7"])],
                                        [("I", "public.vis_b", ["8"])]],
                  "each change sent as the publications stood where it was made, in one session")

    # pg_recvlogical --endpos stops at a keepalive whose position has reached endpos: Postgres's
    # walsender reports the WAL it has decoded, past commits and records no publication needs
    # (a checkpoint's), so an idle stream ends at once. pgrelay reports how far its capture has
    # read the upstream.
    def recvlogical_endpos():
        native_url = env.upstream_url() + "?sslmode=disable"
        native = [os.path.join(PG_BIN, "pg_recvlogical"), "-d", native_url, "--slot", "endpos_native"]
        r = subprocess.run(native + ["--create-slot", "-P", "pgoutput"], capture_output=True, text=True, timeout=60)
        expect(r.returncode == 0, "native --create-slot", got=r.stderr)
        env.psql_admin("CREATE TABLE endpos_t (id int PRIMARY KEY, v text);"
                       " CREATE PUBLICATION pub_endpos FOR TABLE endpos_t;")
        create_slot(relay, "endpos_slot")
        env.direct_query("INSERT INTO endpos_t VALUES (60, 'before endpos')")
        env.direct_query("CHECKPOINT")  # WAL that no transaction wrote
        slots = (("native", native), ("pgrelay", recvlogical(relay, "endpos_slot")))

        def run_to(endpos, when, path=None):
            """Each slot's pg_recvlogical --endpos, its stream written to `path` % its name."""
            ended = {}
            for name, args in slots:
                t = time.monotonic()
                try:
                    out = path % name if path else "/dev/null"
                    r = subprocess.run(args + ["--start", "--endpos", endpos, "-o", "proto_version=1", "-o",
                                               "publication_names=pub_endpos", "-f", out, "-s", "1"],
                                       capture_output=True, text=True, timeout=30)
                except subprocess.TimeoutExpired:
                    expect(False, "%s: pg_recvlogical --endpos %s (%s) still running after 30 s"
                           % (name, endpos, when))
                ended[name] = time.monotonic() - t
                expect_eq(r.returncode, 0, "%s: pg_recvlogical --endpos (%s) exit code (stderr: %s)"
                          % (name, when, r.stderr[-400:]))
            print("    --endpos %s: native ended in %.2fs, pgrelay in %.2fs"
                  % (when, ended["native"], ended["pgrelay"]), flush=True)
        endpos = env.direct_query("SELECT pg_current_wal_lsn()::text")[0][0]
        run_to(endpos, "past a checkpoint", os.path.join(env.base, "endpos-%s.bin"))
        for name, _ in slots:
            with open(os.path.join(env.base, "endpos-%s.bin" % name), "rb") as f:
                got = session_of(decode_recvlogical(f.read())).changes()
            expect_eq(got, [[("I", "public.endpos_t", ["60", "before endpos"])]],
                      "%s: the stream up to endpos" % name)
        # Again while a table no publication has is written without a pause: the upstream's
        # walsender then never falls quiet, and keeps reporting its position.
        busy = threading.Event()

        def write_unpublished():
            up = env.direct()
            with up.cursor() as cur:
                n = 0
                while not busy.is_set():
                    n += 1
                    cur.execute("INSERT INTO ignored VALUES (%s, 'busy') ON CONFLICT (id) DO NOTHING",
                                (100000 + n,))
                    time.sleep(0.002)
            up.close()
        writer = threading.Thread(target=write_unpublished)
        writer.start()
        try:
            time.sleep(0.5)
            run_to(env.direct_query("SELECT pg_current_wal_lsn()::text")[0][0], "while unpublished writes go on")
        finally:
            busy.set()
            writer.join(10)
        env.direct_query("SELECT pg_drop_replication_slot('endpos_native')")

    def keyless_table():
        create_slot(relay, "ins_slot")
        counts = {}

        def write():
            up = env.direct(autocommit=False)
            with up.cursor() as cur:
                cur.execute("INSERT INTO nokey VALUES (1, 'x'), (2, 'z')")
                up.commit()
                cur.execute("UPDATE nokey SET b = 'y' WHERE a = 1")
                counts["update"] = cur.rowcount
                up.commit()
                cur.execute("DELETE FROM nokey WHERE a = 2")
                counts["delete"] = cur.rowcount
                up.commit()
                cur.execute("INSERT INTO nokey VALUES (3, 'w')")
                up.commit()
                # A keyless table published after start: writers may update it at once too.
                cur.execute("CREATE TABLE nokey2 (a int)")
                cur.execute("ALTER PUBLICATION pub_ins ADD TABLE nokey2")
                up.commit()
                cur.execute("INSERT INTO nokey2 VALUES (10)")
                cur.execute("UPDATE nokey2 SET a = 11")
                counts["update2"] = cur.rowcount
                up.commit()
            up.close()
            # Through pgrelay's pass-through as well.
            rc = env.relay_conn(relay)
            with rc.cursor() as cur:
                cur.execute("UPDATE nokey SET b = 'via relay' WHERE a = 3")
                counts["update_relay"] = cur.rowcount
            rc.commit()
            rc.close()
        expected = [[("I", "public.nokey", ["1", "x"]), ("I", "public.nokey", ["2", "z"])],
                    [("I", "public.nokey", ["3", "w"])],
                    [("I", "public.nokey2", ["10"])]]
        write()
        stream_exactly(env, relay, "ins_slot", "pub_ins", os.path.join(env.base, "s4.bin"), expected)
        expect_eq(counts, {"update": 1, "delete": 1, "update2": 1, "update_relay": 1},
                  "UPDATE/DELETE on keyless tables succeed upstream")
        expect_eq(env.direct_query("SELECT a, b FROM nokey ORDER BY a"), [(1, "y"), (3, "via relay")],
                  "the keyless table upstream")
        pubs = env.direct_query("SELECT pubname FROM pg_publication_tables WHERE tablename = 'nokey2'"
                                " ORDER BY 1")
        expect_eq(pubs, [("_pgrelay_capture_keyless",), ("pub_ins",)], "nokey2 in the keyless capture publication")

    def restart():
        expect(state.get("resumed"), "the pg_recvlogical stream and resume succeeded")
        old = state["relay"]
        code, took = old.stop(signal.SIGTERM)
        expect_eq(code, 0, "pgrelay exit code after SIGTERM")
        print("    pgrelay stopped in %.1fs" % took, flush=True)
        run_workload(env, None, WORKLOAD_DOWN)
        t = time.monotonic()
        new = env.start_relay(data_dir=data_dir, extra_args=["--capture", "native"])
        state["relay"] = new
        print("    pgrelay restarted in %.1fs" % (time.monotonic() - t), flush=True)
        expect("starting native capture" in relay_log(new), "the restarted pgrelay streams natively")
        slots = env.direct_query("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'pgrelay\\_%%'")
        expect_eq(slots, [(state["upstream_slot"],)], "the restart reuses the same upstream slot")
        stream_exactly(env, new, "nat_slot", "pub_nat", os.path.join(env.base, "s6.bin"),
                       expected_of(WORKLOAD_DOWN) + expected_of(WORKLOAD_UP_AGAIN),
                       lambda: (time.sleep(0.5), run_workload(env, new, WORKLOAD_UP_AGAIN)))
        state["restarted"] = True

    def hop_trace_written():
        # The first pgrelay ran with --hop-trace and stopped with SIGTERM in restart().
        expect(state.get("restarted"), "the first pgrelay stopped cleanly")
        stopped_us = int(time.time() * 1e6)
        with open(hop_trace) as f:
            lines = f.read().splitlines()
        expect_eq(lines[-1:], ["# dropped 0"], "the trace's last line: nothing dropped")
        stamps = {}
        for line in lines[:-1]:
            hop, lsn, t, session = line.split()
            hi, lo = lsn.split("/")
            stamps.setdefault(hop, []).append(((int(hi, 16) << 32) | int(lo, 16), int(t), int(session)))
        print("    hop trace: %s" % ", ".join("%s %d" % (h, len(r)) for h, r in sorted(stamps.items())), flush=True)
        expect_eq(sorted(stamps), sorted(["upstream_send", "capture_receipt", "append_visible", "durable",
                                           "walsender_read", "socket_write"]), "every hop was stamped")
        for hop, rows in stamps.items():
            expect(all(started_us - 60e6 <= t <= stopped_us for _, t, _ in rows),
                   "%s stamps are times of this run" % hop, got=rows[:3])
            expect(all((s != 0) == (hop in ("walsender_read", "socket_write")) for _, _, s in rows),
                   "%s stamps carry a walsender pid exactly when they are a walsender's" % hop, got=rows[:3])
        # Each commit: sent upstream, then received, then shown in the log, then read by a walsender.
        sent = {lsn: t for lsn, t, _ in stamps["upstream_send"]}
        received = {lsn: t for lsn, t, _ in stamps["capture_receipt"]}
        expect_eq(sorted(sent), sorted(received), "each commit's send and receipt are stamped together")
        expect(all(sent[lsn] <= received[lsn] + 2000 for lsn in sent),
               "the upstream sent each commit before capture received it (2 ms of clock slack)")
        visible = sorted(stamps["append_visible"])
        late = [lsn for lsn, t in received.items()
                if not any(v >= lsn and vt >= t for v, vt, _ in visible)]
        expect_eq(late, [], "every received commit was shown in the log at or after its receipt")
        read = [lsn for lsn, _, _ in stamps["walsender_read"]]
        expect(set(received) & set(read), "walsenders read commits capture received", got=read[:5])
        durable_to = max(lsn for lsn, _, _ in stamps["durable"])
        expect(durable_to >= max(received), "an fdatasync covered every received commit by the stop",
               got=(durable_to, max(received)))
        res = subprocess.run([env.pgrelay, "serve", "--upstream", env.upstream_url(), "--listen",
                              "127.0.0.1:%d" % free_port(), "--data-dir", os.path.join(env.base, "relay-unused"),
                              "--capture", "native", "--hop-trace", os.path.join(env.base, "no", "such", "t.txt")],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        expect(res.returncode != 0 and "pgrelay ready" not in res.stdout,
               "a --hop-trace in a missing directory is refused at start", got=(res.returncode, res.stderr[-600:]))
        print("    --hop-trace in a missing directory: exit %d, %s" % (res.returncode, res.stderr.strip()[-300:]),
              flush=True)
        expect("could not create the hop trace" in res.stderr and "--hop-trace" in res.stderr,
               "the error names the trace file and the option", got=res.stderr[-600:])

    def auto_on_logical():
        r = env.start_relay(data_dir=os.path.join(env.base, "relay-auto"), extra_args=["--capture", "auto"])
        try:
            log = relay_log(r)
            expect("starting native capture" in log and "installing trigger capture" not in log,
                   "--capture auto against wal_level=logical chooses native", got=log[-1500:])
        finally:
            code, _ = r.stop(signal.SIGTERM)
        expect_eq(code, 0, "pgrelay (auto) exit code after SIGTERM")
        # Its slot would hold upstream WAL forever: drop it.
        other = [s for (s,) in env.direct_query("SELECT slot_name FROM pg_replication_slots"
                                                 " WHERE slot_name LIKE 'pgrelay\\_%%'")
                 if s != state.get("upstream_slot")]
        expect(len(other) == 1, "the auto-mode pgrelay created its own upstream slot", got=other)
        wait_until(lambda: env.direct_query("SELECT pg_drop_replication_slot(%s)", (other[0],)) is not None, 10,
                   "dropping the auto-mode slot")

    def auto_on_replica_and_refusal():
        env2 = Env(env.pgrelay, env.name + "/replica")
        try:
            env2.start_postgres()  # wal_level = replica
            env2.psql_admin("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;")
            trig_dir = os.path.join(env2.base, "relay-data")
            r = env2.start_relay(data_dir=trig_dir, extra_args=["--capture", "auto"])
            log = relay_log(r)
            expect("installing trigger capture" in log and "starting native capture" not in log,
                   "--capture auto against wal_level=replica chooses trigger", got=log[-1500:])
            # Put a transaction in the trigger-captured log.
            conn = psycopg2.connect(r.url, connection_factory=LogicalReplicationConnection)
            conn.cursor().create_replication_slot("t_slot", output_plugin="pgoutput")
            conn.close()
            env2.direct_query("INSERT INTO t VALUES (1)")
            c = Consumer(r.url, "t_slot", "p")
            try:
                c.pump(lambda: len(c.session.transactions) >= 1, 30, "the trigger-captured insert")
            finally:
                c.close()
            expect_eq(c.session.changes(), [[("I", "public.t", ["1"])]], "trigger capture streamed the insert")
            code, _ = r.stop(signal.SIGTERM)
            expect_eq(code, 0, "pgrelay (trigger) exit code after SIGTERM")
            res = subprocess.run([env.pgrelay, "serve", "--upstream", env2.upstream_url(), "--listen",
                                  "127.0.0.1:%d" % free_port(), "--data-dir", trig_dir, "--capture", "native"],
                                 capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            print("    --capture native on a trigger data dir: exit %d, stderr: %s"
                  % (res.returncode, res.stderr.strip()[-400:]), flush=True)
            expect(res.returncode != 0, "pgrelay --capture native on a trigger-captured data dir exits non-zero",
                   got=(res.returncode, res.stdout, res.stderr[-800:]))
            expect("pgrelay ready" not in res.stdout, "no ready line", got=res.stdout)
            expect("captured with triggers" in res.stderr,
                   "stderr says the data directory's log was captured with triggers", got=res.stderr[-800:])
        finally:
            env2.cleanup()

    env.check("native capture set up: upstream slot, mirrored publications, no triggers", setup)
    env.check("pg_recvlogical: changes and logical messages (upstream and pass-through) in order", recvlogical_stream)
    env.check("pg_recvlogical resume: no loss, no duplicate", recvlogical_resume)
    env.check("psycopg2 exported snapshot + stream under concurrent writes == upstream table",
              snapshot_copy_and_stream)
    env.check("tables created and published after start stream at once", late_tables)
    env.check("publication changes that become visible after their WAL (a synchronous standby), an upstream"
              " restart meanwhile",
              publications_visible_late)
    env.check("pg_recvlogical --endpos at the upstream's WAL position ends on an idle stream, as Postgres's",
              recvlogical_endpos)
    env.check("keyless table in an insert-only publication: writers unaffected, inserts stream", keyless_table)
    env.check("restart (SIGTERM): streaming resumes, nothing lost or repeated", restart)
    env.check("--hop-trace: every hop of the run stamped in order, written at SIGTERM; a bad path refused",
              hop_trace_written)
    env.check("--capture auto on wal_level=logical chooses native", auto_on_logical)
    env.check("--capture auto on wal_level=replica chooses trigger; --capture native then refused",
              auto_on_replica_and_refusal)


if __name__ == "__main__":
    main("native_capture", body)
