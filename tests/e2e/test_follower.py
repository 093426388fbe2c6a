# Followers of a primary's JetStream stream: logs rebuilt at the primary's LSNs, the same
# pgoutput bytes served from them, consumer failover and kill -9, a follower without an
# upstream (the primary's server facts from the stream), retention, and bad input.
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import (CheckFailed, ensure_npm_package, expect, expect_eq, free_port, lsn_to_int,
                         lsn_to_str, main, wait_until)
from nats_cluster import NatsCluster
from test_nats import JetStreamClient

CONF = "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
DB = "app"
PUB = "everything"
WRITERS = 4
RUN_SECONDS = 10
PG_BIN = "/usr/lib/postgresql/15/bin"


class Stream:
    """A psycopg2 replication stream of pgoutput v1, kept as (dataStart, payload) pairs."""

    def __init__(self, url, slot, start_lsn, **connect):
        self.conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection, **connect)
        self.cur = self.conn.cursor()
        self.cur.start_replication(slot_name=slot, decode=False, start_lsn=start_lsn, status_interval=5,
                                   options={"proto_version": "1", "publication_names": PUB})
        self.messages = []
        self.last_end = 0  # end_lsn of the last Commit read

    def pump(self, seconds):
        """Reads whatever arrives for up to `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.cur.read_message()
            if msg is None:
                select.select([self.cur], [], [], 0.05)
                continue
            payload = bytes(msg.payload)
            self.messages.append((msg.data_start, payload))
            if payload[:1] == b"C":
                self.last_end = int.from_bytes(payload[10:18], "big")

    def confirm(self):
        self.cur.send_feedback(flush_lsn=self.last_end, force=True)

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


def pump_until(streams, end, timeout, what):
    """Reads every stream together (each keeps its server's wal_sender_timeout at bay) until
    each has read a Commit ending at or past `end`."""
    deadline = time.monotonic() + timeout
    while any(s.last_end < end for s in streams):
        if time.monotonic() > deadline:
            raise CheckFailed("%s: timed out at %s" % (what, ", ".join(lsn_to_str(s.last_end) for s in streams)))
        for s in streams:
            s.pump(0.05)


def create_slot(url, name, **connect):
    """CREATE_REPLICATION_SLOT ... NOEXPORT_SNAPSHOT; returns its consistent point."""
    conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection, **connect)
    try:
        cur = conn.cursor()
        cur.execute('CREATE_REPLICATION_SLOT "%s" LOGICAL pgoutput NOEXPORT_SNAPSHOT' % name)
        return lsn_to_int(cur.fetchone()[1])
    finally:
        conn.close()


def describe(message):
    start, payload = message
    return "%s %s(%d bytes) %s" % (lsn_to_str(start), payload[:1].decode(errors="replace"), len(payload),
                                   payload[1:24].hex())


def same_list(got, expected, what, show=str):
    """Equal lists, or a failure that shows where they part."""
    if got == expected:
        return
    first = next((i for i, (x, y) in enumerate(zip(got, expected)) if x != y), min(len(got), len(expected)))
    lines = ["%s: %d items where %d were expected; they part at item %d" % (what, len(got), len(expected), first)]
    for i in range(max(0, first - 2), first + 3):
        lines.append("  %6d  got %-60s expected %s" % (
            i, show(got[i]) if i < len(got) else "(end)", show(expected[i]) if i < len(expected) else "(end)"))
    raise CheckFailed("\n".join(lines))


def same_messages(got, expected, what):
    same_list(got, expected, what, describe)


def transactions(messages):
    """The commit end LSNs of the Commit messages, in order."""
    return [int.from_bytes(p[10:18], "big") for _, p in messages if p[:1] == b"C"]


class Writer(threading.Thread):
    def __init__(self, env, n, stop):
        super().__init__(daemon=True)
        self.env, self.n, self.stop = env, n, stop
        self.error = None
        self.committed = 0

    def run(self):
        rnd = random.Random(self.n)
        try:
            conn = psycopg2.connect(self.env.upstream_url(DB))
            while not self.stop.is_set():
                # Keys in order, so that writers wait for each other without deadlocks.
                keys = sorted(rnd.sample(range(1, 51), rnd.randint(1, 5)))
                with conn.cursor() as cur:
                    for k in keys:
                        if rnd.random() < 0.1:
                            cur.execute("DELETE FROM accounts WHERE id = %s", (k,))
                            continue
                        cur.execute("INSERT INTO accounts VALUES (%s, 0, 'w') ON CONFLICT (id) DO UPDATE "
                                    "SET balance = accounts.balance + 1, note = %s", (k, "w%d" % self.n))
                    cur.execute("INSERT INTO events (writer, body) VALUES (%s, %s)", (self.n, "x" * rnd.randint(1, 300)))
                time.sleep(0.003)  # a few thousand transactions in the run, not tens of thousands
                if rnd.random() < 0.1:
                    conn.rollback()
                else:
                    conn.commit()
                    self.committed += 1
            conn.close()
        except Exception as e:  # reported by the check that waits for it
            self.error = e


class Case:
    def __init__(self, env, npm):
        self.env = env
        self.npm = npm
        self.cluster = None
        self.js = None
        self.primary = None
        self.followers = {}
        self.metrics_ports = {}

    def follower_args(self, name, extra=()):
        port = self.metrics_ports.setdefault(name, free_port())
        return ["--no-tls", "--follow", self.cluster.urls(), "--metrics", "127.0.0.1:%d" % port] + list(extra)

    def start_follower(self, name, extra=(), port=None, upstream=None):
        relay = self.env.start_relay(data_dir=os.path.join(self.env.base, "follower-" + name),
                                     port=port, upstream=self.env.upstream_url(DB) if upstream is None else upstream,
                                     extra_args=self.follower_args(name, extra))
        self.followers[name] = relay
        return relay

    def metric(self, name, metric):
        port = self.metrics_ports[name]
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            text = r.read().decode()
        # A name alone matches any labels; one with its labels matches those.
        labels = "" if "{" in metric else r"(\{[^}]*\})?"
        m = re.search(r"^%s%s (\S+)$" % (re.escape(metric), labels), text, re.M)
        return float(m.group(m.lastindex)) if m else None

    def head(self, name):
        return self.metric(name, "pgrelay_log_head_lsn") or 0

    def wait_caught_up(self, names, timeout=60):
        target = self.head("primary")

        def there():
            return all(self.head(n) >= target for n in names)
        wait_until(there, timeout, "followers %s at the primary's head %s" % (names, lsn_to_str(int(target))), 0.2)
        return int(target)

    def dump(self, data_dir):
        r = subprocess.run([self.env.pgrelay, "log", "dump", "-D", data_dir], capture_output=True, text=True, timeout=120)
        expect(r.returncode == 0, "pgrelay log dump -D %s succeeds" % data_dir, got=r.stderr[-500:])
        return r.stdout

    def follower_log(self, name):
        with open(self.followers[name].log_path, errors="replace") as f:
            return f.read()

    def setup(self):
        env = self.env
        env.start_postgres(CONF)
        env.psql_admin("CREATE DATABASE %s" % DB, db="postgres")
        env.db_query(DB, "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, note text)")
        env.db_query(DB, "CREATE TABLE events (id bigserial PRIMARY KEY, writer int, body text)")
        env.db_query(DB, "CREATE TABLE scratch (id int PRIMARY KEY, v text)")
        env.db_query(DB, "CREATE PUBLICATION %s FOR ALL TABLES" % PUB)
        self.cluster = NatsCluster(env, "f", 3, extra="max_payload: 262144").start()
        self.js = JetStreamClient(self.npm, self.cluster.urls())
        self.metrics_ports["primary"] = free_port()
        self.primary = env.start_relay(
            data_dir=os.path.join(env.base, "primary"), upstream=env.upstream_url(DB),
            extra_args=["--no-tls", "--capture", "native", "--nats", self.cluster.urls(),
                        "--metrics", "127.0.0.1:%d" % self.metrics_ports["primary"]])
        env.db_query(DB, "INSERT INTO scratch VALUES (0, 'before the followers')")
        self.start_follower("a")
        self.start_follower("b")
        self.wait_caught_up(["a", "b"])

    def run(self):
        env = self.env
        self.setup()
        urls = {"primary": self.primary.url, "a": self.followers["a"].url, "b": self.followers["b"].url}
        state = {}

        def slots_on_followers():
            # Slots without a snapshot, on every server, before the writes: each streams from
            # the same start on. Failover needs the slot on B made before A goes.
            points = []
            for name, url in urls.items():
                points.append(create_slot(url, "same"))
                r = subprocess.run([os.path.join(PG_BIN, "pg_recvlogical"), "-d", url, "--slot", "recv",
                                    "--create-slot", "-P", "pgoutput"], capture_output=True, text=True, timeout=30)
                expect(r.returncode == 0, "pg_recvlogical --create-slot on %s" % name, got=r.stderr)
            # For follower a once it is back from its kill: the same stream, read afterwards.
            r = subprocess.run([os.path.join(PG_BIN, "pg_recvlogical"), "-d", urls["a"], "--slot", "later",
                                "--create-slot", "-P", "pgoutput"], capture_output=True, text=True, timeout=30)
            expect(r.returncode == 0, "pg_recvlogical --create-slot later on a", got=r.stderr)
            points.append(create_slot(urls["a"], "failover"))
            points.append(create_slot(urls["b"], "failover"))
            state["start"] = max(points)
        env.check("slots on followers: CREATE_REPLICATION_SLOT NOEXPORT_SNAPSHOT and pg_recvlogical --create-slot",
                  slots_on_followers)
        if "start" not in state:
            return

        def export_refused():
            for command in ['CREATE_REPLICATION_SLOT "exp" LOGICAL pgoutput',
                            "CREATE_REPLICATION_SLOT \"exp\" LOGICAL pgoutput (SNAPSHOT 'export')"]:
                conn = psycopg2.connect(urls["a"], connection_factory=LogicalReplicationConnection)
                try:
                    conn.cursor().execute(command)
                    raise CheckFailed("%s on a follower should fail" % command)
                except psycopg2.Error as e:
                    expect_eq(e.pgcode, "0A000", "SQLSTATE of %s on a follower" % command)
                    expect("cannot export a snapshot" in str(e) and "NOEXPORT_SNAPSHOT" in str(e),
                           "the error names NOEXPORT_SNAPSHOT", got=str(e))
                finally:
                    conn.close()
            # The refused slot was not left behind.
            r = env.relay_query(self.followers["a"], "SELECT 1")
            expect_eq(r, [(1,)], "the follower's ordinary session after the refusal")
        env.check("EXPORT_SNAPSHOT on a follower is refused with 0A000, naming NOEXPORT_SNAPSHOT", export_refused)

        def pass_through():
            env.db_query(DB, "INSERT INTO scratch VALUES (1, 'through the follower?')")
            got = env.relay_query(self.followers["b"], "SELECT v FROM scratch WHERE id = 1")
            expect_eq(got, [("through the follower?",)], "an ordinary session on a follower reads --upstream")
        env.check("ordinary sessions on a follower go to --upstream", pass_through)

        streams = {}
        recv = {}

        def workload_with_failover():
            start = state["start"]
            streams["primary"] = Stream(urls["primary"], "same", start)
            streams["a"] = Stream(urls["a"], "same", start)
            streams["b"] = Stream(urls["b"], "same", start)
            streams["fa"] = Stream(urls["a"], "failover", start)
            for name, url in urls.items():
                path = os.path.join(env.base, "recv-%s.bin" % name)
                recv[name] = (path, env.spawn([os.path.join(PG_BIN, "pg_recvlogical"), "-d", url, "--slot", "recv",
                                               "--start", "-f", path, "-F", "1", "-s", "1", "--no-loop",
                                               "-o", "proto_version=1", "-o", "publication_names=" + PUB],
                                              stdout=subprocess.DEVNULL, stderr=open(path + ".err", "wb")))
            stop = threading.Event()
            writers = [Writer(env, n, stop) for n in range(WRITERS)]
            for w in writers:
                w.start()
            t0 = time.monotonic()
            big_done = False
            killed = False
            while time.monotonic() - t0 < RUN_SECONDS:
                for s in streams.values():
                    s.pump(0.05)
                elapsed = time.monotonic() - t0
                if not big_done and elapsed > 2:
                    # ~1.2 MB in one transaction: several parts of 256 kB on the stream.
                    env.db_query(DB, "INSERT INTO scratch SELECT g, repeat('y', 1000) FROM generate_series(10, 1210) g")
                    env.db_query(DB, "SELECT pg_logical_emit_message(true, 'app', 'hello')")
                    big_done = True
                if not killed and elapsed > RUN_SECONDS / 2 and streams["fa"].last_end > 0:
                    # The failover consumer confirms what it has, and its follower dies.
                    streams["fa"].confirm()
                    time.sleep(0.3)
                    state["confirmed"] = streams["fa"].last_end
                    state["a_prefix"] = list(streams["fa"].messages)
                    self.cluster.stop_node(1)  # and a NATS node with it
                    self.followers["a"].stop(sig=signal.SIGKILL)
                    for s in (streams.pop("a"), streams.pop("fa")):
                        s.close()
                    streams["fb"] = Stream(urls["b"], "failover", state["confirmed"])
                    killed = True
            stop.set()
            for w in writers:
                w.join(30)
                expect(w.error is None, "writer %d ran" % w.n, got=w.error)
            expect(killed, "follower a was killed mid-run")
            env.db_query(DB, "TRUNCATE scratch")
            env.db_query(DB, "INSERT INTO scratch VALUES (2, 'the end')")
            self.cluster.start_node(1)
            # The run ends with the commit of that last row, as the primary streams it.
            primary = streams["primary"]
            deadline = time.monotonic() + 90
            while not any(b"the end" in p for _, p in primary.messages) or primary.messages[-1][1][:1] != b"C":
                expect(time.monotonic() < deadline, "the primary streams the run's last row")
                for s in streams.values():
                    s.pump(0.05)
            state["end"] = primary.last_end
            pump_until(list(streams.values()), state["end"], 90, "every stream at the primary's end")
            state["committed"] = sum(w.committed for w in writers)
        env.check("writers, a 1.2 MB transaction, a follower and a NATS node killed -9: streams reach the end",
                  workload_with_failover)
        if "end" not in state:
            for s in streams.values():
                s.close()
            return

        def identical_psycopg2():
            primary = streams["primary"].messages
            expect(len(transactions(primary)) >= 100, "the primary streamed the run's transactions",
                   got=len(transactions(primary)))
            same_messages(streams["b"].messages, primary, "follower b's psycopg2 stream")
        env.check("psycopg2: follower b streams byte-identical pgoutput (same xids and LSNs) as the primary",
                  identical_psycopg2)

        def failover_lost_nothing():
            primary = transactions(streams["primary"].messages)
            before = transactions(state["a_prefix"])
            after = transactions(streams["fb"].messages)
            confirmed = state["confirmed"]
            expect(before and after, "the failover consumer read on both followers", got=(len(before), len(after)))
            expect(after[0] > confirmed, "follower b resumed after the confirmed LSN %s" % lsn_to_str(confirmed),
                   got=lsn_to_str(after[0]))
            have = [t for t in before if t <= confirmed] + after
            same_list(have, primary, "the failover consumer's commits (on follower a up to %s, then on b)"
                      % lsn_to_str(confirmed))
        env.check("a consumer of a follower killed -9 resumes on the other with nothing lost", failover_lost_nothing)

        def killed_follower_recovers():
            port = int(urls["a"].rsplit(":", 1)[1].split("/")[0])
            self.start_follower("a", port=port)
            self.wait_caught_up(["a", "b"], 90)
            # Its slot "same" never confirmed anything: it streams the run again, from its start.
            again = Stream(urls["a"], "same", state["start"])
            try:
                pump_until([again], state["end"], 90, "follower a's stream after its restart")
                same_messages(again.messages, streams["primary"].messages, "follower a's psycopg2 stream after kill -9")
            finally:
                again.close()
            primary = self.dump(os.path.join(env.base, "primary"))
            expect(primary.count('"begin"') >= 100, "the primary's log holds the run", got=primary.count('"begin"'))
            for name in ("a", "b"):
                got = self.dump(os.path.join(env.base, "follower-" + name))
                if got != primary:
                    mine, theirs = got.splitlines(), primary.splitlines()
                    first = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
                    raise CheckFailed("follower %s's log differs from the primary's at line %d of %d/%d:\n  %s\n  %s" % (
                        name, first, len(mine), len(theirs), mine[first] if first < len(mine) else "(end)",
                        theirs[first] if first < len(theirs) else "(end)"))
        env.check("after kill -9 follower a recovers: both logs hold the primary's entries exactly, a streams them again",
                  killed_follower_recovers)

        def identical_recvlogical():
            # pg_recvlogical -F 1 flushes each second; its files hold the same bytes once all end.
            files = {}
            for name, (path, proc) in recv.items():
                if name == "a":
                    continue  # it died with follower a
                wait_until(lambda p=path: os.path.exists(p) and os.path.getsize(p) > 0, 30, "pg_recvlogical output")
                files[name] = path
            time.sleep(3)  # a last flush
            for name, (path, proc) in recv.items():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
                    proc.wait(15)
            primary = open(files["primary"], "rb").read()
            expect(len(primary) > 100000, "pg_recvlogical wrote the run from the primary", got=len(primary))
            expect(primary.count(b"C\x00") > 0, "commits in it")
            expect_eq(open(files["b"], "rb").read(), primary, "pg_recvlogical's bytes from follower b")
            # Follower a, back from its kill, streams the same bytes to --endpos.
            later = os.path.join(env.base, "recv-a-later.bin")
            r = subprocess.run([os.path.join(PG_BIN, "pg_recvlogical"), "-d", urls["a"], "--slot", "later", "--start",
                                "-f", later, "--no-loop", "-E", lsn_to_str(state["end"]),
                                "-o", "proto_version=1", "-o", "publication_names=" + PUB],
                               capture_output=True, text=True, timeout=120)
            expect(r.returncode == 0, "pg_recvlogical --endpos on follower a", got=r.stderr)
            expect_eq(open(later, "rb").read(), primary, "pg_recvlogical's bytes from follower a after its kill -9")
        env.check("pg_recvlogical: both followers stream the primary's bytes", identical_recvlogical)

        for s in streams.values():
            s.close()

        def metrics():
            for name in ("a", "b"):
                expect((self.metric(name, "pgrelay_follower_applied_seq") or 0) > 0, "follower %s's applied_seq" % name)
                expect_eq(self.metric(name, "pgrelay_follower_pending_messages"), 0.0,
                          "follower %s's pending messages, caught up" % name)
                expect((self.metric(name, "pgrelay_follower_entries_total") or 0) > 0, "follower %s's entries" % name)
        env.check("metrics: pgrelay_follower_applied_seq, _pending_messages, _entries_total", metrics)

        def status():
            data_dir = os.path.join(env.base, "follower-b")
            r = subprocess.run([env.pgrelay, "status", "-D", data_dir, "--json"], capture_output=True, text=True,
                               timeout=60)
            expect_eq(r.returncode, 0, "pgrelay status --json of follower b", )
            follower = json.loads(r.stdout).get("follower")
            expect(follower is not None, "status --json has the follower", got=r.stdout[-500:])
            expect_eq(follower["stream"], "PGRELAY", "the stream it follows")
            expect_eq(follower["stream_seq"], int(self.metric("b", "pgrelay_follower_applied_seq")),
                      "the sequence its log holds the stream through, as its metric says")
            r = subprocess.run([env.pgrelay, "status", "-D", data_dir], capture_output=True, text=True, timeout=60)
            expect("follower:      of JetStream stream PGRELAY" in r.stdout, "pgrelay status says it follows",
                   got=r.stdout)
        env.check("pgrelay status of a follower: the stream and the sequence its log holds it through", status)

        self.sessions_without_upstream_links()
        self.without_upstream()
        self.retention()
        self.bad_input()

    def sessions_without_upstream_links(self):
        env = self.env

        def lazy_link():
            # A follower's replication sessions answer from the stream's server facts: none
            # opens an upstream backend (it would carry the client's application_name) until
            # SQL comes.
            b = self.followers["b"]
            start = create_slot(b.url, "probe")
            conn = psycopg2.connect(b.url, connection_factory=LogicalReplicationConnection,
                                    application_name="probe-b")
            probes = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'probe-b'"
            try:
                cur = conn.cursor()
                cur.execute("IDENTIFY_SYSTEM")
                cur.fetchone()
                cur.start_replication(slot_name="probe", decode=False, start_lsn=start,
                                      options={"proto_version": "1", "publication_names": PUB})
                env.db_query(DB, "INSERT INTO scratch VALUES (3, 'to probe-b')")
                deadline = time.monotonic() + 30
                got = b""
                while b"to probe-b" not in got:
                    expect(time.monotonic() < deadline, "follower b streams the row to probe-b")
                    msg = cur.read_message()
                    if msg is None:
                        select.select([cur], [], [], 0.05)
                        continue
                    got += bytes(msg.payload)
                expect_eq(env.db_query(DB, probes), [(0,)], "upstream backends of the streaming session")
            finally:
                conn.close()
            conn = psycopg2.connect(b.url, connection_factory=LogicalReplicationConnection,
                                    application_name="probe-b")
            try:
                cur = conn.cursor()
                cur.execute("SELECT current_database()")
                expect_eq(cur.fetchone(), (DB,), "SQL on the replication session, through --upstream")
                expect_eq(env.db_query(DB, probes), [(1,)], "the upstream backend SQL opened")
            finally:
                conn.close()
        env.check("a follower's replication sessions open an upstream backend only for SQL", lazy_link)

    def without_upstream(self):
        env = self.env
        password = "follower-n-pw"
        r = subprocess.run([env.pgrelay, "hash-password"], input=password + "\n", capture_output=True, text=True,
                           timeout=30)
        expect(r.returncode == 0, "pgrelay hash-password", got=r.stderr)
        users = ["--database", DB, "--user", "rep %s replication" % r.stdout.strip()]
        n = self.start_follower("n", extra=users, upstream=False)
        slot_end = {}

        def connect(relay, **kw):
            return psycopg2.connect(relay.url, password=password, **kw)

        def answers():
            self.wait_caught_up(["n"])
            version = env.db_query(DB, "SHOW server_version")[0][0]
            conn = connect(n, connection_factory=LogicalReplicationConnection, application_name="probe-n")
            try:
                expect_eq(conn.get_parameter_status("server_version"), version,
                          "ParameterStatus server_version: the primary's upstream's")
                expect_eq(conn.get_parameter_status("application_name"), "probe-n",
                          "ParameterStatus application_name: the session's own")
                cur = conn.cursor()
                cur.execute("IDENTIFY_SYSTEM")
                row = cur.fetchone()
                expect_eq(row[3], DB, "IDENTIFY_SYSTEM's dbname")
                expect_eq(lsn_to_int(row[2]), int(self.head("n")), "IDENTIFY_SYSTEM's xlogpos: the follower's head")
                cur.execute("SHOW server_version")
                expect_eq(cur.fetchone()[0], version, "SHOW server_version")
                try:
                    cur.execute("SELECT 1")
                    raise CheckFailed("SQL on a replication session of a follower without --upstream should fail")
                except psycopg2.Error as e:
                    expect_eq(e.pgcode, "08004", "SQLSTATE of SQL there")
                    expect("--upstream" in str(e), "the hint names --upstream", got=str(e))
                cur.execute("IDENTIFY_SYSTEM")
                expect_eq(cur.fetchone()[3], DB, "the session goes on after the refusal")
            finally:
                conn.close()
            try:
                psycopg2.connect(n.url.rsplit("/", 1)[0] + "/postgres", password=password,
                                 connection_factory=LogicalReplicationConnection).close()
                raise CheckFailed("a replication session of another database should be refused")
            except psycopg2.OperationalError as e:
                expect('serves database "%s", not "postgres"' % DB in str(e) and "--database" in str(e),
                       "the refusal names the database it serves", got=str(e))
            try:
                connect(n).close()
                raise CheckFailed("an ordinary session on a follower without --upstream should be refused")
            except psycopg2.OperationalError as e:
                expect("has no upstream for ordinary sessions" in str(e) and "--upstream URL" in str(e),
                       "the refusal names --upstream", got=str(e))
        env.check("without --upstream: the primary's settings from the stream; IDENTIFY_SYSTEM, SHOW answered; "
                  "SQL and ordinary sessions refused with 08004 naming --upstream, another database with 3D000",
                  answers)

        def recv(relay, slot, path, publication, pgpassword=None):
            proc_env = dict(os.environ, PGPASSWORD=pgpassword) if pgpassword else None
            r = subprocess.run([os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", slot, "--start",
                                "-f", path, "--no-loop", "-E", lsn_to_str(slot_end["end"]),
                                "-o", "proto_version=1", "-o", "publication_names=" + publication],
                               capture_output=True, text=True, timeout=120, env=proc_env)
            expect(r.returncode == 0, "pg_recvlogical --endpos from %s" % relay.url, got=r.stderr)
            with open(path, "rb") as f:
                return f.read()

        def streams():
            # A publication made after the primary published its facts: the follower knows it
            # from the marker capture logs in the DDL's transaction, before the row after it.
            env.db_query(DB, "CREATE PUBLICATION only_scratch FOR TABLE scratch")
            env.db_query(DB, "INSERT INTO scratch VALUES (6, 'fence for n')")
            wait_until(lambda: "fence for n" in self.dump(os.path.join(env.base, "follower-n")), 60,
                       "the row after CREATE PUBLICATION in follower n's log")
            self.wait_caught_up(["n"])
            create_slot(self.primary.url, "nslot")
            create_slot(n.url, "nslot", password=password)
            env.db_query(DB, "INSERT INTO scratch VALUES (4, 'scratch row for n')")
            env.db_query(DB, "INSERT INTO accounts VALUES (900, 1, 'account row for n')")
            env.db_query(DB, "INSERT INTO scratch VALUES (5, 'last scratch row for n')")
            wait_until(lambda: "last scratch row for n" in self.dump(os.path.join(env.base, "follower-n")), 60,
                       "the last row in follower n's log")
            slot_end["end"] = self.wait_caught_up(["n"])
            primary = recv(self.primary, "nslot", os.path.join(env.base, "recv-n-primary.bin"), "only_scratch")
            got = recv(n, "nslot", os.path.join(env.base, "recv-n.bin"), "only_scratch", password)
            expect(b"last scratch row for n" in primary and b"account row for n" not in primary,
                   "the primary streams only_scratch's rows", got=primary[-300:])
            expect_eq(got, primary, "pg_recvlogical's bytes from follower n")
            conn = connect(n, connection_factory=LogicalReplicationConnection)
            try:
                cur = conn.cursor()
                try:
                    cur.start_replication(slot_name="nslot", decode=False, start_lsn=slot_end["end"],
                                          options={"proto_version": "1", "publication_names": PUB, "binary": "true"})
                    raise CheckFailed("binary mode on a follower without --upstream should be refused")
                except psycopg2.Error as e:
                    expect_eq(e.pgcode, "08004", "SQLSTATE of binary mode without --upstream")
                    expect("--upstream" in str(e), "the hint names --upstream", got=str(e))
            finally:
                conn.close()
        env.check("without --upstream: pg_recvlogical streams the primary's bytes, with a publication made "
                  "since its facts; binary mode refused (08004)", streams)

        def kept_facts():
            # Restarted with NATS unreachable, it answers from the facts it kept.
            n.stop()
            dead = free_port()
            again = env.start_relay(data_dir=os.path.join(env.base, "follower-n"), port=n.port, upstream=False,
                                    extra_args=["--no-tls", "--follow", "nats://127.0.0.1:%d" % dead] + users)
            try:
                version = env.db_query(DB, "SHOW server_version")[0][0]
                conn = connect(again, connection_factory=LogicalReplicationConnection)
                try:
                    cur = conn.cursor()
                    cur.execute("SHOW server_version")
                    expect_eq(cur.fetchone()[0], version, "SHOW server_version after the restart")
                finally:
                    conn.close()
                expect(os.path.exists(os.path.join(env.base, "follower-n", "server_facts.json")),
                       "the facts kept in the data directory")
            finally:
                again.stop()
        env.check("without --upstream, restarted with NATS unreachable: it answers from the facts it kept",
                  kept_facts)

    def retention(self):
        env = self.env

        def behind_retention():
            self.wait_caught_up(["b"])
            before = self.dump(os.path.join(env.base, "follower-b"))
            self.followers["b"].stop()
            for i in range(5):
                env.db_query(DB, "INSERT INTO scratch VALUES (%d, 'while b is down')" % (100 + i))
            # Published, not only captured: a lag of 0 alone may be read before capture took them.
            scratch = "pgrelay.%s.public.scratch" % DB
            wait_until(lambda: any((json.loads(m["data"]).get("new") or {}).get("id") == "104"
                                   for m in self.js.read("PGRELAY", scratch)), 60, "the last row on " + scratch)
            wait_until(lambda: (self.metric("primary", "pgrelay_nats_lag_bytes") or 0) == 0, 30, "the primary published")
            last = self.js.last("PGRELAY", "pgrelay.%s._tx" % DB)
            self.js.run("purge", "PGRELAY", str(last["seq"] + 1))
            for i in range(3):
                env.db_query(DB, "INSERT INTO scratch VALUES (%d, 'after the purge')" % (200 + i))
            wait_until(lambda: (self.metric("primary", "pgrelay_nats_lag_bytes") or 0) == 0, 30, "the primary published")
            b = self.start_follower("b")
            try:
                wait_until(lambda: "no longer holds what follows this follower's log" in self.follower_log("b"), 60,
                           "follower b says the stream lost what it needs")
            except CheckFailed as e:
                raise CheckFailed("%s\n%s" % (e, b.stderr_tail(30)))
            text = self.follower_log("b")
            expect("Rebuild this follower" in text, "the hint says how to rebuild it", got=text[-1500:])
            expect((self.metric("b", 'pgrelay_follower_errors_total{database="%s",reason="stream"}' % DB) or 0) > 0,
                   "pgrelay_follower_errors_total{reason=\"stream\"} counts it")
            expect_eq(self.dump(os.path.join(env.base, "follower-b")), before, "follower b's log, unchanged")
            got = env.relay_query(b, "SELECT count(*) FROM scratch")
            expect(got[0][0] > 0, "follower b still serves")
            # A follower made anew starts from the stream's oldest transaction; its --upstream
            # is the primary pgrelay itself.
            c = self.start_follower("c", upstream=self.primary.url)
            wait_until(lambda: self.head("c") >= self.head("primary"), 60, "follower c at the primary's head")
            dump = self.dump(os.path.join(env.base, "follower-c"))
            expect_eq(dump.count('"begin"'), 3, "follower c's log: the 3 transactions the stream still holds")
            expect("after the purge" in dump and "while b is down" not in dump, "and only those", got=dump[:500])
            expect_eq(env.relay_query(c, "SELECT v FROM scratch WHERE id = 200"), [("after the purge",)],
                      "an ordinary session on c, through the primary")
            start = create_slot(c.url, "through_primary")
            env.db_query(DB, "INSERT INTO scratch VALUES (300, 'streamed by c')")
            stream = Stream(c.url, "through_primary", start)
            try:
                deadline = time.monotonic() + 60
                while not any(b"streamed by c" in p for _, p in stream.messages):
                    expect(time.monotonic() < deadline, "follower c streams the new row, its publication read "
                           "through the primary")
                    stream.pump(0.2)
            finally:
                stream.close()
            c.stop()
            expect_eq(self.follower_log("b").count("no longer holds what follows"), 1,
                      "times follower b logged it while it retried")
        env.check("a follower behind the stream's retention says so and keeps its log; a new one starts at the oldest",
                  behind_retention)

    def bad_input(self):
        env = self.env

        def no_upstream():
            base = [env.pgrelay, "serve", "--follow", self.cluster.urls(), "--data-dir", os.path.join(env.base, "x")]
            for extra, phrase in (([], "--follow without --upstream needs --database NAME"),
                                  (["--database", DB], "--follow without --upstream needs --users or --user")):
                r = subprocess.run(base + extra, capture_output=True, text=True, timeout=30)
                expect_eq(r.returncode, 2, "exit status of --follow without --upstream %s" % " ".join(extra))
                expect(phrase in r.stderr, "the error says %r" % phrase, got=r.stderr)
        env.check("--follow without --upstream: exit 2 naming --database, then --user", no_upstream)

        def capture_into_a_followers_log():
            # Follower c stopped at the end of the retention check; its log is a follower's.
            r = subprocess.run([env.pgrelay, "serve", "--upstream", env.upstream_url(DB), "--no-tls",
                                "--listen", "127.0.0.1:%d" % free_port(), "--capture", "native",
                                "--data-dir", os.path.join(env.base, "follower-c")],
                               capture_output=True, text=True, timeout=60)
            expect(r.returncode != 0, "a capturing pgrelay on a follower's data directory fails", got=r.returncode)
            expect("is a follower's, rebuilt from a NATS stream" in r.stderr and "--follow" in r.stderr,
                   "the error says whose log it is and names --follow", got=r.stderr[-1500:])
        env.check("a capturing pgrelay refuses a follower's data directory, naming --follow",
                  capture_into_a_followers_log)

        def starts_and_says(name, extra, phrase, hint):
            relay = self.start_follower(name, extra=extra)
            wait_until(lambda: phrase in self.follower_log(name), 30, "follower %s logs %r" % (name, phrase))
            text = self.follower_log(name)
            expect(hint in text, "the hint %r" % hint, got=text[-1500:])
            expect_eq(env.relay_query(relay, "SELECT 1"), [(1,)], "follower %s still serves" % name)
            relay.stop()

        def unreachable():
            port = free_port()
            relay = self.env.start_relay(
                data_dir=os.path.join(env.base, "follower-u"), upstream=env.upstream_url(DB),
                extra_args=["--no-tls", "--follow", "nats://127.0.0.1:%d" % port])
            self.followers["u"] = relay
            wait_until(lambda: "following the NATS stream interrupted" in self.follower_log("u"), 30, "an error logged")
            expect("127.0.0.1:%d" % port in self.follower_log("u") or "no server" in self.follower_log("u").lower(),
                   "the error names the server", got=self.follower_log("u")[-1500:])
            expect_eq(env.relay_query(relay, "SELECT 1"), [(1,)], "the follower still serves")
            relay.stop()
        env.check("bad input: an unreachable NATS URL is logged, and the follower serves", unreachable)
        env.check("bad input: a stream that does not exist",
                  lambda: starts_and_says("m", ["--nats-stream", "NOPE"], "the JetStream stream NOPE does not exist",
                                          "--nats-stream"))

        def foreign():
            self.js.run("add-stream", "FOREIGN", "foreign.>")
            self.js.run("publish", "foreign.%s._tx" % DB, "not pgrelay's")
            starts_and_says("f", ["--nats-stream", "FOREIGN", "--nats-subject-prefix", "foreign"],
                            "was not written by pgrelay", "Point the follower at the stream a pgrelay primary publishes")
        env.check("bad input: a stream pgrelay did not write", foreign)


def body(env):
    if not shutil.which("nats-server"):
        raise RuntimeError("nats-server is not installed: apt-get install nats-server (scripts/deps.sh does)")
    module, why = ensure_npm_package("nats@2", "nats")
    if module is None:
        env.skip("followers", why)
        return
    Case(env, module).run()


if __name__ == "__main__":
    main("follower", body)
