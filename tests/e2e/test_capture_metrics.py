# End-to-end test of capture's time metrics on /metrics (the last commit captured, its delay) and thread names.
import os
import re
import time
import urllib.request

from e2e_support import expect, free_port, main, wait_until

CONF = "wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\ntrack_commit_timestamp = on\n"
SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, note text);
CREATE PUBLICATION pub_items FOR TABLE items;
"""
LAST_COMMIT = "pgrelay_capture_last_commit_timestamp_seconds"
DELAY = "pgrelay_capture_delay_seconds"


def metrics_text(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        return r.read().decode()


def metric(port, name):
    """The value of `name` for database e2e, or None when the series is absent."""
    m = re.search(r'^%s\{database="e2e"\} (\S+)$' % re.escape(name), metrics_text(port), re.M)
    return float(m.group(1)) if m else None


CAPTURE_THREADS = {"trigger": ["trigger-poll", "trigger-tables"], "native": ["native-capture", "native-mirror"]}


def thread_names(pid):
    names = set()
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                names.add(f.read().strip())
        except OSError:
            pass  # it ended meanwhile
    return names


def commit_seconds(env, row_id):
    """The upstream's commit time of the transaction that wrote row `row_id`, in Unix seconds."""
    rows = env.direct_query("SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 "
                            "FROM items WHERE id = %s", (row_id,))
    return rows[0][0]


def insert(env, row_id):
    env.direct_query("INSERT INTO items VALUES (%s, 'x')", (row_id,))
    return commit_seconds(env, row_id)


def body(env):
    env.start_postgres(CONF)
    env.psql_admin(SCHEMA)
    state = {"next_id": 1}

    def follows_commits(mode):
        def check():
            port = free_port()
            relay = env.start_relay(data_dir=os.path.join(env.base, "relay-" + mode),
                                    extra_args=["--no-tls", "--capture", mode, "--schema", "pgrelay_" + mode,
                                                "--metrics", "127.0.0.1:%d" % port])
            try:
                # Its threads carry the names of their parts (top -H, ps -L, perf).
                threads = thread_names(relay.proc.pid)
                for name in CAPTURE_THREADS[mode] + ["log-sync"]:
                    expect(name in threads, "a thread named %s" % name, got=sorted(threads))
                for _ in range(2):  # the second commit moves the series on
                    row_id = state["next_id"]
                    state["next_id"] += 1
                    committed = insert(env, row_id)
                    # The double's shortest text keeps microseconds at today's Unix times.
                    wait_until(lambda: (metric(port, LAST_COMMIT) or 0) >= committed - 1e-6, 30,
                               "%s at the commit of row %d (%.6f)" % (LAST_COMMIT, row_id, committed))
                    got = metric(port, LAST_COMMIT)
                    expect(abs(got - committed) < 2e-6, "%s is the upstream's commit time of row %d" %
                           (LAST_COMMIT, row_id), got="%.6f" % got, expected="%.6f" % committed)
                    delay = metric(port, DELAY)
                    expect(delay is not None and 0 <= delay < 30,
                           "%s is the time from that commit to the append" % DELAY, got=delay)
            finally:
                relay.stop()
        return check

    env.check("trigger capture: its threads named, the last commit captured and its delay", follows_commits("trigger"))
    env.check("native capture: its threads named, the last commit captured and its delay", follows_commits("native"))

    def known_only_with_commit_timestamps():
        # Without them trigger capture stamps transactions with its poll's time, which says nothing
        # of the upstream's commit: the series stay out rather than report a delay of about zero.
        env.psql_admin("ALTER SYSTEM SET track_commit_timestamp = off")
        env.restart_postgres()
        port = free_port()
        relay = env.start_relay(data_dir=os.path.join(env.base, "relay-off"),
                                extra_args=["--no-tls", "--capture", "trigger", "--schema", "pgrelay_off",
                                            "--metrics", "127.0.0.1:%d" % port])
        try:
            env.direct_query("INSERT INTO items VALUES (%s, 'x')", (state["next_id"],))
            state["next_id"] += 1
            wait_until(lambda: (metric(port, "pgrelay_captured_transactions_total") or 0) >= 1, 30,
                       "the transaction captured")
            text = metrics_text(port)
            expect(LAST_COMMIT not in text and DELAY not in text,
                   "no commit-time series where the upstream keeps no commit timestamps", got=text)
            # Turned on while pgrelay runs: after its reconnect, the poll's time kept from before
            # is not reported as a commit's; the next transaction's commit is.
            env.psql_admin("ALTER SYSTEM SET track_commit_timestamp = on")
            env.restart_postgres()
            wait_until(lambda: (metric(port, "pgrelay_capture_reconnects_total") or 0) >= 1, 30,
                       "trigger capture reconnected")
            time.sleep(2.5)  # idle polls come at most a second apart: some ran since
            text = metrics_text(port)
            expect(LAST_COMMIT not in text and DELAY not in text,
                   "no commit time from before the upstream kept them", got=text)
            row_id = state["next_id"]
            committed = insert(env, row_id)
            wait_until(lambda: metric(port, LAST_COMMIT) is not None, 30, "%s after the restart" % LAST_COMMIT)
            got = metric(port, LAST_COMMIT)
            expect(abs(got - committed) < 2e-6, "%s is the upstream's commit time of row %d" % (LAST_COMMIT, row_id),
                   got="%.6f" % got, expected="%.6f" % committed)
        finally:
            relay.stop()

    env.check("trigger capture: commit-time series only while the upstream keeps commit timestamps",
              known_only_with_commit_timestamps)

if __name__ == "__main__":
    main("capture_metrics", body)
