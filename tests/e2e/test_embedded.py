# End-to-end: `pgrelay` alone runs a private PostgreSQL, as root and as a normal OS user.
"""pgrelay with no subcommand initializes a PostgreSQL cluster in ./pgrelay-data/pg on first
run, serves it on 127.0.0.1, restarts it when it dies, stops it on SIGTERM, takes it over after
a kill -9, and keeps its data across runs. Run as root, the cluster runs as an unprivileged OS
user, and a data dir that user cannot reach is relocated to /var/lib/pgrelay. As a normal user
(`nobody` when the test runs as root) the same start works without any privilege."""

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_support as e2e  # noqa: E402
from e2e_support import CheckFailed, expect, expect_eq, wait_until  # noqa: E402


class PrivateRelay(e2e.Relay):
    """`pgrelay [OPTIONS]` (the embedded default) in `cwd`, optionally as another OS user."""

    def __init__(self, env, cwd, port, extra_args=(), user=None, binary=None, environ=None):
        self.env = env
        self.cwd = cwd
        self.port = port
        self.data_dir = os.path.join(cwd, "pgrelay-data")
        self.log_path = os.path.join(env.base, "relay-%d.log" % len(env.relays))
        self.log_file = open(self.log_path, "wb")
        if user:
            os.chown(self.log_path, user.pw_uid, user.pw_gid)
        self.args = [binary or env.pgrelay] + (["--listen", "127.0.0.1:%d" % port] if port else [])
        self.args += list(extra_args)
        kw = {"env": environ} if environ else {}
        if user:
            kw.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.args, cwd=cwd, stdout=subprocess.PIPE, stderr=self.log_file,
                                     stdin=subprocess.DEVNULL, **kw)
        env.track(self.proc.pid)
        env.relays.append(self)
        self.url = None
        self.exit_code = None

    def stderr_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def cluster_dir(self):
        return os.path.realpath(os.path.join(self.data_dir, "pg"))

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.cluster_dir(), "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (an exited child not yet reaped) is not running.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def process_uid(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def query(url, sql, args=None, dbname=None):
    kw = {"dbname": dbname} if dbname else {}
    return e2e.query_url(url, sql, args, connect_timeout=10, **kw)


def retry_query(url, sql, timeout=60):
    """The query's rows once it succeeds (the private PostgreSQL may be restarting)."""
    import psycopg2
    holder = {}

    def attempt():
        try:
            holder["rows"] = query(url, sql)
            return True
        except psycopg2.Error as e:
            holder["error"] = str(e)
            return False
    wait_until(attempt, timeout, "query %r to succeed (last error %r)" % (sql, holder.get("error")))
    return holder["rows"]


def stream_values(url, slot, publication, want, timeout=60):
    """Streams the slot with psycopg2 until every string of `want` was seen in an Insert;
    confirms what it read, and returns the set seen."""
    import select as select_mod
    import psycopg2
    import psycopg2.extras
    conn = psycopg2.connect(url, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            connect_timeout=10)
    seen = set()
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False,
                              options={"proto_version": "1", "publication_names": publication})
        deadline = time.monotonic() + timeout
        while not want <= seen and time.monotonic() < deadline:
            msg = cur.read_message()
            if msg is None:
                select_mod.select([cur], [], [], 0.5)
                continue
            payload = bytes(msg.payload)
            if payload[:1] == b"I":
                for value in want:
                    if value.encode() in payload:
                        seen.add(value)
            msg.cursor.send_feedback(flush_lsn=msg.data_start)
    finally:
        conn.close()
    expect(want <= seen, "the stream to carry rows %s" % sorted(want - seen), got=sorted(seen))
    return seen


def run_private_instance_checks(env, label, cwd, user=None, binary=None):
    """The embedded default's life cycle in `cwd`, as `user` (None: as this process)."""
    state = {}

    def fresh_start():
        port = e2e.free_port()
        relay = PrivateRelay(env, cwd, port, ["--database", "zero_cvr", "--database", "zero_cdb"],
                             user=user, binary=binary)
        url = relay.wait_ready(timeout=180)
        state["relay"] = relay
        state["cold_seconds"] = time.monotonic() - relay.started_at
        expect_eq(url, "postgres://postgres@127.0.0.1:%d/postgres" % port, "the ready URL")
        expect("initializing a private PostgreSQL" in relay.stderr_text(),
               "stderr to say that the cluster is being initialized", got=relay.stderr_text())
        expect(os.path.isfile(os.path.join(relay.cluster_dir(), "PG_VERSION")),
               "a cluster in pgrelay-data/pg")
        print("    cold start to the ready line: %.2f s" % state["cold_seconds"])
    env.check("fresh start of the private PostgreSQL (%s)" % label, fresh_start)
    if "relay" not in state:
        return
    relay = state["relay"]

    def private():
        rows = query(relay.url, "SELECT current_setting('listen_addresses'), "
                                "current_setting('unix_socket_directories'), "
                                "current_setting('server_encoding'), current_setting('max_connections'), "
                                "current_setting('track_commit_timestamp')")
        listen, sockets, encoding, max_conn, commit_ts = rows[0]
        expect_eq(listen, "", "listen_addresses of the private PostgreSQL (Unix socket only)")
        expect(sockets.startswith(relay.cluster_dir()) or sockets.startswith("/tmp/pgrelay-"),
               "its socket directory to be private", got=sockets)
        mode = stat.S_IMODE(os.stat(sockets).st_mode)
        expect_eq(mode, 0o700, "the socket directory's mode")
        expect_eq(encoding, "UTF8", "server_encoding")
        expect_eq(max_conn, "200", "max_connections (sized for zero-cache's pools)")
        expect_eq(commit_ts, "on", "track_commit_timestamp (trigger capture sends each commit's own time)")
        pid = relay.postmaster_pid()
        expect(pid is not None and alive(pid), "a running postmaster", got=pid)
        expected_uid = user.pw_uid if user else (
            pwd.getpwnam(e2e_runs_as_name()).pw_uid if os.geteuid() == 0 else os.geteuid())
        expect_eq(process_uid(pid), expected_uid, "the postmaster's OS user id")
        expect(process_uid(pid) != 0, "the postmaster not to run as root")
    env.check("the private PostgreSQL is private and unprivileged (%s)" % label, private)

    def databases():
        names = {r[0] for r in query(relay.url, "SELECT datname FROM pg_database")}
        expect({"postgres", "zero_cvr", "zero_cdb"} <= names, "--database to create databases",
               got=sorted(names))
        # Served through pgrelay like the main one.
        query(relay.url, "CREATE TABLE cvr_t (id int PRIMARY KEY)", dbname="zero_cvr")
        query(relay.url, "INSERT INTO cvr_t VALUES (7)", dbname="zero_cvr")
        expect_eq(query(relay.url, "SELECT id FROM cvr_t", dbname="zero_cvr"), [(7,)],
                  "a row written through pgrelay in zero_cvr")
    env.check("--database creates and serves other databases (%s)" % label, databases)

    def replication():
        query(relay.url, "CREATE TABLE items (id int PRIMARY KEY, name text)")
        query(relay.url, "CREATE PUBLICATION items_pub FOR TABLE items")
        query(relay.url, "SELECT pg_create_logical_replication_slot('items_slot', 'pgoutput')")
        query(relay.url, "INSERT INTO items VALUES (1, 'first-row'), (2, 'second-row')")
        stream_values(relay.url, "items_slot", "items_pub", {"first-row", "second-row"})
        # Captured natively by default: pgrelay's publications, no trigger capture tables.
        expect_eq(query(relay.url, "SELECT pubname::text FROM pg_publication WHERE pubname LIKE "
                        "'\\_pgrelay%' ORDER BY 1"),
                  [("_pgrelay_capture",), ("_pgrelay_capture_keyless",)], "native capture's publications")
        expect_eq(query(relay.url, "SELECT to_regclass('_pgrelay.changes') IS NULL"), [(True,)],
                  "no trigger capture table")
        expect("starting native capture" in relay.stderr_text(), "stderr to say native capture started",
               got=relay.stderr_text()[-2000:])
    env.check("logical replication from the private PostgreSQL, captured natively (%s)" % label,
              replication)

    def restart_after_crash():
        pid = relay.postmaster_pid()
        expect(pid is not None, "a postmaster pid")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: relay.postmaster_pid() not in (None, pid) and alive(relay.postmaster_pid()),
                   60, "a new postmaster after kill -9 of the old one")
        retry_query(relay.url, "SELECT 1")
        expect(relay.proc.poll() is None, "pgrelay to survive its PostgreSQL's crash")
        expect("restarting" in relay.stderr_text(), "stderr to report the restart",
               got=relay.stderr_text()[-2000:])
        retry_query(relay.url, "INSERT INTO items VALUES (3, 'after-crash') RETURNING id")
        stream_values(relay.url, "items_slot", "items_pub", {"after-crash"})
    env.check("a private PostgreSQL that dies is restarted (%s)" % label, restart_after_crash)

    def second_instance_refused():
        other = subprocess.run([binary or env.pgrelay, "--listen", "127.0.0.1:%d" % e2e.free_port()],
                               cwd=cwd, capture_output=True, text=True, timeout=60,
                               **(dict(user=user.pw_uid, group=user.pw_gid, extra_groups=[]) if user else {}))
        expect(other.returncode != 0, "a second pgrelay on the same data dir to fail",
               got=other.returncode)
        expect("another pgrelay (pid %d)" % relay.proc.pid in other.stderr,
               "the error to name the running pgrelay", got=other.stderr)
    env.check("a second pgrelay on the same data dir is refused (%s)" % label, second_instance_refused)

    def clean_stop():
        pid = relay.postmaster_pid()
        code, _ = relay.stop(signal.SIGTERM, timeout=60)
        expect_eq(code, 0, "pgrelay's exit status after SIGTERM")
        expect(pid is not None and not alive(pid), "the postmaster to be stopped with pgrelay", got=pid)
        expect(not os.path.exists(os.path.join(relay.data_dir, "pgrelay.pid")),
               "pgrelay.pid to be removed")
    env.check("SIGTERM stops pgrelay and its PostgreSQL (%s)" % label, clean_stop)

    def warm_restart():
        again = PrivateRelay(env, cwd, e2e.free_port(), user=user, binary=binary)
        again.wait_ready(timeout=120)
        warm = time.monotonic() - again.started_at
        print("    warm start to the ready line: %.2f s" % warm)
        state["relay2"] = again
        expect("initializing" not in again.stderr_text(), "no initdb on the second run",
               got=again.stderr_text())
        rows = query(again.url, "SELECT name FROM items ORDER BY id")
        expect_eq(rows, [("first-row",), ("second-row",), ("after-crash",)], "rows kept across runs")
        slots = query(again.url, "SELECT slot_name FROM pg_replication_slots")
        expect_eq(slots, [("items_slot",)], "the slot kept across runs")
    env.check("data persists across runs (%s)" % label, warm_restart)

    def kill9_then_recover():
        again = state.get("relay2")
        expect(again is not None, "a running pgrelay from the previous check")
        pid = again.postmaster_pid()
        again.proc.kill()
        again.proc.wait()
        # PR_SET_PDEATHSIG: the postmaster gets SIGQUIT when pgrelay dies.
        wait_until(lambda: not alive(pid), 30, "the postmaster to end after kill -9 of pgrelay")
        # A postmaster.pid naming a live process that is not our postmaster (pids are recycled,
        # e.g. in containers) must not stop the next start.
        decoy = env.spawn(["sleep", "120"])
        pidfile = os.path.join(again.cluster_dir(), "postmaster.pid")
        with open(pidfile, "w") as f:
            f.write("%d\n%s\n" % (decoy.pid, again.cluster_dir()))
        if user:
            os.chown(pidfile, user.pw_uid, user.pw_gid)
        third = PrivateRelay(env, cwd, e2e.free_port(), user=user, binary=binary)
        third.wait_ready(timeout=120)
        expect(decoy.poll() is None, "the unrelated process named by the stale pid file to live on")
        rows = query(third.url, "SELECT count(*) FROM items")
        expect_eq(rows, [(3,)], "rows after recovery")
        code, _ = third.stop(signal.SIGTERM, timeout=60)
        expect_eq(code, 0, "exit status of the recovered pgrelay")
    env.check("kill -9 of pgrelay leaves nothing behind; the next start recovers (%s)" % label,
              kill9_then_recover)

    def config_file_and_environment():
        port = e2e.free_port()
        config = os.path.join(cwd, "pgrelay.toml")
        with open(config, "w") as f:
            f.write('# pgrelay settings\n[serve]\nlisten = "127.0.0.1:%d"\n'
                    'database = ["from_config"]\n' % port)
        environ = dict(os.environ, PGRELAY_CONFIG=config, PGRELAY_WAL_SENDER_TIMEOUT="17")
        relay = PrivateRelay(env, cwd, None, user=user, binary=binary, environ=environ)
        url = relay.wait_ready(timeout=120)
        expect_eq(url, "postgres://postgres@127.0.0.1:%d/postgres" % port, "the ready URL (listen from the file)")
        names = {r[0] for r in query(url, "SELECT datname FROM pg_database")}
        expect("from_config" in names, "the config file's database to be created", got=sorted(names))
        rows = query(url, "SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'")
        expect_eq(rows, [("17000",)], "wal_sender_timeout from PGRELAY_WAL_SENDER_TIMEOUT")
        code, _ = relay.stop(signal.SIGTERM, timeout=60)
        expect_eq(code, 0, "exit status")
        with open(config, "a") as f:
            f.write("no_such_setting = 1\n")
        r = subprocess.run([binary or env.pgrelay, "--config", config], cwd=cwd, capture_output=True,
                           text=True, timeout=60)
        expect(r.returncode != 0 and "no_such_setting" in r.stderr,
               "an unknown setting in the config file to be refused, naming it", got=(r.returncode, r.stderr))
        os.unlink(config)
    if user is None:
        env.check("settings from a config file and PGRELAY_* variables (%s)" % label,
                  config_file_and_environment)

    def trigger_data_dir_keeps_trigger_capture():
        # A data directory first captured with triggers (by an older pgrelay, whose default that
        # was, or with --capture trigger) stays with triggers under the default.
        where = os.path.join(cwd, "trigger-first")
        os.mkdir(where)
        if user:
            os.chown(where, user.pw_uid, user.pw_gid)
        first = PrivateRelay(env, where, e2e.free_port(), ["--capture", "trigger"], user=user, binary=binary)
        url = first.wait_ready(timeout=120)
        query(url, "CREATE TABLE kept (id int PRIMARY KEY)")
        query(url, "CREATE PUBLICATION kept_pub FOR TABLE kept")
        query(url, "INSERT INTO kept VALUES (1)")
        wait_until(lambda: query(url, "SELECT count(*) FROM _pgrelay.changes")[0][0] == 0, 30,
                   "trigger capture to log the insert")
        code, _ = first.stop(signal.SIGTERM, timeout=60)
        expect_eq(code, 0, "exit status of the trigger-captured run")
        again = PrivateRelay(env, where, e2e.free_port(), user=user, binary=binary)
        url = again.wait_ready(timeout=120)
        expect("installing trigger capture" in again.stderr_text(), "the second run to keep triggers",
               got=again.stderr_text()[-2000:])
        expect_eq(query(url, "SELECT count(*) FROM pg_publication WHERE pubname LIKE '\\_pgrelay%'"),
                  [(0,)], "no native capture publication")
        code, _ = again.stop(signal.SIGTERM, timeout=60)
        expect_eq(code, 0, "exit status of the second run")
    if user is None:
        env.check("a data directory captured with triggers keeps them by default (%s)" % label,
                  trigger_data_dir_keeps_trigger_capture)


def e2e_runs_as_name():
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        return "nobody"


def body(env):
    def usage_errors():
        r = subprocess.run([env.pgrelay, "serve", "--upstream", "postgres://x@127.0.0.1:1/x",
                            "--database", "extra"], capture_output=True, text=True, timeout=30)
        expect_eq(r.returncode, 2, "exit status of --database with --upstream")
        expect("--database creates databases in pgrelay's private PostgreSQL only" in r.stderr,
               "the error to explain --database", got=r.stderr)
        r = subprocess.run([env.pgrelay, "--pg-bin", env.base], capture_output=True, text=True,
                           timeout=30, cwd=env.base)
        expect(r.returncode != 0 and "no PostgreSQL server programs" in r.stderr and "--pg-bin" in r.stderr,
               "a --pg-bin without server programs to be refused with a hint", got=r.stderr)
    env.check("usage errors of the embedded default", usage_errors)

    if os.geteuid() == 0:
        as_root = os.path.join(env.base, "root-run")
        os.mkdir(as_root)
        run_private_instance_checks(env, "as root", as_root)

        # A normal user: nobody, with the binary copied where it can read it.
        nobody = pwd.getpwnam("nobody")
        home = os.path.join(env.base, "nobody-run")
        os.mkdir(home)
        binary = os.path.join(home, "pgrelay")
        shutil.copy2(env.pgrelay, binary)
        os.chmod(binary, 0o755)
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        run_private_instance_checks(env, "as nobody", home, user=nobody, binary=binary)

        def relocation():
            hidden = os.path.join(env.base, "hidden")
            os.mkdir(hidden, 0o700)  # the cluster's OS user cannot enter it
            relay = PrivateRelay(env, hidden, e2e.free_port())
            try:
                relay.wait_ready(timeout=180)
                link = os.path.join(hidden, "pgrelay-data", "pg")
                expect(os.path.islink(link), "pgrelay-data/pg to be a symlink")
                target = os.readlink(link)
                expect(target.startswith("/var/lib/pgrelay/clusters/"),
                       "the cluster to be relocated under /var/lib/pgrelay", got=target)
                expect_eq(query(relay.url, "SELECT 41 + 1"), [(42,)], "a query on the relocated cluster")
                code, _ = relay.stop(signal.SIGTERM, timeout=60)
                expect_eq(code, 0, "exit status")
            finally:
                if relay.proc.poll() is None:
                    relay.stop(signal.SIGTERM, timeout=60)
                link = os.path.join(hidden, "pgrelay-data", "pg")
                if os.path.islink(link):
                    target = os.readlink(link)
                    if target.startswith("/var/lib/pgrelay/clusters/"):
                        shutil.rmtree(target, ignore_errors=True)
                        shutil.rmtree(target + ".initdb", ignore_errors=True)
        env.check("a data dir the cluster's user cannot reach is relocated (as root)", relocation)
    else:
        home = os.path.join(env.base, "user-run")
        os.mkdir(home)
        run_private_instance_checks(env, "as %s" % pwd.getpwuid(os.geteuid()).pw_name, home)
        env.skip("the private PostgreSQL as root", "the test does not run as root")


if __name__ == "__main__":
    e2e.main("embedded", body)
