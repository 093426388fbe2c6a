# Restarting `pgrelay serve`: SIGTERM ends streams as Postgres's walsender does (CommandComplete
# "COPY 0" once the consumer confirmed everything), slots and positions survive.
import os
import select
import signal
import struct
import subprocess
import time

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import (PASSWORD, PG_BIN, RawConn, expect, expect_eq, lsn_to_int, lsn_to_str, main, parse_error,
                         standby_status, wait_until)
from pgoutput_decode import Session, decode_message, decode_recvlogical, session_of

SCHEMA = """
CREATE TABLE r_items (id int PRIMARY KEY, label text NOT NULL);
CREATE PUBLICATION pub_rs FOR TABLE r_items;
"""
START_OPTIONS = "(proto_version '1', publication_names 'pub_rs')"


def write(env, n):
    conn = env.direct(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO r_items VALUES (%s, %s), (%s, %s)", (10 * n, "t%d" % n, 10 * n + 1, "t%d" % n))
    conn.commit()
    conn.close()


def changes_of(n):
    return [("I", "public.r_items", [str(10 * n), "t%d" % n]), ("I", "public.r_items", [str(10 * n + 1), "t%d" % n])]


class RawStream:
    """A replication stream on a raw socket: every protocol message is visible."""

    def __init__(self, relay, slot):
        self.conn = RawConn("127.0.0.1", relay.port, "postgres", PASSWORD, "e2e")
        self.conn.query("START_REPLICATION SLOT %s LOGICAL 0/0 %s" % (slot, START_OPTIONS))
        tag, payload = self.conn.read()
        if tag != b"W":
            raise AssertionError("START_REPLICATION answered %r %r" % (tag, parse_error(payload or b"")))
        self.session = Session()
        self.commit_ends = []
        self.other = []  # (tag, payload) of non-CopyData messages

    def pump(self, until, timeout):
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("raw stream: timed out; have %d transactions, other %r" % (
                    len(self.session.transactions), self.other))
            tag, payload = self.conn.read(timeout=left)
            if tag is None:
                self.other.append(("EOF", b""))
                return
            self.handle(tag, payload)

    def handle(self, tag, payload):
        if tag == b"d" and payload[:1] == b"w":
            msg = decode_message(payload[25:])
            if msg["tag"] == "C":
                self.commit_ends.append(msg["end_lsn"])
            self.session.feed(msg)
        elif tag == b"d" and payload[:1] == b"k":
            if payload[17]:  # reply requested
                self.conn.send(b"d", standby_status(self.commit_ends[-1] if self.commit_ends else 0))
        else:
            self.other.append((tag, payload))

    def confirm(self, lsn):
        self.conn.send(b"d", standby_status(lsn))


def identify_system(relay):
    raw = RawConn("127.0.0.1", relay.port, "postgres", PASSWORD, "e2e")
    try:
        raw.query("IDENTIFY_SYSTEM")
        row = None
        while True:
            tag, payload = raw.read()
            if tag == b"D":
                n = struct.unpack("!h", payload[:2])[0]
                pos, row = 2, []
                for _ in range(n):
                    ln = struct.unpack("!i", payload[pos:pos + 4])[0]
                    pos += 4
                    row.append(payload[pos:pos + ln].decode())
                    pos += ln
            if tag in (b"Z", None):
                return row
    finally:
        raw.close()


def body(env):
    env.start_postgres()
    env.psql_admin(SCHEMA)
    data_dir = os.path.join(env.base, "relay-data")
    relay = env.start_relay(data_dir=data_dir)
    port = relay.port
    state = {}
    recv_file = os.path.join(env.base, "recv.bin")
    recv_err = open(os.path.join(env.base, "recv.stderr"), "wb")

    def recv_stderr():
        with open(os.path.join(env.base, "recv.stderr"), "rb") as f:
            return f.read().decode(errors="replace")

    def recv_messages(partial=True):
        try:
            with open(recv_file, "rb") as f:
                return decode_recvlogical(f.read(), allow_partial=partial)
        except FileNotFoundError:
            return []

    def slots(r):
        return {row[0]: row[1:] for row in env.relay_query(
            r, "SELECT slot_name, confirmed_flush_lsn::text, active FROM pg_replication_slots")}

    def before_restart():
        state["sysid"] = identify_system(relay)
        r = subprocess.run([os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", "rs_recv",
                            "--create-slot", "-P", "pgoutput"], capture_output=True, text=True, timeout=60)
        expect(r.returncode == 0, "pg_recvlogical --create-slot: " + r.stderr)
        conn = psycopg2.connect(relay.url, connection_factory=LogicalReplicationConnection)
        cur = conn.cursor()
        cur.create_replication_slot("rs_py", output_plugin="pgoutput")
        cur.create_replication_slot("rs_raw", output_plugin="pgoutput")
        # Streams: pg_recvlogical loops (reconnects after a disconnect), psycopg2, a raw socket.
        state["recv"] = env.spawn([os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", "rs_recv",
                                   "--start", "-o", "proto_version=1", "-o", "publication_names=pub_rs", "-f",
                                   recv_file, "-F", "1", "-s", "1", "-v"], stdout=subprocess.DEVNULL, stderr=recv_err)
        cur.start_replication(slot_name="rs_py", decode=False,
                              options={"proto_version": "1", "publication_names": "pub_rs"})
        state["py_conn"], state["py"] = conn, cur
        py_session, py_commits = Session(), []
        state["raw"] = raw = RawStream(relay, "rs_raw")
        write(env, 1)
        write(env, 2)

        def py_until(n, timeout):
            deadline = time.monotonic() + timeout
            while len(py_session.transactions) < n:
                expect(time.monotonic() < deadline, "psycopg2 got %d transactions" % len(py_session.transactions))
                msg = cur.read_message()
                if msg is None:
                    select.select([cur], [], [], 0.2)
                    continue
                m = decode_message(msg.payload)
                if m["tag"] == "C":
                    py_commits.append(msg.data_start)
                py_session.feed(m)
        py_until(2, 30)
        raw.pump(lambda: len(raw.session.transactions) >= 2, 30)
        wait_until(lambda: sum(1 for m in recv_messages() if m["tag"] == "C") >= 2, 30, "pg_recvlogical: 2 commits")
        expect_eq(py_session.changes(), [changes_of(1), changes_of(2)], "psycopg2 before restart")
        expect_eq(raw.session.changes(), [changes_of(1), changes_of(2)], "raw stream before restart")
        cur.send_feedback(flush_lsn=py_commits[-1], force=True)
        raw.confirm(raw.commit_ends[-1])
        state["t2_end"] = raw.commit_ends[-1]
        state["t2_commit"] = raw.session.transactions[-1]["commit_lsn"]
        expect_eq(py_commits[-1], raw.commit_ends[-1], "both consumers saw the same end LSN for T2")
        want = lsn_to_str(state["t2_end"])

        def confirmed():
            s = slots(relay)
            state["slots_before"] = s
            return all(k in s and s[k][0] == want and s[k][1] is True for k in ("rs_py", "rs_raw")) \
                and "rs_recv" in s and s["rs_recv"][0] is not None and lsn_to_int(s["rs_recv"][0]) >= state["t2_end"]
        try:
            wait_until(confirmed, 15, "confirmed positions of the 3 slots")
        except Exception:
            expect(False, "slots confirmed before restart", got=state.get("slots_before"), expected="rs_py, rs_raw at %s; rs_recv at or after it" % want)
        state["ready"] = True

    def sigterm():
        expect(state.get("ready"), "streams were running")
        raw = state["raw"]
        relay.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        got_end = None
        after = []
        try:
            while time.monotonic() - t0 < 8:
                tag, payload = raw.conn.read(timeout=max(0.1, 8 - (time.monotonic() - t0)))
                if tag is None:
                    after.append("EOF")
                    break
                if got_end is None and tag == b"C" and payload.rstrip(b"\0") == b"COPY 0":
                    got_end = time.monotonic() - t0
                    continue
                if tag == b"d":
                    if got_end is not None:
                        after.append("CopyData after COPY 0")
                    continue
                after.append((tag.decode(), parse_error(payload).get("C") if tag == b"E" else payload[:20]))
        except OSError as e:
            after.append("socket: %s" % e)
        try:
            code = relay.proc.wait(10)
        except subprocess.TimeoutExpired:
            code = "still running after 10 s"
        took = time.monotonic() - t0
        state["stopped"] = True
        expect(got_end is not None and got_end < 5,
               "the raw stream ends with CommandComplete COPY 0 within 5 s of SIGTERM", got={"COPY 0 at": got_end, "after": after})
        expect(after[-1:] == ["EOF"], "the connection closes after COPY 0", got=after)
        expect_eq(code, 0, "pgrelay serve exit code after SIGTERM (took %.1fs)" % took)
        expect(took < 6, "serve exits within a few seconds of SIGTERM", got=round(took, 1))
        print("    after COPY 0 the raw client saw: %r; serve exited in %.1fs" % (after, took))
        # psycopg2 sees its stream end instead of hanging.
        cur = state["py"]
        ended = None
        deadline = time.monotonic() + 10
        while ended is None and time.monotonic() < deadline:
            try:
                msg = cur.read_message()
                if msg is None:
                    if state["py_conn"].closed:
                        ended = "connection closed"
                    else:
                        select.select([cur], [], [], 0.2)
            except psycopg2.Error as e:
                ended = "%s: %s" % (type(e).__name__, str(e).strip())
        expect(ended is not None, "psycopg2's stream ends when serve stops")
        print("    psycopg2 stream ended with: %s" % ended)
        recv = state["recv"]
        wait_until(lambda: "disconnected" in recv_stderr(), 10, "pg_recvlogical to notice the disconnect")
        expect(recv.poll() is None, "pg_recvlogical keeps retrying (it was started without --no-loop)")

    def after_restart():
        expect(state.get("stopped"), "serve was stopped")
        write(env, 3)  # while serve is down: the triggers keep it upstream
        relay2 = env.start_relay(data_dir=data_dir, port=port)
        sysid = identify_system(relay2)
        expect_eq((sysid[0], sysid[1], sysid[3]), (state["sysid"][0], state["sysid"][1], state["sysid"][3]),
                  "IDENTIFY_SYSTEM systemid, timeline, dbname stable across the restart")
        s = slots(relay2)
        want = lsn_to_str(state["t2_end"])
        expect_eq(sorted(s), ["rs_py", "rs_raw", "rs_recv"], "slots after restart")
        expect_eq((s["rs_py"][0], s["rs_raw"][0]), (want, want), "confirmed_flush_lsn survived the restart")
        write(env, 4)
        # pg_recvlogical reconnects by itself (every 5 s) and resumes from its confirmed position.
        wait_until(lambda: sum(1 for m in recv_messages() if m["tag"] == "C") >= 4, 40,
                   "pg_recvlogical to reconnect and receive T3 and T4")
        time.sleep(1.5)
        all_recv = session_of(recv_messages())
        expect_eq(all_recv.changes(), [changes_of(n) for n in (1, 2, 3, 4)],
                  "pg_recvlogical's file across the restart: T1..T4, none lost, none twice")
        commits = [t["commit_lsn"] for t in all_recv.transactions]
        expect(all(a < b for a, b in zip(commits, commits[1:])), "commit LSNs keep increasing across the restart",
               got=[lsn_to_str(c) for c in commits])
        # psycopg2 and the raw client resume from their confirmed positions.
        conn = psycopg2.connect(relay2.url, connection_factory=LogicalReplicationConnection)
        try:
            cur = conn.cursor()
            cur.start_replication(slot_name="rs_py", decode=False,
                                  options={"proto_version": "1", "publication_names": "pub_rs"})
            session = Session()
            deadline = time.monotonic() + 30
            while len(session.transactions) < 2 and time.monotonic() < deadline:
                msg = cur.read_message()
                if msg is None:
                    select.select([cur], [], [], 0.2)
                else:
                    session.feed(decode_message(msg.payload))
            expect_eq(session.changes(), [changes_of(3), changes_of(4)], "psycopg2 resumes after the restart")
        finally:
            conn.close()
        raw = RawStream(relay2, "rs_raw")
        try:
            raw.pump(lambda: len(raw.session.transactions) >= 2, 30)
            expect_eq(raw.session.changes(), [changes_of(3), changes_of(4)], "raw stream resumes after the restart")
        finally:
            raw.conn.close()
        state["recv"].send_signal(signal.SIGINT)
        state["recv"].wait(10)

    env.check("streams running, positions confirmed", before_restart)
    env.check("SIGTERM: streams end with COPY 0, exit 0", sigterm)
    env.check("restart on the same data dir: slots and positions survive, consumers resume", after_restart)


if __name__ == "__main__":
    main("restart", body)
