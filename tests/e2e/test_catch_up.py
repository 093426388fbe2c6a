# Consumers that catch up across publication changes, in both capture modes: sent what a native slot sends, judged by the publications as they stood then.
"""A consumer behind ALTER PUBLICATION, through `pgrelay serve`, against native slots.

Postgres decodes each change with the catalog of its time, so a consumer that connects after
its publications changed is sent the changes each version of them published. In each capture
mode, on one wal_level=logical upstream (a database each), with pgrelay's slots and native slots
made before the workload and read only after it:
  - tables added to and dropped from a publication with rows written in between, a row filter
    and a column list set and changed, publish actions narrowed and widened, two changes in one
    transaction with a row between them, a TABLES IN SCHEMA publication and a table moved into
    its schema, a publication dropped: every stream (each publication alone, and two in one
    stream) equals the native slot's, message by message, the dropped one's ending with
    Postgres's error;
  - a slot made halfway, between two publication changes, starts there with the publications
    then in force;
  - pgrelay killed with -9 before any consumer connects: the catalogs come from its log.
"""

import os

import psycopg2

from e2e_support import main, run_capture_modes, with_db
from pgoutput_diff import Stream, compared, first_difference, mark, native_view, replication

LOGICAL_CONF = "wal_level = logical\nmax_replication_slots = 30\nmax_wal_senders = 30\n"
SCHEMA = """
CREATE TABLE x (id int PRIMARY KEY, v text, w text);
CREATE TABLE y (id int PRIMARY KEY, v text);
CREATE TABLE z (id int PRIMARY KEY, v text);
CREATE SCHEMA s;
CREATE TABLE s.t (id int PRIMARY KEY, v text);
CREATE PUBLICATION p FOR TABLE y;
CREATE PUBLICATION q FOR TABLES IN SCHEMA s;
CREATE PUBLICATION vanish FOR TABLE y;
"""
# HALFWAY: the halfway slot is made there.
WORKLOAD = [
    "INSERT INTO x VALUES (1, 'before add', 'w'); INSERT INTO y VALUES (1, 'y')",
    "ALTER PUBLICATION p ADD TABLE x",
    "INSERT INTO x VALUES (2, 'added', 'w')",
    "UPDATE y SET v = 'y2' WHERE id = 1",
    "ALTER PUBLICATION p DROP TABLE x",
    "INSERT INTO x VALUES (3, 'dropped again', 'w')",
    "HALFWAY",
    "ALTER PUBLICATION p SET TABLE y WHERE (id > 10), x (id, v)",
    "INSERT INTO y VALUES (5, 'filtered out'), (15, 'filtered in')",
    "INSERT INTO x VALUES (4, 'column list', 'not sent')",
    "UPDATE y SET id = 6 WHERE id = 15",
    "ALTER PUBLICATION p SET TABLE y, x",
    "UPDATE y SET id = 16 WHERE id = 5",
    "BEGIN; ALTER PUBLICATION p DROP TABLE x; INSERT INTO x VALUES (5, 'between two', 'w');"
    " ALTER PUBLICATION p ADD TABLE x; INSERT INTO x VALUES (6, 'after both', 'w'); COMMIT",
    "ALTER PUBLICATION p SET (publish = 'insert')",
    "UPDATE x SET v = 'not an insert' WHERE id = 6; DELETE FROM y WHERE id = 16;"
    " INSERT INTO y VALUES (20, 'insert')",
    "ALTER PUBLICATION p SET (publish = 'insert, update, delete, truncate')",
    "UPDATE x SET v = 'update again' WHERE id = 6",
    "INSERT INTO s.t VALUES (1, 't'); INSERT INTO z VALUES (1, 'z')",
    "ALTER TABLE z SET SCHEMA s",
    "INSERT INTO s.z VALUES (2, 'moved into s')",
    "ALTER PUBLICATION q DROP TABLES IN SCHEMA s",
    "INSERT INTO s.t VALUES (2, 'schema dropped')",
    "ALTER PUBLICATION q ADD TABLES IN SCHEMA s",
    "INSERT INTO s.t VALUES (3, 'schema back'); TRUNCATE y",
]
STREAMS = ["p", "q", "p,q", "vanish"]
DONE = "catch-up-done"


def read(stream):
    """The stream's messages through DONE, or up to the error that ended it, then as
    {"tag": "error", ...}: Postgres ends a stream whose publication is gone at its next change."""
    try:
        return stream.read_until(DONE)
    except psycopg2.Error as e:
        return stream.messages + [{"tag": "error", "sqlstate": e.pgcode,
                                   "message": e.diag.message_primary if e.diag else str(e)}]


class Mode:
    def __init__(self, env, name):
        self.env, self.name = env, name
        self.db = "catch_%s" % name
        self.relay = None

    def connect(self):
        conn = psycopg2.connect(self.env.upstream_url(self.db))
        conn.autocommit = True
        return conn

    def create_slots(self, slot):
        for url in (with_db(self.relay.url, self.db), self.env.upstream_url(self.db)):
            c = replication(url)
            try:
                c.cursor().create_replication_slot(slot, output_plugin="pgoutput")
            finally:
                c.close()

    def run(self):
        env, n = self.env, self.name
        relay_dir = os.path.join(env.base, "relay-%s" % n)
        args = ["--no-tls", "--capture", n, "--max-replication-slots", "20"]

        def setup():
            env.psql_admin("CREATE DATABASE %s" % self.db, db="postgres")
            env.db_query(self.db, SCHEMA)
            self.relay = env.start_relay(data_dir=relay_dir, upstream=env.upstream_url(self.db), extra_args=args)
            for i in range(len(STREAMS)):
                self.create_slots("lag_%s_%d" % (n, i))

        env.check("%s: pgrelay serve starts, slots made before the workload" % n, setup)
        if self.relay is None:
            return

        def workload():
            conn = self.connect()
            try:
                cur = conn.cursor()
                for sql in WORKLOAD:
                    if sql == "HALFWAY":
                        self.create_slots("half_%s" % self.name)
                        continue
                    cur.execute(sql)
                # `vanish` is dropped: its stream ends with Postgres's error. (Postgres decodes
                # the row pgrelay's event trigger writes in that transaction as a change, and
                # fails there; pgrelay, which never logs its own rows, at the next change.)
                cur.execute("DROP PUBLICATION vanish")
                cur.execute("INSERT INTO y VALUES (30, 'after the drop')")
                mark(n, cur, DONE, "end")
            finally:
                conn.close()

        env.check("%s: the workload changes the publications %d times with no consumer connected"
                  % (n, sum(s.count("ALTER PUBLICATION") for s in WORKLOAD)), workload)

        def killed():
            self.relay.proc.kill()
            self.relay.proc.wait()
            env.relays.remove(self.relay)
            self.relay = env.start_relay(data_dir=relay_dir, upstream=env.upstream_url(self.db), extra_args=args)

        env.check("%s: pgrelay killed with -9 and started again before any consumer connects" % n, killed)
        ours_url = with_db(self.relay.url, self.db)
        slots = [("lag_%s_%d" % (n, i), pub) for i, pub in enumerate(STREAMS)] + [("half_%s" % n, "p")]
        for slot, pub in slots:
            def same(slot=slot, pub=pub):
                ours = Stream(ours_url, slot, pub)
                theirs = Stream(env.upstream_url(self.db), slot, pub)
                try:
                    (a, whole_a) = compared(n, read(ours))
                    (b, whole_b) = compared(n, native_view(read(theirs)))
                finally:
                    ours.close()
                    theirs.close()
                if not any(m["tag"] in ("I", "U", "D", "T") for m in b):
                    raise AssertionError("the native slot sent no change: the check proves nothing")
                if (pub == "vanish") != (b[-1]["tag"] == "error"):
                    raise AssertionError("the native slot's stream ended unexpectedly: %r" % b[-1])
                if a != b:
                    raise AssertionError("changes differ: %s" % first_difference(a, b))
                if whole_a != whole_b:
                    raise AssertionError("transactions differ: %s" % first_difference(whole_a, whole_b))

            what = "made halfway, between two publication changes," if slot.startswith("half") else "made before the workload"
            env.check("%s: a consumer of %s on a slot %s catches up with what a native slot sends" % (n, pub, what), same)


def body(env):
    run_capture_modes(env, Mode, LOGICAL_CONF)


if __name__ == "__main__":
    main("catch_up", body)
