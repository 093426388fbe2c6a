#!/usr/bin/python3
# End-to-end test of pgrelay's admin page, in a real browser (headless Chromium).
"""Checks `pgrelay serve --admin` / `pgrelay zero --admin`: the JSON API's access rules over
plain HTTP, then the page itself in Debian's headless Chromium, driven over the DevTools protocol
by admin_page.cjs (npm puppeteer-core, which never downloads a browser).

  A. access, with `pgrelay serve` (its private PostgreSQL, no zero-cache)
     1. --admin 0.0.0.0:PORT without --admin-token: exit 2 within 30 s, stderr names --admin-token
     2. --admin 127.0.0.1:PORT --admin-token s3cret: no token or a wrong one 401; Bearer or
        ?token= 200; unknown path 404; bad source/lines 400; POST without X-Pgrelay-Admin 403;
        zero restart 409 (no zero-cache); SIGINT: exit 0
  B. the page, with `pgrelay zero --admin 127.0.0.1:PORT` and a real zero-cache
     0. without a token: a non-loopback Host header gets 403; POST without X-Pgrelay-Admin 403
     1. the page loads and fills in (#upstream, #zero-state "ready"); no console errors; while
        it polls, another client's GET /api/status still answers within 5 s
     2. a slot made through pgrelay (admin_probe) gets its row; its lag (bytes) grows as rows
        are inserted through pgrelay, within 10 s
     3. the log tail (source pgrelay) shows a new pgrelay log line within 2 s of its writing;
        the filter box leaves only lines holding the typed text
     4. "Reset zero" (confirm dialog accepted): zero-cache ready again, a new replica file,
        replication works again, the test's own slot admin_probe survives
     5. screenshots after each of B1-B4 in WORK/admin-page/screenshots/
     6. `pgrelay dump -D DATA`: zero's real app and shard schemas and _pgrelay left out of the
        archive; a row changed after it; `pgrelay restore -D DATA` replaces the tables, resets
        zero-cache through the admin API and waits for it: the replica holds the dump's row
        again and later writes still arrive; a table dumped from a second database and
        restored here (only created) reaches the replica through capture, without a restart
     then SIGINT: pgrelay exits 0 and leaves no process behind; no console error all along

Reuses zero_e2e.py (the npm install of Node 22 and zero-cache, helpers) and
test_zero_command.py (its Run: app directory, process tracking, Ctrl-C and leftover checks).
Prints PASS/FAIL per check, then a summary; exits 0 only if every check passed, 77 (ctest
SKIP_RETURN_CODE) if npm could not install Node, zero-cache or puppeteer-core.
"""

import argparse
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

try:
    import psycopg2
except ImportError:  # a pyenv/venv python3 first on PATH; Debian's has python3-psycopg2
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("FATAL: psycopg2 missing (apt-get install python3-psycopg2)", file=sys.stderr)
    sys.exit(2)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_zero_command as tzc  # noqa: E402
import zero_e2e as ze  # noqa: E402
from zero_e2e import (LOOPBACK_PRELOAD, Installer, free_port, set_parent_death_signal,  # noqa: E402
                      stop_tree)

SKIP = 77
APP_ID = tzc.APP_ID  # "zt": zero-cache's slots are zt_*
CHROMIUM = os.environ.get("PGRELAY_CHROMIUM", "/usr/bin/chromium")
PUPPETEER_VERSION = os.environ.get("PGRELAY_PUPPETEER_VERSION", "25.16.0")
DRIVER = os.path.join(HERE, "admin_page.cjs")
TOKEN = "s3cret"
PROBE_SLOT = "admin_probe"
READY_TIMEOUT = tzc.READY_TIMEOUT
REFUSE_TIMEOUT = 30.0
STOP_TIMEOUT = 60.0
PAGE_TIMEOUT = 30.0
SLOT_TIMEOUT = 10.0
LOG_TAIL_TIMEOUT = 2.0
RESET_TIMEOUT = 120.0
SYNC_TIMEOUT = 60.0
RESTORE_TIMEOUT = 240.0  # a restore that replaces tables waits for zero-cache to be ready again
FRESH_ROWS = 300
# Stay under ctest's TIMEOUT (900) so cleanup runs from here, not from a SIGKILL.
RUN_BUDGET = float(os.environ.get("PGRELAY_ADMIN_BUDGET", "840"))
ADMIN_PREFIX = "admin page: "
READY_PREFIX = tzc.READY_PREFIX


def say(msg):
    print(f"[admin-page {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def short(text, n=300):
    text = text if isinstance(text, str) else json.dumps(text)
    return text if len(text) <= n else text[:n] + "…"


def http(method, url, headers=None, body=None, timeout=15.0):
    """(status, text, json or None) of one request; never raises for an HTTP status."""
    if method == "POST" and body is None:
        body = b""  # urllib then sends Content-Length: 0
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return status, text, parsed


def ensure_puppeteer(cache):
    """npm puppeteer-core into CACHE/puppeteer-core-VERSION (no browser download: -core never
    fetches one, and --ignore-scripts runs no install script); returns its package directory."""
    where = os.path.join(cache, f"puppeteer-core-{PUPPETEER_VERSION}")
    pkg = os.path.join(where, "node_modules", "puppeteer-core")
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, ".lock"), "w") as lock:  # Installer's lock: one npm at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = ""
        with contextlib.suppress(OSError, ValueError), open(os.path.join(pkg, "package.json")) as f:
            have = json.load(f).get("version", "")
        if have != PUPPETEER_VERSION:
            os.makedirs(where, exist_ok=True)
            pj = os.path.join(where, "package.json")
            if not os.path.exists(pj):
                with open(pj, "w") as f:
                    json.dump({"name": "pgrelay-admin-page-e2e-deps", "private": True}, f)
            say(f"npm install puppeteer-core@{PUPPETEER_VERSION} into {where}")
            try:
                r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts",
                                    "--loglevel=error", f"puppeteer-core@{PUPPETEER_VERSION}"],
                                   cwd=where, capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"npm install puppeteer-core@{PUPPETEER_VERSION} timed out")
            if r.returncode != 0:
                raise RuntimeError(f"npm install puppeteer-core@{PUPPETEER_VERSION} failed: "
                                   f"{(r.stdout + r.stderr)[-800:]}")
    if not os.path.exists(os.path.join(pkg, "lib", "puppeteer", "puppeteer-core.js")):
        raise RuntimeError(f"missing after install: {pkg}/lib/puppeteer/puppeteer-core.js")
    return pkg


def js(value):
    """A Python value as a JS literal."""
    return json.dumps(value)


# --------------------------------------------------------------------------- the browser


class BrowserError(Exception):
    pass


class Browser:
    """admin_page.cjs under Node 22: one JSON command a line, one JSON answer a line."""

    def __init__(self, node, puppeteer_dir, user_data_dir, log_path):
        self.user_data_dir = user_data_dir
        self.log_path = log_path
        self.buf = b""
        self.broken = None
        with open(log_path, "w") as err:
            self.proc = subprocess.Popen([node, DRIVER, puppeteer_dir], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err,
                                         preexec_fn=set_parent_death_signal, start_new_session=True)

    def call(self, cmd, timeout=PAGE_TIMEOUT, **kw):
        if self.broken:
            raise BrowserError(f"the browser driver is unusable: {self.broken}")
        msg = dict(kw, cmd=cmd, timeout=int(timeout * 1000))
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            self.broken = f"cannot write to it: {e}"
            raise BrowserError(self.broken)
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout + 15.0
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                self.broken = f"no answer to {cmd} after {timeout + 15:.0f} s"
                raise BrowserError(self.broken)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.broken = f"it exited (status {self.proc.wait(timeout=10)}) during {cmd}"
                    raise BrowserError(self.broken + "; " + " | ".join(tzc.tail(self.log_path, 5)))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        answer = json.loads(line)
        if not answer.get("ok"):
            raise BrowserError(answer.get("error", "failed"))
        return answer.get("value")

    def wait(self, expr, timeout):
        """(value, None) once expr is truthy in the page, or (None, why not)."""
        try:
            return self.call("wait", expr=expr, timeout=timeout), None
        except BrowserError as e:
            return None, str(e)

    def events(self):
        return self.call("events", timeout=10)

    def close(self):
        if self.proc.poll() is None and not self.broken:
            with contextlib.suppress(BrowserError, OSError, ValueError):
                self.call("close", timeout=15)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            stop_tree(self.proc, "admin_page.cjs", grace=5)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        # Chromium runs in a process group of its own: find what is left by its profile dir.
        for pid in tzc.all_pids():
            if tzc.alive(pid) and self.user_data_dir in " ".join(tzc.cmdline(pid)):
                say(f"browser cleanup: SIGKILL {pid}: {' '.join(tzc.cmdline(pid))[:120]}")
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- A. access


class ServeAccess:
    """`pgrelay serve` with its private PostgreSQL: the checks that need no browser."""

    def __init__(self, binary, checks, logs, env):
        self.binary = binary
        self.checks = checks
        self.logs = logs
        self.env = env
        self.root = None
        self.proc = None

    def run(self):
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="pgrelay-admin-serve-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # as root, PostgreSQL runs as `postgres` and must reach it
        data = os.path.join(self.root, "data")
        self.refused(data)
        self.with_token(data)

    def launch(self, data, admin, extra, tag):
        port = free_port()
        argv = [self.binary, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}",
                "--no-tls", "--admin", admin] + extra
        say(" ".join(argv))
        out_path = os.path.join(self.logs, f"serve-{tag}.stdout")
        err_path = os.path.join(self.logs, f"serve-{tag}.stderr")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    preexec_fn=set_parent_death_signal, start_new_session=True)
        return proc, out_path, err_path

    def refused(self, data):
        name = "A1 --admin 0.0.0.0 without --admin-token"
        proc, out_path, err_path = self.launch(data, f"0.0.0.0:{free_port()}", [], "refused")
        self.proc = proc
        t0 = time.monotonic()
        try:
            rc = proc.wait(timeout=REFUSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        secs = time.monotonic() - t0
        self.stop()
        err = tzc.read_text(err_path)
        if rc == 2:
            self.checks.pass_(f"{name}: exit status 2", f"{secs:.1f} s")
        else:
            self.checks.fail(f"{name}: exit status 2",
                             f"still running after {REFUSE_TIMEOUT:.0f} s (killed)" if rc is None
                             else f"exit status {rc} after {secs:.1f} s")
        if "--admin-token" in err:
            line = next(l for l in err.splitlines() if "--admin-token" in l)
            self.checks.pass_(f"{name}: stderr names --admin-token", short(line.strip(), 200))
        else:
            self.checks.fail(f"{name}: stderr names --admin-token", f"stderr was [{err.strip()[-600:]}]")
            tzc.print_tail("its stdout", out_path, 20)

    def with_token(self, data):
        aport = free_port()
        proc, out_path, err_path = self.launch(data, f"127.0.0.1:{aport}", ["--admin-token", TOKEN], "token")
        self.proc = proc
        admin_url = None
        ready = False
        end = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < end and proc.poll() is None:
            for line in tzc.read_text(out_path).splitlines():
                if line.startswith(ADMIN_PREFIX):
                    admin_url = line[len(ADMIN_PREFIX):].strip()
                ready |= line.startswith("pgrelay ready: ")
            if admin_url and ready:
                break
            time.sleep(0.1)
        name = "A2 serve --admin-token"
        if not (admin_url and ready):
            self.checks.fail(f"{name}: `admin page:` and `pgrelay ready:` lines",
                             f"admin line {admin_url!r}, ready {ready}, exit status {proc.poll()}")
            tzc.print_tail("its stdout", out_path, 20)
            tzc.print_tail("its stderr", err_path, 20)
            self.stop()
            return
        want = f"http://127.0.0.1:{aport}/"
        if admin_url == want:
            self.checks.pass_(f"{name}: prints `admin page: {want}`")
        else:
            self.checks.fail(f"{name}: prints `admin page: {want}`", f"printed [{admin_url}]")
        base = f"http://127.0.0.1:{aport}"
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        cases = [
            ("GET /api/status without a token", "GET", "/api/status", {}, 401),
            ("GET /api/status with a wrong Bearer token", "GET", "/api/status",
             {"Authorization": "Bearer s3cre"}, 401),
            ("GET /api/status with a wrong ?token=", "GET", "/api/status?token=wrong", {}, 401),
            ("GET / without a token", "GET", "/", {}, 401),
            ("GET /api/status with Authorization: Bearer", "GET", "/api/status", bearer, 200),
            ("GET /api/status with ?token=", "GET", f"/api/status?token={TOKEN}", {}, 200),
            ("GET / with ?token=", "GET", f"/?token={TOKEN}", {}, 200),
            ("GET /nothing with the token", "GET", "/nothing", bearer, 404),
            ("GET /api/logs?source=nope", "GET", "/api/logs?source=nope", bearer, 400),
            ("GET /api/logs?source=pgrelay&lines=0", "GET", "/api/logs?source=pgrelay&lines=0", bearer, 400),
            ("GET /api/logs?source=pgrelay&lines=abc", "GET", "/api/logs?source=pgrelay&lines=abc", bearer, 400),
            ("POST /api/zero/restart without X-Pgrelay-Admin", "POST", f"/api/zero/restart?token={TOKEN}",
             {}, 403),
            ("POST /api/zero/restart (no zero-cache here)", "POST", f"/api/zero/restart?token={TOKEN}",
             {"X-Pgrelay-Admin": "1"}, 409),
            ("POST /api/zero/reset (no zero-cache here)", "POST", "/api/zero/reset",
             dict(bearer, **{"X-Pgrelay-Admin": "1"}), 409),
        ]
        for label, method, path, headers, want_status in cases:
            try:
                status, text, body = http(method, base + path, headers)
            except OSError as e:
                self.checks.fail(f"{name}: {label} -> {want_status}", f"request failed: {e}")
                continue
            problems = []
            if status != want_status:
                problems.append(f"status {status}")
            if path.startswith("/?") or path == "/":
                if status == 200 and 'id="slots"' not in text:
                    problems.append("not the admin page")
            elif not isinstance(body, dict):
                problems.append("body is not a JSON object")
            elif want_status >= 400 and not body.get("error"):
                problems.append("no \"error\" in the JSON body")
            elif "source=nope" in path and not body.get("hint"):
                problems.append("no \"hint\" in the JSON body")
            if problems:
                self.checks.fail(f"{name}: {label} -> {want_status}", f"{'; '.join(problems)}: {short(text)}")
            else:
                self.checks.pass_(f"{name}: {label} -> {want_status}", short(text, 120))
            if label == "GET /api/status with Authorization: Bearer" and isinstance(body, dict):
                self.status_shape(name, body)
        self.sigint(name, proc)

    def status_shape(self, name, s):
        problems = []
        for key in ("upstream", "capture_mode", "private_postgres", "databases", "slots", "zero", "time"):
            if key not in s:
                problems.append(f"no {key}")
        if s.get("zero", "missing") is not None:
            problems.append(f"zero is {s.get('zero')!r}, expected null (no zero-cache)")
        if s.get("private_postgres") is not True:
            problems.append(f"private_postgres is {s.get('private_postgres')!r}")
        dbs = s.get("databases") or []
        if not any(d.get("database") == "postgres" and "head_lsn" in d for d in dbs):
            problems.append(f"databases lack postgres: {dbs}")
        if problems:
            self.checks.fail(f"{name}: /api/status has its fields", "; ".join(problems) + f": {short(s)}")
        else:
            self.checks.pass_(f"{name}: /api/status has its fields",
                              f"upstream {s['upstream']}, capture {s['capture_mode']}")

    def sigint(self, name, proc):
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        secs = time.monotonic() - t0
        if rc == 0:
            self.checks.pass_(f"{name}: SIGINT -> exit status 0", f"{secs:.1f} s")
        else:
            self.checks.fail(f"{name}: SIGINT -> exit status 0",
                             f"still running after {STOP_TIMEOUT:.0f} s" if rc is None else f"exit status {rc}")
        self.stop()

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                stop_tree(self.proc, "pgrelay serve", grace=30)
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc = None

    def cleanup(self):
        self.stop()
        if self.root:
            # Anything of the private PostgreSQL still running from the data dir.
            for pid in tzc.all_pids():
                if tzc.alive(pid) and self.root in " ".join(tzc.cmdline(pid)):
                    say(f"cleanup: SIGKILL {pid}: {' '.join(tzc.cmdline(pid))[:120]}")
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


# --------------------------------------------------------------------------- B. the page


class AdminRun(tzc.Run):
    """test_zero_command.py's Run (app dir, tracking, Ctrl-C, leftovers, cleanup), started with
    --admin, and the page's checks."""

    def __init__(self, args, inst, checks, logs, deadline, puppeteer_dir, shots):
        super().__init__(args, inst, checks, logs, deadline)
        self.puppeteer_dir = puppeteer_dir
        self.shots = shots
        self.shot_paths = []
        self.browser = None
        self.recv = []  # pg_recvlogical processes
        self.aport = None
        self.admin_url = None
        self.n_console_seen = 0

    # ---- start (as Run.start, with --admin)

    def start(self):
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="pgrelay-admin-zero-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.app = os.path.join(self.root, "app")
        self.data = os.path.join(self.root, "data")
        self.tmp = os.path.join(self.root, "tmp")
        os.makedirs(self.app)
        os.makedirs(self.tmp)
        os.symlink(os.path.join(self.inst.zero_dir, "node_modules"), os.path.join(self.app, "node_modules"))
        self.preload = os.path.join(self.root, "loopback-preload.cjs")
        with open(self.preload, "w") as f:
            f.write(LOOPBACK_PRELOAD)
        self.zport = free_port(pair=True)  # zero-cache also binds ZERO_PORT+1
        taken = {self.zport, self.zport + 1}
        self.port = free_port()
        while self.port in taken:
            self.port = free_port()
        taken.add(self.port)
        self.aport = free_port()
        while self.aport in taken:
            self.aport = free_port()
        with open(os.path.join(self.app, ".env"), "w") as f:
            f.write(f"""ZERO_PORT={self.zport}
ZERO_APP_ID={APP_ID}
ZERO_ADMIN_PASSWORD=x
ZERO_TASK_ID=pgrelay-admin-page
ZERO_NUM_SYNC_WORKERS=1
ZERO_UPSTREAM_MAX_CONNS=4
ZERO_CVR_MAX_CONNS=4
ZERO_ENABLE_TELEMETRY=false
""")
        env = self.base_env()
        env["NODE_OPTIONS"] = f"--require {self.preload}"
        env["TMPDIR"] = self.tmp
        env["ZERO_LOG_LEVEL"] = "info"
        self.env = env
        argv = [self.binary, "zero", "--admin", f"127.0.0.1:{self.aport}", "--data-dir", self.data,
                "--listen", f"127.0.0.1:{self.port}", "--no-tls", "--node", self.inst.node,
                "--pg-bin", ze.PG_BINDIR]
        say(f"in {self.app} (ZERO_PORT={self.zport}): " + " ".join(argv))
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(argv, cwd=self.app, env=env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, preexec_fn=set_parent_death_signal,
                                         start_new_session=True)
        self.relay_start_ticks = tzc.start_ticks(self.proc.pid)
        t0 = time.monotonic()

        def lines_seen():
            for line in self.stdout().splitlines():
                if line.startswith("pgrelay ready: "):
                    self.url = line[len("pgrelay ready: "):].strip()
                elif line.startswith(ADMIN_PREFIX):
                    self.admin_url = line[len(ADMIN_PREFIX):].strip()
            return bool(self.url and self.admin_url and self.ready_lines())

        problem = self.wait_for("`pgrelay ready:`, `admin page:` and `zero-cache ready:` lines",
                                lines_seen, READY_TIMEOUT)
        if problem:
            self.checks.fail("B start: pgrelay zero ready with its admin page",
                             f"{problem} (pgrelay URL {self.url}, admin URL {self.admin_url}, "
                             f"{len(self.ready_lines())} zero-cache ready lines)")
            return False
        want = f"http://127.0.0.1:{self.aport}/"
        if self.admin_url != want:
            self.checks.fail("B start: pgrelay zero ready with its admin page",
                             f"printed `admin page: {self.admin_url}`, expected {want}")
            return False
        self.checks.pass_("B start: pgrelay zero ready with its admin page",
                          f"{self.admin_url}, pgrelay {self.url}, {time.monotonic() - t0:.1f} s")
        self.conn = psycopg2.connect(self.url, connect_timeout=30)
        self.conn.autocommit = True
        return True

    # ---- helpers

    def api(self, path, method="GET", headers=None, timeout=15.0):
        return http(method, f"http://127.0.0.1:{self.aport}{path}", headers, timeout=timeout)

    def status(self):
        """GET /api/status: from Python before and after the browser, through the page's own
        fetch while it is open (Python's new connection may wait long for a server thread
        then: see check_other_client)."""
        if self.browser is not None and not self.browser.broken:
            got = self.browser.call("eval", expr="""fetch('/api/status', {cache: 'no-store'})
                .then(r => r.ok ? r.json() : r.text().then(t => ({http_status: r.status, text: t})))""")
            if not isinstance(got, dict) or "http_status" in got:
                raise RuntimeError(f"the page's GET /api/status answered {short(got)}")
            return got
        code, text, body = self.api("/api/status", timeout=30)
        if code != 200 or not isinstance(body, dict):
            raise RuntimeError(f"GET /api/status answered {code}: {short(text)}")
        return body

    def shoot(self, name):
        path = os.path.join(self.shots, name)
        try:
            self.browser.call("screenshot", path=path)
            self.shot_paths.append(path)
            say(f"screenshot {path}")
        except BrowserError as e:
            self.checks.fail(f"B5 screenshot {name}", str(e))

    def console_problems(self):
        ev = self.browser.events()
        return ev, ev["consoleErrors"] + ev["pageErrors"]

    def sql(self, name, statement):
        try:
            with self.conn.cursor() as cur:
                cur.execute(statement)
                return cur.fetchall() if cur.description else []
        except psycopg2.Error as e:
            self.checks.fail(name, f"pgrelay rejected [{statement[:120]}]: {e.pgcode or ''} {str(e).strip()}")
            return None

    # ---- B0: access rules without a token

    def check_access(self):
        name = "B0 no token"
        code, text, _ = self.api("/api/status", headers={"Host": f"pgrelay.example:{self.aport}"})
        if code == 403:
            self.checks.pass_(f"{name}: a non-loopback Host header gets 403", short(text, 120))
        else:
            self.checks.fail(f"{name}: a non-loopback Host header gets 403", f"{code}: {short(text)}")
        code, text, _ = self.api("/api/status", headers={"Host": f"localhost:{self.aport}"})
        if code == 200:
            self.checks.pass_(f"{name}: Host localhost gets 200")
        else:
            self.checks.fail(f"{name}: Host localhost gets 200", f"{code}: {short(text)}")
        before = self.status()["zero"]
        code, text, _ = self.api("/api/zero/restart", method="POST")
        after = self.status()["zero"]
        if code == 403 and before and after and before.get("starts") == after.get("starts"):
            self.checks.pass_(f"{name}: POST without X-Pgrelay-Admin gets 403 and restarts nothing",
                              short(text, 120))
        else:
            self.checks.fail(f"{name}: POST without X-Pgrelay-Admin gets 403 and restarts nothing",
                             f"{code}: {short(text)}; zero before {before}, after {after}")
        code, text, body = self.api("/api/history")
        if code == 200 and isinstance(body, dict) and body.get("span_seconds") == 600 \
                and isinstance(body.get("samples"), list) and body["samples"]:
            self.checks.pass_(f"{name}: /api/history", f"{len(body['samples'])} samples")
        else:
            self.checks.fail(f"{name}: /api/history", f"{code}: {short(text)}")

    # ---- B1: the page loads

    def check_loaded(self):
        name = "B1 page loads"
        udd = os.path.join(self.root, "chromium-profile")
        self.browser = Browser(self.inst.node, self.puppeteer_dir, udd,
                               os.path.join(self.logs, "admin_page.cjs.stderr"))
        version = self.browser.call("launch", timeout=60, chromium=CHROMIUM, userDataDir=udd)
        say(f"browser: {version.get('version')}")
        got = self.browser.call("goto", url=self.admin_url)
        if got.get("status") != 200:
            self.checks.fail(f"{name}: GET / answers 200", f"status {got.get('status')}")
        value, problem = self.browser.wait("""(() => {
            const t = (id) => document.getElementById(id).textContent.trim();
            return t('upstream') && t('upstream') !== '…' && t('zero-state') === 'ready'
              ? {upstream: t('upstream'), capture: t('capture-mode'), zero: t('zero-state'),
                 detail: t('zero-detail'), notice: t('notice'),
                 logs: document.querySelectorAll('#logs-table tr').length,
                 slots: Array.from(document.querySelectorAll('#slots tr')).map(r => r.dataset.slot)}
              : false; })()""", PAGE_TIMEOUT)
        if problem:
            texts = self.browser.call("eval", expr="""({upstream: document.getElementById('upstream').textContent,
                zero: document.getElementById('zero-state').textContent,
                notice: document.getElementById('notice').textContent})""")
            self.checks.fail(f"{name}: #upstream filled in and #zero-state ready", f"{problem}; page shows {texts}")
            self.shoot("1-loaded.png")
            return False
        s = self.status()
        problems = []
        if value["upstream"] != s.get("upstream"):
            problems.append(f"#upstream [{value['upstream']}], /api/status upstream [{s.get('upstream')}]")
        if value["capture"] != s.get("capture_mode"):
            problems.append(f"#capture-mode [{value['capture']}], /api/status [{s.get('capture_mode')}]")
        if value["logs"] < 1:
            problems.append("#logs-table has no row")
        if value["notice"]:
            problems.append(f"#notice says [{value['notice']}]")
        zero = s.get("zero") or {}
        if zero.get("replica_file") != self.replica():
            problems.append(f"/api/status zero.replica_file {zero.get('replica_file')!r}, expected {self.replica()!r}")
        if problems:
            self.checks.fail(f"{name}: #upstream filled in and #zero-state ready", "; ".join(problems))
        else:
            self.checks.pass_(f"{name}: #upstream filled in and #zero-state ready",
                              f"upstream [{value['upstream']}], capture [{value['capture']}], "
                              f"zero-cache [{value['detail']}], slots {value['slots']}")
        # Give the page a few polling rounds before judging its console.
        time.sleep(3)
        _, errors = self.console_problems()
        if errors:
            self.checks.fail(f"{name}: no console errors after loading", short(errors, 1200))
        else:
            self.checks.pass_(f"{name}: no console errors after loading")
        self.shoot("1-loaded.png")
        self.check_other_client()
        return True

    def check_other_client(self):
        """While the page polls, another client (a second tab, curl, a monitor) still gets
        answers promptly: the page must not hold all of the admin server's threads."""
        name = "B1 the API answers another client within 5 s while the page is open"
        times = []
        for i in range(10):
            t0 = time.monotonic()
            try:
                code, text, _ = self.api("/api/status", timeout=5)
            except OSError as e:
                code, text = None, f"no answer: {e}"
            secs = time.monotonic() - t0
            if code != 200:
                established = self.admin_connections()
                self.checks.fail(name, f"GET /api/status #{i + 1} (a new connection; one every 0.5 s, the "
                                 f"page open in Chromium): {code or ''} {short(text, 160)} after {secs:.1f} s; "
                                 f"connections to the admin port (unread bytes): {established}")
                return
            times.append(secs)
            time.sleep(0.5)
        self.checks.pass_(name, f"{len(times)} requests, slowest {max(times):.2f} s")

    def admin_connections(self):
        """Established connections to the admin port, each with the bytes the server has not read."""
        try:
            r = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{self.aport} )"],
                               capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as e:
            return f"(ss failed: {e})"
        rows = [l.split() for l in r.stdout.splitlines() if l.strip()]
        return ", ".join(f"{row[3]}:{row[0]}" for row in rows if len(row) >= 4) or "none"

    # ---- B2: a slot and its lag

    def check_slot_lag(self):
        name = "B2 slot admin_probe"
        if self.sql(f"{name}: create table and slot through pgrelay",
                    "CREATE TABLE public.items (id int PRIMARY KEY, v text); "
                    "INSERT INTO public.items VALUES (1, 'one')") is None:
            return
        got = self.sql(f"{name}: create table and slot through pgrelay",
                       f"SELECT slot_name FROM pg_create_logical_replication_slot('{PROBE_SLOT}', 'pgoutput')")
        if got is None:
            return
        t0 = time.monotonic()
        cells, problem = self.browser.wait(f"""(() => {{
            const tr = document.querySelector('tr[data-slot="{PROBE_SLOT}"]');
            return tr ? Array.from(tr.cells).map(c => c.textContent) : false; }})()""", SLOT_TIMEOUT)
        if problem:
            self.checks.fail(f"{name}: its row appears on the page within {SLOT_TIMEOUT:.0f} s",
                             f"{problem}; /api/status slots: "
                             f"{[sl.get('name') for sl in self.status().get('slots', [])]}")
            self.shoot("2-slot-lag.png")
            return
        self.checks.pass_(f"{name}: its row appears on the page within {SLOT_TIMEOUT:.0f} s",
                          f"{time.monotonic() - t0:.1f} s: {cells}")
        problems = []
        if len(cells) != 7:
            problems.append(f"{len(cells)} cells, expected 7")
        elif cells[0] != PROBE_SLOT or cells[1] != "postgres" or cells[2] != "no":
            problems.append(f"slot/database/active cells {cells[:3]}, expected [{PROBE_SLOT}, postgres, no]")
        if problems:
            self.checks.fail(f"{name}: its row's cells", "; ".join(problems))
        try:
            before = int(cells[4])
        except (IndexError, ValueError):
            self.checks.fail(f"{name}: lag (bytes) cell is a number", f"cells {cells}")
            return
        for k in range(4):  # 200 rows in four transactions
            first = 1000 + 50 * k
            if self.sql(f"{name}: insert rows through pgrelay",
                        f"INSERT INTO public.items SELECT g, repeat('x', 100) || g "
                        f"FROM generate_series({first}, {first + 49}) g") is None:
                return
        t0 = time.monotonic()
        value, problem = self.browser.wait(f"""(() => {{
            const tr = document.querySelector('tr[data-slot="{PROBE_SLOT}"]');
            if (!tr || tr.cells.length < 5) return false;
            const lag = Number(tr.cells[4].textContent);
            return lag > {before} ? lag : false; }})()""", SLOT_TIMEOUT)
        if problem:
            s = [sl for sl in self.status().get("slots", []) if sl.get("name") == PROBE_SLOT]
            self.checks.fail(f"{name}: lag (bytes) grows after 200 inserted rows, within {SLOT_TIMEOUT:.0f} s",
                             f"{problem}; page cell was {before}; /api/status says {s}")
        else:
            self.checks.pass_(f"{name}: lag (bytes) grows after 200 inserted rows, within {SLOT_TIMEOUT:.0f} s",
                              f"{before} -> {value} after {time.monotonic() - t0:.1f} s")
        legend, problem = self.browser.wait(f"""(() => {{
            const t = document.getElementById('lag-legend').textContent;
            return t.includes({js(PROBE_SLOT)}) ? t : false; }})()""", SLOT_TIMEOUT)
        if problem:
            self.checks.fail(f"{name}: named in the lag chart's legend", problem)
        else:
            self.checks.pass_(f"{name}: named in the lag chart's legend", f"[{legend}]")
        self.shoot("2-slot-lag.png")

    # ---- B3: the log tail

    def check_log_tail(self):
        name = "B3 log tail"
        marker = "tail_" + uuid.uuid4().hex[:10]
        self.browser.call("click", selector='button[data-source="pgrelay"]')
        on, problem = self.browser.wait("""(() => {
            const on = Array.from(document.querySelectorAll('button[data-source].on')).map(b => b.dataset.source);
            return on.length === 1 && on[0] === 'pgrelay' && document.getElementById('log-lines').textContent.length > 0
              ? on : false; })()""", 5)
        if problem:
            self.checks.fail(f"{name}: source pgrelay selected and showing lines", problem)
        if self.sql(f"{name}: publication for pg_recvlogical",
                    "CREATE PUBLICATION admin_tail_pub FOR TABLE public.items") is None:
            return
        recv_log = os.path.join(self.logs, "pg_recvlogical.stderr")
        argv = [os.path.join(ze.PG_BINDIR, "pg_recvlogical"), "-d", self.url, "--slot", marker,
                "--create-slot", "--start", "-P", "pgoutput", "-o", "proto_version=1",
                "-o", "publication_names=admin_tail_pub", "-f", "/dev/null", "--no-loop"]
        say(" ".join(argv))
        with open(recv_log, "w") as err:
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                 env=dict(self.base_env(), PGCONNECT_TIMEOUT="20"),
                                 preexec_fn=set_parent_death_signal, start_new_session=True)
        self.recv.append(p)

        def logged():
            return any("starting logical decoding for slot" in l and marker in l
                       for l in self.stderr().splitlines())

        problem = self.wait_for(f"`starting logical decoding for slot` with {marker} on pgrelay's stderr",
                                logged, 30)
        if problem:
            self.checks.fail(f"{name}: pgrelay logs the marker line",
                             f"{problem}; pg_recvlogical: {' | '.join(tzc.tail(recv_log, 5))} "
                             f"(exit {p.poll()})")
            return
        t_logged = time.monotonic()
        value, problem = self.browser.wait(f"""(() => {{
            const t = document.getElementById('log-lines').textContent;
            return t.includes({js(marker)}) ? t.split('\\n').filter(l => l.includes({js(marker)})) : false; }})()""",
                                           max(0.05, LOG_TAIL_TIMEOUT - (time.monotonic() - t_logged)))
        secs = time.monotonic() - t_logged
        if problem:
            shown = self.browser.call("eval", expr="document.getElementById('log-lines').textContent.split('\\n').slice(-3)")
            self.checks.fail(f"{name}: the new line shows within {LOG_TAIL_TIMEOUT:.0f} s of its writing",
                             f"{problem} ({secs:.2f} s after it was in the stderr file); last lines shown: {shown}")
            # Was it just late?
            _, late = self.browser.wait(f"document.getElementById('log-lines').textContent.includes({js(marker)})", 10)
            say(f"the marker line {'never showed in 10 more s' if late else f'showed {time.monotonic() - t_logged:.1f} s after'}")
        else:
            self.checks.pass_(f"{name}: the new line shows within {LOG_TAIL_TIMEOUT:.0f} s of its writing",
                              f"{secs:.2f} s: {short(value[0], 200)}")
        # The filter box.
        self.browser.call("type", selector="#log-filter", text=marker)
        expr = f"""(() => {{
            const lines = document.getElementById('log-lines').textContent.split('\\n').filter(l => l.length);
            return lines.length > 0 && lines.every(l => l.includes({js(marker)})) ? lines : false; }})()"""
        value, problem = self.browser.wait(expr, 3)
        if problem:
            shown = self.browser.call("eval", expr="document.getElementById('log-lines').textContent.split('\\n').slice(-5)")
            self.checks.fail(f"{name}: with the marker in #log-filter every line holds it", f"{problem}; shown: {shown}")
        else:
            time.sleep(1.5)  # and it stays so through the next polls
            value2, problem = self.browser.wait(expr, 0.1)
            if problem:
                shown = self.browser.call("eval", expr="document.getElementById('log-lines').textContent.split('\\n').slice(-5)")
                self.checks.fail(f"{name}: with the marker in #log-filter every line holds it",
                                 f"held, then not 1.5 s later: {shown}")
            else:
                self.checks.pass_(f"{name}: with the marker in #log-filter every line holds it",
                                  f"{len(value2)} lines")
        self.shoot("3-log-tail.png")
        self.browser.call("clear", selector="#log-filter")
        # Stop the consumer, drop its slot.
        p.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=15)
        if p.poll() is None:
            stop_tree(p, "pg_recvlogical", grace=5)
        end = time.monotonic() + 15
        while True:
            try:
                with self.conn.cursor() as cur:
                    cur.execute(f"SELECT pg_drop_replication_slot('{marker}')")
                break
            except psycopg2.Error as e:
                if time.monotonic() > end:
                    self.checks.fail(f"{name}: drop the marker's slot", f"{e.pgcode or ''} {str(e).strip()}")
                    break
                time.sleep(0.5)
        with contextlib.suppress(psycopg2.Error), self.conn.cursor() as cur:
            cur.execute("DROP PUBLICATION admin_tail_pub")

    # ---- B4: reset

    def check_reset(self):
        name = "B4 reset zero"
        try:
            ino0 = os.stat(self.replica()).st_ino
        except OSError as e:
            self.checks.fail(f"{name}: replica file before", str(e))
            return
        n_ready = len(self.ready_lines())
        starts0 = (self.status().get("zero") or {}).get("starts")
        ev0 = self.browser.events()
        n_dialogs, n_posts = len(ev0["dialogs"]), len(ev0["posts"])
        say(f"click #reset-zero (replica inode {ino0}, {n_ready} ready lines, zero starts {starts0})")
        t0 = time.monotonic()
        self.browser.call("click", selector="#reset-zero")
        seen = {}

        def reset_done():
            with contextlib.suppress(OSError):
                ino = os.stat(self.replica()).st_ino
                if ino != ino0:
                    seen.setdefault("inode", (ino, time.monotonic() - t0))
            if len(self.ready_lines()) > n_ready:
                seen.setdefault("ready", time.monotonic() - t0)
            return "inode" in seen and "ready" in seen

        problem = self.wait_for("a new `zero-cache ready:` line and a new replica file", reset_done, RESET_TIMEOUT)
        ev = self.browser.events()
        dialogs = ev["dialogs"][n_dialogs:]
        if len(dialogs) == 1 and dialogs[0]["type"] == "confirm" and "Reset zero" in dialogs[0]["message"]:
            self.checks.pass_(f"{name}: the button asks to confirm first", short(dialogs[0]["message"], 160))
        else:
            self.checks.fail(f"{name}: the button asks to confirm first", f"dialogs {dialogs}")
        if problem:
            self.checks.fail(f"{name}: zero-cache ready again with a new replica file within {RESET_TIMEOUT:.0f} s",
                             f"{problem}; seen {seen}; replica exists {os.path.exists(self.replica())}")
        else:
            self.checks.pass_(f"{name}: zero-cache ready again with a new replica file within {RESET_TIMEOUT:.0f} s",
                              f"inode {ino0} -> {seen['inode'][0]}, ready line {seen['ready']:.1f} s after the click")
        # The page's POST and what pgrelay answered.
        end = time.monotonic() + 30
        posts = ev["posts"][n_posts:]
        while (not posts or posts[0]["body"] is None) and time.monotonic() < end:
            time.sleep(0.5)
            posts = self.browser.events()["posts"][n_posts:]
        body = None
        with contextlib.suppress(ValueError, IndexError, TypeError):
            body = json.loads(posts[0]["body"])
        if len(posts) == 1 and posts[0]["url"].endswith("/api/zero/reset") and posts[0]["status"] == 200 \
                and isinstance(body, dict) and body.get("reset") is True and body.get("replica_removed") is True \
                and body.get("dropped_slots") and all(n.startswith(APP_ID + "_") for n in body["dropped_slots"]) \
                and PROBE_SLOT not in body["dropped_slots"]:
            self.checks.pass_(f"{name}: POST /api/zero/reset answered 200, dropped only zero's slots",
                              short(posts[0]["body"], 200))
        else:
            self.checks.fail(f"{name}: POST /api/zero/reset answered 200, dropped only zero's slots",
                             f"POSTs seen: {short(posts, 800)}")
        logged = [l for l in self.stderr().splitlines() if "admin page: reset zero" in l]
        if logged:
            self.checks.pass_(f"{name}: pgrelay logs the action", short(logged[-1], 160))
        else:
            self.checks.fail(f"{name}: pgrelay logs the action", "no `admin page: reset zero` on stderr")
        if problem:
            return
        # zero-cache syncs again.
        t = self.write(f"{name}: replication after the reset",
                       "INSERT INTO public.items VALUES (5000, 'after-reset')")
        if t:
            self.checks.expect(f"{name}: replication after the reset", "after-reset",
                               "SELECT v FROM items WHERE id = 5000", t, timeout=SYNC_TIMEOUT)
        s = self.status()
        names = [sl.get("name") for sl in s.get("slots", [])]
        if PROBE_SLOT in names:
            self.checks.pass_(f"{name}: the test's slot {PROBE_SLOT} survives", f"slots now {names}")
        else:
            self.checks.fail(f"{name}: the test's slot {PROBE_SLOT} survives", f"slots now {names}")
        starts = (s.get("zero") or {}).get("starts")
        value, problem = self.browser.wait("""(() => {
            const z = document.getElementById('zero-state').textContent.trim();
            const n = document.getElementById('notice').textContent.trim();
            return z === 'ready' && !n ? {zero: z, detail: document.getElementById('zero-detail').textContent} : false; })()""",
                                           10)
        if problem or not (isinstance(starts, int) and isinstance(starts0, int) and starts > starts0):
            notice = self.browser.call("eval", expr="document.getElementById('notice').textContent")
            self.checks.fail(f"{name}: the page shows zero-cache ready again, no notice",
                             f"{problem}; notice [{notice}]; starts {starts0} -> {starts}")
        else:
            self.checks.pass_(f"{name}: the page shows zero-cache ready again, no notice",
                              f"[{value['detail']}], starts {starts0} -> {starts}")
        self.shoot("4-after-reset.png")

    # ---- B6: pgrelay dump and pgrelay restore beside the running zero-cache

    def tool(self, *args):
        """Runs `pgrelay ARGS` as a user would, beside the running pgrelay zero."""
        r = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=RESTORE_TIMEOUT,
                           env=self.base_env(), cwd=self.tmp)
        say(f"pgrelay {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    def zero_starts(self):
        return (self.status().get("zero") or {}).get("starts")

    def check_restore(self):
        name = "B6 dump and restore"
        archive = os.path.join(self.tmp, "app.dump")
        rows = self.sql(f"{name}: zero's schemas", "SELECT nspname FROM pg_namespace WHERE nspname IN "
                        f"('{APP_ID}', '{APP_ID}_0') ORDER BY 1")
        zero_schemas = [r[0] for r in rows or []]
        if zero_schemas != [APP_ID, f"{APP_ID}_0"]:
            self.checks.fail(f"{name}: zero-cache made its app and shard schemas", f"found {zero_schemas}")
            return
        r = self.tool("dump", "-D", self.data, archive)
        left_out = next((l for l in r.stdout.splitlines() if l.startswith("left out")), "")
        listing = subprocess.run([os.path.join(ze.PG_BINDIR, "pg_restore"), "-l", archive],
                                 capture_output=True, text=True).stdout if r.returncode == 0 else ""
        entries = [l.split() for l in listing.splitlines() if l and not l.startswith(";")]
        internal = [e for e in entries if len(e) > 4 and any(x in (APP_ID, f"{APP_ID}_0", "_pgrelay") for x in e[3:5])]
        has_items = any(e[3:6] == ["TABLE", "public", "items"] for e in entries)
        if r.returncode == 0 and all(sc in left_out for sc in zero_schemas + ["_pgrelay"]) and has_items \
                and not internal:
            self.checks.pass_(f"{name}: dump leaves out zero's schemas {zero_schemas} and _pgrelay", left_out)
        else:
            self.checks.fail(f"{name}: dump leaves out zero's schemas {zero_schemas} and _pgrelay",
                             f"exit {r.returncode}; [{left_out}]; items {has_items}; internal entries "
                             f"{short(internal, 600)}; {short(r.stderr, 600)}")
            return
        # Replacing tables zero-cache syncs: restore resets zero, which syncs the dump's rows.
        t = self.write(f"{name}: a change after the dump", "UPDATE public.items SET v = 'changed' WHERE id = 5000")
        if not t or not self.checks.expect(f"{name}: a change after the dump reaches the replica", "changed",
                                           "SELECT v FROM items WHERE id = 5000", t, timeout=SYNC_TIMEOUT):
            return
        starts0 = self.zero_starts()
        t = ze.now_ms()
        r = self.tool("restore", "-D", self.data, archive)
        if r.returncode == 0 and "resetting zero-cache" in r.stdout and "zero-cache is ready again" in r.stdout \
                and "1 of them replaced" in r.stdout:
            self.checks.pass_(f"{name}: a restore that replaces tables resets zero-cache and waits for it",
                              f"zero starts {starts0} -> {self.zero_starts()}")
        else:
            self.checks.fail(f"{name}: a restore that replaces tables resets zero-cache and waits for it",
                             f"exit {r.returncode}: {short(r.stdout, 800)} {short(r.stderr, 800)}")
            return
        self.checks.expect(f"{name}: zero-cache serves the restored rows", "after-reset",
                           "SELECT v FROM items WHERE id = 5000", t, timeout=SYNC_TIMEOUT)
        t = self.write(f"{name}: a write after the restore", "INSERT INTO public.items VALUES (5001, 'after-restore')")
        if t:
            self.checks.expect(f"{name}: a write after the restore reaches the replica", "after-restore",
                               "SELECT v FROM items WHERE id = 5001", t, timeout=SYNC_TIMEOUT)
        # Creating tables only: the restore reaches zero-cache through capture, no reset.
        fresh = os.path.join(self.tmp, "fresh.dump")
        if self.sql(f"{name}: a second database", "CREATE DATABASE scratch") is None:
            return
        try:
            other = psycopg2.connect(self.url, dbname="scratch", connect_timeout=30)
            other.autocommit = True
            with other.cursor() as cur:
                cur.execute("CREATE TABLE public.fresh (id int PRIMARY KEY, v text); "
                            f"INSERT INTO public.fresh SELECT g, 'fresh ' || g FROM generate_series(1, {FRESH_ROWS}) g")
            other.close()
        except psycopg2.Error as e:
            self.checks.fail(f"{name}: a table in the second database", str(e).strip())
            return
        r = self.tool("dump", "-D", self.data, "-d", "scratch", fresh)
        if r.returncode != 0:
            self.checks.fail(f"{name}: dump of the second database", short(r.stderr, 800))
            return
        starts0 = self.zero_starts()
        t = ze.now_ms()
        r = self.tool("restore", "-D", self.data, fresh)
        if r.returncode == 0 and "follows the restore through capture" in r.stdout and "resetting" not in r.stdout:
            self.checks.pass_(f"{name}: a restore that only creates tables is left to capture", short(r.stdout, 300))
        else:
            self.checks.fail(f"{name}: a restore that only creates tables is left to capture",
                             f"exit {r.returncode}: {short(r.stdout, 800)} {short(r.stderr, 800)}")
            return
        self.checks.expect(f"{name}: its rows reach zero-cache through capture",
                           f"{FRESH_ROWS}|{FRESH_ROWS}|fresh {FRESH_ROWS}",
                           f"SELECT count(*), max(id), (SELECT v FROM fresh WHERE id = {FRESH_ROWS}) FROM fresh",
                           t, timeout=SYNC_TIMEOUT)
        starts = self.zero_starts()
        if starts == starts0:
            self.checks.pass_(f"{name}: zero-cache was not restarted for it", f"starts {starts}")
        else:
            self.checks.fail(f"{name}: zero-cache was not restarted for it", f"starts {starts0} -> {starts}")

    # ---- the end

    def check_console_at_end(self):
        ev, errors = self.console_problems()
        if errors:
            self.checks.fail("B1 no console errors or page errors over the whole session", short(errors, 1500))
        else:
            self.checks.pass_("B1 no console errors or page errors over the whole session",
                              f"{len(ev['requestsFailed'])} failed requests"
                              + (f": {short(ev['requestsFailed'], 300)}" if ev["requestsFailed"] else ""))

    def close_browser(self):
        if self.browser is not None:
            self.browser.close()
            self.browser = None
        for p in self.recv:
            if p.poll() is None:
                stop_tree(p, "pg_recvlogical", grace=5)
        self.recv = []

    def cleanup(self):
        self.close_browser()
        super().cleanup()


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pgrelay", required=True, help="path of the pgrelay binary")
    ap.add_argument("--work", required=True, help="work directory (logs, screenshots; the npm cache in WORK/npm)")
    ap.add_argument("--npm-cache", help="where Node, zero-cache and puppeteer-core are installed (default WORK/npm)")
    args = ap.parse_args()

    started = time.monotonic()
    deadline = started + RUN_BUDGET
    work = os.path.abspath(args.work)
    top = os.path.join(work, "admin-page")
    logs = os.path.join(top, "logs")
    shots = os.path.join(top, "screenshots")
    shutil.rmtree(top, ignore_errors=True)
    os.makedirs(logs)
    os.makedirs(shots)

    ze.cleanup_on_signals()

    cache = os.path.abspath(args.npm_cache or os.path.join(work, "npm"))
    inst = Installer(cache)
    try:
        inst.ensure()
        puppeteer_dir = ensure_puppeteer(cache)
    except (RuntimeError, OSError) as e:
        print(f"SKIP: cannot install from npm: {e}", flush=True)
        return SKIP

    checks = ze.Checks(inst.sqlite, None, ze.now_ms() + RUN_BUDGET * 1000.0)
    if not os.access(CHROMIUM, os.X_OK):
        checks.fail("browser", f"{CHROMIUM} is missing: apt-get install chromium")
        checks.summary()
        return 1

    env = {k: v for k, v in os.environ.items() if not k.startswith("ZERO_") and not k.startswith("PGRELAY_")}
    serve = ServeAccess(os.path.abspath(args.pgrelay), checks, logs, env)
    run = AdminRun(args, inst, checks, logs, deadline, puppeteer_dir, shots)
    try:
        try:
            serve.run()
        finally:
            serve.cleanup()
        if run.start():
            checks.replica = run.replica()
            run.check_access()
            if run.check_loaded():
                for step in (run.check_slot_lag, run.check_log_tail, run.check_reset, run.check_restore):
                    if run.proc.poll() is not None:
                        checks.fail(step.__name__, f"not run: pgrelay exited with status {run.proc.returncode}")
                        continue
                    try:
                        step()
                    except BrowserError as e:
                        checks.fail(f"{step.__name__}: the browser", str(e))
                        if run.browser.broken:
                            break
                if not run.browser.broken:
                    run.check_console_at_end()
            run.close_browser()
            if run.proc.poll() is None:
                run.check_stop()
            else:
                checks.fail("Ctrl-C", f"not tested: pgrelay exited with status {run.proc.returncode}")
    except (RuntimeError, OSError, psycopg2.Error, subprocess.SubprocessError, BrowserError) as e:
        checks.fail("harness", f"{type(e).__name__}: {e}")
    finally:
        run.cleanup()
        if checks.failed:
            run.show_tails()
            tzc.print_tail("admin_page.cjs stderr", os.path.join(logs, "admin_page.cjs.stderr"), 20)
        run.keep_logs_and_remove()
        names = [n for n in ("1-loaded.png", "2-slot-lag.png", "3-log-tail.png", "4-after-reset.png")
                 if os.path.exists(os.path.join(shots, n))]
        if len(names) == 4:
            checks.pass_("B5 screenshots kept", ", ".join(os.path.join(shots, n) for n in names))
        else:
            checks.fail("B5 screenshots kept", f"only {names} in {shots}")
        checks.summary()
        say(f"logs in {logs}; screenshots in {shots}; {time.monotonic() - started:.0f} s in all")
    return 0 if not checks.failed and checks.passed else 1


if __name__ == "__main__":
    sys.exit(main())
