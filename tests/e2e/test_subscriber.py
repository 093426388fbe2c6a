# PostgreSQL 15's own subscriber (CREATE SUBSCRIPTION on a second cluster) replicating through `pgrelay serve`.
"""A second PostgreSQL 15 cluster subscribes to pgrelay as it would to a publisher, in both modes.

Once with `--capture trigger` (upstream wal_level=replica) and once with `--capture native`
(upstream wal_level=logical), against the same subscriber cluster (one database per mode, and
one more for FOR ALL TABLES), the script checks: the initial copy of FOR TABLE, FOR TABLES IN
SCHEMA and FOR ALL TABLES publications (table-sync workers: USE_SNAPSHOT slots and COPY over the
replication connection) with TOASTed, NULL, numeric, timestamptz, jsonb, array, bytea and float
values; apply of 8 concurrent writers (the FOR TABLE subscription with binary = true, the others
in text) (inserts, conflicting updates of hot rows, deletes,
savepoints rolled back and released, TOAST values changed and unchanged, a keyless REPLICA
IDENTITY FULL table); the options streaming = on, two_phase = true (PREPARE / COMMIT PREPARED /
ROLLBACK PREPARED upstream) and disable_on_error = true; ALTER PUBLICATION ADD TABLE with
REFRESH PUBLICATION, DISABLE / ENABLE, DROP SUBSCRIPTION (its slot and every table-sync slot
gone from pgrelay); ALTER TABLE ADD COLUMN mid-stream; pgrelay stopped with SIGTERM and killed
with SIGKILL under load and restarted on the same data dir and port: the subscribers reconnect
by themselves and end identical, with no transaction applied twice (a primary-keyed ledger gets
one row per transaction, so a replay is a unique violation in the subscriber's log). Tables are
compared by a digest of their rows' text (TimeZone UTC on both sides).
"""
import collections
import os
import random
import re
import signal
import threading
import time

import psycopg2
import psycopg2.errors

from e2e_support import PASSWORD, SUPERUSER, CheckFailed, Env, expect, expect_eq, main, query_url, wait_until

LOGICAL_CONF = "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
UPSTREAM_CONF = "max_prepared_transactions = 10\n"
# The subscriber: workers for six subscriptions and their table syncs, a quick retry after a
# lost connection, room for the replication origins (counted against max_replication_slots).
SUBSCRIBER_CONF = ("max_worker_processes = 40\nmax_logical_replication_workers = 24\n"
                   "max_sync_workers_per_subscription = 2\nmax_replication_slots = 40\n"
                   "wal_retrieve_retry_interval = '1s'\nmax_prepared_transactions = 10\n")
RELAY_ARGS = ["--max-replication-slots", "40"]

WRITERS = 8
APPLY_SECONDS = 20
# A synced table turns ready ('r') once the apply worker's stream passes the sync's end. Against
# Postgres itself that waits for the next write upstream (its walsender reports only WAL it has
# decoded); pgrelay's keepalives carry the newest consistent point, so no write is needed.
SYNC_READY_SECONDS = 15
HOT_ITEMS = 10  # items 1..10 are updated by every writer
HOT_DOCS = 4    # app.docs 1..4 too

# Created identically upstream and in every subscriber database.
TABLES = """
CREATE SCHEMA app;
CREATE TABLE items (id int PRIMARY KEY, label text NOT NULL, qty int, price numeric(12,2), updated timestamptz);
CREATE TABLE kinds (id int PRIMARY KEY, t text, n numeric, ts timestamptz, j jsonb, arr int[], b bytea, big text,
                    f float8, iv interval, d date, flag boolean, u uuid);
CREATE TABLE ledger (wid int, seq int, at timestamptz, PRIMARY KEY (wid, seq));
CREATE TABLE nokey (wid int, i int, v text, pad text);
CREATE TABLE marker (id int PRIMARY KEY, at timestamptz);
CREATE TABLE app.docs (id int PRIMARY KEY, title text, body text, rev int, hits int);
CREATE TABLE app.events (id int PRIMARY KEY, wid int, ts timestamptz, amount numeric(18,4), payload jsonb,
                         tags text[], raw bytea);
CREATE TABLE app.marker (id int PRIMARY KEY, at timestamptz);
CREATE TABLE opt_big (id int PRIMARY KEY, v text, n int);
CREATE TABLE opt_2pc (id int PRIMARY KEY, v text);
CREATE TABLE opt_doe (id int PRIMARY KEY, v text);
"""
PUBLICATIONS = """
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE PUBLICATION pub_tables FOR TABLE items, kinds, ledger, nokey, marker;
CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA app;
CREATE PUBLICATION pub_stream FOR TABLE opt_big;
CREATE PUBLICATION pub_2pc FOR TABLE opt_2pc;
CREATE PUBLICATION pub_doe FOR TABLE opt_doe;
CREATE PUBLICATION pub_all FOR ALL TABLES;
"""


def big_text(seed, blocks=320):
    """SQL for an incompressible text of 32*blocks characters (10 kB by default): stored out of line."""
    return "(SELECT string_agg(md5('%s' || g::text), '') FROM generate_series(1, %d) g)" % (seed, blocks)


SEED = """
INSERT INTO items SELECT g, 'item ' || g, g %% 7, g * 1.25,
  '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 minute' FROM generate_series(1, 2000) g;
INSERT INTO kinds VALUES
  (1, 'toasted', 12345678901234567890.123456789, '2026-03-04 05:06:07.123456+02',
   '{"a": [1, 2, {"b": null}], "c": "\\u00e9"}', '{1,NULL,3}', '\\x00ff10', %(big1)s, 1.5, '1 day 02:03:04',
   '2026-02-28', true, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'),
  (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (3, E'quote '' dq " backslash \\\\ tab \\t newline \\n unicode \u00e9\u4e2d', 'NaN', 'infinity', '[]', '{}',
   '\\x', '', -0.0, '-1 mons', 'infinity', false, NULL),
  (4, 'compressible', -0.000001, '1999-12-31 23:59:59.999999-11', '{"k": "v", "n": 1.50}', '{-2147483648,2147483647}',
   decode(repeat('ab', 5000), 'hex'), repeat('x', 100000), 1e-300, '0', '0001-01-01', NULL, NULL),
  (5, 'big json', 7, now(), (SELECT jsonb_agg(g) FROM generate_series(1, 3000) g), ARRAY[5], NULL, %(big5)s,
   'Infinity', NULL, NULL, true, NULL);
INSERT INTO ledger SELECT 0, g, now() FROM generate_series(1, 100) g;
INSERT INTO nokey SELECT 0, g, 'seed ' || g, CASE WHEN g %% 50 = 0 THEN %(bigpad)s END FROM generate_series(1, 300) g;
INSERT INTO nokey VALUES (0, 301, NULL, NULL), (0, 301, NULL, NULL);
INSERT INTO marker VALUES (0, now());
INSERT INTO app.docs SELECT g, 'doc ' || g, CASE WHEN g %% 3 <> 0 THEN %(bigdoc)s END, 1, 0
  FROM generate_series(1, 30) g;
INSERT INTO app.events SELECT g, 0, now(), g / 3.0, jsonb_build_object('g', g, 'txt', 'e' || g), ARRAY['a', 'b' || g],
  decode(md5(g::text), 'hex') FROM generate_series(1, 2000) g;
INSERT INTO app.marker VALUES (0, now());
INSERT INTO opt_big SELECT g, 'seed ' || g, g FROM generate_series(1, 100) g;
INSERT INTO opt_2pc VALUES (1, 'seed'), (2, 'seed');
INSERT INTO opt_doe VALUES (1, 'seed');
""" % {"big1": big_text("k1"), "big5": big_text("k5", 400), "bigpad": big_text("pad"), "bigdoc": big_text("doc")}

MAIN_TABLES = ["items", "kinds", "ledger", "nokey", "marker"]
SCHEMA_TABLES = ["app.docs", "app.events", "app.marker"]
ALL_TABLES = MAIN_TABLES + SCHEMA_TABLES + ["opt_big", "opt_2pc", "opt_doe"]


def qualified(table):
    return table if "." in table else "public." + table


# ---- connections and digests ----

CONNECT_ARGS = dict(host="127.0.0.1", user=SUPERUSER, password=PASSWORD, sslmode="disable",
                    options="-c TimeZone=UTC -c extra_float_digits=1")


def connect(port, db, autocommit=True):
    conn = psycopg2.connect(port=port, dbname=db, **CONNECT_ARGS)
    conn.autocommit = autocommit
    return conn


def query(port, db, sql, args=None):
    return query_url("", sql, args, port=port, dbname=db, **CONNECT_ARGS)


DIGEST = "SELECT count(*), md5(coalesce(string_agg(md5(t::text), ',' ORDER BY md5(t::text)), '')) FROM %s t"


def digests(port, db, tables):
    conn = connect(port, db)
    try:
        out = {}
        with conn.cursor() as cur:
            for t in tables:
                cur.execute(DIGEST % t)
                out[t] = cur.fetchone()
        return out
    finally:
        conn.close()


def row_texts(port, db, table):
    return collections.Counter(r[0] for r in query(port, db, "SELECT t::text FROM %s t" % table))


def describe_differences(up_port, sub_port, db, tables):
    """For each table that differs: row counts and the first rows missing or extra on the subscriber."""
    lines = []
    for t in tables:
        up, sub = row_texts(up_port, "e2e", t), row_texts(sub_port, db, t)
        if up == sub:
            continue
        missing, extra = up - sub, sub - up
        lines.append("%s: upstream %d rows, subscriber %d rows; %d missing on the subscriber, %d extra"
                     % (t, sum(up.values()), sum(sub.values()), sum(missing.values()), sum(extra.values())))
        for label, rows in (("missing", missing), ("extra", extra)):
            for row in sorted(rows)[:4]:
                lines.append("    %s: %s%s" % (label, row[:180], "..." if len(row) > 180 else ""))
    return lines


# ---- the subscriber cluster ----

class Subscriber:
    """The second PostgreSQL 15 cluster: an Env of its own, so its watchdog stops it however the test ends."""

    def __init__(self, pgrelay):
        self.env = Env(pgrelay, "subscriber")
        self.env.start_postgres(SUBSCRIBER_CONF)
        self.port = self.env.pg_port
        self.log_path = os.path.join(self.env.base, "postgres.log")

    def create_database(self, db):
        self.env.psql_admin("CREATE DATABASE %s" % db, db="postgres")

    def log_offset(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_since(self, offset):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def problems_since(self, offset, lines=25):
        """The subscriber log's ERROR/FATAL/WARNING lines (and the statement or context after them)."""
        text = self.log_since(offset).splitlines()
        keep = []
        for n, line in enumerate(text):
            if any(k in line for k in ("ERROR:", "FATAL:", "WARNING:", "PANIC:")):
                keep.append(line)
                if n + 1 < len(text) and ("CONTEXT:" in text[n + 1] or "DETAIL:" in text[n + 1]):
                    keep.append(text[n + 1])
        if not keep:
            return "    subscriber log: no ERROR/FATAL/WARNING lines"
        keep = keep[-lines:]
        return "    subscriber log (last %d problem lines of %s):\n" % (len(keep), self.log_path) + "\n".join(
            "      | " + l[:400] for l in keep)


# ---- writers ----

class Writer(threading.Thread):
    """One upstream connection committing mixed transactions until told to stop."""

    def __init__(self, up_port, wid, pace, flags):
        super().__init__(daemon=True)
        self.up_port, self.wid, self.pace, self.flags = up_port, wid, pace, flags
        self.stop_event = threading.Event()
        self.commits = 0
        self.retries = 0
        self.error = None
        self.rng = random.Random(wid)

    def run(self):
        try:
            conn = connect(self.up_port, "e2e", autocommit=False)
        except Exception as e:
            self.error = "connect: %r" % e
            return
        i = 0
        with conn.cursor() as cur:
            while not self.stop_event.is_set():
                i += 1
                try:
                    self.transaction(cur, i)
                    conn.commit()
                    self.commits += 1
                except (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure):
                    conn.rollback()
                    self.retries += 1
                except Exception as e:
                    self.error = "transaction %d of writer %d: %r" % (i, self.wid, e)
                    break
                time.sleep(self.pace)
        conn.close()

    def transaction(self, cur, i):
        w, rng = self.wid, self.rng
        own = w * 100000 + i
        note = self.flags.get("note")
        if note:
            cur.execute("INSERT INTO items (id, label, qty, price, updated, note) VALUES (%s, %s, %s, %s, now(), %s)",
                        (own, "w%d-%d" % (w, i), i % 9, "%d.%02d" % (i, w), "w%d" % w))
        else:
            cur.execute("INSERT INTO items VALUES (%s, %s, %s, %s, now())", (own, "w%d-%d" % (w, i), i % 9,
                                                                             "%d.%02d" % (i, w)))
        if i % 2 == 0:  # hot rows every writer updates, in ascending order (no deadlock)
            for hot in sorted(rng.sample(range(1, HOT_ITEMS + 1), 2)):
                cur.execute("UPDATE items SET qty = qty + 1, label = %s, updated = now() WHERE id = %s",
                            ("hot by w%d" % w, hot))
        if i > 3:
            cur.execute("UPDATE items SET qty = coalesce(qty, 0) * 2, price = price + 0.01 WHERE id = %s", (own - 3,))
            if note:
                cur.execute("UPDATE items SET note = %s WHERE id = %s", ("w%d upd %d" % (w, i), own - 3))
        if i % 4 == 0:
            cur.execute("DELETE FROM items WHERE id = %s", (own - 2,))
        # Savepoints: a rolled-back one leaves no trace, a released one stays.
        cur.execute("SAVEPOINT sp")
        cur.execute("INSERT INTO items VALUES (%s, 'rolled back', 0, 0, now())", (-own,))
        cur.execute("UPDATE items SET label = 'never' WHERE id = %s", (own,))
        cur.execute("INSERT INTO ledger VALUES (%s, %s, now())", (-w, i))
        cur.execute("ROLLBACK TO SAVEPOINT sp")
        if i % 3 == 0:
            cur.execute("SAVEPOINT sp2")
            cur.execute("UPDATE items SET label = label || ' (sp2)' WHERE id = %s", (own,))
            cur.execute("RELEASE SAVEPOINT sp2")
        # The keyless REPLICA IDENTITY FULL table; some rows carry a TOASTed pad the updates leave alone.
        cur.execute("INSERT INTO nokey VALUES (%s, %s, 'new', " + (big_text("p%d" % own) if i % 10 == 0 else "NULL")
                    + ")", (w, i))
        if i > 2:
            cur.execute("UPDATE nokey SET v = %s WHERE wid = %s AND i = %s", ("upd %d" % i, w, i - 2))
        if i % 10 == 3 and i > 10:
            cur.execute("UPDATE nokey SET v = 'pad kept' WHERE wid = %s AND i = %s", (w, i - 13))
        if i % 5 == 0:
            cur.execute("DELETE FROM nokey WHERE wid = %s AND i = %s", (w, i - 4))
        # TOAST: new big bodies on hot documents, and updates that leave the body unchanged.
        doc = rng.randint(1, HOT_DOCS)
        if i % 7 == 0:
            cur.execute("UPDATE app.docs SET body = " + big_text("d%d" % own) + ", rev = rev + 1 WHERE id = %s", (doc,))
        elif i % 3 == 0:
            cur.execute("UPDATE app.docs SET hits = hits + 1 WHERE id = %s", (doc,))
        if i % 11 == 0:
            cur.execute("INSERT INTO app.docs VALUES (%s, %s, " + big_text("n%d" % own) + ", 1, 0)", (own, "w%d" % w))
        if i % 22 == 0:
            cur.execute("DELETE FROM app.docs WHERE id = %s", (own - 11,))
        cur.execute("INSERT INTO app.events VALUES (%s, %s, now(), %s, %s, %s, %s)",
                    (own, w, "%d.%04d" % (i, rng.randint(0, 9999)), '{"w": %d, "i": %d, "s": "x\\"y"}' % (w, i),
                     ["t%d" % w, None, "q'%d" % i], psycopg2.Binary(bytes([w % 256, i % 256, 0, 255]))))
        if i % 13 == 0:
            cur.execute("UPDATE kinds SET n = n + 0.5, ts = now(), j = jsonb_set(coalesce(j, '{}'), '{w}', %s)"
                        " WHERE id = 1", (str(w),))
        # The ledger: one row per transaction, a replay is a unique violation on the subscriber.
        cur.execute("INSERT INTO ledger VALUES (%s, %s, now())", (w, i))


class Writers:
    def __init__(self, up_port, phase, n, pace=0.02):
        self.flags = {}
        self.threads = [Writer(up_port, phase * 100 + k, pace, self.flags) for k in range(1, n + 1)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        for t in self.threads:
            t.stop_event.set()
        for t in self.threads:
            t.join(30)

    def commits(self):
        return sum(t.commits for t in self.threads)

    def errors(self):
        """What failed in the writers; after stop(), also any writer that did not end."""
        stuck = ["writer %d still running" % t.wid for t in self.threads if t.stop_event.is_set() and t.is_alive()]
        return [t.error for t in self.threads if t.error] + stuck

    def summary(self):
        return "%d commits, %d deadlock retries" % (self.commits(), sum(t.retries for t in self.threads))


# ---- one capture mode ----

class Mode:
    """One upstream + one `pgrelay serve --capture MODE` + its subscriptions on the subscriber."""

    def __init__(self, env, sub, name, up_env):
        self.env, self.sub, self.name, self.up = env, sub, name, up_env
        self.db = "sub_" + name
        self.db_all = "suball_" + name
        self.relay = None
        self.data_dir = os.path.join(up_env.base, "relay-data")
        self.port = None
        self.state = {}
        self.log_start = sub.log_offset()
        self.marker = 0
        self.subs = {}  # subscription name -> database, for those that exist

    # -- helpers --
    def check(self, name, fn):
        def run():
            try:
                fn()
            except CheckFailed as e:
                raise CheckFailed("%s\n%s\n%s" % (e, self.relay_tail(), self.sub.problems_since(self.log_start)))
            except Exception as e:
                raise CheckFailed("%s: %r\n%s\n%s" % (type(e).__name__, e, self.relay_tail(),
                                                     self.sub.problems_since(self.log_start)))
        self.env.check("%s: %s" % (self.name, name), run)

    def relay_tail(self):
        return self.relay.stderr_tail(30) if self.relay else "    (no pgrelay started)"

    def require(self, *keys):
        for k in keys:
            expect(self.state.get(k), "prerequisite %r succeeded earlier" % k)

    def upq(self, sql, args=None):
        return query(self.up.pg_port, "e2e", sql, args)

    def subq(self, db, sql, args=None):
        return query(self.sub.port, db, sql, args)

    def relay_slots(self):
        return sorted(r[0] for r in self.env.relay_query(self.relay, "SELECT slot_name FROM pg_replication_slots"))

    def start_relay(self):
        args = ["--capture", self.name] + RELAY_ARGS
        t0 = time.monotonic()
        self.relay = self.up.start_relay(data_dir=self.data_dir, port=self.port, extra_args=args)
        self.port = self.relay.port
        return time.monotonic() - t0

    def create_subscription(self, db, name, publication, options=""):
        conn = connect(self.sub.port, db)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE SUBSCRIPTION %s CONNECTION '%s' PUBLICATION %s%s"
                            % (name, self.relay.url, publication, " WITH (%s)" % options if options else ""))
        finally:
            conn.close()
        self.subs[name] = db

    def sync_states(self, db, subname):
        return dict(self.subq(db, "SELECT n.nspname || '.' || c.relname, r.srsubstate FROM pg_subscription_rel r"
                                  " JOIN pg_subscription s ON s.oid = r.srsubid JOIN pg_class c ON c.oid = r.srrelid"
                                  " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE s.subname = %s", (subname,)))

    def sync_report(self, subs):
        """Per subscription not ready: its tables' states and sync end LSNs, what its apply worker
        received, and pgrelay's slot: what decides when Postgres marks a synced table ready."""
        slots = {r[0]: r[1:] for r in self.env.relay_query(
            self.relay, "SELECT slot_name, confirmed_flush_lsn::text, active FROM pg_replication_slots")}
        lines = []
        for db, name in subs:
            rels = self.subq(db, "SELECT c.relname, r.srsubstate, r.srsublsn::text FROM pg_subscription_rel r"
                                 " JOIN pg_subscription s ON s.oid = r.srsubid JOIN pg_class c ON c.oid = r.srrelid"
                                 " WHERE s.subname = %s ORDER BY 1", (name,))
            if all(state == "r" for _, state, _ in rels):
                continue
            worker = self.subq(db, "SELECT received_lsn::text, latest_end_lsn::text FROM pg_stat_subscription"
                                   " WHERE subname = %s AND relid IS NULL", (name,))
            lines.append("%s: tables (name, state, sync end lsn) %r; apply worker (received_lsn, latest_end_lsn) %r;"
                         " pgrelay slot (confirmed_flush, active) %r" % (name, rels, worker, slots.get(name)))
        return lines

    def wait_ready(self, db, subname, tables, timeout=120, states="r"):
        """Waits until pg_subscription_rel lists exactly `tables` for the subscription, each in one of
        `states` ('r' ready; 's' sync done: copied and caught up, waiting for the apply worker)."""
        want = sorted(qualified(t) for t in tables)
        seen = {}

        def ready():
            got = self.sync_states(db, subname)
            seen["states"] = got
            return sorted(got) == want and all(s in states for s in got.values())
        try:
            wait_until(ready, timeout, "subscription %s: every table in state %s" % (subname, "/".join(states)),
                       interval=0.3)
        except CheckFailed:
            expect(False, "subscription %s after %ds: pg_subscription_rel lists exactly the published tables, all %s"
                   % (subname, timeout, " or ".join("'%s'" % c for c in states)),
                   got=seen.get("states"), expected={t: "/".join(states) for t in want})

    def compare(self, db, tables, what):
        up = digests(self.up.pg_port, "e2e", tables)
        sub = digests(self.sub.port, db, tables)
        if up != sub:
            lines = describe_differences(self.up.pg_port, self.sub.port, db, tables)
            expect(False, "%s: tables identical upstream and on the subscriber (%s)\n      " % (what, db)
                   + "\n      ".join(lines or ["digests %r vs %r" % (up, sub)]))
        return up

    def wait_same(self, db, tables, what, timeout=60):
        """Polls until the digests agree (for publications without a marker table), then compares."""
        try:
            wait_until(lambda: digests(self.up.pg_port, "e2e", tables) == digests(self.sub.port, db, tables),
                       timeout, what, interval=0.5)
        except CheckFailed:
            pass
        self.compare(db, tables, what)

    def catch_up(self, targets, timeout=120):
        """Commits one marker row in each marker table; waits until every (db, marker table) has it."""
        self.marker += 1
        m = self.marker
        conn = connect(self.up.pg_port, "e2e", autocommit=False)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO marker VALUES (%s, now())", (m,))
            cur.execute("INSERT INTO app.marker VALUES (%s, now())", (m,))
        conn.commit()
        conn.close()
        t0 = time.monotonic()
        for db, table in targets:
            wait_until(lambda: self.subq(db, "SELECT 1 FROM %s WHERE id = %%s" % table, (m,)), max(
                1, timeout - (time.monotonic() - t0)), "marker %d in %s.%s on the subscriber" % (m, db, table),
                interval=0.3)
        return time.monotonic() - t0

    def duplicate_errors(self):
        text = self.sub.log_since(self.log_start)
        return [l for l in text.splitlines() if "duplicate key value violates unique constraint" in l
                and "opt_doe_pkey" not in l]

    # -- the checks --
    def run(self, upstream_conf):
        def setup():
            self.up.start_postgres(upstream_conf)
            self.up.psql_admin(TABLES + PUBLICATIONS)
            self.up.psql_admin(SEED)
            for db in (self.db, self.db_all):
                self.sub.create_database(db)
                self.sub.env.psql_admin(TABLES, db=db)
            took = self.start_relay()
            print("    %s: pgrelay ready in %.1fs at %s"
                  % (self.name, took, re.sub(r":[^:@/]*@", ":***@", self.relay.url)), flush=True)
            with open(self.relay.log_path, "rb") as f:
                log = f.read().decode(errors="replace")
            marker = "starting native capture" if self.name == "native" else "installing trigger capture"
            expect(marker in log, "pgrelay's log says %r" % marker, got=log[-1500:])
            self.state["setup"] = True

        def create():
            self.require("setup")
            t0 = time.monotonic()
            # The FOR TABLE subscription streams in binary, the TABLES IN SCHEMA one in text.
            self.create_subscription(self.db, "sub_tables", "pub_tables", "binary = true")
            self.create_subscription(self.db, "sub_schema", "pub_schema")
            self.create_subscription(self.db, "sub_stream", "pub_stream", "streaming = on")
            self.create_subscription(self.db, "sub_2pc", "pub_2pc", "two_phase = true")
            self.create_subscription(self.db, "sub_doe", "pub_doe", "disable_on_error = true")
            print("    %s: 5 subscriptions created in %.1fs" % (self.name, time.monotonic() - t0), flush=True)
            expect_eq(self.subq(self.db, "SELECT subname, subbinary FROM pg_subscription ORDER BY 1"),
                      [("sub_2pc", False), ("sub_doe", False), ("sub_schema", False), ("sub_stream", False),
                       ("sub_tables", True)], "which subscriptions stream in binary")
            slots = self.relay_slots()
            for name in ("sub_2pc", "sub_doe", "sub_schema", "sub_stream", "sub_tables"):
                expect(name in slots, "pgrelay lists the subscription's slot %s" % name, got=slots)
            self.state["created"] = True

        def initial_copy(subname, tables):
            def fn():
                self.require("created")
                t0 = time.monotonic()
                self.wait_ready(self.db, subname, tables, timeout=90, states="sr")
                self.compare(self.db, tables, "initial copy of %s" % subname)
                print("    %s: %s copied in %.1fs" % (self.name, subname, time.monotonic() - t0), flush=True)
                self.state["copied_" + subname] = True
            return fn

        def sync_ready():
            # No upstream write happens here: as with Postgres, the apply worker must learn from
            # the stream (data or keepalives) that it is past each table sync's end LSN.
            self.require("created")
            subs = [(self.db, "sub_tables"), (self.db, "sub_schema"), (self.db, "sub_stream"), (self.db, "sub_2pc"),
                    (self.db, "sub_doe")] + ([(self.db_all, "sub_all")] if self.state.get("all_copied") else [])
            t0 = time.monotonic()
            try:
                wait_until(lambda: all(set(self.sync_states(db, name).values()) == {"r"} for db, name in subs),
                           SYNC_READY_SECONDS, "every table of every subscription in state 'r'", interval=0.3)
            except CheckFailed:
                expect(False, "every table 'r' %ds after the copies; not ready:\n      %s"
                       % (SYNC_READY_SECONDS, "\n      ".join(self.sync_report(subs))))
            print("    %s: every table 'r' %.1fs after the copies" % (self.name, time.monotonic() - t0), flush=True)

        def copy_types():
            self.require("copied_sub_tables", "copied_sub_schema")
            columns = ("SELECT id, length(big), octet_length(b), t, n::text, ts::text, j::text, arr::text, f::text,"
                       " iv::text, d::text, flag, u::text FROM kinds ORDER BY id")
            got, want = self.subq(self.db, columns), self.upq(columns)
            expect_eq(got, want, "kinds column by column (text forms) on the subscriber")
            expect(got[0][1] == 10240 and got[1][1:] == (None,) * 12, "the TOASTed value and the NULL row arrived",
                   got=got[:2])
            toasted = self.upq("SELECT pg_relation_size(reltoastrelid) > 0 FROM pg_class WHERE oid = 'kinds'::regclass")
            expect_eq(toasted, [(True,)], "kinds' values > 8 kB are stored in its TOAST table upstream")
            docs = self.subq(self.db, "SELECT count(*), sum(length(body)) FROM app.docs")
            expect_eq(docs, self.upq("SELECT count(*), sum(length(body)) FROM app.docs"), "app.docs bodies")

        def create_all():
            self.require("setup")
            try:
                self.create_subscription(self.db_all, "sub_all", "pub_all")
            except psycopg2.Error as e:
                expect(False, "CREATE SUBSCRIPTION sub_all ... PUBLICATION pub_all (FOR ALL TABLES) through pgrelay",
                       got="%s: %s" % (type(e).__name__, str(e).strip()))
            self.state["all_created"] = True
            self.wait_ready(self.db_all, "sub_all", ALL_TABLES, timeout=90, states="sr")
            self.compare(self.db_all, ALL_TABLES, "initial copy of sub_all (FOR ALL TABLES)")
            self.state["all_copied"] = True

        def apply_writers():
            self.require("created")
            w = Writers(self.up.pg_port, 1, WRITERS)
            w.start()
            t0 = time.monotonic()
            try:
                self.wait_ready(self.db, "sub_tables", MAIN_TABLES, timeout=60)
                self.wait_ready(self.db, "sub_schema", SCHEMA_TABLES, timeout=60)
                time.sleep(max(0, APPLY_SECONDS - (time.monotonic() - t0)))
            finally:
                w.stop()
            print("    %s: %d writers for %.0fs: %s" % (self.name, WRITERS, time.monotonic() - t0, w.summary()),
                  flush=True)
            expect_eq(w.errors(), [], "writer errors")
            expect(w.commits() > 20 * WRITERS, "the writers committed transactions", got=w.commits())
            took = self.catch_up([(self.db, "marker"), (self.db, "app.marker")])
            print("    %s: the subscriber caught up %.1fs after the writers stopped" % (self.name, took), flush=True)
            self.state["applied"] = True

        def apply_compare(tables, what):
            def fn():
                self.require("applied")
                d = self.compare(self.db, tables, what)
                rows = sum(c for c, _ in d.values())
                expect(rows > 0, "rows compared", got=d)
            return fn

        def apply_details():
            self.require("applied")
            neg = self.subq(self.db, "SELECT (SELECT count(*) FROM items WHERE id < 0 OR label = 'never'),"
                                     " (SELECT count(*) FROM ledger WHERE wid < 0)")
            expect_eq(neg, [(0, 0)], "rows written in rolled-back savepoints are absent on the subscriber")
            sp2 = self.subq(self.db, "SELECT count(*) FROM items WHERE label LIKE '% (sp2)'")
            expect(sp2[0][0] > 0, "rows changed in released savepoints arrived", got=sp2)
            expect_eq(sp2, self.upq("SELECT count(*) FROM items WHERE label LIKE '% (sp2)'"), "released savepoints")
            hot = self.subq(self.db, "SELECT sum(qty) FROM items WHERE id <= %d" % HOT_ITEMS)
            expect_eq(hot, self.upq("SELECT sum(qty) FROM items WHERE id <= %d" % HOT_ITEMS),
                      "the sum of the hot rows' counters (every conflicting update applied once)")
            pad = "SELECT count(*), count(pad), sum(length(pad)) FROM nokey WHERE v = 'pad kept'"
            got = self.subq(self.db, pad)
            expect(got[0][0] > 0, "keyless rows with a TOASTed pad were updated", got=got)
            expect_eq(got, self.upq(pad), "keyless rows updated around an unchanged TOASTed pad")
            expect_eq(self.duplicate_errors(), [],
                      "duplicate key errors in the subscriber's log (a replayed transaction)")

        def streaming():
            self.require("created")
            expect_eq(self.subq(self.db, "SELECT substream FROM pg_subscription WHERE subname = 'sub_stream'"),
                      [(True,)], "pg_subscription.substream")
            self.wait_ready(self.db, "sub_stream", ["opt_big"])
            conn = connect(self.up.pg_port, "e2e", autocommit=False)
            with conn.cursor() as cur:  # one big transaction (pgrelay sends it whole, at its commit)
                cur.execute("INSERT INTO opt_big SELECT g, repeat('v', g % 300), g FROM generate_series(101, 30100) g")
                cur.execute("UPDATE opt_big SET n = -n, v = v || '!' WHERE id % 5 = 0")
                cur.execute("DELETE FROM opt_big WHERE id % 7 = 0")
                cur.execute("SAVEPOINT a")
                cur.execute("DELETE FROM opt_big")
                cur.execute("ROLLBACK TO SAVEPOINT a")
            conn.commit()
            conn.close()
            t0 = time.monotonic()
            self.wait_same(self.db, ["opt_big"], "sub_stream (streaming = on) after a 40000-change transaction", 90)
            print("    %s: the 40000-change transaction applied in %.1fs" % (self.name, time.monotonic() - t0),
                  flush=True)
            expect_eq(self.subq(self.db, "SELECT count(*) FROM opt_big"), self.upq("SELECT count(*) FROM opt_big"),
                      "opt_big rows")

        def two_phase():
            self.require("created")
            self.wait_ready(self.db, "sub_2pc", ["opt_2pc"])
            wait_until(lambda: self.subq(self.db, "SELECT subtwophasestate FROM pg_subscription"
                                                  " WHERE subname = 'sub_2pc'") == [("e",)], 60,
                       "sub_2pc two_phase state 'e' (enabled after the table sync)", interval=0.3)
            c1, c2 = connect(self.up.pg_port, "e2e"), connect(self.up.pg_port, "e2e")
            try:
                with c1.cursor() as cur:
                    cur.execute("BEGIN")
                    cur.execute("INSERT INTO opt_2pc VALUES (100, 'prepared then committed')")
                    cur.execute("UPDATE opt_2pc SET v = 'updated by a prepared transaction' WHERE id = 1")
                    cur.execute("PREPARE TRANSACTION 'e2e_gid_commit'")
                with c2.cursor() as cur:
                    cur.execute("BEGIN")
                    cur.execute("INSERT INTO opt_2pc VALUES (101, 'prepared then rolled back')")
                    cur.execute("DELETE FROM opt_2pc WHERE id = 2")
                    cur.execute("PREPARE TRANSACTION 'e2e_gid_rollback'")
                self.upq("INSERT INTO opt_2pc VALUES (102, 'committed after the prepares')")
                wait_until(lambda: self.subq(self.db, "SELECT 1 FROM opt_2pc WHERE id = 102"), 30,
                           "row 102 (committed while two transactions are prepared)", interval=0.3)
                expect_eq(self.subq(self.db, "SELECT id, v FROM opt_2pc ORDER BY id"),
                          [(1, "seed"), (2, "seed"), (102, "committed after the prepares")],
                          "while prepared, neither prepared transaction is visible on the subscriber")
                with c1.cursor() as cur:
                    cur.execute("COMMIT PREPARED 'e2e_gid_commit'")
                    cur.execute("ROLLBACK PREPARED 'e2e_gid_rollback'")
                    cur.execute("INSERT INTO opt_2pc VALUES (103, 'after COMMIT PREPARED')")
            finally:
                for c in (c1, c2):
                    c.close()
                for (gid,) in self.upq("SELECT gid FROM pg_prepared_xacts"):
                    self.upq("ROLLBACK PREPARED %s", (gid,))
            wait_until(lambda: self.subq(self.db, "SELECT 1 FROM opt_2pc WHERE id = 103"), 30, "row 103", interval=0.3)
            expect_eq(self.subq(self.db, "SELECT id, v FROM opt_2pc ORDER BY id"),
                      [(1, "updated by a prepared transaction"), (2, "seed"), (100, "prepared then committed"),
                       (102, "committed after the prepares"), (103, "after COMMIT PREPARED")],
                      "the committed prepared transaction arrived, the rolled-back one did not")
            self.compare(self.db, ["opt_2pc"], "sub_2pc")
            expect_eq(self.subq(self.db, "SELECT gid FROM pg_prepared_xacts"), [],
                      "no transaction left prepared on the subscriber")

        def disable_on_error():
            self.require("created")
            expect_eq(self.subq(self.db, "SELECT subdisableonerr, subenabled FROM pg_subscription"
                                         " WHERE subname = 'sub_doe'"), [(True, True)],
                      "pg_subscription: disable_on_error set, enabled")
            self.wait_ready(self.db, "sub_doe", ["opt_doe"])
            self.upq("INSERT INTO opt_doe VALUES (1001, 'streamed')")
            wait_until(lambda: self.subq(self.db, "SELECT 1 FROM opt_doe WHERE id = 1001"), 30, "row 1001",
                       interval=0.3)
            # A conflict made on the subscriber: the apply error disables the subscription.
            self.subq(self.db, "INSERT INTO opt_doe VALUES (1002, 'local conflict')")
            self.upq("INSERT INTO opt_doe VALUES (1002, 'from upstream')")
            wait_until(lambda: self.subq(self.db, "SELECT NOT subenabled FROM pg_subscription"
                                                  " WHERE subname = 'sub_doe'") == [(True,)], 30,
                       "sub_doe disabled by the apply error", interval=0.3)
            expect('subscription "sub_doe" has been disabled because of an error' in self.sub.log_since(self.log_start),
                   "the subscriber logged that sub_doe was disabled because of an error")
            expect_eq(self.subq(self.db, "SELECT id, v FROM opt_doe ORDER BY id"),
                      [(1, "seed"), (1001, "streamed"), (1002, "local conflict")], "opt_doe on the subscriber")
            self.state["doe_disabled"] = True

        def refresh_copy():
            self.require("applied")
            self.up.psql_admin("CREATE TABLE newtab (id int PRIMARY KEY, v text, big text);"
                               "INSERT INTO newtab SELECT g, 'before ' || g, CASE WHEN g % 100 = 0 THEN "
                               + big_text("nt") + " END FROM generate_series(1, 1000) g;")
            for db in (self.db, self.db_all):
                self.sub.env.psql_admin("CREATE TABLE newtab (id int PRIMARY KEY, v text, big text)", db=db)
            self.upq("ALTER PUBLICATION pub_tables ADD TABLE newtab")
            self.subq(self.db, "ALTER SUBSCRIPTION sub_tables REFRESH PUBLICATION")
            self.wait_ready(self.db, "sub_tables", MAIN_TABLES + ["newtab"], timeout=60, states="sr")
            self.compare(self.db, ["newtab"], "newtab copied after REFRESH PUBLICATION")
            self.state["newtab"] = True

        def refresh_ready():
            self.require("newtab")
            try:
                self.wait_ready(self.db, "sub_tables", MAIN_TABLES + ["newtab"], timeout=SYNC_READY_SECONDS)
            except CheckFailed as e:
                raise CheckFailed("%s\n      %s" % (e, "\n      ".join(self.sync_report([(self.db, "sub_tables")]))))

        def refresh_stream():
            self.require("newtab")
            conn = connect(self.up.pg_port, "e2e", autocommit=False)
            with conn.cursor() as cur:
                cur.execute("INSERT INTO newtab SELECT g, 'after ' || g, NULL FROM generate_series(1001, 1500) g")
                cur.execute("UPDATE newtab SET v = v || ' updated' WHERE id % 3 = 0")
                cur.execute("DELETE FROM newtab WHERE id % 10 = 1")
                cur.execute("UPDATE newtab SET big = " + big_text("nt2") + " WHERE id = 7")
            conn.commit()
            conn.close()
            self.catch_up([(self.db, "marker")])
            self.compare(self.db, ["newtab"] + MAIN_TABLES, "newtab after streamed writes")
            self.wait_ready(self.db, "sub_tables", MAIN_TABLES + ["newtab"], timeout=30)

        def disable_enable():
            self.require("applied")
            self.subq(self.db, "ALTER SUBSCRIPTION sub_schema DISABLE")
            try:
                wait_until(lambda: not self.subq(self.db, "SELECT 1 FROM pg_stat_subscription"
                                                          " WHERE subname = 'sub_schema' AND pid IS NOT NULL"), 30,
                           "sub_schema's apply worker gone", interval=0.3)
                wait_until(lambda: self.env.relay_query(self.relay, "SELECT NOT active FROM pg_replication_slots"
                                                                    " WHERE slot_name = 'sub_schema'") == [(True,)],
                           30, "pgrelay's slot sub_schema inactive", interval=0.3)
                conn = connect(self.up.pg_port, "e2e", autocommit=False)
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO app.events SELECT 900000 + g, -1, now(), g, '{}', '{}', '\\x' FROM"
                                " generate_series(1, 300) g")
                    cur.execute("UPDATE app.docs SET hits = hits + 100 WHERE id = 5")
                conn.commit()
                conn.close()
                self.marker += 1
                self.upq("INSERT INTO app.marker VALUES (%s, now())", (self.marker,))
                time.sleep(2)
                expect_eq(self.subq(self.db, "SELECT count(*) FROM app.events WHERE wid = -1"), [(0,)],
                          "nothing applied while sub_schema is disabled")
            finally:
                self.subq(self.db, "ALTER SUBSCRIPTION sub_schema ENABLE")
            wait_until(lambda: self.subq(self.db, "SELECT 1 FROM app.marker WHERE id = %s", (self.marker,)), 60,
                       "the marker written while disabled, after ENABLE", interval=0.3)
            self.compare(self.db, SCHEMA_TABLES, "sub_schema after DISABLE, writes, ENABLE")
            expect_eq(self.subq(self.db, "SELECT count(*) FROM app.events WHERE wid = -1"), [(300,)],
                      "the rows written while disabled")

        def drop_subscription():
            self.require("created")
            before = self.relay_slots()
            for name in ("sub_stream", "sub_doe"):
                self.subq(self.db, "DROP SUBSCRIPTION %s" % name)
                self.subs.pop(name, None)
            after = self.relay_slots()
            remaining = sorted(r[0] for r in self.subq(
                self.db, "SELECT subslotname FROM pg_subscription WHERE subdbid IN"
                         " (SELECT oid FROM pg_database WHERE datname IN (%s, %s))", (self.db, self.db_all)))
            expect("sub_stream" in before and "sub_doe" in before, "both slots existed before", got=before)
            expect_eq(after, remaining, "pgrelay's slots after DROP SUBSCRIPTION sub_stream, sub_doe: exactly the"
                                        " remaining subscriptions' (no table-sync slot left)")

        def schema_change():
            self.require("applied")
            w = Writers(self.up.pg_port, 2, 3)
            w.start()
            try:
                time.sleep(3)
                for db in (self.db, self.db_all):
                    self.sub.env.psql_admin("ALTER TABLE items ADD COLUMN note text DEFAULT 'none';"
                                            "ALTER TABLE app.events ADD COLUMN extra jsonb", db=db)
                self.upq("ALTER TABLE items ADD COLUMN note text DEFAULT 'none'")
                self.upq("ALTER TABLE app.events ADD COLUMN extra jsonb")
                w.flags["note"] = True
                self.upq("UPDATE app.events SET extra = jsonb_build_object('id', id) WHERE id % 10 = 0 AND id < 2000")
                time.sleep(4)
            finally:
                w.stop()
            expect_eq(w.errors(), [], "writer errors")
            self.catch_up([(self.db, "marker"), (self.db, "app.marker")])
            self.compare(self.db, ["items", "app.events"] + MAIN_TABLES + SCHEMA_TABLES, "after ADD COLUMN")
            got = self.subq(self.db, "SELECT count(*) FILTER (WHERE note LIKE 'w%'),"
                                     " count(*) FILTER (WHERE note = 'none') FROM items")
            expect(got[0][0] > 0 and got[0][1] > 0, "rows with the new column written, old rows with its default",
                   got=got)
            ev = self.subq(self.db, "SELECT count(extra) FROM app.events")
            expect(ev[0][0] >= 190, "app.events.extra arrived", got=ev)
            self.state["schema"] = True

        faults = {}

        def wait_reconnected():
            t1 = time.monotonic()
            wait_until(lambda: self.env.relay_query(
                self.relay, "SELECT count(*) FROM pg_replication_slots WHERE active"
                            " AND slot_name IN ('sub_tables', 'sub_schema')") == [(2,)], 60,
                "sub_tables and sub_schema streaming from the restarted pgrelay (active slots)", interval=0.3)
            print("    %s: sub_tables and sub_schema reconnected by themselves %.1fs after the restart"
                  % (self.name, time.monotonic() - t1), flush=True)

        def sigterm_restart():
            self.require("applied")
            w = faults["writers"] = Writers(self.up.pg_port, 3, 4)
            w.flags["note"] = self.state.get("schema")
            w.start()
            wait_until(lambda: w.commits() >= 100 or w.errors(), 30, "the writers' first commits")
            expect_eq(w.errors(), [], "writer errors")
            time.sleep(4)
            code, took = self.relay.stop(signal.SIGTERM)
            expect_eq(code, 0, "pgrelay's exit code after SIGTERM")
            time.sleep(1)
            restart = self.start_relay()
            print("    %s: pgrelay stopped (SIGTERM) in %.1fs, restarted in %.1fs on port %d; writers: %s"
                  % (self.name, took, restart, self.port, w.summary()), flush=True)
            wait_reconnected()
            time.sleep(3)

        def sigkill_restart():
            expect("writers" in faults, "the writers of the SIGTERM check started")
            time.sleep(3)
            code, _ = self.relay.stop(signal.SIGKILL)
            expect_eq(code, -signal.SIGKILL, "pgrelay ended by SIGKILL")
            time.sleep(2)
            restart = self.start_relay()
            print("    %s: pgrelay killed (SIGKILL), restarted in %.1fs; writers: %s"
                  % (self.name, restart, faults["writers"].summary()), flush=True)
            wait_reconnected()
            time.sleep(3)

        def after_faults():
            w = faults.get("writers")
            expect(w is not None, "the fault writers started")
            w.stop()
            print("    %s: fault-phase writers: %s" % (self.name, w.summary()), flush=True)
            expect_eq(w.errors(), [], "writer errors")
            took = self.catch_up([(self.db, "marker"), (self.db, "app.marker")], timeout=150)
            print("    %s: subscribers caught up %.1fs after the writers stopped" % (self.name, took), flush=True)
            tables = MAIN_TABLES + SCHEMA_TABLES + (["newtab"] if self.state.get("newtab") else [])
            self.compare(self.db, tables, "after SIGTERM and SIGKILL of pgrelay under writes")
            expect_eq(self.duplicate_errors(), [],
                      "duplicate key errors in the subscriber's log (a replayed transaction)")
            self.state["faults"] = True

        def all_tables_after():
            self.require("all_copied", "faults")
            for table in ("marker", "app.marker"):  # the last marker: sub_all applied everything before it
                wait_until(lambda: self.subq(self.db_all, "SELECT 1 FROM %s WHERE id = %%s" % table, (self.marker,)),
                           60, "marker %d in %s.%s" % (self.marker, self.db_all, table), interval=0.3)
            self.compare(self.db_all, ALL_TABLES, "sub_all (FOR ALL TABLES) after all the writes")

        def drop_all():
            for name, db in sorted(self.subs.items()):
                self.subq(db, "DROP SUBSCRIPTION %s" % name)
                del self.subs[name]
            expect_eq(self.relay_slots(), [], "pgrelay's slots after DROP SUBSCRIPTION of every subscription")

        pub_note = "upstream wal_level=%s" % ("logical" if self.name == "native" else "replica")
        self.check("setup: upstream (%s), subscriber databases, pgrelay serve --capture %s" % (pub_note, self.name),
                   setup)
        self.check("CREATE SUBSCRIPTION x5 through pgrelay (FOR TABLE, TABLES IN SCHEMA, options): slots created",
                   create)
        self.check("initial copy, FOR TABLE publication: table sync done ('s' or 'r'), identical",
                   initial_copy("sub_tables", MAIN_TABLES))
        self.check("initial copy, FOR TABLES IN SCHEMA publication: table sync done ('s' or 'r'), identical",
                   initial_copy("sub_schema", SCHEMA_TABLES))
        self.check("initial copy: TOAST, NULL, numeric, timestamptz, jsonb, array, bytea, float values", copy_types)
        self.check("FOR ALL TABLES subscription (own database, copy_data): created, table sync done, identical",
                   create_all)
        self.check("table sync completes: every table 'r' within %ds, with no upstream write" % SYNC_READY_SECONDS,
                   sync_ready)
        self.check("apply: %d writers x %ds upstream, subscriber caught up" % (WRITERS, APPLY_SECONDS), apply_writers)
        self.check("apply: FOR TABLE tables identical (items, kinds, ledger, keyless nokey, marker)",
                   apply_compare(MAIN_TABLES, "apply of sub_tables"))
        self.check("apply: FOR TABLES IN SCHEMA tables identical (TOAST docs, events)",
                   apply_compare(SCHEMA_TABLES, "apply of sub_schema"))
        self.check("apply: savepoints, hot-row counters, unchanged TOAST in a FULL keyless row, no replay",
                   apply_details)
        self.check("streaming = on: a 40000-change transaction applied", streaming)
        self.check("two_phase = true: PREPARE invisible, COMMIT PREPARED arrives, ROLLBACK PREPARED does not",
                   two_phase)
        self.check("disable_on_error = true: accepted, streams, an apply error disables the subscription",
                   disable_on_error)
        self.check("ALTER PUBLICATION ADD TABLE + REFRESH PUBLICATION: the new table copied", refresh_copy)
        self.check("REFRESH PUBLICATION: the new table 'r' within %ds, with no upstream write" % SYNC_READY_SECONDS,
                   refresh_ready)
        self.check("REFRESH PUBLICATION: writes to the new table stream", refresh_stream)
        self.check("ALTER SUBSCRIPTION DISABLE, writes, ENABLE: the writes arrive", disable_enable)
        self.check("DROP SUBSCRIPTION: its slot gone from pgrelay, no table-sync slot left", drop_subscription)
        self.check("ALTER TABLE ADD COLUMN mid-stream (both sides), writes using it: identical", schema_change)
        self.check("pgrelay SIGTERM under writes: exit 0, restart on the same data dir and port, subscribers reconnect",
                   sigterm_restart)
        self.check("pgrelay SIGKILL under writes: restart on the same data dir and port, subscribers reconnect",
                   sigkill_restart)
        self.check("after both faults: every table identical, nothing lost, nothing applied twice", after_faults)
        self.check("FOR ALL TABLES subscription: identical after all the writes", all_tables_after)
        self.check("DROP SUBSCRIPTION of the others: pgrelay lists no slot", drop_all)

    def teardown(self):
        """Drops what is left of this mode's subscriptions (not a check) and stops its pgrelay."""
        for name, db in list(self.subs.items()):
            try:
                conn = connect(self.sub.port, db)
                with conn.cursor() as cur:
                    try:
                        cur.execute("DROP SUBSCRIPTION %s" % name)
                    except psycopg2.Error:  # pgrelay unreachable: drop without its slot
                        cur.execute("ALTER SUBSCRIPTION %s DISABLE" % name)
                        cur.execute("ALTER SUBSCRIPTION %s SET (slot_name = NONE)" % name)
                        cur.execute("DROP SUBSCRIPTION %s" % name)
                conn.close()
            except Exception as e:
                print("    %s: could not drop subscription %s: %r" % (self.name, name, e), flush=True)
        if self.relay and self.relay.proc.poll() is None:
            self.relay.stop(signal.SIGTERM)


def body(env):
    t0 = time.monotonic()
    sub = Subscriber(env.pgrelay)
    native_env = None
    try:
        trigger = Mode(env, sub, "trigger", env)  # env's own PostgreSQL is the wal_level=replica upstream
        try:
            trigger.run(UPSTREAM_CONF)
        finally:
            trigger.teardown()
        print("    trigger mode took %.0fs" % (time.monotonic() - t0), flush=True)
        t1 = time.monotonic()
        native_env = Env(env.pgrelay, env.name + "/native")
        native = Mode(env, sub, "native", native_env)
        try:
            native.run(UPSTREAM_CONF + LOGICAL_CONF)
        finally:
            native.teardown()
        print("    native mode took %.0fs; both %.0fs" % (time.monotonic() - t1, time.monotonic() - t0), flush=True)
    finally:
        if native_env:
            native_env.cleanup()
        sub.env.cleanup()


if __name__ == "__main__":
    main("subscriber", body)
