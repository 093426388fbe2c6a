# Partitioned tables through `pgrelay serve`, in both capture modes: streamed as a native slot streams them, as partitions and via the root.
"""Partitioned tables, in both capture modes, on one wal_level=logical upstream (a database each).

In each mode:
  - each publication of partitions streams, message by message, what a native pgoutput slot of
    the same publications streams on the same upstream: publishing partitions as themselves (FOR
    TABLE the root, FOR TABLE partitions, FOR ALL TABLES, IN SCHEMA) and via the root
    (publish_via_partition_root: FOR TABLE the root, FOR ALL TABLES, with a column list and a
    row filter on the root, a sub-level root), alone and several in one stream. The workload:
    writes through the root and straight into partitions, a default partition, a partition
    with its own column order and a dropped column, two levels of partitioning, UPDATEs that
    move rows between partitions, a partition created, one attached and one detached (and one
    detached CONCURRENTLY) after the streams began, TRUNCATE of one partition and of the root,
    a column added to the root and one renamed. Native capture's streams are compared with
    their LSNs, xids and commit times; trigger capture numbers its own (README), so its
    streams are compared without them, transaction boundaries kept;
  - 8 writers for 20 s move rows between partitions; the stream replayed equals the table, and
    PostgreSQL's own subscriber ends equal to it through a publication of the partitions and
    through one via the root (into a table that is not partitioned);
  - kill -9 of pgrelay during an ATTACH PARTITION while a writer runs: after the restart the
    streams (of the partitions, and via the root) still equal a native slot's;
  - a plain publication streams in the same pgrelay.
"""

import os
import random
import select
import threading
import time

import psycopg2

from e2e_support import CheckFailed, Env, expect, expect_eq, main, query_url, run_capture_modes, wait_until
from pgoutput_decode import decode_message
from pgoutput_diff import Stream, compared, first_difference, mark, native_view, replication, transactions

LOGICAL_CONF = "wal_level = logical\nmax_replication_slots = 40\nmax_wal_senders = 40\n"
SCHEMA = """
CREATE TABLE m (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu');
CREATE TABLE m_us (v text, gone int, region text NOT NULL, id int NOT NULL);
ALTER TABLE m_us DROP COLUMN gone;
ALTER TABLE m ATTACH PARTITION m_us FOR VALUES IN ('us');
CREATE TABLE m_asia PARTITION OF m FOR VALUES IN ('jp', 'kr') PARTITION BY LIST (region);
CREATE TABLE m_jp PARTITION OF m_asia FOR VALUES IN ('jp');
CREATE TABLE m_kr PARTITION OF m_asia FOR VALUES IN ('kr');
CREATE TABLE m_rest PARTITION OF m DEFAULT;
CREATE TABLE r (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
CREATE TABLE r_1 PARTITION OF r FOR VALUES FROM (0) TO (100);
CREATE TABLE r_2 PARTITION OF r FOR VALUES FROM (100) TO (200);
CREATE TABLE plain (id int PRIMARY KEY, v text);
CREATE TABLE m_it (id int NOT NULL, region text NOT NULL, v text);
INSERT INTO m_it SELECT g, 'it', 'before attach' FROM generate_series(1000, 1099) g;
CREATE PUBLICATION leafpub FOR TABLE m, r;
CREATE PUBLICATION partpub FOR TABLE m_eu, m_jp;
CREATE PUBLICATION allpub FOR ALL TABLES;
CREATE PUBLICATION schemapub FOR TABLES IN SCHEMA public;
CREATE PUBLICATION rootpub FOR TABLE m WITH (publish_via_partition_root = true);
CREATE PUBLICATION rootallpub FOR ALL TABLES WITH (publish_via_partition_root = true);
CREATE PUBLICATION rootfiltpub FOR TABLE m (id, region) WHERE (id < 12), r
  WITH (publish_via_partition_root = true);
CREATE PUBLICATION asiarootpub FOR TABLE m_asia WITH (publish_via_partition_root = true);
CREATE PUBLICATION plainpub FOR TABLE plain;
CREATE PUBLICATION mvpub FOR TABLE mv;
CREATE PUBLICATION mvrootpub FOR TABLE mv WITH (publish_via_partition_root = true);
"""
MV_SCHEMA = """
CREATE TABLE mv (id int, region text, n int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE mv_a PARTITION OF mv FOR VALUES IN ('a');
CREATE TABLE mv_b PARTITION OF mv FOR VALUES IN ('b');
CREATE TABLE mv_c PARTITION OF mv FOR VALUES IN ('c');
CREATE TABLE mv_rest PARTITION OF mv DEFAULT;
"""
# Both captures stream these (publication_names), each with a slot of its own.
STREAMED = ["leafpub", "partpub", "allpub", "schemapub", "rootpub", "rootallpub", "rootfiltpub",
            "leafpub,rootpub", "partpub,asiarootpub"]
# What the changes of some streams are sent as: the roots, where a publication publishes via them.
SENT_AS = {
    "rootpub": {"m"},
    "rootfiltpub": {"m", "r"},
    "partpub,asiarootpub": {"m_eu", "m_asia"},
    "leafpub": {"m_eu", "m_us", "m_jp", "m_kr", "m_rest", "m_fr", "m_de", "r_1", "r_2"},
}
# Every kind of change a stream of a partitioned table must carry; each statement commits alone.
WORKLOAD = [
    "INSERT INTO m VALUES (1, 'eu', 'root'), (2, 'us', 'root'), (3, 'jp', 'root'), (4, 'kr', 'root'),"
    " (5, 'xx', 'root, default')",
    "INSERT INTO m_eu VALUES (6, 'eu', 'direct')",
    "INSERT INTO m_us (id, region, v) VALUES (7, 'us', 'direct, other column order')",
    "INSERT INTO m_jp VALUES (8, 'jp', 'direct, second level')",
    "INSERT INTO r VALUES (1, 'r1'), (150, 'r2')",
    "BEGIN; UPDATE m SET v = 'updated' WHERE id IN (1, 2, 3); UPDATE m_rest SET v = 'updated' WHERE id = 5; COMMIT",
    "UPDATE m SET region = 'us' WHERE id = 1",          # eu -> us
    "UPDATE m SET region = 'zz' WHERE id = 2",          # us -> default
    "UPDATE m SET region = 'kr' WHERE id = 3",          # jp -> kr, inside m_asia
    "UPDATE m SET region = 'eu' WHERE id = 5",          # default -> eu
    "UPDATE r SET id = 120 WHERE id = 1",               # r_1 -> r_2
    "DELETE FROM m WHERE id = 4",
    "DELETE FROM m_eu WHERE id = 6",
    "CREATE TABLE m_fr PARTITION OF m FOR VALUES IN ('fr')",
    "INSERT INTO m VALUES (9, 'fr', 'new partition')",
    "CREATE TABLE m_de (id int NOT NULL, region text NOT NULL, v text)",
    "INSERT INTO m_de VALUES (10, 'de', 'before attach')",
    "ALTER TABLE m ATTACH PARTITION m_de FOR VALUES IN ('de')",
    "INSERT INTO m VALUES (11, 'de', 'attached')",
    "UPDATE m SET v = 'attached, updated' WHERE id = 10",
    "ALTER TABLE m DETACH PARTITION m_fr",
    "INSERT INTO m_fr VALUES (12, 'fr', 'detached')",
    "ALTER TABLE r DETACH PARTITION r_2 CONCURRENTLY",
    "INSERT INTO r_2 VALUES (199, 'detached concurrently')",
    "INSERT INTO r VALUES (2, 'r1 again')",
    "INSERT INTO plain VALUES (1, 'plain')",
    "TRUNCATE m_eu",
    "TRUNCATE m",
    "INSERT INTO m VALUES (13, 'us', 'after truncate'), (14, 'kr', 'after truncate')",
    "BEGIN; ALTER TABLE m ADD COLUMN note text; ALTER TABLE m_it ADD COLUMN note text; COMMIT",
    "INSERT INTO m VALUES (15, 'eu', 'with a note', 'n1'), (16, 'jp', 'with a note', 'n2')",
    "UPDATE m SET note = 'noted', region = 'us' WHERE id = 15",
    # A stream via the root sends the root's columns in the root's order, read again here.
    "BEGIN; ALTER TABLE m RENAME COLUMN v TO val; ALTER TABLE m_it RENAME COLUMN v TO val; COMMIT",
    "INSERT INTO m VALUES (17, 'kr', 'renamed', 'n3')",
    "UPDATE m SET val = 'renamed too' WHERE id = 16",
]
DONE = "partitions-done"
def read_until_done(url, slot, publication, timeout=120):
    """Every pgoutput message of the slot, through the transactional message DONE."""
    stream = Stream(url, slot, publication)
    try:
        return stream.read_until(DONE, timeout)
    finally:
        stream.close()


class Mode:
    def __init__(self, env, name):
        self.env = env
        self.name = name
        self.db = "part_%s" % name
        self.relay = None
        self.subscriber = None

    def query(self, sql, args=None):
        return self.env.db_query(self.db, sql, args)

    def mark(self, prefix, content=""):
        conn = psycopg2.connect(self.env.upstream_url(self.db))
        conn.autocommit = True
        try:
            mark(self.name, conn.cursor(), prefix, content)
        finally:
            conn.close()

    def run(self):
        env, n = self.env, self.name

        def setup():
            env.psql_admin("CREATE DATABASE %s" % self.db, db="postgres")
            self.query(MV_SCHEMA + SCHEMA)
            self.relay = env.start_relay(data_dir=os.path.join(env.base, "relay-%s" % n),
                                         upstream=env.upstream_url(self.db),
                                         extra_args=["--no-tls", "--capture", n, "--max-replication-slots", "30"])

        env.check("%s: pgrelay serve starts beside partitioned tables with default partitions" % n, setup)
        self.catalog_answers()
        self.equals_a_native_slot()
        try:
            self.writers_move_rows()
        finally:
            if self.subscriber:
                self.subscriber.cleanup()
        self.killed_during_attach()
        self.plain_streams()

    def catalog_answers(self):
        """What subscribers read of the publications (PostgreSQL 15's table sync reads
        pg_publication_tables; 16's also pg_get_publication_tables) is Postgres's answer through
        pgrelay, less pgrelay's own schema."""
        pubs = sorted({p for names in STREAMED for p in names.split(",")} | {"mvpub", "mvrootpub"})
        tables = ("SELECT pubname, schemaname, tablename, attnames::text, rowfilter "
                  "FROM pg_publication_tables WHERE pubname = ANY (%s) AND schemaname <> '_pgrelay' "
                  "ORDER BY 1, 2, 3")
        functions = ("SELECT p.pubname, t.relid::regclass::text, t.attrs::text, "
                     "pg_get_expr(t.qual, t.relid) FROM pg_publication p, "
                     "pg_get_publication_tables(p.pubname) t WHERE p.pubname = ANY (%s) "
                     "AND t.relid::regclass::text NOT LIKE '\\_pgrelay.%%' ORDER BY 1, 2")

        def same():
            for sql in (tables, functions):
                ours = query_url(self.relay.url, sql, (pubs,))
                theirs = self.query(sql, (pubs,))
                expect(ours == theirs and len(theirs) > 20, "through pgrelay as from the upstream: " + sql[:60],
                       got=(len(ours), len(theirs), sorted(set(map(tuple, ours)) ^ set(map(tuple, theirs)))[:5]))
            roots = [r[2] for r in query_url(self.relay.url, tables, (["rootpub"],))]
            expect_eq(roots, ["m"], "rootpub's table through pgrelay is the root")

        self.env.check("%s: pg_publication_tables and pg_get_publication_tables answer through pgrelay as from "
                       "the upstream, for publications of partitions and via the root" % self.name, same)

    def equals_a_native_slot(self):
        env = self.env
        upstream = env.upstream_url(self.db)
        streams = {}

        def stream():
            for i, pub in enumerate(STREAMED):
                for url in (self.relay.url, upstream):
                    conn = replication(url)
                    try:
                        conn.cursor().create_replication_slot("diff_%s_%d" % (self.name, i),
                                                              output_plugin="pgoutput")
                    finally:
                        conn.close()
            live = [Stream(url, "diff_%s_%d" % (self.name, i), pub) for i, pub in enumerate(STREAMED)
                    for url in (self.relay.url, upstream)]
            conn = psycopg2.connect(upstream)
            conn.autocommit = True  # DETACH ... CONCURRENTLY runs outside a transaction block
            try:
                cur = conn.cursor()
                for i, sql in enumerate(WORKLOAD):
                    cur.execute(sql)
                    # A stream reads a publication's tables as they are when it reaches the change
                    # of them (README), which is exact for a consumer that keeps up: each stream
                    # reads through each statement before the next runs.
                    mark(self.name, cur, "step-%d" % i)
                    for stream in live:
                        stream.read_until("step-%d" % i)
                mark(self.name, cur, DONE, "end")
            finally:
                conn.close()
            for i, pub in enumerate(STREAMED):
                streams[pub] = (live[2 * i].read_until(DONE), live[2 * i + 1].read_until(DONE))
            for stream in live:
                stream.close()
            # The upstream's slots are the cluster's: they would pin WAL through the other mode.
            self.query("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                       "WHERE slot_name LIKE %s", ("diff\\_%s\\_%%" % self.name,))

        env.check("%s: the workload over partitioned tables runs with slots of pgrelay and of the "
                  "upstream on %s" % (self.name, "; ".join(STREAMED)), stream)
        for pub in STREAMED:
            def same(pub=pub):
                (a, whole_a), (b, whole_b) = (compared(self.name, streams[pub][0]),
                                              compared(self.name, native_view(streams[pub][1])))
                expect(a == b, "%s: pgrelay's changes equal the native slot's" % pub, got=first_difference(a, b))
                expect(whole_a == whole_b, "%s: and so do the transactions%s" % (
                    pub, ", LSNs and xids included" if self.name == "native" else ""),
                    got=first_difference(whole_a, whole_b))
                a = whole_a
                tags = [m["tag"] for m in a]
                expect(all(t in tags for t in "IUDT"), "%s carries inserts, updates, deletes and truncates" % pub,
                       got=tags)
                sent_as = {m["relid"]["name"] for m in a if m["tag"] in ("I", "U", "D")}
                if pub in SENT_AS:
                    expect(sent_as == SENT_AS[pub], "%s sends the changes as these tables" % pub, got=sent_as)

            env.check("%s: %s streams through pgrelay message by message as from a native slot"
                      % (self.name, pub), same)

    def writers_move_rows(self):
        env = self.env
        upstream = env.upstream_url(self.db)

        def replayed():
            conn = replication(self.relay.url)
            try:
                conn.cursor().create_replication_slot("movers", output_plugin="pgoutput")
            finally:
                conn.close()
            # PostgreSQL's own subscriber, on a second cluster with the same partitions: its
            # table sync copies each partition, then its apply worker follows the writers.
            sub = Env(env.pgrelay, env.name + "/subscriber")
            self.subscriber = sub
            sub.start_postgres("max_logical_replication_workers = 8\nmax_sync_workers_per_subscription = 4\n"
                               "wal_retrieve_retry_interval = '1s'\n")
            sub.psql_admin("CREATE DATABASE sub", db="postgres")
            sub_url = sub.upstream_url("sub")
            query_url(sub_url, MV_SCHEMA)
            query_url(sub_url, "CREATE SUBSCRIPTION movers_sub CONNECTION '%s' PUBLICATION mvpub" % self.relay.url)
            wait_until(lambda: query_url(sub_url, "SELECT count(*) = 4 AND bool_and(srsubstate = 'r') "
                                                  "FROM pg_subscription_rel")[0][0],
                       120, "the subscriber's table sync of mv's 4 partitions")
            # And through a publication via the root, into a table that is not partitioned: the
            # table sync copies mv whole, and every change comes as mv's.
            sub.psql_admin("CREATE DATABASE subroot", db="postgres")
            root_url = sub.upstream_url("subroot")
            query_url(root_url, "CREATE TABLE mv (id int, region text, n int, PRIMARY KEY (id, region))")
            query_url(root_url, "CREATE SUBSCRIPTION movers_root_sub CONNECTION '%s' PUBLICATION mvrootpub"
                      % self.relay.url)
            wait_until(lambda: query_url(root_url, "SELECT count(*) = 1 AND bool_and(srsubstate = 'r') "
                                                   "FROM pg_subscription_rel")[0][0],
                       120, "the via-root subscriber's table sync of mv")
            stop = time.monotonic() + 20
            failures = []

            def writer(w):
                rng = random.Random(w)
                c = psycopg2.connect(upstream)
                c.autocommit = True
                cur = c.cursor()
                ids = []
                try:
                    while time.monotonic() < stop:
                        op = rng.random()
                        if op < 0.4 or not ids:
                            new = w * 1000000 + len(ids) + 1
                            cur.execute("INSERT INTO mv VALUES (%s, %s, 0)", (new, rng.choice("abcdz")))
                            ids.append(new)
                        elif op < 0.7:
                            cur.execute("UPDATE mv SET region = %s, n = n + 1 WHERE id = %s",
                                        (rng.choice("abcdz"), rng.choice(ids)))
                        elif op < 0.9:
                            cur.execute("UPDATE mv SET n = n + 1 WHERE id = %s", (rng.choice(ids),))
                        else:
                            cur.execute("DELETE FROM mv WHERE id = %s", (rng.choice(ids),))
                        # At most ~100 statements a second each: the check reads every change
                        # back through Python, which unthrottled writers outrun ~10x.
                        time.sleep(0.01)
                except Exception as e:  # reported below, with the writer
                    failures.append("writer %d: %s" % (w, e))
                finally:
                    c.close()

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            expect_eq(failures, [], "the writers' errors")
            self.mark(DONE, "end")
            messages = read_until_done(self.relay.url, "movers", "mvpub", timeout=300)
            columns, state, moves = {}, {}, 0
            for m in messages:
                if m["tag"] == "R":
                    columns[m["oid"]] = [c["name"] for c in m["columns"]]
                    continue
                if m["tag"] not in ("I", "U", "D"):
                    continue
                names = columns[m["relid"]]

                def row(t):
                    return dict(zip(names, t))
                if m["tag"] in ("U", "D") and m["old"] is not None:
                    old = row(m["old"])
                    state.pop((old["id"], old["region"]), None)
                if m["tag"] == "D":
                    moves += 1
                if m["tag"] in ("I", "U"):
                    new = row(m["new"])
                    state[(new["id"], new["region"])] = new["n"]
            rows = self.query("SELECT id::text, region, n::text FROM mv")
            expected = {(i, region): n for i, region, n in rows}
            expect(len(expected) > 1000, "the writers left more than 1,000 rows", got=len(expected))
            expect(state == expected, "the stream replayed equals mv (%d rows; %d deletes, row moves included)"
                   % (len(expected), moves),
                   got=sorted(set(state.items()) ^ set(expected.items()))[:10])
            self.subscriber_equals(sub_url, "SELECT tableoid::regclass::text, id::text, region, n::text "
                                   "FROM mv ORDER BY 2, 3", "PostgreSQL's subscriber has mv exactly, partition by "
                                   "partition")
            self.subscriber_equals(root_url, "SELECT id::text, region, n::text FROM mv ORDER BY 1, 2",
                                   "PostgreSQL's subscriber of mvrootpub has mv exactly, in one table")

        env.check("%s: 8 writers for 20 s moving rows between partitions; the stream replayed, and "
                  "PostgreSQL's own subscriber (of the partitions, and via the root into one table), "
                  "equal the table" % self.name, replayed)

    def subscriber_equals(self, url, sql, what):
        """Waits until `sql` answers on the subscriber at `url` what it answers upstream."""
        want = self.query(sql)
        seen = {}

        def caught_up():
            seen["rows"] = query_url(url, sql)
            return seen["rows"] == want
        try:
            wait_until(caught_up, 120, what)
        except CheckFailed:
            got = set(map(tuple, seen.get("rows", [])))
            expect(False, what, got=sorted(got ^ set(map(tuple, want)))[:10])

    def killed_during_attach(self):
        env = self.env
        upstream = env.upstream_url(self.db)

        def crash():
            for url in (self.relay.url, upstream):
                conn = replication(url)
                try:
                    for slot in ("attach", "attach_root"):
                        conn.cursor().create_replication_slot("%s_%s" % (slot, self.name), output_plugin="pgoutput")
                finally:
                    conn.close()
            stop = threading.Event()
            failures = []

            def writer():
                c = psycopg2.connect(upstream)
                c.autocommit = True
                try:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        c.cursor().execute("INSERT INTO m VALUES (%s, %s, 'writer')",
                                           (2000 + i, ("eu", "us", "jp", "zz")[i % 4]))
                except Exception as e:  # reported below
                    failures.append(str(e))
                finally:
                    c.close()

            def attach():
                try:
                    env.db_query(self.db, "ALTER TABLE m ATTACH PARTITION m_it FOR VALUES IN ('it')")
                except Exception as e:  # reported below
                    failures.append("ATTACH: %s" % e)

            w = threading.Thread(target=writer)
            w.start()
            time.sleep(1.0)
            a = threading.Thread(target=attach)
            a.start()
            time.sleep(random.Random(7).uniform(0.0, 0.05))
            self.relay.kill_if_running()
            a.join()
            self.query("INSERT INTO m VALUES (3000, 'it', 'attached while pgrelay was down')")
            time.sleep(0.5)
            self.relay = env.start_relay(data_dir=self.relay.data_dir, upstream=upstream,
                                         extra_args=["--no-tls", "--capture", self.name,
                                                     "--max-replication-slots", "30"])
            self.query("INSERT INTO m VALUES (3001, 'it', 'after the restart')")
            time.sleep(1.0)
            stop.set()
            w.join()
            expect_eq(failures, [], "the writer's and the ATTACH's errors")
            self.mark(DONE, "end")
            for slot, pub in (("attach_%s" % self.name, "leafpub"), ("attach_root_%s" % self.name, "rootpub")):
                (a, whole_a), (b, whole_b) = (compared(self.name, read_until_done(self.relay.url, slot, pub)),
                                              compared(self.name, native_view(read_until_done(upstream, slot, pub))))
                if self.name == "trigger":
                    # Writers ran concurrently with the INSERTs made while pgrelay was down.
                    a, b = transactions(whole_a), transactions(whole_b)
                    expect(a == b, "%s: after kill -9 during ATTACH, pgrelay's transactions equal the native "
                           "slot's (in the order of their last writes)" % pub, got=first_difference(a, b))
                else:
                    expect(a == b, "%s: after kill -9 during ATTACH, pgrelay's changes equal the native slot's"
                           % pub, got=first_difference(a, b))
                    expect(whole_a == whole_b, "%s: and so do the transactions" % pub,
                           got=first_difference(whole_a, whole_b))
                a = whole_a
                inserted = [m["new"][0] for m in a if m["tag"] == "I"]
                expect("3000" in inserted and "3001" in inserted and len(inserted) > 20,
                       "%s: the attached partition's rows and the writer's are in the stream" % pub,
                       got=inserted[-5:])

        env.check("%s: kill -9 of pgrelay during an ATTACH PARTITION while a writer runs; after the "
                  "restart the streams of leafpub and of rootpub (via the root) equal a native slot's"
                  % self.name, crash)

    def plain_streams(self):
        n = self.name

        def plain():
            conn = replication(self.relay.url)
            try:
                cur = conn.cursor()
                cur.create_replication_slot("plain_%s" % n, output_plugin="pgoutput")
                cur.start_replication(slot_name="plain_%s" % n, decode=False,
                                      options={"proto_version": "1", "publication_names": "plainpub"})
                self.query("INSERT INTO plain VALUES (101, 'one'), (102, 'two')")
                self.query("INSERT INTO m VALUES (100, 'eu', 'not in plainpub')")
                ids, deadline = [], time.monotonic() + 60
                while len(ids) < 2 and time.monotonic() < deadline:
                    msg = cur.read_message()
                    if msg is None:
                        select.select([cur], [], [], 0.2)
                        continue
                    m = decode_message(msg.payload)
                    if m["tag"] == "I":
                        ids.append(m["new"][0])
                expect_eq(ids, ["101", "102"], "the plain table's rows through plainpub")
            finally:
                conn.close()

        self.env.check("%s: a publication of the plain table streams in the same pgrelay" % n, plain)


def body(env):
    run_capture_modes(env, Mode, LOGICAL_CONF)


if __name__ == "__main__":
    main("partitions", body)
