# Large transactions through `pgrelay serve`, both capture modes: memory bounded, whole delivery, kill -9.
"""A transaction far larger than pgrelay may hold in memory, committed while a consumer streams.

For each capture mode, in a database of its own on one wal_level=logical upstream:
  - one INSERT of ROWS rows (200-byte text each) in one transaction, and one of TOAST_VALUES
    values of 1 MiB (STORAGE EXTERNAL, so the bytes really are that many) in another: each
    arrives at a psycopg2 consumer streaming through pgrelay as one transaction, every row once
    and in order, while pgrelay's RSS (sampled every 50 ms from /proc) stays within
    BOUND_MIB of what it was before the write;
  - kill -9 of pgrelay while it captures such a transaction (seen by the unnamed spill file it
    holds open), and again while it serves one (the consumer has part of it): after a restart
    on the same data directory the consumer gets the transaction whole and exactly once, and
    no spill file of the killed run is left.
"""

import os
import select
import threading
import time
import urllib.request

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import expect, expect_eq, free_port, main, run_capture_modes, wait_until
from pgoutput_decode import decode_message

ROWS = int(os.environ.get("PGRELAY_E2E_LARGE_ROWS", "150000"))
TOAST_VALUES = int(os.environ.get("PGRELAY_E2E_LARGE_TOAST", "48"))
BOUND_MIB = 64
# Small enough that the upstream streams these transactions to native capture while they run
# (the default, 64MB, would stream only ones larger than the suite's).
LOGICAL_CONF = ("wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
                "logical_decoding_work_mem = 4MB\n")
# ASan keeps freed memory in quarantine (256 MiB by default) before reusing it, which would
# count as pgrelay's own; a small quarantine keeps what is measured the program's.
ASAN_QUARANTINE = "quarantine_size_mb=8:thread_local_quarantine_size_kb=256"


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class RssSampler(threading.Thread):
    """The peak of a process's resident set, sampled every 50 ms until stopped."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.idle = rss_kib(pid)
        self.peak = self.idle
        self.samples = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, rss_kib(self.pid))
                self.samples += 1
            except OSError:
                return
            time.sleep(0.05)

    def stop(self):
        self.done.set()
        self.join()
        return (self.peak - self.idle) / 1024.0


class Stream:
    """A psycopg2 replication stream through pgrelay: the transactions of table `big`, summed."""

    def __init__(self, url, slot):
        self.conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection, connect_timeout=10)
        self.cur = self.conn.cursor()
        self.cur.start_replication(slot_name=slot, decode=False, status_interval=1,
                                   options={"proto_version": "1", "publication_names": "bigpub"})
        self.big = None  # the relation OID of `big`
        self.open = None  # the transaction being received: [rows, first id, last id, in order, bytes]
        self.done = []  # finished transactions with rows: (rows, first id, last id, in order, bytes)

    def partial_rows(self):
        return self.open[0] if self.open else 0

    def pump(self, until, timeout, what):
        deadline = time.monotonic() + timeout
        while not until():
            expect(time.monotonic() < deadline, "timed out after %ss waiting for %s (finished %r, open %r)"
                   % (timeout, what, self.done, self.open and self.open[:4]))
            msg = self.cur.read_message()
            if msg is None:
                select.select([self.cur], [], [], 0.2)
                continue
            m = decode_message(msg.payload)
            tag = m["tag"]
            if tag == "R" and m["name"] == "big":
                self.big = m["oid"]
            elif tag == "B":
                self.open = [0, None, None, True, 0]
            elif tag == "I" and m["relid"] == self.big:
                key = int(m["new"][0])
                t = self.open
                if t[2] is not None and key != t[2] + 1:
                    t[3] = False
                if t[1] is None:
                    t[1] = key
                t[0] += 1
                t[2] = key
                t[4] += len(m["new"][1] or "")
            elif tag == "C":
                if self.open[0]:
                    self.done.append(tuple(self.open))
                self.open = None
                self.cur.send_feedback(flush_lsn=msg.data_start)

    def listen(self, seconds):
        """Reads whatever arrives for `seconds`."""
        deadline = time.monotonic() + seconds
        self.pump(lambda: time.monotonic() >= deadline, seconds + 5, "%ss of the stream" % seconds)

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


def spill_files(pid, spill_dir):
    """The spill files pgrelay holds open: unnamed (O_TMPFILE) or unlinked files in spill_dir."""
    out = []
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith(spill_dir + "/"):
            out.append(target)
    return out


class Mode:
    def __init__(self, env, name):
        self.env = env
        self.name = name
        self.db = "big_%s" % name
        self.data_dir = os.path.join(env.base, "relay-%s" % name)
        self.spill_dir = os.path.join(self.data_dir, "spill")
        self.relay = None
        self.port = None
        self.next_id = 1
        self.slot_n = 0
        self.metrics_port = free_port()

    def start(self):
        os.environ["ASAN_OPTIONS"] = ":".join(
            o for o in (os.environ.get("ASAN_OPTIONS", ""), ASAN_QUARANTINE) if o)
        upstream = self.env.upstream_url(self.db)
        self.relay = self.env.start_relay(data_dir=self.data_dir, port=self.port, upstream=upstream,
                                          extra_args=["--no-tls", "--capture", self.name, "--metrics",
                                                      "127.0.0.1:%d" % self.metrics_port])
        self.port = self.relay.port

    def stream(self, slot=None):
        if slot is None:
            self.slot_n += 1
            slot = "big_%s_%d" % (self.name, self.slot_n)
            conn = psycopg2.connect(self.relay.url, connection_factory=LogicalReplicationConnection)
            conn.cursor().create_replication_slot(slot, output_plugin="pgoutput")
            conn.close()
        return slot, Stream(self.relay.url, slot)

    def query(self, sql, args=None):
        return self.env.db_query(self.db, sql, args)

    def insert_rows(self, rows):
        first = self.next_id
        self.query("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(%s, %s) g",
                              (first, first + rows - 1))
        self.next_id += rows
        return first

    def insert_toast(self, values):
        first = self.next_id
        # md5 text is incompressible enough, and STORAGE EXTERNAL stores it out of line as is.
        self.query(
            "INSERT INTO big SELECT g, (SELECT string_agg(md5(g::text || ':' || i::text), '') "
            "FROM generate_series(1, 32768) i) FROM generate_series(%s, %s) g", (first, first + values - 1))
        self.next_id += values
        return first

    def expect_whole(self, stream, first, rows, what, timeout):
        stream.pump(lambda: len(stream.done) >= 1, timeout, what)
        expect_eq(len(stream.done), 1, "%s: transactions with rows received" % what)
        got_rows, got_first, got_last, ordered, _ = stream.done[0]
        expect_eq((got_rows, got_first, got_last, ordered), (rows, first, first + rows - 1, True),
                  "%s: (rows, first id, last id, in order) of the one transaction" % what)
        stream.done.clear()

    def bounded(self, write, rows, what, timeout):
        slot, stream = self.stream()
        try:
            sampler = RssSampler(self.relay.proc.pid)
            sampler.start()
            start = time.monotonic()
            first = write(rows)
            write_s = time.monotonic() - start
            self.expect_whole(stream, first, rows, what, timeout)
            total_s = time.monotonic() - start
            grown = sampler.stop()
            print("    %s: %s, write %.1fs, commit to whole transaction %.1fs; pgrelay RSS %.0f MiB idle, "
                  "peak %.1f MiB above it (%d samples)" % (self.name, what, write_s, total_s - write_s,
                                                           sampler.idle / 1024.0, grown, sampler.samples))
            expect(grown <= BOUND_MIB, "%s: pgrelay's RSS grew %.1f MiB (bound %d MiB)" % (what, grown, BOUND_MIB))
        finally:
            stream.close()
        self.drop_slot(slot)

    def streamed_transactions(self):
        """pgrelay's count of transactions it took in while they ran upstream (from /metrics)."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith("pgrelay_captured_streamed_transactions_total") and self.db in line:
                return float(line.split()[-1])
        raise AssertionError("no streamed-transactions metric for %s in:\n%s" % (self.db, text[-2000:]))

    def drop_slot(self, slot):
        conn = psycopg2.connect(self.relay.url, connection_factory=LogicalReplicationConnection)
        try:
            conn.cursor().drop_replication_slot(slot)
        finally:
            conn.close()

    def kill_and_restart(self):
        pid = self.relay.proc.pid
        self.relay.stop(sig=9)
        self.start()
        left = [f for f in os.listdir(self.spill_dir)] if os.path.isdir(self.spill_dir) else []
        expect_eq(left, [], "files in the spill directory after the restart")
        print("    %s: killed pgrelay (pid %d) with SIGKILL, restarted as pid %d" % (self.name, pid, self.relay.proc.pid))

    def kill_while_capturing(self):
        slot, stream = self.stream()
        stream.close()  # nothing is delivered before the capture ends; the stream starts again later
        first = self.next_id
        # Native capture takes the transaction in while it runs, trigger capture after it commits:
        # the INSERT runs beside the wait for the spill file either way.
        failed = []
        writer = threading.Thread(target=lambda: self.guarded(failed, self.insert_rows, ROWS), daemon=True)
        writer.start()
        pid = self.relay.proc.pid
        wait_until(lambda: spill_files(pid, self.spill_dir), 120,
                   "pgrelay to hold a spill file of the transaction it captures", interval=0.01)
        self.kill_and_restart()
        writer.join(120)
        expect(not writer.is_alive() and not failed, "the INSERT committed upstream (%r)" % failed)
        _, stream = self.stream(slot)
        try:
            self.expect_whole(stream, first, ROWS, "after kill -9 while capturing", 300)
            stream.listen(3)  # a second copy would follow at once
            expect_eq(stream.done, [], "transactions after the whole one (a second copy)")
        finally:
            stream.close()
        self.drop_slot(slot)

    @staticmethod
    def guarded(failed, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # reported by the caller's check
            failed.append(repr(e))

    def kill_while_serving(self):
        slot, stream = self.stream()
        first = self.insert_rows(ROWS)
        stream.pump(lambda: stream.partial_rows() >= 1000, 300, "the first rows of the transaction")
        expect(not stream.done, "the transaction was still arriving when pgrelay was killed")
        had = stream.partial_rows()
        stream.close()
        self.kill_and_restart()
        _, stream = self.stream(slot)
        try:
            self.expect_whole(stream, first, ROWS, "after kill -9 while serving (%d rows had arrived)" % had, 300)
            stream.listen(3)
            expect_eq(stream.done, [], "transactions after the whole one (a second copy)")
        finally:
            stream.close()
        self.drop_slot(slot)

    def run(self):
        env = self.env
        n = self.name

        def setup():
            env.psql_admin("CREATE DATABASE %s" % self.db, db="postgres")
            self.query("CREATE TABLE big (id int PRIMARY KEY, v text)")
            self.query("ALTER TABLE big ALTER COLUMN v SET STORAGE EXTERNAL")
            self.query("CREATE PUBLICATION bigpub FOR TABLE big")
            self.start()

        env.check("%s: setup: upstream, table big, publication, pgrelay serve --capture %s" % (n, n), setup)
        def rows_bounded():
            self.bounded(self.insert_rows, ROWS, "%d rows" % ROWS, 600)
            # Native capture took it in while it ran (the upstream streamed it); trigger capture
            # reads after the commit.
            streamed = self.streamed_transactions()
            if n == "native":
                expect(streamed >= 1, "the upstream streamed the transaction to native capture", got=streamed)
            else:
                expect_eq(streamed, 0.0, "transactions streamed to trigger capture")

        env.check("%s: %d-row transaction (200 B each): one transaction, every row once, in order; "
                  "RSS within %d MiB%s" % (n, ROWS, BOUND_MIB, "; taken in while it ran" if n == "native" else ""),
                  rows_bounded)
        env.check("%s: %d x 1 MiB TOAST values in one transaction: whole, in order; RSS within %d MiB"
                  % (n, TOAST_VALUES, BOUND_MIB),
                  lambda: self.bounded(self.insert_toast, TOAST_VALUES, "%d MiB of TOAST" % TOAST_VALUES, 600))
        env.check("%s: kill -9 while capturing a %d-row transaction: after restart it arrives whole, once; "
                  "no spill file left" % (n, ROWS), self.kill_while_capturing)
        env.check("%s: kill -9 while serving a %d-row transaction: after restart it arrives whole, once"
                  % (n, ROWS), self.kill_while_serving)


def body(env):
    run_capture_modes(env, Mode, LOGICAL_CONF)


if __name__ == "__main__":
    main("large_tx", body)
