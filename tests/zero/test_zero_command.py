#!/usr/bin/python3
# End-to-end test of `pgrelay zero`: pgrelay's private PostgreSQL plus a supervised zero-cache.
"""Runs `pgrelay zero` with a real zero-cache (npm @rocicorp/zero 1.9.0, Node 22) and checks it.

  1. missing zero-cache: in a directory with no node_modules above it, `pgrelay zero` exits 2
     before PostgreSQL starts, and says `npm install @rocicorp/zero`
  2. start: an app directory (node_modules linked to the installed zero) and its .env; pgrelay
     prints `pgrelay ready:`, then `zero-cache ready: http://127.0.0.1:ZERO_PORT` (the .env's
     port); zero-cache's environment holds pgrelay's databases and the user's settings
  3. sync: tables created, altered and dropped through pgrelay while zero-cache runs reach the
     replica in DATA_DIR/zero/replica.db (read with zero-sqlite3's shell: WAL2), without a reset
  4. output: DATA_DIR/zero/zero-cache.log, and `zero-cache | ` lines on pgrelay's stdout
  5. kill -9 of zero-cache's main process: pgrelay says `zero-cache exited`, restarts it after
     its backoff, prints a second ready line; replication carries on
  6. SIGINT: pgrelay exits 0 and leaves no zero-cache or PostgreSQL process behind

Reuses zero_e2e.py (same directory) for the npm install, the loopback preload and process
helpers. Prints PASS/FAIL per check, then a summary; exits 0 only if every check passed, 77
(ctest SKIP_RETURN_CODE) if zero-cache or Node could not be installed from npm.
"""

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

try:
    import psycopg2
except ImportError:  # a pyenv/venv python3 first on PATH; Debian's has python3-psycopg2
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("FATAL: psycopg2 missing (apt-get install python3-psycopg2)", file=sys.stderr)
    sys.exit(2)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zero_e2e as ze  # noqa: E402
from zero_e2e import (LOOPBACK_PRELOAD, Installer, descendants, free_port,  # noqa: E402
                      set_parent_death_signal, stop_tree)

SKIP = 77
APP_ID = "zt"
MISSING_TIMEOUT = 30.0
READY_TIMEOUT = float(os.environ.get("PGRELAY_ZERO_READY_TIMEOUT", "180"))
SYNC_TIMEOUT = 60.0
RESTART_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
# Stay under ctest's TIMEOUT (900) so cleanup runs from here, not from a SIGKILL.
RUN_BUDGET = float(os.environ.get("PGRELAY_ZERO_BUDGET", "840"))
READY_PREFIX = "zero-cache ready: "
LINE_PREFIX = "zero-cache | "


def say(msg):
    print(f"[zero-command {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_text(path):
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        return f.read()
    return ""


def tail(path, n=40):
    lines = read_text(path).splitlines()
    return lines[-n:]


def print_tail(title, path, n=40):
    lines = tail(path, n)
    print(f"---- last {len(lines)} lines of {title} ({path})", flush=True)
    for line in lines:
        print("    " + line[:400], flush=True)


# --------------------------------------------------------------------------- /proc


def proc_read(pid, what):
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read()
    except OSError:
        return None


def cmdline(pid):
    raw = proc_read(pid, "cmdline")
    if not raw:
        return []
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def environ(pid):
    raw = proc_read(pid, "environ")
    out = {}
    for item in (raw or b"").split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def start_ticks(pid):
    raw = proc_read(pid, "stat")
    if not raw:
        return None
    fields = raw.decode(errors="replace").rsplit(")", 1)[1].split()
    return int(fields[19])  # field 22, starttime (fields[0] is field 3, state)


def state(pid):
    raw = proc_read(pid, "stat")
    if not raw:
        return None
    return raw.decode(errors="replace").rsplit(")", 1)[1].split()[0]


def alive(pid):
    s = state(pid)
    return s is not None and s != "Z"


def children(pid):
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out.extend(int(k) for k in f.read().split())
    return out


def group_of(pid):
    try:
        return f"pgid {os.getpgid(pid)}, sid {os.getsid(pid)}"
    except OSError:
        return "gone"


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def under(path, root):
    return path == root or path.startswith(root + "/")


def is_node(pid, node_real):
    with contextlib.suppress(OSError):
        if os.path.realpath(f"/proc/{pid}/exe") == node_real:
            return True
    argv = cmdline(pid)
    return bool(argv) and os.path.basename(argv[0]).startswith("node")


def zero_main_pids(relay_pid, node_real):
    """zero-cache's main process: pgrelay's direct child running node."""
    return [c for c in children(relay_pid) if alive(c) and is_node(c, node_real)]


# --------------------------------------------------------------------------- the run


class Run:
    def __init__(self, args, inst, checks, logs, deadline):
        self.args = args
        self.inst = inst
        self.checks = checks
        self.logs = logs
        self.deadline = deadline
        self.binary = os.path.abspath(args.pgrelay)
        self.node_real = os.path.realpath(inst.node)
        self.zero_pkg_real = os.path.realpath(
            os.path.join(inst.zero_dir, "node_modules", "@rocicorp", "zero"))
        self.root = None
        self.missing_dir = None
        self.proc = None
        self.relay_start_ticks = None
        self.tracked = set()  # every pid seen under pgrelay
        self.old_tree = []  # the processes of the zero-cache check 5 kills
        self.stdout_path = os.path.join(logs, "pgrelay.stdout")
        self.stderr_path = os.path.join(logs, "pgrelay.stderr")
        self.url = None
        self.conn = None

    # ---- helpers

    def left(self):
        return max(0.0, self.deadline - time.monotonic())

    def base_env(self):
        # Nothing of the caller's ZERO_*/PGRELAY_* settings: the test says what zero-cache gets.
        return {k: v for k, v in os.environ.items()
                if not k.startswith("ZERO_") and not k.startswith("PGRELAY_")}

    def stdout(self):
        return read_text(self.stdout_path)

    def stderr(self):
        return read_text(self.stderr_path)

    def ready_lines(self):
        return [l for l in self.stdout().splitlines() if l.startswith(READY_PREFIX)]

    def track(self):
        if self.proc is not None and self.proc.poll() is None:
            self.tracked.update(descendants(self.proc.pid))

    def wait_for(self, what, pred, timeout, need_alive=True):
        """Polls pred() until true; returns None, or why it never was."""
        end = time.monotonic() + min(timeout, self.left())
        while True:
            self.track()
            if pred():
                return None
            if need_alive and self.proc is not None and self.proc.poll() is not None:
                return f"pgrelay exited with status {self.proc.returncode} while waiting for {what}"
            if time.monotonic() > end:
                return f"no {what} after {timeout:.0f} s"
            time.sleep(0.1)

    def replica(self):
        return os.path.join(self.data, "zero", "replica.db")

    def write(self, name, sql):
        try:
            with self.conn.cursor() as cur:
                cur.execute(sql)
            return ze.now_ms()
        except psycopg2.Error as e:
            self.checks.fail(name, f"pgrelay rejected the statement: {e.pgcode or ''} {str(e).strip()}")
            return None

    # ---- 1. missing zero-cache

    def check_missing(self):
        name = "missing zero-cache"
        self.missing_dir = os.path.realpath(tempfile.mkdtemp(prefix="pgrelay-zero-missing-", dir="/tmp"))
        cwd = self.missing_dir
        d = cwd
        while True:
            if os.path.exists(os.path.join(d, "node_modules", "@rocicorp", "zero", "package.json")):
                self.checks.fail(name, f"cannot test: {d}/node_modules/@rocicorp/zero exists above {cwd}")
                return
            if d == "/":
                break
            d = os.path.dirname(d)
        data = os.path.join(cwd, "data")
        port = free_port()
        argv = [self.binary, "zero", "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--no-tls"]
        say("in an empty directory: " + " ".join(argv))
        out_path = os.path.join(self.logs, "missing.stdout")
        err_path = os.path.join(self.logs, "missing.stderr")
        t0 = time.monotonic()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            p = subprocess.Popen(argv, cwd=cwd, env=self.base_env(), stdout=out, stderr=err,
                                 stdin=subprocess.DEVNULL, preexec_fn=set_parent_death_signal,
                                 start_new_session=True)
        try:
            rc = p.wait(timeout=MISSING_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            stop_tree(p, "pgrelay zero (missing zero-cache)", grace=5)
        secs = time.monotonic() - t0
        err_text = read_text(err_path)
        ok = True
        if rc == 2:
            self.checks.pass_(f"{name}: exit status 2", f"{secs:.1f} s")
        else:
            ok = False
            self.checks.fail(f"{name}: exit status 2",
                             f"still running after {MISSING_TIMEOUT:.0f} s (killed)" if rc is None
                             else f"exit status {rc}")
        if "npm install @rocicorp/zero" in err_text:
            self.checks.pass_(f"{name}: stderr names `npm install @rocicorp/zero`")
        else:
            ok = False
            self.checks.fail(f"{name}: stderr names `npm install @rocicorp/zero`",
                             f"stderr was [{err_text.strip()[-600:]}]")
        if not os.path.exists(os.path.join(data, "pg")):
            self.checks.pass_(f"{name}: PostgreSQL never started (no DATA_DIR/pg)")
        else:
            ok = False
            self.checks.fail(f"{name}: PostgreSQL never started (no DATA_DIR/pg)",
                             f"{data}/pg was created")
        if not ok:
            print_tail("its stdout", out_path, 20)
            print_tail("its stderr", err_path, 20)

    # ---- 2. start

    def start(self):
        # As root, PostgreSQL runs as `postgres`, which must reach DATA_DIR: a directory outside
        # the build tree, opened up, as zero_e2e.py's embedded variant does.
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="pgrelay-zero-cmd-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.app = os.path.join(self.root, "app")
        self.data = os.path.join(self.root, "data")
        self.tmp = os.path.join(self.root, "tmp")
        os.makedirs(self.app)
        os.makedirs(self.tmp)
        os.symlink(os.path.join(self.inst.zero_dir, "node_modules"),
                   os.path.join(self.app, "node_modules"))
        self.preload = os.path.join(self.root, "loopback-preload.cjs")
        with open(self.preload, "w") as f:
            f.write(LOOPBACK_PRELOAD)
        self.zport = free_port(pair=True)  # zero-cache also binds ZERO_PORT+1
        self.port = free_port()
        while self.port in (self.zport, self.zport + 1):
            self.port = free_port()
        # See zero_e2e.py's ZeroCache.start for why each. ZERO_LOG_LEVEL=debug is overridden
        # by the environment's info: the real environment wins over .env.
        with open(os.path.join(self.app, ".env"), "w") as f:
            f.write(f"""# pgrelay zero reads the ZERO_* settings of the app's .env
ZERO_PORT={self.zport}
ZERO_APP_ID={APP_ID}
ZERO_ADMIN_PASSWORD=x
ZERO_TASK_ID=pgrelay-zero-cmd
ZERO_NUM_SYNC_WORKERS=1
ZERO_UPSTREAM_MAX_CONNS=4
ZERO_CVR_MAX_CONNS=4
ZERO_ENABLE_TELEMETRY=false
ZERO_LOG_LEVEL=debug
""")
        env = self.base_env()
        env["NODE_OPTIONS"] = f"--require {self.preload}"
        env["TMPDIR"] = self.tmp
        env["ZERO_LOG_LEVEL"] = "info"
        self.env = env
        argv = [self.binary, "zero", "--data-dir", self.data, "--listen", f"127.0.0.1:{self.port}",
                "--no-tls", "--node", self.inst.node, "--pg-bin", ze.PG_BINDIR]
        say(f"in {self.app} (ZERO_PORT={self.zport} in .env): " + " ".join(argv))
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(argv, cwd=self.app, env=env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, preexec_fn=set_parent_death_signal,
                                         start_new_session=True)
        self.relay_start_ticks = start_ticks(self.proc.pid)
        t0 = time.monotonic()

        def relay_ready():
            for line in self.stdout().splitlines():
                if line.startswith("pgrelay ready: "):
                    self.url = line[len("pgrelay ready: "):].strip()
                    return True
            return False

        problem = self.wait_for("`pgrelay ready:` line", relay_ready, READY_TIMEOUT)
        if problem:
            self.checks.fail("start: pgrelay ready", problem)
            return False
        self.checks.pass_("start: pgrelay ready", f"{self.url}, {time.monotonic() - t0:.1f} s")
        if urllib.parse.urlsplit(self.url).port != self.port:
            self.checks.fail("start: pgrelay serves --listen", f"ready URL {self.url}, --listen port {self.port}")

        want = f"{READY_PREFIX}http://127.0.0.1:{self.zport}"
        problem = self.wait_for("`zero-cache ready:` line", lambda: bool(self.ready_lines()),
                                max(1.0, READY_TIMEOUT - (time.monotonic() - t0)))
        if problem:
            self.checks.fail("start: zero-cache ready", problem)
            return False
        got = self.ready_lines()[0].rstrip()
        if got != want:
            self.checks.fail("start: zero-cache ready on .env's ZERO_PORT", f"printed [{got}], expected [{want}]")
            return False
        self.checks.pass_("start: zero-cache ready on .env's ZERO_PORT", f"[{got}], {time.monotonic() - t0:.1f} s after launch")
        self.ready_ino = None
        with contextlib.suppress(OSError):
            self.ready_ino = os.stat(self.replica()).st_ino

        # The ready line promises that GET / answers.
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.zport}/", timeout=10) as r:
                body = r.read().decode(errors="replace").strip()
            if body == "OK":
                self.checks.pass_("start: GET / on zero-cache's port answers OK")
            else:
                self.checks.fail("start: GET / on zero-cache's port answers OK", f"answered [{body[:200]}]")
        except OSError as e:
            self.checks.fail("start: GET / on zero-cache's port answers OK", str(e))
        self.check_environment()
        return True

    def check_environment(self):
        name = "start: zero-cache's environment"
        mains = zero_main_pids(self.proc.pid, self.node_real)
        if len(mains) != 1:
            self.checks.fail(name, f"expected one node child of pgrelay, found {mains}")
            return
        env = environ(mains[0])
        problems = []

        def db_url(var, db):
            v = env.get(var)
            if v is None:
                problems.append(f"{var} unset")
                return
            u = urllib.parse.urlsplit(v)
            if u.port != self.port or u.path != "/" + db:
                problems.append(f"{var}={v}, expected pgrelay's 127.0.0.1:{self.port}/{db}")

        db_url("ZERO_UPSTREAM_DB", "postgres")
        db_url("ZERO_CVR_DB", "zero_cvr")
        db_url("ZERO_CHANGE_DB", "zero_cdb")
        want = {
            "ZERO_REPLICA_FILE": os.path.join(self.data, "zero", "replica.db"),
            "ZERO_PORT": str(self.zport),  # from .env
            "ZERO_APP_ID": APP_ID,  # from .env
            "ZERO_TASK_ID": "pgrelay-zero-cmd",  # from .env
            "ZERO_LOG_LEVEL": "info",  # the environment over .env's debug
            "NODE_OPTIONS": self.env["NODE_OPTIONS"],  # inherited
            "TMPDIR": self.tmp,  # inherited
        }
        for k, v in want.items():
            if env.get(k) != v:
                problems.append(f"{k}={env.get(k)!r}, expected {v!r}")
        if problems:
            self.checks.fail(name, "; ".join(problems))
        else:
            self.checks.pass_(name, "pgrelay's databases and replica file, .env's settings, "
                              "the environment over .env, NODE_OPTIONS/TMPDIR inherited")

    # ---- 3. sync

    def check_sync(self):
        try:
            self.conn = psycopg2.connect(self.url, connect_timeout=30)
            self.conn.autocommit = True
        except psycopg2.Error as e:
            self.checks.fail("sync: connect through pgrelay", str(e).strip())
            return
        c = self.checks
        n_ready = len(self.ready_lines())

        t = self.write("sync: CREATE TABLE items + INSERT",
                       "CREATE TABLE public.items (id int PRIMARY KEY, v text); "
                       "INSERT INTO public.items VALUES (1, 'one')")
        if t:
            c.expect("sync: CREATE TABLE items + INSERT reach the replica", "1|one",
                     "SELECT id, v FROM items ORDER BY id", t, timeout=SYNC_TIMEOUT)
        t = self.write("sync: ALTER TABLE ADD COLUMN + UPDATE",
                       "ALTER TABLE public.items ADD COLUMN w text; "
                       "UPDATE public.items SET w = 'w-one' WHERE id = 1")
        if t:
            c.expect("sync: ALTER TABLE ADD COLUMN + UPDATE reach the replica", "1|one|w-one",
                     "SELECT id, v, w FROM items ORDER BY id", t, timeout=SYNC_TIMEOUT)
        t = self.write("sync: CREATE TABLE scratch",
                       "CREATE TABLE public.scratch (id int PRIMARY KEY, s text); "
                       "INSERT INTO public.scratch VALUES (7, 'seven')")
        made = t and c.expect("sync: CREATE TABLE scratch reaches the replica", "7|seven",
                              "SELECT id, s FROM scratch", t, timeout=SYNC_TIMEOUT)
        if made:
            t = self.write("sync: DROP TABLE scratch", "DROP TABLE public.scratch")
            if t:
                c.expect("sync: DROP TABLE scratch reaches the replica (table gone)", "0",
                         "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'scratch'",
                         t, timeout=SYNC_TIMEOUT)
        elif t:
            c.fail("sync: DROP TABLE scratch reaches the replica (table gone)",
                   "not tested: the table never reached the replica")

        # Without a reset: zero-cache neither restarted nor rebuilt its replica for the DDL.
        problems = []
        if len(self.ready_lines()) != n_ready:
            problems.append(f"{len(self.ready_lines())} `zero-cache ready:` lines, {n_ready} before the DDL")
        if "zero-cache exited" in self.stderr():
            problems.append("stderr says `zero-cache exited`")
        ino = None
        with contextlib.suppress(OSError):
            ino = os.stat(self.replica()).st_ino
        if self.ready_ino is not None and ino != self.ready_ino:
            problems.append(f"replica.db was recreated (inode {self.ready_ino} -> {ino})")
        if problems:
            c.fail("sync: DDL applied without a restart or replica reset", "; ".join(problems))
        else:
            c.pass_("sync: DDL applied without a restart or replica reset")

    # ---- 4. output

    def check_output(self):
        log = os.path.join(self.data, "zero", "zero-cache.log")
        text = read_text(log)
        if text.strip():
            self.checks.pass_("output: DATA_DIR/zero/zero-cache.log non-empty", f"{len(text)} bytes")
        else:
            self.checks.fail("output: DATA_DIR/zero/zero-cache.log non-empty",
                             "missing" if not os.path.exists(log) else "empty")
        prefixed = [l[len(LINE_PREFIX):] for l in self.stdout().splitlines() if l.startswith(LINE_PREFIX)]
        if not prefixed:
            self.checks.fail("output: `zero-cache | ` lines on pgrelay's stdout", "none")
            return
        self.checks.pass_("output: `zero-cache | ` lines on pgrelay's stdout", f"{len(prefixed)} lines")
        logged = set(text.splitlines())
        both = [l for l in prefixed if l.strip() and l in logged]
        if both:
            self.checks.pass_("output: stdout's zero-cache lines are in zero-cache.log",
                              f"{len(both)} of {len(prefixed)}")
        else:
            self.checks.fail("output: stdout's zero-cache lines are in zero-cache.log",
                             f"none of {len(prefixed)}, e.g. [{prefixed[0][:200]}]")

    # ---- 5. kill -9

    def check_restart(self):
        name = "kill -9"
        mains = zero_main_pids(self.proc.pid, self.node_real)
        if len(mains) != 1:
            self.checks.fail(f"{name}: zero-cache's main process found",
                             f"expected one node child of pgrelay {self.proc.pid}, found {mains}")
            return
        old = mains[0]
        # zero-cache forks its workers detached (each in a session of its own), so they are
        # not in the main process's group: remember them to see that they go too.
        self.old_tree = descendants(old)
        self.tracked.update([old] + self.old_tree)
        self.checks.pass_(f"{name}: zero-cache's main process found",
                          f"pid {old}, {len(self.old_tree)} descendants: {' '.join(cmdline(old))[:160]}")
        n_ready = len(self.ready_lines())
        say(f"SIGKILL zero-cache's main process {old}")
        t_kill = time.monotonic()
        os.kill(old, signal.SIGKILL)
        seen = {}

        def restarted():
            for p in zero_main_pids(self.proc.pid, self.node_real):
                if p != old and p not in seen:
                    seen[p] = time.monotonic() - t_kill
            return "zero-cache exited" in self.stderr() and len(self.ready_lines()) > n_ready

        problem = self.wait_for("`zero-cache exited` on stderr and a new `zero-cache ready:` line",
                                restarted, RESTART_TIMEOUT)
        secs = time.monotonic() - t_kill

        # The killed zero-cache's workers must not linger beside the new one (they would hold
        # its ports and replica). Checked whether or not the restart worked: it explains why not.
        end = time.monotonic() + (15 if not problem else 0)
        while time.monotonic() < end and any(alive(p) for p in self.old_tree):
            time.sleep(0.1)
        lingering = [p for p in self.old_tree if alive(p)]
        if lingering:
            self.checks.fail(f"{name}: the killed zero-cache's other processes are gone",
                             f"{time.monotonic() - t_kill:.0f} s after the kill, still alive: " +
                             "; ".join(f"{p} ({group_of(p)}): {' '.join(cmdline(p))[:150]}"
                                       for p in lingering))
        else:
            self.checks.pass_(f"{name}: the killed zero-cache's other processes are gone",
                              f"{len(self.old_tree)} processes")

        if problem:
            self.checks.fail(f"{name}: `zero-cache exited` logged and zero-cache ready again",
                             f"{problem}; exited logged: {'zero-cache exited' in self.stderr()}, "
                             f"ready lines {len(self.ready_lines())} (were {n_ready}), "
                             f"zero-cache starts since the kill: {len(seen)}")
            return
        exited = [l for l in self.stderr().splitlines() if "zero-cache exited" in l]
        self.checks.pass_(f"{name}: `zero-cache exited` logged and zero-cache ready again",
                          f"{secs:.1f} s after the kill; [{exited[0][:160]}]")
        last = self.ready_lines()[-1].rstrip()
        if last != f"{READY_PREFIX}http://127.0.0.1:{self.zport}":
            self.checks.fail(f"{name}: second ready line names the same port", f"[{last}]")
        now_mains = zero_main_pids(self.proc.pid, self.node_real)
        if len(now_mains) == 1 and now_mains[0] != old and now_mains[0] in seen:
            delay = seen[now_mains[0]]
            first = min(seen.values())
            if 0.5 <= first <= 10.0:
                self.checks.pass_(f"{name}: restarted after a backoff (about 1 s)",
                                  f"first new main process seen {first:.2f} s after the kill")
            else:
                self.checks.fail(f"{name}: restarted after a backoff (about 1 s)",
                                 f"first new main process seen {first:.2f} s after the kill")
            if len(seen) > 1:
                say(f"note: {len(seen)} zero-cache starts after the kill; the ready one {delay:.1f} s after it")
        else:
            self.checks.fail(f"{name}: restarted after a backoff (about 1 s)",
                             f"node children of pgrelay now {now_mains}, killed {old}, seen {seen}")
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT 1")
        except psycopg2.Error:
            with contextlib.suppress(psycopg2.Error):
                self.conn.close()
            self.conn = psycopg2.connect(self.url, connect_timeout=30)
            self.conn.autocommit = True
        t = self.write(f"{name}: replication after the restart",
                       "INSERT INTO public.items VALUES (2, 'two', 'w-two')")
        if t:
            self.checks.expect(f"{name}: replication after the restart", ["1|one|w-one", "2|two|w-two"],
                               "SELECT id, v, w FROM items ORDER BY id", t, timeout=SYNC_TIMEOUT)

    # ---- 6. Ctrl-C

    def leftovers(self):
        """Processes of this run still alive: by command line, working directory, environment,
        or because they ran under pgrelay."""
        out = []
        me = os.getpid()
        marks = (self.app, self.data)
        cli_marks = (self.zero_pkg_real, os.path.realpath(self.inst.cli))
        for pid in all_pids():
            if pid == me or not alive(pid):
                continue
            cmd = " ".join(cmdline(pid))
            reason = None
            if any(m in cmd for m in marks):
                reason = "command line names the app or data directory"
            elif any(m in cmd for m in cli_marks) and (start_ticks(pid) or 0) >= (self.relay_start_ticks or 0):
                reason = "runs the zero package's code"
            else:
                cwd = None
                with contextlib.suppress(OSError):
                    cwd = os.path.realpath(f"/proc/{pid}/cwd")
                if cwd and (under(cwd, self.data) or under(cwd, self.app)):
                    reason = f"working directory {cwd}"
                elif any(under(v, self.data) for v in environ(pid).values()):
                    reason = "environment names the data directory"
                elif pid in self.tracked and (start_ticks(pid) or 0) >= (self.relay_start_ticks or 0):
                    reason = "ran under pgrelay"
            if reason and alive(pid):
                out.append((pid, reason, cmd[:160]))
        return out

    def check_stop(self):
        name = "Ctrl-C"
        self.track()
        say(f"SIGINT to pgrelay {self.proc.pid} ({len(self.tracked)} processes seen under it)")
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=min(STOP_TIMEOUT, max(1.0, self.left())))
        except subprocess.TimeoutExpired:
            self.checks.fail(f"{name}: pgrelay exits with status 0", f"still running after {STOP_TIMEOUT:.0f} s")
            return
        secs = time.monotonic() - t0
        if rc == 0:
            self.checks.pass_(f"{name}: pgrelay exits with status 0", f"{secs:.1f} s")
        else:
            self.checks.fail(f"{name}: pgrelay exits with status 0", f"exit status {rc} after {secs:.1f} s")
        at_exit = self.leftovers()
        end = time.monotonic() + 5
        left = at_exit
        while left and time.monotonic() < end:
            time.sleep(0.2)
            left = self.leftovers()
        if left:
            old = set(self.old_tree)
            self.checks.fail(f"{name}: no zero-cache or PostgreSQL process left",
                             "; ".join(f"{p} ({why}"
                                       f"{', a worker of the zero-cache killed by kill -9' if p in old else ''}"
                                       f"): {cmd}" for p, why, cmd in left))
        else:
            self.checks.pass_(f"{name}: no zero-cache or PostgreSQL process left",
                              f"{len(self.tracked)} processes had run under pgrelay"
                              + (f"; {len(at_exit)} were still ending at its exit" if at_exit else ""))

    # ---- cleanup

    def cleanup(self):
        with contextlib.suppress(psycopg2.Error, AttributeError):
            if self.conn is not None:
                self.conn.close()
        if self.proc is not None:
            self.track()
            if self.proc.poll() is None:
                stop_tree(self.proc, "pgrelay zero", grace=30)
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
        if self.root:
            for pid, why, cmd in self.leftovers():
                say(f"cleanup: SIGKILL {pid} ({why}): {cmd}")
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def keep_logs_and_remove(self):
        if self.root:
            log = os.path.join(self.data, "zero", "zero-cache.log")
            with contextlib.suppress(OSError):
                shutil.copyfile(log, os.path.join(self.logs, "zero-cache.log"))
            shutil.rmtree(self.root, ignore_errors=True)
        if self.missing_dir:
            shutil.rmtree(self.missing_dir, ignore_errors=True)

    def show_tails(self):
        print_tail("pgrelay stdout", self.stdout_path)
        print_tail("pgrelay stderr", self.stderr_path)
        if self.root:
            print_tail("zero-cache.log", os.path.join(self.data, "zero", "zero-cache.log"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pgrelay", required=True, help="path of the pgrelay binary")
    ap.add_argument("--work", required=True, help="work directory (logs; the npm cache in WORK/npm)")
    ap.add_argument("--npm-cache", help="where Node and zero-cache are installed (default WORK/npm)")
    args = ap.parse_args()

    started = time.monotonic()
    deadline = started + RUN_BUDGET
    work = os.path.abspath(args.work)
    logs = os.path.join(work, "zero-command", "logs")
    shutil.rmtree(os.path.dirname(logs), ignore_errors=True)
    os.makedirs(logs)

    ze.cleanup_on_signals()

    inst = Installer(os.path.abspath(args.npm_cache or os.path.join(work, "npm")))
    try:
        inst.ensure()
    except (RuntimeError, OSError) as e:
        print(f"SKIP: cannot install zero-cache from npm: {e}", flush=True)
        return SKIP

    checks = ze.Checks(inst.sqlite, None, ze.now_ms() + RUN_BUDGET * 1000.0)
    run = Run(args, inst, checks, logs, deadline)
    try:
        run.check_missing()
        if run.start():
            checks.replica = run.replica()
            run.check_sync()
            run.check_output()
            if run.proc.poll() is None:
                run.check_restart()
            else:
                checks.fail("kill -9", f"not tested: pgrelay exited with status {run.proc.returncode}")
            if run.proc.poll() is None:
                run.check_stop()
            else:
                checks.fail("Ctrl-C", f"not tested: pgrelay exited with status {run.proc.returncode}")
    except (RuntimeError, OSError, psycopg2.Error, subprocess.SubprocessError) as e:
        checks.fail("harness", f"{type(e).__name__}: {e}")
    finally:
        run.cleanup()
        if checks.failed:
            run.show_tails()
        run.keep_logs_and_remove()
        checks.summary()
        say(f"logs in {logs}; {time.monotonic() - started:.0f} s in all")
    return 0 if not checks.failed and checks.passed else 1


if __name__ == "__main__":
    sys.exit(main())
