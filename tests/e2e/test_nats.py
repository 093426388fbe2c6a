# `pgrelay serve --nats`: the change log published to a 3-node JetStream cluster, exactly once, in commit order.
"""A PostgreSQL 15 upstream captured natively, a 3-node nats-server cluster with JetStream (its
max_payload lowered to 256 kB, so that a large transaction's log entry is cut into parts), and
`pgrelay serve --nats` publishing into stream PGRELAY. What a client sees is read with npm `nats`.

  - 8 writers run for 30 s: conflicting updates of hot rows, inserts and deletes, transactions that
    wait before they commit, rollbacks, a TRUNCATE and one large transaction, while pgrelay is
    killed with -9 twice and one NATS node (the stream's leader) once. Afterwards the stream holds
    every committed transaction exactly once (each Msg-Id once, each transaction's indexes
    0..count-1 and its parts 0..n-1, contiguous) in commit order, no rolled-back one, and replaying
    its JSON changes gives the upstream's tables;
  - a consumer filtered on one table's subject sees exactly that table's messages; a table whose
    name is not a NATS token gets its escaped subject; `pgrelay status` shows the publisher;
  - every NATS node down for a while: capture goes on, and publishing resumes afterwards;
  - kill -9 while a 100,000-row transaction is being published (the stream ending inside it):
    after the restart the stream holds it once, whole, its messages contiguous;
  - TLS: a nats-server with a certificate of a test CA takes pgrelay's messages over tls:// with
    --nats-tls-ca;
  - bad input, each giving a message that names the fix while capture goes on: no server at the
    URL, wrong credentials (the password never logged), a TLS server whose CA is not given, a stream whose subjects do not take
    pgrelay's, a stream that is full, a stream holding a message pgrelay did not write, and a
    stream written from another pgrelay's log.
"""

import base64
import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import psycopg2

from e2e_support import ensure_npm_package, expect, expect_eq, free_port, main, wait_until
from nats_cluster import NatsCluster

HERE = os.path.dirname(os.path.abspath(__file__))
CONF = "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
DB = "app"
FACTS_SUBJECT = "pgrelay.~server.%s" % DB  # the server facts followers answer sessions with
WRITERS = 8
RUN_SECONDS = 30
HOT_ROWS = 20
PASSWORD_SEEN_NOWHERE = "n0t-in-any-log-7f3a"


class JetStreamClient:
    """nats_stream.cjs: an application's view of the stream, through npm `nats`."""

    def __init__(self, module_dir, servers):
        self.module_dir = module_dir
        self.servers = servers

    def run(self, *args, timeout=120):
        r = subprocess.run(["node", os.path.join(HERE, "nats_stream.cjs"), self.module_dir, self.servers] + list(args),
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError("nats_stream.cjs %s failed: %s" % (" ".join(args), r.stderr[-800:]))
        return r.stdout

    def last(self, stream, subject):
        out = self.run("last", stream, subject).strip()
        if not out:
            return None
        m = json.loads(out)
        m["data"] = base64.b64decode(m["data"])
        return m

    def read(self, stream, subject=None):
        out = []
        for line in self.run("read", stream, *([subject] if subject else [])).splitlines():
            m = json.loads(line)
            m["data"] = base64.b64decode(m["data"])
            out.append(m)
        return out


def entry_messages(messages):
    """The messages the log's entries were published as: all but the primary's server facts,
    which lie outside the database's subjects."""
    return [m for m in messages if m["subject"] != FACTS_SUBJECT]


def parse_msg_id(text):
    m = re.fullmatch(r"([0-9A-F]+/[0-9A-F]+)/(tx/)?(\d+)", text)
    expect(m is not None, "a Nats-Msg-Id of pgrelay's form", got=text)
    return m.group(1), m.group(2) is not None, int(m.group(3))


def lsn_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def transactions_of(messages):
    """Walks the stream in order, checking that each transaction is whole, contiguous and after
    the one before; returns [(commit lsn, xid, [change payloads], [part sizes])]."""
    out = []
    i = 0
    previous = -1
    while i < len(messages):
        lsn, _, _ = parse_msg_id(messages[i]["headers"]["Nats-Msg-Id"])
        expect(lsn_int(lsn) > previous, "transactions in commit order: %s after %s" % (lsn, out[-1][0] if out else "-"))
        previous = lsn_int(lsn)
        count = int(messages[i]["headers"]["Pgrelay-Count"])
        xid = int(messages[i]["headers"]["Pgrelay-Xid"])
        changes = []
        for k in range(count):
            m = messages[i]
            expect_eq(m["headers"]["Nats-Msg-Id"], "%s/%d" % (lsn, k), "message %d: change %d of %s" % (m["seq"], k, lsn))
            payload = json.loads(m["data"])
            expect_eq((payload["commit_lsn"], payload["index"], payload["count"]), (lsn, k, count),
                      "message %d: commit_lsn, index and count in its payload" % m["seq"])
            changes.append((m["subject"], payload))
            i += 1
        expect(i < len(messages), "the log entry of %s after its changes" % lsn)
        part, parts, size = (int(x) for x in messages[i]["headers"]["Pgrelay-Part"].split("/"))
        sizes = []
        for k in range(parts):
            m = messages[i]
            expect_eq((m["headers"]["Nats-Msg-Id"], m["headers"]["Pgrelay-Part"]), ("%s/tx/%d" % (lsn, k), "%d/%d/%d" % (k, parts, size)),
                      "message %d: part %d of %d of %s" % (m["seq"], k, parts, lsn))
            expect(k + 1 == parts or len(m["data"]) == size, "every part but the last holds %d bytes" % size)
            sizes.append(len(m["data"]))
            i += 1
        out.append((lsn, xid, changes, sizes))
    return out


def replay(transactions):
    """The tables the JSON changes build: {table: {key: row}}."""
    tables = {}
    for _, _, changes, _ in transactions:
        for _, c in changes:
            if c["op"] == "message":
                continue
            rows = tables.setdefault(c["table"], {})
            if c["op"] == "truncate":
                rows.clear()
                continue
            key = tuple(sorted(c["key"].items()))
            if c["op"] == "delete":
                expect(key in rows, "a delete of a row the stream inserted", got=c)
                del rows[key]
            else:
                rows[key] = c["new"]
    return tables


class Writer(threading.Thread):
    """Changes the upstream directly, recording the xids it committed and rolled back."""

    def __init__(self, env, n, deadline):
        super().__init__(daemon=True)
        self.env, self.n, self.deadline = env, n, deadline
        self.committed, self.rolled_back = set(), set()
        self.mine = []  # ids of its events rows
        self.error = None
        self.rng = random.Random(n)

    def run(self):
        try:
            conn = psycopg2.connect(self.env.upstream_url(DB))
            while time.monotonic() < self.deadline:
                cur = conn.cursor()
                try:
                    cur.execute("SELECT txid_current() % 4294967296")
                    xid = cur.fetchone()[0]
                    self.step(cur)
                    if self.rng.random() < 0.08:
                        conn.rollback()
                        self.rolled_back.add(xid)
                    else:
                        conn.commit()
                        self.committed.add(xid)
                except psycopg2.errors.DeadlockDetected:
                    conn.rollback()
                    self.rolled_back.add(xid)
            conn.close()
        except Exception as e:  # the check reports it
            self.error = e

    def step(self, cur):
        r = self.rng
        ids = sorted(r.sample(range(1, HOT_ROWS + 1), 2))
        for i in ids:  # in key order: conflicting, never deadlocking among themselves
            cur.execute("UPDATE accounts SET balance = balance + %s, note = %s WHERE id = %s",
                        (r.randint(-5, 5), "w%d" % self.n, i))
        cur.execute("INSERT INTO events (writer, body) VALUES (%s, %s) RETURNING id", (self.n, "e" * r.randint(1, 200)))
        self.mine.append(cur.fetchone()[0])
        if len(self.mine) > 5 and r.random() < 0.5:
            cur.execute("DELETE FROM events WHERE id = %s", (self.mine.pop(r.randrange(len(self.mine) - 1)),))
        if r.random() < 0.05:
            time.sleep(r.uniform(0.2, 0.8))  # a late commit: later transactions commit first


class Case:
    def __init__(self, env, npm):
        self.env = env
        self.npm = npm
        self.cluster = None
        self.relay = None
        self.port = free_port()
        self.metrics_port = free_port()
        self.data_dir = os.path.join(env.base, "relay")
        self.writers = []
        self.faults = []
        self.js = None

    def start_relay(self, data_dir=None, port=None, db=DB, extra=(), nats=None, metrics_port=None):
        args = ["--no-tls", "--capture", "native", "--nats", nats or self.cluster.urls()] + list(extra)
        if metrics_port:
            args += ["--metrics", "127.0.0.1:%d" % metrics_port]
        return self.env.start_relay(data_dir=data_dir or self.data_dir, port=port or self.port,
                                    upstream=self.env.upstream_url(db), extra_args=args)

    def setup(self):
        env = self.env
        env.start_postgres(CONF)
        env.psql_admin("CREATE DATABASE %s" % DB, db="postgres")
        env.db_query(DB, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, note text)")
        env.db_query(DB, "INSERT INTO accounts SELECT g, 100, 'start' FROM generate_series(1, %d) g" % HOT_ROWS)
        env.db_query(DB, "CREATE TABLE events (id bigserial PRIMARY KEY, writer int, body text)")
        env.db_query(DB, "CREATE TABLE scratch (id int PRIMARY KEY)")
        env.db_query(DB, 'CREATE TABLE "Odd.Name" (id int PRIMARY KEY, v text)')
        env.db_query(DB, "CREATE TABLE fence (id int PRIMARY KEY)")
        env.db_query(DB, "CREATE PUBLICATION everything FOR ALL TABLES")
        self.cluster = NatsCluster(env, "main", 3, extra="max_payload: 262144").start()
        self.js = JetStreamClient(self.npm, self.cluster.urls())
        self.relay = self.start_relay(metrics_port=self.metrics_port)

    def metrics(self, port=None):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (port or self.metrics_port), timeout=10) as r:
            return r.read().decode()

    def metric(self, name, port=None):
        m = re.search(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), self.metrics(port), re.M)
        return float(m.group(2)) if m else None

    def stream_leader(self):
        for i in range(self.cluster.size):
            if self.cluster.procs[i] is None:
                continue
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/jsz?streams=true" % self.cluster.http_ports[i],
                                            timeout=2) as r:
                    z = json.load(r)
            except OSError:
                continue
            for account in z.get("account_details") or []:
                for stream in account.get("stream_detail") or []:
                    if stream.get("name") == "PGRELAY":
                        leader = (stream.get("cluster") or {}).get("leader", "")
                        for j in range(self.cluster.size):
                            if leader.endswith("-n%d" % j):
                                return j
        return 0

    def kill_relay(self):
        pid = self.relay.proc.pid
        self.relay.stop(sig=signal.SIGKILL)
        if self.js is not None:
            self.last_of_app_before_restart = self.last_of_app()
        self.relay = self.start_relay(metrics_port=self.metrics_port)
        self.faults.append("pgrelay pid %d killed -9, restarted as %d" % (pid, self.relay.proc.pid))

    def under_faults(self):
        deadline = time.monotonic() + RUN_SECONDS
        self.writers = [Writer(self.env, n, deadline) for n in range(WRITERS)]
        for w in self.writers:
            w.start()
        start = time.monotonic()

        def at(t):
            time.sleep(max(0, start + t - time.monotonic()))

        at(4)
        self.kill_relay()
        at(9)
        with psycopg2.connect(self.env.upstream_url(DB)) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO scratch SELECT generate_series(1, 50)")
            cur.execute("TRUNCATE scratch")
            cur.execute("INSERT INTO scratch VALUES (7)")
            # One transaction of ~1 MB: its log entry is cut into parts of under 256 kB.
            cur.execute("INSERT INTO events (writer, body) SELECT -1, repeat('x', 2000) FROM generate_series(1, 500)")
            cur.execute("""INSERT INTO "Odd.Name" VALUES (1, 'dotted')""")
        at(12)
        node = self.stream_leader()
        self.cluster.stop_node(node)
        self.faults.append("NATS node %d (the stream's leader) killed -9" % node)
        at(18)
        self.cluster.start_node(node)
        self.faults.append("NATS node %d restarted" % node)
        at(22)
        self.kill_relay()
        for w in self.writers:
            w.join(RUN_SECONDS + 30)
            expect(w.error is None, "writer %d ran without error" % w.n, got=repr(w.error))
        committed = set().union(*(w.committed for w in self.writers))
        rolled_back = set().union(*(w.rolled_back for w in self.writers))
        print("    %d transactions committed, %d rolled back; %s" % (len(committed), len(rolled_back), "; ".join(self.faults)))
        self.env.db_query(DB, "INSERT INTO fence VALUES (1)")
        fence = "pgrelay.%s.public.fence" % DB
        wait_until(lambda: self.js.read("PGRELAY", fence), 120, "the fence row on %s" % fence, 1.0)
        everything = self.js.read("PGRELAY")
        facts = [m for m in everything if m["subject"] == FACTS_SUBJECT]
        messages = entry_messages(everything)
        expect(facts, "the server facts on pgrelay.~server.%s" % DB)
        payloads = [json.loads(m["data"]) for m in facts]
        version = self.env.db_query(DB, "SHOW server_version")[0][0]
        expect_eq(dict(payloads[-1]["parameters"]).get("server_version"), version,
                  "the facts' server_version, the upstream's")
        expect(payloads[-1]["catalog"] is not None, "the facts carry the publications catalog")
        for before, after in zip(payloads, payloads[1:]):
            expect((before["parameters"], before["catalog"]) != (after["parameters"], after["catalog"]),
                   "the facts are published again only when they change (kill -9 and restarts included)")
        ids = [m["headers"]["Nats-Msg-Id"] for m in messages]
        expect_eq(len(set(ids)), len(ids), "each Msg-Id once in the stream")
        txs = transactions_of(messages)
        xids = [xid for _, xid, _, _ in txs]
        expect_eq(len(set(xids)), len(xids), "each transaction once in the stream")
        expect(committed <= set(xids), "every committed transaction in the stream",
               got=sorted(committed - set(xids))[:10])
        expect(not (rolled_back & set(xids)), "no rolled back transaction in the stream",
               got=sorted(rolled_back & set(xids))[:10])
        tables = replay(txs)
        for table, columns in (("accounts", "id, balance, note"), ("events", "id, writer, body"), ("scratch", "id"),
                               ("Odd.Name", "id, v")):
            names = [c.strip() for c in columns.split(",")]
            rows = self.env.db_query(DB, 'SELECT %s FROM "%s"' % (", ".join("%s::text" % n for n in names), table))
            want = {tuple(sorted({"id": r[0]}.items())): dict(zip(names, r)) for r in rows}
            expect_eq(tables.get(table, {}), want, "table %s replayed from the stream equals the upstream's" % table)
        split = [sizes for _, _, _, sizes in txs if len(sizes) > 1]
        expect(split, "a transaction larger than max_payload cut into parts")
        print("    the stream: %d messages, %d transactions; the large one in %d parts of %s bytes"
              % (len(messages), len(txs), len(split[0]), split[0]))
        wait_until(lambda: self.metric("pgrelay_nats_lag_bytes") == 0, 60, "pgrelay_nats_lag_bytes 0")
        expect((self.metric("pgrelay_nats_published_total") or 0) > 0, "pgrelay_nats_published_total counts")
        self.messages = messages

    def filtered_consumer(self):
        subject = "pgrelay.%s.public.accounts" % DB
        got = self.js.read("PGRELAY", subject)
        want = [m["headers"]["Nats-Msg-Id"] for m in self.messages if m["subject"] == subject]
        expect(want, "updates of accounts in the stream")
        expect_eq([m["headers"]["Nats-Msg-Id"] for m in got], want, "a consumer filtered on %s: that table's messages, in order" % subject)
        odd = [m for m in self.messages if m["subject"] == "pgrelay.%s.public.Odd~2EName" % DB]
        expect_eq([json.loads(m["data"])["table"] for m in odd], ["Odd.Name"], 'table "Odd.Name" on subject ...public.Odd~2EName')

    def last_of_app(self):
        return self.js.last("PGRELAY", "pgrelay.%s.>" % DB)

    def fence(self, sql=None):
        """One transaction on the upstream (`sql`, then a row of table fence); returns its xid."""
        self.fences = getattr(self, "fences", 1) + 1
        with psycopg2.connect(self.env.upstream_url(DB)) as conn, conn.cursor() as cur:
            cur.execute("SELECT txid_current() % 4294967296")
            xid = cur.fetchone()[0]
            if sql:
                cur.execute(sql)
            cur.execute("INSERT INTO fence VALUES (%s)", (self.fences,))
        return xid

    def wait_published(self, xid, timeout=120):
        """Until the stream's last message of the database is the last part of transaction xid."""
        def done():
            m = self.last_of_app()
            if m is None or "Pgrelay-Part" not in m["headers"]:
                return False
            _, _, k = parse_msg_id(m["headers"]["Nats-Msg-Id"])
            parts = int(m["headers"]["Pgrelay-Part"].split("/")[1])
            return int(m["headers"]["Pgrelay-Xid"]) == xid and k + 1 == parts
        wait_until(done, timeout, "the stream holding transaction %d whole, last" % xid, 0.5)

    def nats_outage(self):
        for i in range(self.cluster.size):
            self.cluster.stop_node(i)
        before = self.metric("pgrelay_captured_transactions_total") or 0
        for i in range(30):
            self.env.db_query(DB, "INSERT INTO scratch VALUES (%d)" % (1000 + i))
        wait_until(lambda: (self.metric("pgrelay_captured_transactions_total") or 0) >= before + 30, 30,
                   "30 transactions captured while every NATS node is down")
        time.sleep(3)
        expect(self.relay.proc.poll() is None, "pgrelay still runs")
        for i in range(self.cluster.size):
            self.cluster.start_node(i)
        wait_until(self.cluster.ready, 60, "the cluster back", 0.2)
        self.wait_published(self.fence())

    def killed_inside_a_transaction(self):
        # About 100,000 change messages and 60 parts: seconds of publishing to be killed inside.
        p0 = self.metric("pgrelay_nats_published_total") or 0
        xid = self.fence("INSERT INTO events (writer, body) SELECT -2, repeat('y', 100) FROM generate_series(1, 100000)")
        wait_until(lambda: (self.metric("pgrelay_nats_published_total") or 0) >= p0 + 20000, 120,
                   "20,000 of the transaction's messages published", 0.05)
        self.kill_relay()
        last = self.faults[-1]
        self.faults = []
        cut = self.last_of_app_before_restart
        lsn, part, k = parse_msg_id(cut["headers"]["Nats-Msg-Id"])
        count = int(cut["headers"]["Pgrelay-Count"])
        expect(int(cut["headers"]["Pgrelay-Xid"]) == xid
               and not (part and k + 1 == int(cut["headers"]["Pgrelay-Part"].split("/")[1])),
               "killed with the stream ending inside the large transaction", got=cut["headers"])
        self.wait_published(xid)
        messages = entry_messages(self.js.read("PGRELAY"))
        ids = [m["headers"]["Nats-Msg-Id"] for m in messages]
        expect_eq(len(set(ids)), len(ids), "each Msg-Id once in the stream")
        txs = transactions_of(messages)
        big = [t for t in txs if t[0] == lsn]
        expect_eq(len(big), 1, "the transaction once")
        expect_eq(len(big[0][2]), count, "all its change messages, once, in order")
        tables = replay(txs)
        rows = self.env.db_query(DB, "SELECT count(*) FROM events")[0][0]
        expect_eq(len(tables.get("events", {})), rows, "events replayed from the stream: the upstream's row count")
        print("    %s; the stream ended at message %d, inside %s (%s); the restart went on right after it" % (
            last, cut["seq"], lsn, cut["headers"]["Nats-Msg-Id"]))

    def status_line(self):
        last = transactions_of(entry_messages(self.js.read("PGRELAY")))[-1][0]

        def status():
            r = subprocess.run([self.env.pgrelay, "status", "-D", self.data_dir, "--json"], capture_output=True,
                               text=True, timeout=60)
            return json.loads(r.stdout)["nats"]
        nats = wait_until(lambda: (lambda n: n if n and n["published_commit_lsn"] == last else None)(status()), 30,
                          "pgrelay status --json: published through %s" % last)
        expect_eq((nats["stream"], nats["state"], nats["lag_bytes"], nats["current"]), ("PGRELAY", "publishing", 0, True),
                  "pgrelay status --json: the stream, publishing, no lag")
        r = subprocess.run([self.env.pgrelay, "status", "-D", self.data_dir], capture_output=True, text=True, timeout=60)
        expect("nats:          publishing stream PGRELAY at %s: published through %s, lag 0 bytes"
               % (self.cluster.urls(), last) in r.stdout, "pgrelay status: the NATS line", got=r.stdout)

    # ---- bad input: each a pgrelay of its own, in a database of its own ----
    def bad_relay(self, name, nats, extra=()):
        self.env.psql_admin("CREATE DATABASE %s" % name, db="postgres")
        self.env.db_query(name, "CREATE TABLE t (id int PRIMARY KEY)")
        self.env.db_query(name, "CREATE PUBLICATION p FOR ALL TABLES")
        port = free_port()
        metrics_port = free_port()
        relay = self.start_relay(data_dir=os.path.join(self.env.base, name), port=port, db=name, extra=extra,
                                 nats=nats, metrics_port=metrics_port)
        return relay, metrics_port

    def logged(self, relay, text, timeout=30):
        def seen():
            with open(relay.log_path, "rb") as f:
                return text in f.read().decode("utf-8", "replace")
        wait_until(seen, timeout, "pgrelay's log says %r" % text, 0.2)

    def captures(self, relay, metrics_port, db):
        """Capture goes on: an insert reaches pgrelay's log while NATS publishing fails."""
        before = self.metric("pgrelay_captured_transactions_total", metrics_port) or 0
        self.env.db_query(db, "INSERT INTO t VALUES (%d)" % random.randint(1, 10 ** 9))
        wait_until(lambda: (self.metric("pgrelay_captured_transactions_total", metrics_port) or 0) > before, 30,
                   "an insert captured while publishing fails")
        expect(relay.proc.poll() is None, "pgrelay still runs")

    def unreachable(self):
        relay, mp = self.bad_relay("bad_unreachable", "nats://127.0.0.1:%d" % free_port())
        self.logged(relay, "no NATS server answers at nats://127.0.0.1:")
        self.logged(relay, "Start nats-server there")
        self.captures(relay, mp, "bad_unreachable")
        relay.stop()

    def wrong_credentials(self):
        secured = NatsCluster(self.env, "secured", 1,
                              extra='authorization { user: pgrelay, password: "right-one" }').start()
        relay, mp = self.bad_relay("bad_credentials", "nats://pgrelay:%s@127.0.0.1:%d" % (PASSWORD_SEEN_NOWHERE, secured.ports[0]))
        self.logged(relay, "refused pgrelay's credentials")
        self.captures(relay, mp, "bad_credentials")
        relay.stop()
        with open(relay.log_path, "rb") as f:
            expect(PASSWORD_SEEN_NOWHERE.encode() not in f.read(), "the NATS password in no log line")
        secured.stop()

    def tls(self):
        d = os.path.join(self.env.base, "nats-tls-certs")
        os.makedirs(d)
        ca, ca_key, crt, key = (os.path.join(d, n) for n in ("ca.crt", "ca.key", "server.crt", "server.key"))
        ext = os.path.join(d, "ext.cnf")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        for args in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-subj",
                      "/CN=pgrelay test CA", "-days", "1"],
                     ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt + ".csr", "-subj", "/CN=127.0.0.1"],
                     ["x509", "-req", "-in", crt + ".csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", crt,
                      "-days", "1", "-extfile", ext]):
            subprocess.run(["openssl"] + args, check=True, capture_output=True)
        secure = NatsCluster(self.env, "tls", 1, extra='tls { cert_file: "%s", key_file: "%s" }' % (crt, key)).start()
        url = "tls://127.0.0.1:%d" % secure.ports[0]
        relay, mp = self.bad_relay("tls_ok", url, extra=["--nats-tls-ca", ca])
        self.env.db_query("tls_ok", "INSERT INTO t VALUES (1)")
        wait_until(lambda: (self.metric("pgrelay_nats_published_transactions_total", mp) or 0) >= 1, 60,
                   "a transaction acked by JetStream over TLS")
        relay.stop()
        unverified, mp2 = self.bad_relay("tls_no_ca", url)
        self.logged(unverified, "the TLS handshake with NATS at %s failed" % url)
        self.logged(unverified, "--nats-tls-ca")
        self.captures(unverified, mp2, "tls_no_ca")
        unverified.stop()
        secure.stop()

    def side_cluster(self):
        if not hasattr(self, "side"):
            self.side = NatsCluster(self.env, "side", 1).start()
            self.side_js = JetStreamClient(self.npm, self.side.urls())
        return self.side

    def stream_without_subjects(self):
        side = self.side_cluster()
        self.side_js.run("add-stream", "OTHER", "other.>")
        relay, mp = self.bad_relay("bad_subjects", side.urls(), extra=["--nats-stream", "OTHER"])
        self.logged(relay, "does not take pgrelay's subjects pgrelay.>")
        self.logged(relay, "--nats-stream NAME")
        self.captures(relay, mp, "bad_subjects")
        relay.stop()

    def facts_too_large(self):
        # Server facts (40 publications in their catalog) larger than the servers' max_payload:
        # said with the fix, and the transactions are published all the same.
        small = NatsCluster(self.env, "small_payload", 1, extra="max_payload: 2048").start()
        name = "big_facts"
        self.env.psql_admin("CREATE DATABASE %s" % name, db="postgres")
        self.env.db_query(name, "CREATE TABLE t (id int PRIMARY KEY)")
        for i in range(40):
            self.env.db_query(name, "CREATE PUBLICATION p%d FOR TABLE t" % i)
        mp = free_port()
        relay = self.start_relay(data_dir=os.path.join(self.env.base, name), port=free_port(), db=name,
                                 nats=small.urls(), metrics_port=mp)
        try:
            self.logged(relay, "not publishing the server facts: ")
            self.logged(relay, "exceed the NATS servers' max_payload of 2048")
            self.logged(relay, "Raise max_payload")
            self.env.db_query(name, "INSERT INTO t VALUES (1)")
            wait_until(lambda: (self.metric("pgrelay_nats_published_transactions_total", mp) or 0) >= 1, 60,
                       "a transaction published all the same")
        finally:
            relay.stop()
            small.stop()

    def stream_full(self):
        side = self.side_cluster()
        self.side_js.run("add-stream", "SMALL", "small.>", "3000")
        relay, mp = self.bad_relay("bad_full", side.urls(), extra=["--nats-stream", "SMALL", "--nats-subject-prefix", "small"])
        for i in range(20):
            self.env.db_query("bad_full", "INSERT INTO t VALUES (%d)" % (i + 1))
        self.logged(relay, "is full: raise its max bytes")
        errors = re.findall(r'pgrelay_nats_errors_total\{reason="stream_full",stream="SMALL"\} (\S+)', self.metrics(mp))
        expect(errors and float(errors[0]) >= 1, "pgrelay_nats_errors_total{reason=stream_full} counts", got=errors)
        self.captures(relay, mp, "bad_full")
        relay.stop()

    def foreign_message(self):
        side = self.side_cluster()
        self.side_js.run("add-stream", "MIXED", "mixed.>")
        self.side_js.run("publish", "mixed.bad_foreign.public.t", "not pgrelay's")
        relay, mp = self.bad_relay("bad_foreign", side.urls(), extra=["--nats-stream", "MIXED", "--nats-subject-prefix", "mixed"])
        self.logged(relay, "was not written by pgrelay: it lacks pgrelay's headers")
        self.captures(relay, mp, "bad_foreign")
        relay.stop()

    def another_log(self):
        # A second pgrelay of the same database, with a data directory of its own: the stream
        # holds the first one's log, which this one must not continue.
        port, mp = free_port(), free_port()
        other = self.start_relay(data_dir=os.path.join(self.env.base, "other-log"), port=port, metrics_port=mp)
        self.logged(other, "came from another change log")
        other.stop()
        logs = {m["headers"]["Pgrelay-Log-Id"] for m in self.js.read("PGRELAY")}
        expect_eq(len(logs), 1, "every message in the stream from the first pgrelay's log")

    def run(self):
        env = self.env
        env.check("setup: upstream, a 3-node JetStream cluster, pgrelay serve --nats", self.setup)
        if self.relay is None:
            return
        env.check("8 writers for 30 s, pgrelay killed -9 twice and the stream's leader once: every committed "
                  "transaction once, whole, in commit order; replayed, the upstream's tables", self.under_faults)
        if not hasattr(self, "messages"):
            return
        env.check("a JetStream consumer filtered on one table's subject sees exactly that table's messages",
                  self.filtered_consumer)
        env.check("pgrelay status shows the stream, how far it is published and its lag", self.status_line)
        env.check("every NATS node down for a while: capture goes on, publishing resumes after the outage",
                  self.nats_outage)
        env.check("kill -9 while a 100,000-row transaction is being published: afterwards the stream holds it "
                  "once, whole, its messages contiguous", self.killed_inside_a_transaction)
        env.check("no NATS server at the URL: the error names the fix, capture goes on", self.unreachable)
        env.check("wrong NATS credentials: the error names the fix, the password is logged nowhere",
                  self.wrong_credentials)
        env.check("TLS to NATS: published through tls:// with --nats-tls-ca; without the CA the error names the fix",
                  self.tls)
        env.check("a stream whose subjects do not take pgrelay's: the error names the fix", self.stream_without_subjects)
        env.check("a full stream (max bytes, discard new): the error names the fix, capture goes on", self.stream_full)
        env.check("a stream holding a message pgrelay did not write: refused, naming the fix", self.foreign_message)
        env.check("server facts larger than max_payload: said with the fix, transactions published all the same",
                  self.facts_too_large)
        env.check("a stream written from another pgrelay's log: refused, naming the fix", self.another_log)


def body(env):
    if not shutil.which("nats-server"):
        raise RuntimeError("nats-server is not installed: apt-get install nats-server (scripts/deps.sh does)")
    module, why = ensure_npm_package("nats@2", "nats")
    if module is None:
        env.skip("JetStream publishing", why)
        return
    Case(env, module).run()


if __name__ == "__main__":
    main("nats", body)
