# Shared harness for the end-to-end tests: a throwaway PostgreSQL 15, `pgrelay serve`, checks.
"""Every e2e script builds on this module.

An `Env` owns one temporary directory under /tmp holding a PostgreSQL 15 cluster (wal_level=replica,
SCRAM passwords, so nothing native can answer logical replication) and the data directories of
the `pgrelay serve` processes it starts. A watchdog shell, started in its own session, holds the
read end of a pipe: if the test dies in any way (even SIGKILL from a ctest timeout) the pipe
closes and the watchdog kills the processes the test registered, stops the postmaster and
deletes the directory. A normal exit does the same cleanup itself first.
"""

import base64
import hashlib
import hmac
import os
import pwd
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from urllib.parse import urlsplit, urlunsplit

PG_BIN = os.environ.get("PGRELAY_PG_BINDIR", "/usr/lib/postgresql/15/bin")
PASSWORD = "e2e-Secret!pw"
DBNAME = "e2e"
SUPERUSER = "postgres"

_WATCHDOG = r"""
pids=""
while read -r pid; do pids="$pids $pid"; done
for pid in $pids; do kill -TERM "$pid" 2>/dev/null; done
sleep 0.5
for pid in $pids; do kill -KILL "$pid" 2>/dev/null; done
pidfile="$1/pg/postmaster.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL "$pid" 2>/dev/null
  fi
fi
rm -rf "$1"
"""


def query_url(url, sql, args=None, **connect_args):
    """One statement in autocommit on a connection of its own; its rows (None without any)."""
    import psycopg2
    conn = psycopg2.connect(url, **connect_args)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def with_db(url, db):
    """The postgres:// URL with its database replaced."""
    return urlunsplit(urlsplit(url)._replace(path="/" + db))


def npm_dir():
    """Where the tests install npm packages: --npm-dir DIR, else build/e2e-npm."""
    for i, arg in enumerate(sys.argv):
        if arg == "--npm-dir" and i + 1 < len(sys.argv):
            return os.path.abspath(sys.argv[i + 1])
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "e2e-npm")


def ensure_npm_package(spec, name):
    """Installs npm package `spec` (e.g. postgres@3) into npm_dir() once; returns (the path of
    node_modules/NAME, None), or (None, why not)."""
    prefix = npm_dir()
    module = os.path.join(prefix, "node_modules", name)
    if os.path.exists(os.path.join(module, "package.json")):
        return module, None
    if not shutil.which("node") or not shutil.which("npm"):
        return None, "node or npm is not installed"
    os.makedirs(prefix, exist_ok=True)
    try:
        r = subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", spec],
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return None, "npm install %s timed out" % spec
    if r.returncode != 0 or not os.path.exists(os.path.join(module, "package.json")):
        return None, "npm install %s failed: %s" % (spec, (r.stderr or r.stdout)[-600:])
    return module, None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CheckFailed(Exception):
    pass


def expect(condition, what, got=None, expected=None):
    """Raises CheckFailed naming what was expected and what came, unless condition holds."""
    if condition:
        return
    message = what
    if expected is not None or got is not None:
        message += "\n      expected: %r\n      got:      %r" % (expected, got)
    raise CheckFailed(message)


def expect_eq(got, expected, what):
    expect(got == expected, what, got=got, expected=expected)


def wait_until(predicate, timeout, what, interval=0.1):
    """Polls predicate() until it returns a truthy value; returns it, or fails after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = predicate()
        except CheckFailed:
            raise
        except Exception as e:  # a transient error while waiting counts as "not yet"
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise CheckFailed("timed out after %.0fs waiting for %s (last: %r)" % (timeout, what, last))
        time.sleep(interval)


class Relay:
    """One `pgrelay serve` process."""

    def __init__(self, env, data_dir, port, extra_args, upstream=None):
        """upstream: a URL, None for the test's upstream, False for none (a follower's)."""
        self.env = env
        self.data_dir = data_dir
        self.port = port
        self.log_path = os.path.join(env.base, "relay-%d.log" % len(env.relays))
        self.log_file = open(self.log_path, "wb")
        upstream_args = [] if upstream is False else ["--upstream", upstream or env.upstream_url()]
        args = [env.pgrelay, "serve"] + upstream_args + ["--listen", "127.0.0.1:%d" % port,
                                                         "--data-dir", data_dir] + list(extra_args)
        self.args = args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log_file,
                                     stdin=subprocess.DEVNULL)
        env.track(self.proc.pid)
        self.url = None
        self.exit_code = None

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        line = b""
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                line += chunk
                if b"\n" in line:
                    break
            elif self.proc.poll() is not None:
                break
        text = line.decode(errors="replace").strip()
        if not text:
            try:  # it closed stdout without a line: give it a moment to report its exit code
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                pass
        m = re.match(r"^pgrelay ready: (postgres://\S+)$", text.splitlines()[0] if text else "")
        if not m:
            raise CheckFailed("pgrelay serve did not print its ready line (stdout %r, exit %r)\n%s"
                              % (text, self.proc.poll(), self.stderr_tail()))
        self.url = m.group(1)
        return self.url

    def kill_if_running(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, sig=signal.SIGTERM, timeout=15):
        """Sends sig and waits; returns (exit code or None if it had to be killed, seconds)."""
        if self.proc.poll() is not None:
            self.exit_code = self.proc.returncode
            return self.exit_code, 0.0
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
            self.exit_code = self.proc.returncode
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.exit_code = None
        return self.exit_code, time.monotonic() - start

    def stderr_tail(self, lines=40):
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        tail = text.splitlines()[-lines:]
        if not tail:
            return "    (pgrelay stderr is empty)"
        return "    pgrelay stderr (last %d lines of %s):\n" % (len(tail), self.log_path) + "\n".join(
            "      | " + l for l in tail)


class Env:
    """A temporary PostgreSQL 15 upstream plus the pgrelay processes of one test script."""

    def __init__(self, pgrelay, name):
        self.pgrelay = os.path.abspath(pgrelay)
        self.name = name
        self.relays = []
        self.procs = []
        self.results = []
        self.base = tempfile.mkdtemp(prefix="pgrelay-e2e-", dir="/tmp")
        os.chmod(self.base, 0o755)
        self._watchdog = subprocess.Popen(["/bin/sh", "-c", _WATCHDOG, "pgrelay-e2e-watchdog", self.base],
                                          stdin=subprocess.PIPE, start_new_session=True)
        self.as_postgres = os.geteuid() == 0
        self.pg_port = free_port()
        self.pg_dir = os.path.join(self.base, "pg")
        self.sock_dir = os.path.join(self.base, "sock")
        os.mkdir(self.sock_dir)
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            os.chown(self.sock_dir, pw.pw_uid, pw.pw_gid)
        self.started_pg = False

    # ---- processes ----
    def track(self, pid):
        try:
            self._watchdog.stdin.write(b"%d\n" % pid)
            self._watchdog.stdin.flush()
        except OSError:
            pass

    def spawn(self, args, **kw):
        """Starts a client process that cleanup() will end if the test does not."""
        p = subprocess.Popen(args, **kw)
        self.track(p.pid)
        self.procs.append(p)
        return p

    def pg_cmd(self, args, check=True, **kw):
        cmd = [os.path.join(PG_BIN, args[0])] + list(args[1:])
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, **kw)
        if check and r.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
        return r

    # ---- the upstream ----
    def make_certificate(self):
        """A self-signed certificate and key for the upstream (ssl_conf()); its path, or None
        when openssl fails."""
        crt = os.path.join(self.base, "server.crt")
        key = os.path.join(self.base, "server.key")
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=localhost", "-keyout", key, "-out", crt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        os.chmod(key, 0o600)
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(key, pw.pw_uid, pw.pw_gid)
            os.chown(crt, pw.pw_uid, pw.pw_gid)
        return crt

    def ssl_conf(self):
        """postgresql.conf lines that turn TLS on with make_certificate()'s files."""
        return "ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n" % (
            os.path.join(self.base, "server.crt"), os.path.join(self.base, "server.key"))

    def start_postgres(self, extra_conf=""):
        pwfile = os.path.join(self.base, "pwfile")
        with open(pwfile, "w") as f:
            f.write(PASSWORD + "\n")
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        self.pg_cmd(["initdb", "-D", self.pg_dir, "-U", SUPERUSER, "--pwfile", pwfile, "-E", "UTF8",
                     "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"])
        conf = os.path.join(self.pg_dir, "postgresql.conf")
        with open(conf, "a") as f:
            f.write("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n"
                    "wal_level = replica\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                    "shared_buffers = 32MB\nmax_connections = 100\npassword_encryption = 'scram-sha-256'\n"
                    "%s\n" % (self.pg_port, self.sock_dir, extra_conf))
        self.pg_cmd(["pg_ctl", "-D", self.pg_dir, "-l", os.path.join(self.base, "postgres.log"), "-w",
                     "-t", "60", "start"])
        self.started_pg = True
        self.psql_admin("CREATE DATABASE %s" % DBNAME, db="postgres")

    def restart_postgres(self):
        """A fast shutdown and start of the upstream: every session and walsender ends."""
        self.pg_cmd(["pg_ctl", "-D", self.pg_dir, "-l", os.path.join(self.base, "postgres.log"), "-w",
                     "-t", "60", "-m", "fast", "restart"])

    def psql_admin(self, sql, db=DBNAME):
        """Runs SQL as the superuser over the Unix socket (trust): setup only, not a test path."""
        r = self.pg_cmd(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", self.sock_dir, "-p",
                         str(self.pg_port), "-U", SUPERUSER, "-d", db, "-c", sql])
        return r.stdout

    def upstream_url(self, db=DBNAME):
        return "postgres://%s:%s@127.0.0.1:%d/%s" % (SUPERUSER, _pct(PASSWORD), self.pg_port, db)

    def db_query(self, db, sql, args=None):
        """One statement straight to the upstream's database `db`, as the superuser."""
        return query_url("", sql, args, host="127.0.0.1", port=self.pg_port, user=SUPERUSER,
                         password=PASSWORD, dbname=db, sslmode="disable")

    def direct(self, autocommit=True):
        """A psycopg2 connection straight to the upstream."""
        import psycopg2
        conn = psycopg2.connect(host="127.0.0.1", port=self.pg_port, user=SUPERUSER, password=PASSWORD,
                                dbname=DBNAME, sslmode="disable")
        conn.autocommit = autocommit
        return conn

    def direct_query(self, sql, args=None):
        return query_url("", sql, args, host="127.0.0.1", port=self.pg_port, user=SUPERUSER,
                         password=PASSWORD, dbname=DBNAME, sslmode="disable")

    # ---- pgrelay ----
    def start_relay(self, data_dir=None, port=None, extra_args=(), timeout=90, upstream=None):
        data_dir = data_dir or os.path.join(self.base, "relay-data")
        port = port or free_port()
        relay = Relay(self, data_dir, port, extra_args, upstream=upstream)
        self.relays.append(relay)
        relay.wait_ready(timeout)
        return relay

    def relay_conn(self, relay, **kw):
        import psycopg2
        return psycopg2.connect(relay.url, **kw)

    def relay_query(self, relay, sql, args=None):
        return query_url(relay.url, sql, args)

    # ---- checks ----
    def check(self, name, fn):
        """Runs one check; prints PASS/FAIL; never raises (so later checks still run)."""
        start = time.monotonic()
        try:
            fn()
        except CheckFailed as e:
            self._record(name, False, str(e), start)
        except Exception:  # an unexpected exception is a failure of the check, with its trace
            self._record(name, False, traceback.format_exc(), start)
        else:
            self._record(name, True, "", start)

    def _record(self, name, ok, detail, start):
        took = time.monotonic() - start
        print("%s: %s [%s] (%.1fs)" % ("PASS" if ok else "FAIL", name, self.name, took), flush=True)
        if not ok:
            for line in detail.rstrip().splitlines():
                print("    " + line)
            if "pgrelay stderr" not in detail:
                for relay in self.relays:
                    if relay.proc.poll() is None or relay is self.relays[-1]:
                        print(relay.stderr_tail(25))
            if self.started_pg:
                print(self.upstream_warnings(10))
            sys.stdout.flush()
        self.results.append((name, ok))

    def upstream_warnings(self, n):
        """The upstream's last n WARNING lines: trigger capture's event trigger warns there,
        rather than fail the application's DDL, when it could not follow it."""
        try:
            with open(os.path.join(self.base, "postgres.log"), errors="replace") as f:
                lines = [l.rstrip() for l in f if "WARNING:" in l]
        except OSError as e:
            return "    (upstream log unreadable: %s)" % e
        tail = lines[-n:]
        return "    upstream warnings (last %d of %d):\n%s" % (
            len(tail), len(lines), "\n".join("      | " + l for l in tail))

    def skip(self, name, why):
        print("SKIP: %s [%s]: %s" % (name, self.name, why), flush=True)
        self.results.append((name, None))

    # ---- teardown ----
    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        for relay in self.relays:
            if relay.proc.poll() is None:
                relay.stop(signal.SIGTERM, timeout=5)
        if self.started_pg:
            self.pg_cmd(["pg_ctl", "-D", self.pg_dir, "-m", "immediate", "-w", "stop"], check=False)
        keep = os.environ.get("PGRELAY_E2E_KEEP")
        if keep:
            print("kept %s (PGRELAY_E2E_KEEP is set)" % self.base)
            self._watchdog.kill()  # it would delete the directory
            self._watchdog.wait()
        else:
            shutil.rmtree(self.base, ignore_errors=True)
        try:
            self._watchdog.stdin.close()  # the watchdog finds nothing left to do
        except OSError:
            pass

    def summary(self):
        passed = sum(1 for _, ok in self.results if ok)
        failed = [n for n, ok in self.results if ok is False]
        skipped = [n for n, ok in self.results if ok is None]
        print("%s: %d passed, %d failed, %d skipped" % (self.name, passed, len(failed), len(skipped)))
        for n in failed:
            print("  failed: " + n)
        return failed, skipped


def _pct(text):
    from urllib.parse import quote
    return quote(text, safe="")


def run_capture_modes(env, make_mode, conf):
    """Starts the upstream with `conf`, then make_mode(env, mode).run() for trigger and then native
    capture (each in a database of its own), stopping each mode's pgrelay (`.relay`) after it."""
    env.start_postgres(conf)
    for name in ("trigger", "native"):
        mode = make_mode(env, name)
        mode.run()
        if mode.relay:
            mode.relay.stop()


def main(name, body, skip_code=77):
    """Runs body(env) with cleanup on any exit; exit 1 on failure, 77 when everything skipped."""
    if len(sys.argv) < 2:
        print("usage: %s PATH_TO_PGRELAY [options]" % sys.argv[0])
        sys.exit(2)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_signal)
    env = Env(sys.argv[1], name)
    crashed = False
    try:
        body(env)
    except CheckFailed as e:
        env._record("setup", False, str(e), time.monotonic())
        crashed = True
    except BaseException:
        print("FAIL: %s aborted:\n%s" % (name, traceback.format_exc()), flush=True)
        for relay in env.relays:
            print(relay.stderr_tail(25))
        crashed = True
    finally:
        env.cleanup()
    failed, skipped = env.summary()
    if failed or crashed:
        sys.exit(1)
    if skipped and len(skipped) == len(env.results):
        sys.exit(skip_code)
    sys.exit(0)


# ---- a minimal replication client over a raw socket, to see exact protocol messages ----

class RawConn:
    """Speaks the v3 protocol directly (no TLS, SCRAM-SHA-256), for checks libpq hides."""

    def __init__(self, host, port, user, password, database, replication="database"):
        self.sock = socket.create_connection((host, port), timeout=10)
        params = {"user": user, "database": database}
        if replication:
            params["replication"] = replication
        body = struct.pack("!I", 196608)
        for k, v in params.items():
            body += k.encode() + b"\0" + v.encode() + b"\0"
        body += b"\0"
        self.sock.sendall(struct.pack("!I", len(body) + 4) + body)
        self._buf = b""
        self._auth(user, password)
        self.parameters = {}
        while True:
            tag, payload = self.read()
            if tag == b"S":
                k, v, _ = payload.split(b"\0", 2)
                self.parameters[k.decode()] = v.decode()
            elif tag == b"Z":
                break
            elif tag == b"E":
                raise RuntimeError("startup failed: %r" % parse_error(payload))

    def _auth(self, user, password):
        tag, payload = self.read()
        if tag == b"E":
            raise RuntimeError("auth failed: %r" % parse_error(payload))
        (code,) = struct.unpack("!I", payload[:4])
        if code == 0:
            return
        if code != 10:
            raise RuntimeError("unsupported auth request %d" % code)
        nonce = base64.b64encode(os.urandom(18)).decode()
        first_bare = "n=,r=" + nonce
        initial = ("n,," + first_bare).encode()
        body = b"SCRAM-SHA-256\0" + struct.pack("!i", len(initial)) + initial
        self.send(b"p", body)
        tag, payload = self.read()
        server_first = payload[4:].decode()
        attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored = hashlib.sha256(client_key).digest()
        without_proof = "c=biws,r=" + attrs["r"]
        auth_message = ",".join([first_bare, server_first, without_proof]).encode()
        signature = hmac.new(stored, auth_message, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self.send(b"p", (without_proof + ",p=" + base64.b64encode(proof).decode()).encode())
        while True:
            tag, payload = self.read()
            if tag == b"E":
                raise RuntimeError("auth failed: %r" % parse_error(payload))
            (code,) = struct.unpack("!I", payload[:4])
            if code == 0:
                return

    def send(self, tag, body):
        self.sock.sendall(tag + struct.pack("!I", len(body) + 4) + body)

    def query(self, sql):
        self.send(b"Q", sql.encode() + b"\0")

    def read(self, timeout=10):
        """Returns (tag, payload), or (None, None) at EOF."""
        self.sock.settimeout(timeout)
        while len(self._buf) < 5 or len(self._buf) < 1 + struct.unpack("!I", self._buf[1:5])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None, None
            self._buf += chunk
        n = struct.unpack("!I", self._buf[1:5])[0]
        tag, payload = self._buf[:1], self._buf[5:1 + n]
        self._buf = self._buf[1 + n:]
        return tag, payload

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def parse_error(payload):
    fields = {}
    for part in payload.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return fields


def standby_status(lsn_int):
    now = int((time.time() - 946684800) * 1e6)
    return b"r" + struct.pack("!QQQqB", lsn_int, lsn_int, lsn_int, now, 0)


def lsn_to_int(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_to_str(value):
    return "%X/%X" % (value >> 32, value & 0xFFFFFFFF)
