# Transactions in progress streamed through `pgrelay serve` to consumers that ask for streaming, as Postgres streams them.
"""Native capture, an upstream that streams large transactions to it (logical_decoding_work_mem =
64kB), and consumers through pgrelay with `streaming 'on'` (pgoutput protocol 2):

  - a large transaction reaches a psycopg2 consumer in stream blocks while it is still open
    upstream (Stream Start with the upstream's xid, changes naming it), then Stream Commit at the
    commit; assembled, it equals what a native slot of the upstream streams, and a consumer that
    does not ask for streaming gets it whole (Begin .. Commit);
  - a savepoint rolled back after some of its rows were streamed: Stream Abort of that
    subtransaction, the rows the subscriber-side rule then drops are exactly the rolled back ones;
  - a transaction rolled back after part of it was streamed: Stream Abort of the whole of it;
  - a publication changed inside a streamed transaction: pgrelay aborts the stream and sends the
    transaction whole at its commit, through the publications as they are then (as a native
    slot's stream has it, the new table's rows included);
  - kill -9 of pgrelay while a consumer holds part of a streamed transaction: after the restart
    the transaction arrives once, whole;
  - a transaction replicated into the upstream from a replication origin is streamed too;
  - PostgreSQL 15's own subscriber (a second cluster, `streaming = on`): it holds the open
    transaction's stream file before the commit, and afterwards its table equals the upstream's,
    a savepoint rolled back inside the transaction included.
"""

import glob
import os
import select
import time

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import CheckFailed, Env, expect, expect_eq, main, wait_until
from pgoutput_decode import decode_message

CONF = ("wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
        "logical_decoding_work_mem = 64kB\nmax_prepared_transactions = 10\n")
SUBSCRIBER_CONF = "max_worker_processes = 16\nmax_logical_replication_workers = 8\nmax_replication_slots = 10\n"
DB = "streamed"
ROW = 500  # bytes of text per row: 40,000 rows are 20 MB, well past pgrelay's 8 MiB spill
STREAM_OPTIONS = {"proto_version": "2", "publication_names": "bigpub", "streaming": "on"}


class Consumer:
    """A psycopg2 replication stream, assembled as a subscriber assembles it: stream blocks per
    transaction (a subtransaction's Stream Abort drops from its first change on, as worker.c
    truncates its file), whole transactions as they come."""

    def __init__(self, name, url, slot, options):
        self.name = name
        self.conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection, connect_timeout=10)
        self.cur = self.conn.cursor()
        self.cur.start_replication(slot_name=slot, decode=False, status_interval=1, options=options)
        self.in_block = None       # xid of the open stream block
        self.streams = {}          # xid -> [(xid tag, message)] streamed so far
        self.starts = []           # (xid, first) of each Stream Start
        self.aborts = []           # (xid, subxid) of each Stream Abort
        self.origins = []          # Origin messages' names
        self.open = None           # a whole transaction being received: [xid, messages]
        self.committed = []        # (xid, "stream" | "whole", [messages], commit lsn)
        self.errors = []

    def streamed_rows(self, xid, key_from=None):
        return sum(1 for _, m in self.streams.get(xid, []) if m["tag"] == "I"
                   and (key_from is None or int(m["new"][0]) >= key_from))

    def state(self):
        return "%s: committed %d, streams %r, aborts %r" % (
            self.name, len(self.committed), {x: len(v) for x, v in self.streams.items()}, self.aborts)

    def take(self, msg):
        m = decode_message(msg.payload, in_stream=self.in_block is not None)
        tag = m["tag"]
        if tag == "S":
            expect(self.in_block is None, "Stream Start inside a block")
            self.in_block = m["xid"]
            self.starts.append((m["xid"], m["first"]))
            if m["first"]:
                expect(m["xid"] not in self.streams, "first Stream Start of a transaction already streamed")
                self.streams[m["xid"]] = []
            else:
                expect(m["xid"] in self.streams, "a later Stream Start of a transaction never started")
        elif tag == "E":
            expect(self.in_block is not None, "Stream Stop outside a block")
            self.in_block = None
        elif tag == "A":
            expect(self.in_block is None, "Stream Abort inside a block")
            self.aborts.append((m["xid"], m["subxid"]))
            if m["xid"] == m["subxid"]:
                self.streams.pop(m["xid"], None)
            else:
                changes = self.streams.get(m["xid"], [])
                first = next((i for i, (x, _) in enumerate(changes) if x == m["subxid"]), None)
                if first is not None:
                    del changes[first:]
        elif tag == "c":
            expect(self.in_block is None, "Stream Commit inside a block")
            changes = [change for _, change in self.streams.pop(m["xid"], [])]
            self.committed.append((m["xid"], "stream", changes, m["commit_lsn"]))
            self.cur.send_feedback(flush_lsn=m["end_lsn"])
        elif tag == "O":
            self.origins.append(m["name"])
        elif self.in_block is not None:
            expect("xid" in m, "a %s message inside a block names its transaction" % tag)
            self.streams[self.in_block].append((m["xid"], m))
        elif tag == "B":
            self.open = [m["xid"], []]
        elif tag == "C":
            self.committed.append((self.open[0], "whole", self.open[1], m["commit_lsn"]))
            self.open = None
            self.cur.send_feedback(flush_lsn=msg.data_start)
        elif self.open is not None:
            self.open[1].append(m)

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


def pump(consumers, until, timeout, what):
    """Reads every one of `consumers` until `until()` holds. All of them are read all along, not
    one after another: a server (Postgres or pgrelay) ends a walsender whose consumer sends no
    status for wal_sender_timeout (60 s), and psycopg2 sends it only while it reads."""
    deadline = time.monotonic() + timeout
    while not until():
        expect(time.monotonic() < deadline, "timed out after %ss waiting for %s (%s)"
               % (timeout, what, "; ".join(c.state() for c in consumers)))
        idle = True
        for c in consumers:
            try:
                msg = c.cur.read_message()
            except psycopg2.Error as e:
                raise CheckFailed("%s: the replication stream failed: %s" % (c.name, e)) from e
            if msg is not None:
                c.take(msg)
                idle = False
        if idle:
            select.select([c.cur for c in consumers], [], [], 0.2)


def rows_of(messages):
    """The inserted rows' (id, length of v), in order."""
    return [(int(m["new"][0]), len(m["new"][1] or "")) for m in messages if m["tag"] == "I"]


class Case:
    def __init__(self, env):
        self.env = env
        self.relay = None
        self.data_dir = os.path.join(env.base, "relay")
        self.port = None
        self.slots = 0

    def start(self):
        self.relay = self.env.start_relay(data_dir=self.data_dir, port=self.port, upstream=self.env.upstream_url(DB),
                                          extra_args=["--no-tls", "--capture", "native"])
        self.port = self.relay.port

    def slot(self, native=False):
        self.slots += 1
        name = "s_%d%s" % (self.slots, "_native" if native else "")
        conn = psycopg2.connect(self.env.upstream_url(DB) if native else self.relay.url,
                                connection_factory=LogicalReplicationConnection)
        conn.cursor().create_replication_slot(name, output_plugin="pgoutput")
        conn.close()
        return name

    def consumer(self, options=STREAM_OPTIONS, native=False, slot=None):
        slot = slot or self.slot(native)
        name = "native" if native else "ours (%s)" % slot
        return slot, Consumer(name, self.env.upstream_url(DB) if native else self.relay.url, slot, options)

    def writer(self):
        conn = psycopg2.connect(self.env.upstream_url(DB))
        conn.autocommit = False
        cur = conn.cursor()
        cur.execute("SELECT txid_current()")
        return conn, cur, cur.fetchone()[0]

    @staticmethod
    def insert(cur, first, last):
        cur.execute("INSERT INTO big SELECT g, repeat(chr(97 + g %% 26), %s) FROM generate_series(%s, %s) g",
                    (ROW, first, last))

    def one_committed(self, consumer, what):
        expect_eq(len(consumer.committed), 1, "%s: transactions received" % what)
        return consumer.committed.pop()

    def streamed_while_open(self):
        _, ours = self.consumer()
        _, whole = self.consumer({"proto_version": "1", "publication_names": "bigpub"})
        _, native = self.consumer(native=True)
        try:
            conn, cur, xid = self.writer()
            self.insert(cur, 1, 40000)
            pump((ours, whole, native), lambda: ours.streamed_rows(xid) >= 10000, 120,
                 "10,000 rows streamed before the commit")
            before = ours.streamed_rows(xid)
            expect(not ours.committed and not whole.committed, "nothing committed before the commit")
            expect_eq(ours.starts[0], (xid, 1), "the first Stream Start: the upstream's xid, first segment")
            expect(all(x == xid for x, _ in ours.streams[xid]), "every streamed change names the transaction")
            conn.commit()
            conn.close()
            pump((ours, whole, native), lambda: ours.committed and whole.committed and native.committed, 120,
                 "the commit")
            got = self.one_committed(ours, "ours")
            theirs = self.one_committed(native, "native")
            plain = self.one_committed(whole, "proto 1")
            expect_eq(got[:2], (xid, "stream"), "ours: the transaction came as a stream")
            expect_eq(theirs[:2], (xid, "stream"), "native: the transaction came as a stream")
            expect_eq(plain[:2], (xid, "whole"), "a consumer without streaming: Begin .. Commit")
            expect_eq(rows_of(got[2]), [(i, ROW) for i in range(1, 40001)], "ours: every row once, in order")
            expect_eq(got[3], theirs[3], "commit LSN, ours and native")
            expect_eq(rows_of(got[2]), rows_of(theirs[2]), "rows, ours and native")
            expect_eq(rows_of(plain[2]), rows_of(got[2]), "rows, streamed and whole")
            expect_eq([m for m in got[2] if m["tag"] == "R"][0]["name"], "big", "the stream describes big")
            print("    %d of 40,000 rows streamed before the commit, in %d blocks" % (before, len(ours.starts)))
        finally:
            for c in (ours, whole, native):
                c.close()

    def savepoint_rolled_back(self):
        _, ours = self.consumer()
        _, native = self.consumer(native=True)
        try:
            conn, cur, xid = self.writer()
            self.insert(cur, 100001, 120000)
            cur.execute("SAVEPOINT s")
            self.insert(cur, 130001, 160000)
            pump((ours, native), lambda: ours.streamed_rows(xid, 130001) >= 1000, 120, "rows of the savepoint streamed")
            sub = next(x for x, m in ours.streams[xid] if m["tag"] == "I" and int(m["new"][0]) >= 130001)
            expect(sub != xid, "the savepoint's rows name its subtransaction", got=sub)
            cur.execute("ROLLBACK TO SAVEPOINT s")
            self.insert(cur, 170001, 180000)
            conn.commit()
            conn.close()
            pump((ours, native), lambda: ours.committed and native.committed, 120, "the commit")
            expect_eq(ours.aborts, [(xid, sub)], "Stream Abort of the subtransaction")
            got = self.one_committed(ours, "ours")
            theirs = self.one_committed(native, "native")
            want = [(i, ROW) for i in list(range(100001, 120001)) + list(range(170001, 180001))]
            expect_eq(rows_of(got[2]), want, "ours: the rows outside the savepoint, once, in order")
            expect_eq(rows_of(theirs[2]), want, "native: the same")
        finally:
            ours.close()
            native.close()

    def rolled_back(self):
        _, ours = self.consumer()
        try:
            conn, cur, xid = self.writer()
            self.insert(cur, 200001, 240000)
            pump((ours,), lambda: ours.streamed_rows(xid) >= 1000, 120, "rows streamed")
            conn.rollback()
            conn.close()
            self.env.db_query(DB, "INSERT INTO big VALUES (1000001, 'after')")
            pump((ours,), lambda: ours.committed, 120, "the next transaction")
            expect_eq(ours.aborts, [(xid, xid)], "Stream Abort of the whole transaction")
            got = self.one_committed(ours, "ours")
            expect_eq((got[1], rows_of(got[2])), ("whole", [(1000001, 5)]), "only the next transaction, whole")
        finally:
            ours.close()

    def publication_changed_inside(self):
        _, ours = self.consumer()
        _, native = self.consumer(native=True)
        try:
            conn, cur, xid = self.writer()
            self.insert(cur, 700001, 740000)
            pump((ours, native), lambda: ours.streamed_rows(xid) >= 1000, 120, "rows streamed")
            cur.execute("CREATE TABLE added (id int PRIMARY KEY, v text)")
            cur.execute("ALTER PUBLICATION bigpub ADD TABLE added")
            cur.execute("INSERT INTO added VALUES (1, 'one'), (2, 'two')")
            self.insert(cur, 740001, 741000)
            conn.commit()
            conn.close()
            pump((ours, native), lambda: ours.committed and native.committed, 120, "the commit")
            expect_eq(ours.aborts, [(xid, xid)], "the stream aborted where the publications changed")
            got = self.one_committed(ours, "ours")
            theirs = self.one_committed(native, "native")
            expect_eq(got[:2], (xid, "whole"), "ours: then sent whole at its commit")
            names = {m["oid"]: m["name"] for m in got[2] + theirs[2] if m["tag"] == "R"}
            inserts = lambda msgs: [(names.get(m["relid"]), m["new"][0]) for m in msgs if m["tag"] == "I"]
            expect_eq(inserts(got[2]), inserts(theirs[2]), "rows of big and of the table added, ours and native")
            expect_eq(inserts(got[2])[-1001:-999], [("added", "2"), ("big", "740001")],
                      "the added table's rows, sent after the publication changed")
        finally:
            ours.close()
            native.close()

    def killed_while_streaming(self):
        slot, ours = self.consumer()
        conn, cur, xid = self.writer()
        self.insert(cur, 300001, 340000)
        try:
            pump((ours,), lambda: ours.streamed_rows(xid) >= 5000, 120, "rows streamed")
        finally:
            ours.close()
        pid = self.relay.proc.pid
        self.relay.stop(sig=9)
        self.start()
        print("    killed pgrelay (pid %d) with %d rows of the open transaction streamed; restarted as pid %d"
              % (pid, ours.streamed_rows(xid), self.relay.proc.pid))
        self.insert(cur, 340001, 350000)
        conn.commit()
        conn.close()
        _, again = self.consumer(slot=slot)
        try:
            pump((again,), lambda: again.committed, 180, "the transaction after the restart")
            got = self.one_committed(again, "after the restart")
            expect_eq(rows_of(got[2]), [(i, ROW) for i in range(300001, 350001)], "every row once, in order")
            quiet_until = time.monotonic() + 3  # a second copy would follow at once
            pump((again,), lambda: time.monotonic() >= quiet_until, 10, "three quiet seconds")
            expect_eq(again.committed, [], "transactions after the whole one (a second copy)")
        finally:
            again.close()

    def with_origin(self):
        _, ours = self.consumer()
        try:
            self.env.db_query(DB, "SELECT pg_replication_origin_create('elsewhere')")
            conn, cur, xid = self.writer()
            cur.execute("SELECT pg_replication_origin_session_setup('elsewhere')")
            self.insert(cur, 400001, 440000)
            conn.commit()
            cur.execute("SELECT pg_replication_origin_session_reset()")
            conn.commit()
            conn.close()
            pump((ours,), lambda: ours.committed, 120, "the transaction")
            got = self.one_committed(ours, "ours")
            expect_eq((got[:2], len(rows_of(got[2]))), ((xid, "stream"), 40000), "streamed, every row")
            expect_eq(ours.origins, ["elsewhere"], "the Origin message of its first block")
        finally:
            ours.close()

    def subscriber(self):
        sub = Env(self.env.pgrelay, "streaming-subscriber")
        try:
            sub.start_postgres(SUBSCRIBER_CONF)
            sub.psql_admin("CREATE TABLE big (id int PRIMARY KEY, v text)")
            sub.psql_admin("CREATE TABLE added (id int PRIMARY KEY, v text)")
            sub.psql_admin("CREATE SUBSCRIPTION s CONNECTION '%s' PUBLICATION bigpub WITH (streaming = on)"
                           % self.relay.url)
            same = "SELECT count(*), coalesce(sum(length(v)), 0), coalesce(sum(id), 0) FROM big"
            wait_until(lambda: sub.direct_query(same) == self.env.db_query(DB, same), 120, "the initial copy")
            conn, cur, _ = self.writer()
            self.insert(cur, 500001, 540000)
            cur.execute("UPDATE big SET v = v || '!' WHERE id BETWEEN 500001 AND 520000 AND id % 3 = 0")
            cur.execute("SAVEPOINT a")
            cur.execute("DELETE FROM big WHERE id > 500000")
            self.insert(cur, 600001, 620000)
            cur.execute("ROLLBACK TO SAVEPOINT a")
            cur.execute("DELETE FROM big WHERE id BETWEEN 530001 AND 531000")
            stream_files = os.path.join(sub.pg_dir, "base", "pgsql_tmp", "*", "*.changes*")
            wait_until(lambda: glob.glob(stream_files), 120,
                       "the subscriber's stream file of the open transaction (%s)" % stream_files)
            conn.commit()
            conn.close()
            wait_until(lambda: sub.direct_query(same) == self.env.db_query(DB, same), 180,
                       "the subscriber's table equal to the upstream's after the commit")
            expect_eq(sub.direct_query("SELECT count(*) FROM big WHERE id BETWEEN 600001 AND 620000"), [(0,)],
                      "rows of the rolled back savepoint on the subscriber")
        finally:
            sub.cleanup()

    def run(self):
        env = self.env

        def setup():
            env.start_postgres(CONF)
            env.psql_admin("CREATE DATABASE %s" % DB, db="postgres")
            env.db_query(DB, "CREATE TABLE big (id int PRIMARY KEY, v text)")
            env.db_query(DB, "CREATE PUBLICATION bigpub FOR TABLE big")
            self.start()

        env.check("setup: upstream streaming past 64kB, table big, pgrelay serve --capture native", setup)
        env.check("a 40,000-row transaction is streamed while it is open, Stream Commit at its commit; "
                  "equal to a native slot's; whole for a consumer without streaming", self.streamed_while_open)
        env.check("a savepoint rolled back after its rows were streamed: Stream Abort of the subtransaction",
                  self.savepoint_rolled_back)
        env.check("a transaction rolled back after part of it was streamed: Stream Abort of all of it",
                  self.rolled_back)
        env.check("a publication changed inside a streamed transaction: its stream is aborted and it "
                  "is sent whole at its commit, as the changed publications say", self.publication_changed_inside)
        env.check("kill -9 while a consumer holds part of a streamed transaction: after the restart it "
                  "arrives once, whole", self.killed_while_streaming)
        env.check("a transaction from a replication origin is streamed, its Origin in the first block",
                  self.with_origin)
        env.check("PostgreSQL's subscriber with streaming = on: the stream file while the transaction is "
                  "open, the same table after the commit", self.subscriber)


def body(env):
    Case(env).run()


if __name__ == "__main__":
    main("streaming", body)
