# pg_recvlogical against `pgrelay serve`: create a slot, stream pgoutput v1, decode, stop, resume.
import os
import signal
import subprocess
import time

from e2e_support import PG_BIN, expect, expect_eq, lsn_to_int, main, wait_until
from pgoutput_decode import decode_recvlogical, lsn_str, session_of

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int, note text);
CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2));
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE TABLE ignored (id int PRIMARY KEY, v text);
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE tagged (id int PRIMARY KEY, m mood);
CREATE PUBLICATION pub_e2e FOR TABLE items, accounts, tagged;
"""

INT4, TEXT, NUMERIC = 23, 25, 1700

# Each entry: the SQL of one upstream transaction, and the changes pgoutput must send for it
# (None: the transaction must not appear in the stream at all).
WORKLOAD_1 = [
    ("INSERT INTO items VALUES (1, 'apple', 5, NULL), (2, E'it''s a \"pear\"\\nline 2', 7, 'ü€'),"
     " (3, 'cherry', 0, '')",
     [("I", "public.items", ["1", "apple", "5", None]),
      ("I", "public.items", ["2", "it's a \"pear\"\nline 2", "7", "ü€"]),
      ("I", "public.items", ["3", "cherry", "0", ""])]),
    ("UPDATE items SET qty = qty + 1 WHERE id = 1; INSERT INTO accounts VALUES (1, 'ann', 10.50);"
     " INSERT INTO ignored VALUES (1, 'not published')",
     [("U", "public.items", None, None, ["1", "apple", "6", None]),
      ("I", "public.accounts", ["1", "ann", "10.50"])]),
    ("INSERT INTO ignored VALUES (2, 'only unpublished')", None),
    ("UPDATE accounts SET balance = balance - 0.25 WHERE id = 1; DELETE FROM items WHERE id = 3",
     [("U", "public.accounts", "O", ["1", "ann", "10.50"], ["1", "ann", "10.25"]),
      ("D", "public.items", "K", ["3", None, None, None])]),
    ("UPDATE items SET id = 20 WHERE id = 2",
     [("U", "public.items", "K", ["2", None, None, None], ["20", "it's a \"pear\"\nline 2", "7", "ü€"])]),
    ("TRUNCATE accounts",
     [("T", ["public.accounts"], 0)]),
    ("INSERT INTO accounts VALUES (2, 'bob', -3.00); DELETE FROM accounts WHERE id = 2",
     [("I", "public.accounts", ["2", "bob", "-3.00"]),
      ("D", "public.accounts", "O", ["2", "bob", "-3.00"])]),
]

WORKLOAD_2 = [
    ("INSERT INTO items VALUES (30, 'after stop', 1, 'n')",
     [("I", "public.items", ["30", "after stop", "1", "n"])]),
    ("UPDATE items SET note = NULL WHERE id = 30; INSERT INTO items VALUES (31, 'second', NULL, NULL)",
     [("U", "public.items", None, None, ["30", "after stop", "1", None]),
      ("I", "public.items", ["31", "second", None, None])]),
]

WORKLOAD_3 = [
    ("INSERT INTO items VALUES (40, 'while streaming', 4, NULL)",
     [("I", "public.items", ["40", "while streaming", "4", None])]),
]


def recvlogical(env, relay, *args, **kw):
    return [os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", "e2e_slot"] + list(args)


def run_workload(env, workload):
    conn = env.direct(autocommit=False)
    try:
        with conn.cursor() as cur:
            for sql, _ in workload:
                cur.execute(sql)
                conn.commit()
            # A rolled-back transaction must never reach the stream.
            cur.execute("INSERT INTO items VALUES (999, 'rolled back', 0, NULL)")
            conn.rollback()
    finally:
        conn.close()


def expected_changes(workload):
    return [changes for _, changes in workload if changes is not None]


class Streamer:
    """One pg_recvlogical --start process writing to its own file."""

    def __init__(self, env, relay, path, extra=()):
        self.path = path
        self.err_path = path + ".stderr"
        self.err = open(self.err_path, "wb")
        args = recvlogical(env, relay, "--start", "-o", "proto_version=1", "-o", "publication_names=pub_e2e",
                           "-f", path, "-F", "1", "-s", "1", "--no-loop", "-v", *extra)
        self.proc = env.spawn(args, stdout=subprocess.DEVNULL, stderr=self.err)

    def messages(self, partial=True):
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        return decode_recvlogical(data, allow_partial=partial)

    def wait_commits(self, n, timeout=30):
        def enough():
            expect(self.proc.poll() is None, "pg_recvlogical exited early (%r): %s" % (
                self.proc.returncode, self.stderr()))
            return sum(1 for m in self.messages() if m["tag"] == "C") >= n
        wait_until(enough, timeout, "%d commits from pg_recvlogical" % n)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = "hung"
        return code

    def stderr(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode(errors="replace")


def check_relations(session):
    rels = {"%s.%s" % (r["schema"], r["name"]): r for r in session.relation_messages}
    for name in rels:
        count = sum(1 for r in session.relation_messages if "%s.%s" % (r["schema"], r["name"]) == name)
        expect_eq(count, 1, "Relation messages for %s in one session (no schema change)" % name)
    items = rels.get("public.items")
    expect(items is not None, "a Relation message for public.items", got=sorted(rels))
    expect_eq(items["replident"], "d", "items replica identity")
    expect_eq([(c["name"], c["type"], c["flags"]) for c in items["columns"]],
              [("id", INT4, 1), ("name", TEXT, 0), ("qty", INT4, 0), ("note", TEXT, 0)], "items columns")
    oid = env_oid_cache.get("items")
    if oid is not None:
        expect_eq(items["oid"], oid, "Relation oid is the upstream table's oid")
    return rels


env_oid_cache = {}


# Every statement's plan logged, and JIT for any plan at all, so that the log shows which of
# pgrelay's own statements PostgreSQL would compile (pgrelay turns JIT off on its sessions: LLVM
# compiled its polls anew on each execution, at 17-293 ms each).
JIT_EVERYWHERE = """shared_preload_libraries = 'auto_explain'
auto_explain.log_min_duration = 0
auto_explain.log_nested_statements = on
jit_above_cost = 0
log_line_prefix = '%m [%p] app=%a '"""


def jit_compiled_statements(log_path):
    """(application_name, first line of the query) of each plan the upstream logged with JIT."""
    found, app, query = [], None, None
    with open(log_path, errors="replace") as f:
        for line in f:
            if not line.startswith("\t"):
                head = line.split(" app=", 1)
                app = head[1].split(" ", 1)[0] if len(head) == 2 else None
                query = None
            elif line.startswith("\tQuery Text:") and query is None:
                query = line.strip()[:160]
            elif line.startswith("\tJIT:"):
                found.append((app, query))
    return found


def body(env):
    env.start_postgres(extra_conf=JIT_EVERYWHERE)
    env.psql_admin(SCHEMA)
    for name in ("items", "accounts"):
        env_oid_cache[name] = env.direct_query("SELECT %s::regclass::oid" % ("'%s'" % name))[0][0]
    env_oid_cache["mood"] = env.direct_query("SELECT 'mood'::regtype::oid")[0][0]
    relay = env.start_relay()
    state = {}

    def create_slot():
        r = subprocess.run(recvlogical(env, relay, "--create-slot", "-P", "pgoutput"), capture_output=True,
                           text=True, timeout=60)
        expect(r.returncode == 0, "pg_recvlogical --create-slot exited %d: %s" % (r.returncode, r.stderr))
        # As in Postgres, the slot must be visible as soon as CREATE_REPLICATION_SLOT returned.
        query = "SELECT slot_name, plugin, slot_type, database, active FROM pg_replication_slots"
        state["immediate"] = env.relay_query(relay, query)
        want = [("e2e_slot", "pgoutput", "logical", "e2e", False)]
        rows = wait_until(lambda: env.relay_query(relay, query) == want and want, 10, "the slot in pg_replication_slots")
        expect_eq(rows, want, "pg_replication_slots through pgrelay after --create-slot")
        again = subprocess.run(recvlogical(env, relay, "--create-slot", "-P", "pgoutput"), capture_output=True,
                               text=True, timeout=60)
        expect(again.returncode != 0 and 'replication slot "e2e_slot" already exists' in again.stderr,
               "creating the same slot again fails", got=again.stderr)
        state["created"] = True

    def stream_and_decode():
        expect(state.get("created"), "the slot was created")
        s1 = Streamer(env, relay, os.path.join(env.base, "stream1.bin"))
        time.sleep(1.0)  # let START_REPLICATION begin; changes are in the slot either way
        run_workload(env, WORKLOAD_1)
        expected = expected_changes(WORKLOAD_1)
        s1.wait_commits(len(expected))
        time.sleep(1.0)  # anything extra (a duplicate, the rolled-back row) would arrive now
        messages = s1.messages(partial=False)
        session = session_of(messages)
        expect_eq(session.errors, [], "pgoutput ordering rules in the stream")
        expect_eq(messages[0]["tag"], "B", "the stream starts with Begin")
        check_relations(session)
        expect_eq(session.changes(), expected, "transactions and row values streamed by pg_recvlogical")
        commits = [t["commit_lsn"] for t in session.transactions]
        expect(all(a < b for a, b in zip(commits, commits[1:])), "commit LSNs strictly increase",
               got=[lsn_str(c) for c in commits])
        xids = [t["xid"] for t in session.transactions]
        expect_eq(len(set(xids)), len(xids), "each transaction has its own xid")
        state["last_end"] = session.transactions[-1]["end_lsn"]

        # pg_recvlogical 15 sends no feedback on SIGINT: its position moves with its status
        # messages (-s 1), and pg_replication_slots shows it live, as in Postgres.
        def confirmed(active):
            rows = env.relay_query(relay, "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots"
                                   " WHERE slot_name = 'e2e_slot'")
            state["slot_row"] = rows
            return (rows and rows[0][0] and rows[0][1] is active
                    and lsn_to_int(rows[0][0]) >= state["last_end"])
        try:
            wait_until(lambda: confirmed(True), 10, "confirmed_flush_lsn to cover the last commit")
        except Exception:
            expect(False, "pg_replication_slots through pgrelay after pg_recvlogical's feedback",
                   got=state.get("slot_row"), expected="confirmed_flush_lsn >= %s, active true" % lsn_str(state["last_end"]))
        code = s1.stop()
        expect_eq(code, 0, "pg_recvlogical exit code after SIGINT (stderr: %s)" % s1.stderr()[-800:])
        expect_eq(s1.messages(partial=False), messages, "nothing more arrived before the stop")
        try:
            wait_until(lambda: confirmed(False), 10, "the slot to be released")
        except Exception:
            expect(False, "pg_replication_slots after pg_recvlogical stopped", got=state.get("slot_row"),
                   expected="active false, confirmed_flush_lsn >= %s" % lsn_str(state["last_end"]))
        state["streamed"] = True

    def resume():
        expect(state.get("streamed"), "the first stream succeeded")
        run_workload(env, WORKLOAD_2)  # written while nobody streams
        s2 = Streamer(env, relay, os.path.join(env.base, "stream2.bin"))
        s2.wait_commits(2)
        run_workload(env, WORKLOAD_3)  # and one while streaming
        s2.wait_commits(3)
        time.sleep(1.0)
        last = session_of(s2.messages()).transactions[-1]["end_lsn"]
        wait_until(lambda: lsn_to_int(env.relay_query(relay, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
                                                     " WHERE slot_name = 'e2e_slot'")[0][0]) >= last,
                   10, "pg_recvlogical's feedback to confirm the last commit")
        code = s2.stop()
        expect_eq(code, 0, "pg_recvlogical exit code after SIGINT")
        messages = s2.messages(partial=False)
        session = session_of(messages)
        expect_eq(session.errors, [], "pgoutput ordering rules in the resumed stream")
        expect_eq(messages[0]["tag"], "B", "the resumed stream starts with Begin")
        expect(session.transactions[0]["commit_lsn"] >= state["last_end"],
               "the first resumed transaction commits after the confirmed position")
        check_relations(session)
        expect_eq(session.changes(), expected_changes(WORKLOAD_2) + expected_changes(WORKLOAD_3),
                  "resumed stream: exactly the new transactions, none lost, none repeated")

    def messages_and_types():
        expect(state.get("streamed"), "the first stream succeeded")
        s3 = Streamer(env, relay, os.path.join(env.base, "stream3.bin"), extra=("-o", "messages=true"))
        # pg_logical_emit_message through pgrelay (the upstream has wal_level=replica).
        conn = env.relay_conn(relay)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO tagged VALUES (1, 'happy')")
            cur.execute("SELECT pg_logical_emit_message(true, 'e2e', 'in txn')")
            conn.commit()
            conn.autocommit = True
            cur.execute("SELECT pg_logical_emit_message(false, 'e2e', 'outside')")
        conn.close()
        run_workload(env, [("INSERT INTO tagged VALUES (2, 'sad')", None)])
        s3.wait_commits(2)
        time.sleep(1.0)
        s3.stop()
        messages = s3.messages(partial=False)
        session = session_of(messages)
        expect_eq(session.errors, [], "pgoutput ordering rules")
        expect_eq([m["tag"] for m in messages], ["B", "Y", "R", "I", "M", "C", "M", "B", "I", "C"],
                  "message sequence: Type before Relation once, transactional and non-transactional M")
        y = messages[1]
        expect_eq((y["schema"], y["name"], y["oid"]), ("public", "mood", env_oid_cache["mood"]), "Type message")
        expect_eq(session.changes(), [[("I", "public.tagged", ["1", "happy"]), ("M", "e2e", b"in txn")],
                                      [("M", "e2e", b"outside")],
                                      [("I", "public.tagged", ["2", "sad"])]],
                  "changes and logical messages")

    def start_errors():
        r = subprocess.run([os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", "no_such_slot",
                            "--start", "-o", "proto_version=1", "-o", "publication_names=pub_e2e", "-f", "-",
                            "--no-loop"], capture_output=True, text=True, timeout=30)
        expect(r.returncode != 0 and 'replication slot "no_such_slot" does not exist' in r.stderr,
               "START_REPLICATION of a missing slot fails with Postgres's message", got=r.stderr)
        r = subprocess.run(recvlogical(env, relay, "--start", "-o", "proto_version=1", "-f", "-", "--no-loop"),
                           capture_output=True, text=True, timeout=30)
        expect(r.returncode != 0 and "publication_names" in r.stderr,
               "START_REPLICATION without publication_names fails", got=r.stderr)

    def drop_slot():
        r = subprocess.run(recvlogical(env, relay, "--drop-slot"), capture_output=True, text=True, timeout=60)
        expect(r.returncode == 0, "pg_recvlogical --drop-slot: " + r.stderr)
        immediate = env.relay_query(relay, "SELECT slot_name FROM pg_replication_slots")
        wait_until(lambda: env.relay_query(relay, "SELECT count(*) FROM pg_replication_slots")[0][0] == 0,
                   10, "the slot to disappear from pg_replication_slots")
        state["immediate_after_drop"] = immediate

    def catalog_in_step():
        expect("immediate" in state and "immediate_after_drop" in state, "create and drop ran")
        expect_eq({"after create": state["immediate"], "after drop": state["immediate_after_drop"]},
                  {"after create": [("e2e_slot", "pgoutput", "logical", "e2e", False)], "after drop": []},
                  "pg_replication_slots queried right after CREATE_/DROP_REPLICATION_SLOT returned")

    env.check("pg_recvlogical --create-slot", create_slot)
    env.check("pg_recvlogical --start: decode inserts/updates/deletes/truncate", stream_and_decode)
    env.check("pg_recvlogical resume: no loss, no duplicate", resume)
    env.check("pg_recvlogical -o messages=true: M and Y messages", messages_and_types)
    env.check("pg_recvlogical errors", start_errors)
    env.check("pg_recvlogical --drop-slot", drop_slot)
    env.check("pg_replication_slots in step with slot commands (no delay)", catalog_in_step)

    def no_jit_for_pgrelay():
        compiled = jit_compiled_statements(os.path.join(env.base, "postgres.log"))
        # The test's own psql sessions are compiled (jit_above_cost = 0): the log can show JIT.
        expect(any(app != "pgrelay" for app, _ in compiled), "the upstream JIT-compiles clients' plans",
               got=len(compiled))
        own = sorted({query for app, query in compiled if app == "pgrelay"})
        expect(not own, "no plan of pgrelay's own sessions JIT-compiled upstream",
               got="%d statements, e.g. %s" % (len(own), own[:5]))

    env.check("pgrelay's own statements are never JIT-compiled upstream", no_jit_for_pgrelay)


if __name__ == "__main__":
    main("pg_recvlogical", body)
