# `pgrelay recv` against a native PostgreSQL 15 slot and against `pgrelay serve`: identical JSON, exact resume.
import base64
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

from e2e_support import DBNAME, Env, expect, expect_eq, lsn_to_int, main, wait_until
from pgoutput_decode import decode_message

PUB = "pub_recv"
NATIVE_SLOT = "recv_native"
RELAY_SLOT = "recv_relay"

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int, note text);
CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2));
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE keyless (a int, b text);
CREATE TABLE kinds (id int PRIMARY KEY, ts timestamptz, flag bool, doc jsonb, tags text[],
                    amount numeric, raw bytea, f float8, d date, iv interval);
CREATE TABLE series (id int PRIMARY KEY, batch int NOT NULL);
CREATE TABLE ignored (id int PRIMARY KEY, v text);
CREATE PUBLICATION pub_recv FOR TABLE items, accounts, docs, keyless, kinds, series;
-- The native slot gets its logical messages from these: created here, straight on the
-- upstream, their bodies are not rewritten by pgrelay, whose own pg_logical_emit_message
-- (what a client of pgrelay calls) feeds pgrelay's capture instead of the WAL.
CREATE FUNCTION native_emit(transactional bool, prefix text, content text) RETURNS pg_lsn
  LANGUAGE sql AS 'SELECT pg_catalog.pg_logical_emit_message($1, $2, $3)';
CREATE FUNCTION native_emit(transactional bool, prefix text, content bytea) RETURNS pg_lsn
  LANGUAGE sql AS 'SELECT pg_catalog.pg_logical_emit_message($1, $2, $3)';
"""

BIG = "".join("%04d-lorem-ipsum-" % i for i in range(400))  # 6.4 kB, stored out of line

# One entry per upstream transaction: its SQL (run through pgrelay) and the JSON lines
# (without lsn, xid, commit_time) it must produce; [] for a transaction that must not appear.
WORKLOAD = [
    ("INSERT INTO items VALUES (1, 'apple', 5, NULL), (2, E'it''s a \"pear\"\\nline 2\\ttab', 7,"
     " 'ü€😀'), (3, 'cherry', 0, '')",
     [{"op": "insert", "schema": "public", "table": "items", "key": {"id": "1"}, "old": None,
       "new": {"id": "1", "name": "apple", "qty": "5", "note": None}},
      {"op": "insert", "schema": "public", "table": "items", "key": {"id": "2"}, "old": None,
       "new": {"id": "2", "name": "it's a \"pear\"\nline 2\ttab", "qty": "7", "note": "ü€😀"}},
      {"op": "insert", "schema": "public", "table": "items", "key": {"id": "3"}, "old": None,
       "new": {"id": "3", "name": "cherry", "qty": "0", "note": ""}}]),
    # Several statements, an unpublished table, a keyless table, and a transactional message.
    ("UPDATE items SET qty = qty + 1 WHERE id = 1; INSERT INTO accounts VALUES (1, 'ann', 10.50);"
     " INSERT INTO ignored VALUES (1, 'not published'); INSERT INTO keyless VALUES (7, NULL);"
     " SELECT pg_logical_emit_message(true, 'e2e', 'in txn'), native_emit(true, 'e2e', 'in txn');"
     " INSERT INTO items VALUES (4, 'date', 1, 'd')",
     [{"op": "update", "schema": "public", "table": "items", "key": {"id": "1"}, "old": None,
       "new": {"id": "1", "name": "apple", "qty": "6", "note": None}},
      {"op": "insert", "schema": "public", "table": "accounts",
       "key": {"id": "1", "owner": "ann", "balance": "10.50"}, "old": None,
       "new": {"id": "1", "owner": "ann", "balance": "10.50"}},
      {"op": "insert", "schema": "public", "table": "keyless", "key": None, "old": None,
       "new": {"a": "7", "b": None}},
      {"op": "message", "transactional": True, "prefix": "e2e", "content": "in txn",
       "content_encoding": "utf8"},
      {"op": "insert", "schema": "public", "table": "items", "key": {"id": "4"}, "old": None,
       "new": {"id": "4", "name": "date", "qty": "1", "note": "d"}}]),
    ("INSERT INTO ignored VALUES (2, 'only unpublished')", []),
    ("UPDATE accounts SET balance = balance - 0.25 WHERE id = 1; DELETE FROM items WHERE id = 3",
     [{"op": "update", "schema": "public", "table": "accounts",
       "key": {"id": "1", "owner": "ann", "balance": "10.50"},
       "old": {"id": "1", "owner": "ann", "balance": "10.50"},
       "new": {"id": "1", "owner": "ann", "balance": "10.25"}},
      {"op": "delete", "schema": "public", "table": "items", "key": {"id": "3"}, "old": None,
       "new": None}]),
    ("UPDATE items SET id = 20 WHERE id = 2",
     [{"op": "update", "schema": "public", "table": "items", "key": {"id": "2"}, "old": None,
       "new": {"id": "20", "name": "it's a \"pear\"\nline 2\ttab", "qty": "7", "note": "ü€😀"}}]),
    ("INSERT INTO docs VALUES (1, 'doc', '%s')" % BIG,
     [{"op": "insert", "schema": "public", "table": "docs", "key": {"id": "1"}, "old": None,
       "new": {"id": "1", "title": "doc", "body": BIG}}]),
    ("UPDATE docs SET title = 'doc v2' WHERE id = 1",
     [{"op": "update", "schema": "public", "table": "docs", "key": {"id": "1"}, "old": None,
       "new": {"id": "1", "title": "doc v2", "body": {"unchanged_toast": True}}}]),
    ("INSERT INTO kinds VALUES (1, '2024-02-29 13:14:15.123456+00', true, '{\"b\": [1, 2], \"a\": null}',"
     " ARRAY['x', 'y z', NULL], 12345.6789, '\\x00ff'::bytea, 0.1, '2024-01-02', '1 day 02:03:04')",
     [{"op": "insert", "schema": "public", "table": "kinds", "key": {"id": "1"}, "old": None,
       "new": {"id": "1", "ts": "2024-02-29 13:14:15.123456+00", "flag": "t", "doc": "{\"a\": null, \"b\": [1, 2]}",
               "tags": "{x,\"y z\",NULL}", "amount": "12345.6789", "raw": "\\x00ff", "f": "0.1",
               "d": "2024-01-02", "iv": "1 day 02:03:04"}}]),
    ("TRUNCATE accounts",
     [{"op": "truncate", "schema": "public", "table": "accounts", "key": None, "old": None,
       "new": None, "cascade": False, "restart_identity": False}]),
    ("INSERT INTO accounts VALUES (2, 'bob', -3.00); DELETE FROM accounts WHERE id = 2",
     [{"op": "insert", "schema": "public", "table": "accounts",
       "key": {"id": "2", "owner": "bob", "balance": "-3.00"}, "old": None,
       "new": {"id": "2", "owner": "bob", "balance": "-3.00"}},
      {"op": "delete", "schema": "public", "table": "accounts",
       "key": {"id": "2", "owner": "bob", "balance": "-3.00"},
       "old": {"id": "2", "owner": "bob", "balance": "-3.00"}, "new": None}]),
    ("SELECT pg_logical_emit_message(true, 'bin', '\\xff00fe'::bytea),"
     " native_emit(true, 'bin', '\\xff00fe'::bytea)",
     [{"op": "message", "transactional": True, "prefix": "bin",
       "content": base64.b64encode(b"\xff\x00\xfe").decode(), "content_encoding": "base64"}]),
    ("UPDATE items SET note = NULL WHERE id = 20; DELETE FROM items WHERE id = 1",
     [{"op": "update", "schema": "public", "table": "items", "key": {"id": "20"}, "old": None,
       "new": {"id": "20", "name": "it's a \"pear\"\nline 2\ttab", "qty": "7", "note": None}},
      {"op": "delete", "schema": "public", "table": "items", "key": {"id": "1"}, "old": None,
       "new": None}]),
]

# Sent in autocommit after WORKLOAD: a non-transactional message (no xid, no commit_time).
OUTSIDE_SQL = ("SELECT pg_logical_emit_message(false, 'e2e', 'outside'),"
               " native_emit(false, 'e2e', 'outside')")
OUTSIDE_LINE = {"op": "message", "transactional": False, "prefix": "e2e", "content": "outside",
                "content_encoding": "utf8"}

TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
LSN_RE = re.compile(r"^[0-9A-F]{1,8}/[0-9A-F]{1,8}$")


class Recv:
    """One `pgrelay recv` process appending JSON (or pgoutput) to its own file."""

    def __init__(self, env, url, slot, path, extra=()):
        self.path = path
        self.err_path = path + ".stderr"
        self.err = open(self.err_path, "ab")
        self.err_offset = self.err.tell()  # stderr() is this run's only
        self.start_offset = os.path.getsize(path) if os.path.exists(path) else 0
        args = [env.pgrelay, "recv", "--slot", slot, "--publication", PUB, "--file", path,
                "--status-interval", "1", "-v"] + list(extra) + [url]
        self.proc = env.spawn(args, stdout=subprocess.DEVNULL, stderr=self.err,
                              stdin=subprocess.DEVNULL)

    def data(self):
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def lines(self):
        """The complete JSON lines in the file (all runs that appended to it)."""
        data = self.data()
        end = data.rfind(b"\n") + 1
        return [json.loads(l) for l in data[:end].decode("utf-8").splitlines()]

    def stderr(self):
        with open(self.err_path, "rb") as f:
            f.seek(self.err_offset)
            return f.read().decode(errors="replace")

    def wait_stderr(self, text, timeout=30):
        def seen():
            expect(self.proc.poll() is None or text in self.stderr(),
                   "pgrelay recv exited early (%r):\n%s" % (self.proc.returncode, self.stderr()))
            return text in self.stderr()
        wait_until(seen, timeout, "%r from pgrelay recv" % text)

    def wait_lines(self, predicate, timeout, what):
        def ok():
            expect(self.proc.poll() is None,
                   "pgrelay recv exited early (%r):\n%s" % (self.proc.returncode, self.stderr()))
            return predicate(self.lines())
        wait_until(ok, timeout, what)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "hung"


def strip(line, keep_xid=True):
    out = {k: v for k, v in line.items() if k not in ("lsn", "commit_time")}
    if not keep_xid:
        out.pop("xid", None)
    return out


def transactions(lines):
    """Groups lines into units: consecutive lines of one xid; a non-transactional message alone."""
    units = []
    for line in lines:
        if "xid" in line and units and units[-1][0].get("xid") == line["xid"]:
            units[-1].append(line)
        else:
            units.append([line])
    return units


def run_sql(conn, statements):
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
            conn.commit()


def slot_confirmed(env, relay, slot):
    q = "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = %s"
    rows = (env.relay_query(relay, q, (slot,)) if relay is not None
            else env.direct_query(q, (slot,)))
    return rows[0] if rows else None


def body(env):
    env.start_postgres(extra_conf="wal_level = logical\nmax_replication_slots = 10\n"
                                  "max_wal_senders = 10\ntimezone = 'UTC'")
    env.psql_admin(SCHEMA)
    relay = env.start_relay()
    native_url = env.upstream_url()
    base = env.base
    state = {}

    def path(name):
        return os.path.join(base, name)

    sides = {"native": (native_url, NATIVE_SLOT, None), "pgrelay": (None, RELAY_SLOT, relay)}

    def url_of(side):
        return sides[side][0] or relay.url

    def create_and_compare():
        recvs = {}
        for side in ("native", "pgrelay"):
            recvs[side] = Recv(env, url_of(side), sides[side][1], path(side + "-1.jsonl"),
                               extra=("--create-slot",))
        for side, r in recvs.items():
            r.wait_stderr("created replication slot")
            r.wait_stderr("streaming initiated")
        state["recvs1"] = recvs

        conn = env.relay_conn(relay)
        run_sql(conn, [sql for sql, _ in WORKLOAD])
        with conn.cursor() as cur:  # a rolled-back transaction never reaches a stream
            cur.execute("INSERT INTO items VALUES (999, 'rolled back', 0, NULL)")
            cur.execute("SELECT pg_logical_emit_message(true, 'e2e', 'rolled back'),"
                        " native_emit(true, 'e2e', 'rolled back')")
            conn.rollback()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(OUTSIDE_SQL)
        conn.close()

        expected = [lines for _, lines in WORKLOAD if lines] + [[OUTSIDE_LINE]]
        count = sum(len(t) for t in expected)
        for r in recvs.values():
            r.wait_lines(lambda ls: len(ls) >= count, 60, "%d JSON lines" % count)
        time.sleep(1.5)  # a duplicate or the rolled-back transaction would arrive now
        got = {side: r.lines() for side, r in recvs.items()}
        state["phase1"] = got

        for side, lines in got.items():
            for line in lines:
                expect(LSN_RE.match(line.get("lsn", "")), "%s: lsn of every line" % side, got=line)
                if line.get("transactional") is False:
                    expect("xid" not in line and "commit_time" not in line,
                           "%s: a non-transactional message has no xid or commit_time" % side,
                           got=line)
                else:
                    expect(isinstance(line.get("xid"), int) and TIME_RE.match(line.get("commit_time", "")),
                           "%s: xid and commit_time of every change" % side, got=line)
            lsns = [lsn_to_int(l["lsn"]) for l in lines]
            expect(all(a <= b for a, b in zip(lsns, lsns[1:])), "%s: lsn never goes back" % side,
                   got=[l["lsn"] for l in lines])
            units = transactions(lines)
            expect_eq([[strip(l, keep_xid=False) for l in u] for u in units], expected,
                      "%s: JSON lines of the workload, transaction by transaction" % side)
            xids = [u[0]["xid"] for u in units if "xid" in u[0]]
            expect_eq(len(set(xids)), len(xids), "%s: one xid per transaction" % side)

        expect_eq([strip(l) for l in got["pgrelay"]], [strip(l) for l in got["native"]],
                  "pgrelay recv output against pgrelay equals that against the native slot "
                  "(everything but lsn and commit_time, xid included)")

    def stop_and_confirm():
        recvs = state.get("recvs1")
        expect(recvs and "phase1" in state, "the first stream ran")
        for side, r in recvs.items():
            code = r.stop(signal.SIGTERM)
            expect_eq(code, 0, "%s: pgrelay recv exit status after SIGTERM (stderr:\n%s)"
                      % (side, r.stderr()[-1500:]))
            expect_eq(r.lines(), state["phase1"][side], "%s: nothing more written on stop" % side)
            last = max(lsn_to_int(l["lsn"]) for l in r.lines())
            row = wait_until(lambda: slot_confirmed(env, sides[side][2], sides[side][1]), 10,
                             "the slot row")
            # The final feedback confirmed at least the last written change, and the slot is free.
            def confirmed():
                row = slot_confirmed(env, sides[side][2], sides[side][1])
                state["row_" + side] = row
                return row and row[0] and lsn_to_int(row[0]) >= last and row[1] is False
            try:
                wait_until(confirmed, 10, "confirmed_flush_lsn past the last line")
            except Exception:
                expect(False, "%s: slot position after SIGTERM" % side, got=state.get("row_" + side),
                       expected="confirmed_flush_lsn >= %X/%X, active false" % (last >> 32, last & 0xFFFFFFFF))
            expect(row is not None, "%s: slot exists" % side)
        state["stopped"] = True

    def resume_mid_stream():
        expect(state.get("stopped"), "the first stream stopped cleanly")
        batches, per_batch = 80, 5
        done = threading.Event()
        errors = []

        def writer():
            try:
                conn = env.direct(autocommit=False)
                with conn.cursor() as cur:
                    for b in range(batches):
                        cur.execute("INSERT INTO series SELECT g, %s FROM generate_series(%s, %s) g",
                                    (b, b * per_batch, b * per_batch + per_batch - 1))
                        conn.commit()
                        time.sleep(0.05)
                conn.close()
            except Exception as e:  # reported by the check below
                errors.append(repr(e))
            done.set()

        t = threading.Thread(target=writer)
        t.start()
        first = {side: Recv(env, url_of(side), sides[side][1], path(side + "-2.jsonl"))
                 for side in sides}
        try:
            for side, r in first.items():
                r.wait_lines(lambda ls: len(ls) >= 100, 60, "%s: 100 lines before the stop" % side)
            codes = {side: r.stop(signal.SIGTERM) for side, r in first.items()}
        finally:
            t.join(120)
        expect(not errors, "the writer ran", got=errors)
        for side, code in codes.items():
            expect_eq(code, 0, "%s: exit status of the recv stopped mid-stream" % side)
        stopped_at = {side: len(r.lines()) for side, r in first.items()}
        second = {side: Recv(env, url_of(side), sides[side][1], path(side + "-2.jsonl"))
                  for side in sides}
        total = batches * per_batch
        for side, r in second.items():
            r.wait_lines(lambda ls: len(ls) >= total, 90, "%s: all %d series rows" % (side, total))
        time.sleep(1.5)
        for side, r in second.items():
            expect_eq(r.stop(signal.SIGTERM), 0, "%s: exit status of the resumed recv" % side)
        for side, r in second.items():
            lines = r.lines()
            expect(stopped_at[side] < total, "%s: the first recv stopped mid-stream" % side,
                   got=stopped_at[side], expected="< %d" % total)
            expect_eq([l for l in lines if l.get("table") != "series"], [],
                      "%s: nothing from before the first stop came again" % side)
            ids = [int(l["new"]["id"]) for l in lines]
            expect_eq(summary(ids), summary(list(range(total))),
                      "%s: series rows over the stop and restart: none lost, none repeated" % side)
            units = transactions(lines)
            expect_eq([len(u) for u in units], [per_batch] * batches,
                      "%s: every transaction whole, exactly once" % side)
            state["resume_" + side] = lines
        expect_eq([strip(l) for l in state["resume_pgrelay"]], [strip(l) for l in state["resume_native"]],
                  "resumed streams: pgrelay equals native")
        print("    (first recv stopped after %s lines)" % stopped_at, flush=True)

    def signal_inside_large_transaction():
        expect("resume_native" in state, "the resume check ran")
        rows = 10000
        # The signal must arrive while recv is inside the transaction: recv is stopped
        # (SIGSTOP) until its socket holds part of the transaction, then signalled and resumed;
        # it takes the signal after the messages that had arrived, i.e. after the Begin.
        cases = [("one signal: the transaction is completed", (signal.SIGTERM,), 100000),
                 ("two signals: the transaction is abandoned", (signal.SIGTERM, signal.SIGINT), 200000)]
        for what, signals, first_id in cases:
            env.direct_query("INSERT INTO series SELECT g, -1 FROM generate_series(%d, %d) g"
                             % (first_id, first_id + rows - 1))
            for side in sides:
                name = "%s-%d.jsonl" % (side, first_id)
                r = Recv(env, url_of(side), sides[side][1], path(name))
                r.wait_stderr("streaming initiated")
                r.proc.send_signal(signal.SIGSTOP)
                try:
                    # A part of the transaction, well past its Begin: not 64 KiB, which a
                    # receive buffer not yet grown (the reader is stopped) may never hold.
                    wait_until(lambda: rx_queue(r.proc.pid) >= 16384, 90,
                               "%s: the server to start sending the transaction" % side)
                    for sig in signals:
                        r.proc.send_signal(sig)
                finally:
                    r.proc.send_signal(signal.SIGCONT)
                code = wait_exit(r, 90)
                expect_eq(code, 0, "%s, %s: exit status (stderr:\n%s)" % (what, side, r.stderr()[-800:]))
                n = len(r.lines())
                if len(signals) == 1:
                    expect("finishing the current transaction" in r.stderr(),
                           "%s, %s: the signal arrived inside the transaction" % (what, side), got=r.stderr())
                    expect_eq(n, rows, "%s, %s: lines written before the exit" % (what, side))
                else:
                    expect_eq(n, 0, "%s, %s: lines written before the exit (none of a half transaction)"
                              % (what, side))
                r2 = Recv(env, url_of(side), sides[side][1], path(name))
                r2.wait_stderr("streaming initiated")
                if n < rows:
                    r2.wait_lines(lambda ls: len(ls) >= rows, 90, "%s: the large transaction" % side)
                time.sleep(1.0)
                expect_eq(r2.stop(signal.SIGTERM), 0, "%s: exit status of the next recv" % side)
                ids = [int(l["new"]["id"]) for l in r2.lines()]
                expect_eq(summary(ids), summary(list(range(first_id, first_id + rows))),
                          "%s, %s: after the restart, the transaction exactly once" % (what, side))

    def endpos_and_pgoutput_format():
        expect("resume_native" in state, "the resume check ran")
        conn = env.relay_conn(relay)
        run_sql(conn, ["INSERT INTO items VALUES (50, 'A', 1, NULL)"])
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")  # pgrelay's own, through its URL
            endpos = {"pgrelay": cur.fetchone()[0]}
        conn.commit()
        # The native slot's own WAL position. Not pg_current_wal_lsn(): with the test cluster's
        # synchronous_commit = off that is the write pointer, which may still be short of row
        # 50's commit, and then --endpos is rightly reached before row 50.
        endpos["native"] = env.direct_query("SELECT pg_current_wal_insert_lsn()::text")[0][0]
        run_sql(conn, ["INSERT INTO items VALUES (51, 'B', 1, NULL)",
                       "INSERT INTO items VALUES (52, 'C', 1, NULL)"])
        conn.close()
        ids = {}
        for side in sides:
            # sslmode as libpq has it: pgrelay answers with TLS, the native server has none.
            url = url_of(side) + ("?sslmode=require" if side == "pgrelay" else "?sslmode=disable")
            r = Recv(env, url, sides[side][1], path(side + "-4.jsonl"), extra=("--endpos", endpos[side]))
            try:
                code = r.proc.wait(60)
            except subprocess.TimeoutExpired:
                code = "did not stop by itself"
            expect_eq(code, 0, "%s: --endpos %s: exit status (stderr:\n%s)" % (side, endpos[side], r.stderr()[-1500:]))
            ids[side] = [l["new"]["id"] if l.get("new") else l for l in r.lines()]
            expect(ids[side] in (["50"], ["50", "51"]),
                   "%s: --endpos stops after the first commit at or beyond it" % side,
                   got=ids[side][:10], expected="['50'] or ['50', '51']")
        # The rest, as raw pgoutput: framed messages that decode, and resume exactly after --endpos.
        decoded = {}
        for side in sides:
            r = Recv(env, url_of(side), sides[side][1], path(side + "-5.bin"),
                     extra=("--format", "pgoutput"))
            want = 3 - len(ids[side])

            def enough():
                expect(r.proc.poll() is None, "%s: pgrelay recv --format pgoutput exited early:\n%s"
                       % (side, r.stderr()))
                return sum(1 for m in frames(r.data()) if m[1]["tag"] == "C") >= want
            wait_until(enough, 60, "%d commits in pgoutput format" % want)
            time.sleep(1.0)
            expect_eq(r.stop(signal.SIGTERM), 0, "%s: exit status (pgoutput format)" % side)
            msgs = frames(r.data())
            tags = "".join(m[1]["tag"] for m in msgs)
            expect(re.fullmatch(r"(B[RY]*IC)+", tags), "%s: pgoutput message sequence" % side, got=tags)
            got_ids = [m[1]["new"][0] for m in msgs if m[1]["tag"] == "I"]
            expect_eq(ids[side] + got_ids, ["50", "51", "52"],
                      "%s: after --endpos, the next run resumes exactly" % side)
            commit_frames = [m for m in msgs if m[1]["tag"] == "C"]
            for lsn, c in commit_frames:
                expect_eq(lsn, c["end_lsn"], "%s: a Commit frame carries the commit's end LSN" % side)
            decoded[side] = {m[1]["new"][0]: m[1]["new"] for m in msgs if m[1]["tag"] == "I"}
        common = sorted(set(decoded["native"]) & set(decoded["pgrelay"]))
        expect("52" in common, "both pgoutput streams carry row 52", got=common)
        expect_eq([decoded["pgrelay"][i] for i in common], [decoded["native"][i] for i in common],
                  "pgoutput format: the same rows from both")

    def errors():
        for side in sides:
            r = subprocess.run([env.pgrelay, "recv", "--slot", "no_such_slot", "--publication", PUB,
                                url_of(side)], capture_output=True, text=True, timeout=60)
            expect(r.returncode != 0, "%s: a missing slot: non-zero exit" % side, got=r.returncode)
            expect('replication slot "no_such_slot" does not exist' in r.stderr and "--create-slot" in r.stderr,
                   "%s: a missing slot: the error and a hint naming --create-slot" % side, got=r.stderr)
            r = subprocess.run([env.pgrelay, "recv", "--slot", sides[side][1], "--publication", PUB,
                                "--create-slot", url_of(side)], capture_output=True, text=True, timeout=60)
            expect(r.returncode != 0 and "already exists" in r.stderr and "--if-not-exists" in r.stderr,
                   "%s: creating an existing slot fails with a hint" % side, got=(r.returncode, r.stderr))
        r = subprocess.run([env.pgrelay, "recv", "--slot", NATIVE_SLOT, url_of("native")],
                           capture_output=True, text=True, timeout=60)
        expect(r.returncode != 0 and "--publication" in r.stderr,
               "no --publication: non-zero exit and a hint", got=(r.returncode, r.stderr))
        r = subprocess.run([env.pgrelay, "recv", "--slot", NATIVE_SLOT, "--publication", PUB,
                            native_url + "?sslmode=require"], capture_output=True, text=True, timeout=60)
        expect(r.returncode != 0 and "SSL" in r.stderr,
               "sslmode=require against a server without TLS fails, as libpq does", got=(r.returncode, r.stderr))
        bad = "postgres://postgres:wrong@127.0.0.1:%d/%s" % (env.pg_port, DBNAME)
        r = subprocess.run([env.pgrelay, "recv", "--slot", NATIVE_SLOT, "--publication", PUB, "-w", bad],
                           capture_output=True, text=True, timeout=60)
        expect(r.returncode != 0 and "password authentication failed" in r.stderr,
               "a wrong password: non-zero exit", got=(r.returncode, r.stderr))

    def wal_level_replica():
        # A second, plain server (wal_level = replica): the error must name the fix.
        plain = Env(env.pgrelay, "recv-replica")
        try:
            plain.start_postgres()
            r = subprocess.run([env.pgrelay, "recv", "--slot", "s", "--publication", PUB, "--create-slot",
                                plain.upstream_url() + "?sslmode=disable"],
                               capture_output=True, text=True, timeout=60)
            expect(r.returncode != 0 and "wal_level" in r.stderr and "hint:" in r.stderr
                   and "pgrelay serve" in r.stderr,
                   "wal_level = replica: non-zero exit, and a hint to set wal_level or use pgrelay serve",
                   got=(r.returncode, r.stderr))
        finally:
            plain.cleanup()

    def signal_before_streaming():
        # A server that accepts the connection and never answers: recv is inside libpq's
        # connect when the signal comes. It must stop at once with 0, not die of the signal.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        try:
            url = "postgres://postgres@127.0.0.1:%d/%s?sslmode=disable" % (silent.getsockname()[1], DBNAME)
            r = Recv(env, url, "s", path("silent.jsonl"))
            wait_until(lambda: established_to(r.proc.pid, silent.getsockname()[1]), 30,
                       "recv to connect to the silent server")
            expect_eq(r.stop(signal.SIGTERM), 0, "SIGTERM while connecting: exit status")
            expect("stopping on signal before streaming began" in r.stderr(),
                   "SIGTERM while connecting: said so (verbose)", got=r.stderr())
            expect_eq(r.data(), b"", "SIGTERM while connecting: nothing written")
        finally:
            silent.close()
        # A signal at any moment of the start (connect, authentication, START_REPLICATION), once
        # recv runs (before its main(), no program can handle one): 0.
        for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.5):
            for side in sides:
                r = Recv(env, url_of(side), sides[side][1], path("%s-early-%g.jsonl" % (side, delay)))
                r.wait_stderr("connecting to the server")
                time.sleep(delay)
                expect_eq(r.stop(signal.SIGTERM), 0,
                          "%s: SIGTERM %.2f s after the start: exit status (stderr:\n%s)"
                          % (side, delay, r.stderr()[-800:]))
                expect_eq(r.lines(), [], "%s: SIGTERM %.2f s after the start: nothing written" % (side, delay))

    def drop_slots():
        for side in sides:
            r = subprocess.run([env.pgrelay, "recv", "--slot", sides[side][1], "--drop-slot", url_of(side)],
                               capture_output=True, text=True, timeout=60)
            expect_eq((r.returncode, r.stderr), (0, ""), "%s: --drop-slot" % side)
            wait_until(lambda: slot_confirmed(env, sides[side][2], sides[side][1]) is None, 10,
                       "%s: the slot to disappear" % side)

    env.check("recv --create-slot: identical JSON from a native slot and from pgrelay", create_and_compare)
    env.check("recv SIGTERM: exit 0, final feedback confirms what was written", stop_and_confirm)
    env.check("recv stopped mid-stream and restarted: no loss, no duplicate", resume_mid_stream)
    env.check("recv signals inside a transaction: completed (one) or abandoned (two), then exactly once",
              signal_inside_large_transaction)
    env.check("recv signalled while connecting or starting: exit 0, nothing written",
              signal_before_streaming)
    env.check("recv --endpos, then --format pgoutput resumes exactly", endpos_and_pgoutput_format)
    env.check("recv errors: missing slot (hint), existing slot, no publication, wrong password", errors)
    def server_shutdown():
        # Last: it stops pgrelay, then the upstream. A stream the server ends is an error (1).
        for side, stop_server in (("pgrelay", lambda: relay.stop(signal.SIGTERM)),
                                  ("native", lambda: env.pg_cmd(["pg_ctl", "-D", env.pg_dir, "-m", "fast",
                                                                 "-w", "stop"]))):
            r = Recv(env, url_of(side), "recv_end", path(side + "-end.jsonl"), extra=("--create-slot",))
            r.wait_stderr("streaming initiated")
            stop_server()
            code = wait_exit(r, 60)
            expect(code == 1 and "error:" in r.stderr(),
                   "%s: the server stops: pgrelay recv exits with status 1 and says why" % side,
                   got=(code, r.stderr()[-600:]))

    env.check("recv against wal_level = replica: an error naming the fix", wal_level_replica)
    env.check("recv --drop-slot", drop_slots)
    env.check("recv when the server shuts down: exit status 1", server_shutdown)


def wait_exit(recv, timeout):
    try:
        return recv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        recv.proc.kill()
        recv.proc.wait()
        return "hung"


def socket_inodes(pid):
    """The inodes of process pid's sockets, as /proc/net/tcp names them."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def established_to(pid, port):
    """Whether process pid has an established TCP connection to 127.0.0.1:port."""
    inodes = socket_inodes(pid)
    with open("/proc/%d/net/tcp" % pid) as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[2].endswith(":%04X" % port) and fields[3] == "01" and fields[9] in inodes:
                return True
    return False


def rx_queue(pid):
    """Bytes waiting in the receive queues of the TCP sockets of process pid."""
    inodes = socket_inodes(pid)
    total = 0
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[9] in inodes:
                        total += int(fields[4].split(":")[1], 16)
        except OSError:
            pass
    return total


def summary(ids):
    """A short, comparable description of a list of row ids: count, order, gaps, repeats."""
    seen, repeated = set(), []
    for i in ids:
        if i in seen:
            repeated.append(i)
        seen.add(i)
    return {"count": len(ids), "first": ids[:3], "last": ids[-3:], "sorted": ids == sorted(ids),
            "repeated": repeated[:10], "distinct": len(seen)}


def frames(data):
    """Decodes --format pgoutput output: (start LSN, message) for each complete frame."""
    out = []
    pos = 0
    while pos + 12 <= len(data):
        lsn = int.from_bytes(data[pos:pos + 8], "big")
        n = int.from_bytes(data[pos + 8:pos + 12], "big")
        if pos + 12 + n > len(data):
            break
        out.append((lsn, decode_message(data[pos + 12:pos + 12 + n])))
        pos += 12 + n
    return out


if __name__ == "__main__":
    main("recv", body)
