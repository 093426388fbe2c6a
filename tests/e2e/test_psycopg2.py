# psycopg2's LogicalReplicationConnection against `pgrelay serve`: slot, stream, feedback, resume.
import select
import time

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import expect, expect_eq, lsn_to_int, lsn_to_str, main, wait_until
from pgoutput_decode import Session, decode_message

WAL_SENDER_TIMEOUT = 4  # seconds: keepalives with reply-requested every 2 s

SCHEMA = """
CREATE TABLE events (id int PRIMARY KEY, kind text NOT NULL, payload jsonb, at timestamptz);
CREATE PUBLICATION pub_py FOR TABLE events;
"""


def txn_sql(i):
    return ("INSERT INTO events VALUES (%d, 'k%d', '{\"n\": %d}', '2024-01-02 03:04:05+00');"
            " INSERT INTO events VALUES (%d, 'k%d', NULL, NULL)" % (2 * i, i, i, 2 * i + 1, i))


def txn_changes(i):
    return [("I", "public.events", [str(2 * i), "k%d" % i, '{"n": %d}' % i, "2024-01-02 03:04:05+00"]),
            ("I", "public.events", [str(2 * i + 1), "k%d" % i, None, None])]


class Consumer:
    """A psycopg2 replication cursor read with read_message(), messages decoded and folded."""

    def __init__(self, url, slot, start_lsn=0):
        self.conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection)
        self.cur = self.conn.cursor()
        self.cur.start_replication(slot_name=slot, decode=False, start_lsn=start_lsn, status_interval=10,
                                   options={"proto_version": "1", "publication_names": "pub_py"})
        self.session = Session()
        self.commit_starts = []  # XLogData dataStart of each Commit message
        self.header_errors = []

    def pump(self, until, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            if until():
                return
            if time.monotonic() >= deadline:
                raise AssertionError("timed out after %ss waiting for %s; have %d transactions" % (
                    timeout, what, len(self.session.transactions)))
            msg = self.cur.read_message()
            if msg is None:
                select.select([self.cur], [], [], 0.2)
                continue
            decoded = decode_message(msg.payload)
            if decoded["tag"] == "C":
                self.commit_starts.append(msg.data_start)
                if msg.data_start != decoded["end_lsn"]:
                    self.header_errors.append("Commit XLogData dataStart %s != end_lsn %s" % (
                        lsn_to_str(msg.data_start), lsn_to_str(decoded["end_lsn"])))
            self.session.feed(decoded)

    def consume(self, n, timeout):
        """consume_stream() until n transactions, acknowledging each Commit as it comes."""
        import threading
        from psycopg2.extras import StopReplication
        timer = threading.Timer(timeout, lambda: self.conn.cancel())
        timer.start()

        def on_message(msg):
            decoded = decode_message(msg.payload)
            self.session.feed(decoded)
            if decoded["tag"] == "C":
                self.commit_starts.append(msg.data_start)
                if msg.data_start != decoded["end_lsn"]:
                    self.header_errors.append("Commit XLogData dataStart %s != end_lsn %s" % (
                        lsn_to_str(msg.data_start), lsn_to_str(decoded["end_lsn"])))
                msg.cursor.send_feedback(flush_lsn=msg.data_start)
                if len(self.session.transactions) >= n:
                    raise StopReplication()
        try:
            self.cur.consume_stream(on_message)
        except StopReplication:
            pass
        finally:
            timer.cancel()

    def idle(self, seconds):
        """Stays connected and reading (keepalives are answered by psycopg2) for `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.cur.read_message()
            if msg is not None:
                self.session.feed(decode_message(msg.payload))
                continue
            select.select([self.cur], [], [], 0.2)

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


def write(env, i):
    conn = env.direct(autocommit=False)
    with conn.cursor() as cur:
        cur.execute(txn_sql(i))
    conn.commit()
    conn.close()


def body(env):
    env.start_postgres()
    env.psql_admin(SCHEMA)
    relay = env.start_relay(extra_args=["--wal-sender-timeout", str(WAL_SENDER_TIMEOUT)])
    state = {}

    def slot_row():
        rows = env.relay_query(relay, "SELECT slot_name, plugin, slot_type, database, temporary, active,"
                               " active_pid, confirmed_flush_lsn::text FROM pg_replication_slots")
        return rows[0] if len(rows) == 1 else rows

    def create():
        conn = psycopg2.connect(relay.url, connection_factory=LogicalReplicationConnection)
        try:
            cur = conn.cursor()
            cur.create_replication_slot("py_slot", output_plugin="pgoutput")
            row = cur.fetchone()
        finally:
            conn.close()
        expect(row is not None and row[0] == "py_slot" and row[3] == "pgoutput" and row[2],
               "CREATE_REPLICATION_SLOT result (slot, consistent point, exported snapshot, plugin)", got=row)
        lsn_to_int(row[1])
        state["consistent_point"] = row[1]
        got = wait_until(lambda: slot_row(), 10, "the slot in pg_replication_slots")
        expect_eq(tuple(got), ("py_slot", "pgoutput", "logical", "e2e", False, False, None, row[1]),
                  "pg_replication_slots through pgrelay right after creation")

    def stream_feedback():
        expect("consistent_point" in state, "the slot was created")
        c = Consumer(relay.url, "py_slot")
        try:
            for i in range(1, 6):
                write(env, i)
            c.consume(3, 30)
            expect_eq(len(c.session.transactions), 3, "consume_stream stopped after 3 transactions")
            third_end = c.commit_starts[2]
            c.cur.send_feedback(flush_lsn=third_end, force=True)
            state["confirmed"] = third_end
            c.pump(lambda: len(c.session.transactions) >= 5, 30, "5 transactions")
            expect_eq(c.session.errors, [], "pgoutput ordering rules")
            expect_eq(c.header_errors, [], "XLogData headers of Commit messages")
            expect_eq(c.session.changes(), [txn_changes(i) for i in range(1, 6)], "the 5 transactions' rows")

            # While streaming: pgrelay's walsender and the slot's confirmed position, as in Postgres.
            def live():
                row = slot_row()
                state["live_row"] = row
                return row[5] is True and row[6] is not None and row[7] == lsn_to_str(third_end)
            try:
                wait_until(live, 10, "an active slot with confirmed_flush_lsn = the fed-back LSN")
            except Exception:
                expect(False, "pg_replication_slots while streaming, after send_feedback(flush_lsn=%s)"
                       % lsn_to_str(third_end), got=state.get("live_row"),
                       expected="active=True, active_pid set, confirmed_flush_lsn=%s" % lsn_to_str(third_end))
            stat = env.relay_query(relay, "SELECT application_name, state, flush_lsn::text FROM pg_stat_replication")
            expect(len(stat) == 1 and stat[0][1] in ("streaming", "catchup"),
                   "pg_stat_replication shows psycopg2's stream", got=stat)
        finally:
            c.close()

        def after():
            row = slot_row()
            state["after_row"] = row
            return row[5] is False and row[7] == lsn_to_str(third_end)
        try:
            wait_until(after, 10, "inactive slot")
        except Exception:
            expect(False, "pg_replication_slots after the consumer disconnected", got=state.get("after_row"),
                   expected="active=False, confirmed_flush_lsn=%s" % lsn_to_str(third_end))
        state["streamed"] = True

    def resume_and_keepalive():
        expect(state.get("streamed"), "the first stream succeeded")
        # Ask for an older position than confirmed: Postgres streams from confirmed_flush anyway.
        c = Consumer(relay.url, "py_slot", start_lsn=lsn_to_int(state["consistent_point"]))
        try:
            c.pump(lambda: len(c.session.transactions) >= 2, 30, "transactions 4 and 5 again")
            expect_eq(c.session.messages[0]["tag"], "B", "first message after resume")
            expect_eq(c.session.changes(), [txn_changes(4), txn_changes(5)],
                      "resume from confirmed_flush: transactions 4 and 5, nothing before")
            idle_from = time.time()
            c.idle(3 * WAL_SENDER_TIMEOUT)
            expect(c.conn.closed == 0, "the connection survives %ds idle with wal_sender_timeout=%ds"
                   % (3 * WAL_SENDER_TIMEOUT, WAL_SENDER_TIMEOUT))
            io = c.cur.io_timestamp.timestamp() if c.cur.io_timestamp else 0
            fb = c.cur.feedback_timestamp.timestamp() if c.cur.feedback_timestamp else 0
            expect(io > idle_from + WAL_SENDER_TIMEOUT and fb > idle_from + WAL_SENDER_TIMEOUT,
                   "keepalives arrived and psycopg2 answered them while idle",
                   got={"last io": io - idle_from, "last feedback": fb - idle_from},
                   expected="both later than %ds into the idle period" % WAL_SENDER_TIMEOUT)
            write(env, 6)
            c.pump(lambda: len(c.session.transactions) >= 3, 30, "transaction 6 after idling")
            expect_eq(c.session.changes()[2], txn_changes(6), "the write after idling is received")
            expect_eq(c.session.errors, [], "pgoutput ordering rules after resume")
            expect_eq(len(c.session.relation_messages), 1, "one Relation message in the resumed session")
        finally:
            c.close()

    def silent_consumer_dropped():
        # Postgres ends a walsender whose consumer stays silent for wal_sender_timeout.
        from e2e_support import RawConn
        from e2e_support import PASSWORD
        raw = RawConn("127.0.0.1", relay.port, "postgres", PASSWORD, "e2e")
        try:
            raw.query("START_REPLICATION SLOT py_slot LOGICAL 0/0 (proto_version '1', publication_names 'pub_py')")
            tag, _ = raw.read()
            expect_eq(tag, b"W", "CopyBothResponse")
            start = time.monotonic()
            seen = []
            while time.monotonic() - start < 4 * WAL_SENDER_TIMEOUT:
                try:
                    tag, payload = raw.read(timeout=4 * WAL_SENDER_TIMEOUT)
                except OSError:
                    break
                if tag is None:
                    break
                seen.append((round(time.monotonic() - start, 1), tag, payload[:1]))
                if tag == b"E":
                    break
            took = time.monotonic() - start
            expect(WAL_SENDER_TIMEOUT - 0.5 <= took <= 2 * WAL_SENDER_TIMEOUT + 1,
                   "a consumer that never answers is dropped after about wal_sender_timeout",
                   got={"seconds": round(took, 1), "messages": seen})
            pings = [s for s in seen if s[1] == b"d" and s[2] == b"k"]
            expect(len(pings) >= 1, "keepalives sent before the timeout", got=seen)
        finally:
            raw.close()

    env.check("psycopg2 create_replication_slot", create)
    env.check("psycopg2 stream, send_feedback, pg_replication_slots", stream_feedback)
    env.check("psycopg2 resume without loss or duplicate; keepalives while idle", resume_and_keepalive)
    env.check("silent consumer ended after wal_sender_timeout", silent_consumer_dropped)


if __name__ == "__main__":
    main("psycopg2", body)
