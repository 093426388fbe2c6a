# `pgrelay doctor` against a real PostgreSQL 15: each check's OK and not-OK cases, and that its fixes work.
import json
import os
import re
import select
import signal
import socket
import subprocess
import time
from urllib.parse import quote

from e2e_support import DBNAME, PASSWORD, SUPERUSER, expect, expect_eq, free_port, main

USER = "doctor_user"
USER_PASSWORD = "Doctor-Pw-4417"
WRONG_PASSWORD = "Wrong-Pw-9931"

CHECKS = ["connection", "server_version", "writable", "tls", "wal_level", "role", "schema", "grants",
          "ddl_tracking", "publications", "publication_filters", "table_privileges",
          "replica_identity", "pg_hba", "prepared_transactions", "commit_timestamps", "replication_slots",
          "all_tables_publications", "databases"]

SETUP = """
CREATE TABLE items (id int PRIMARY KEY, name text);
CREATE TABLE "Mixed Case" (a int, b text);
CREATE TABLE coded (code text NOT NULL, note text, CONSTRAINT coded_code_key UNIQUE (code));
CREATE ROLE %s LOGIN PASSWORD '%s';
""" % (USER, USER_PASSWORD)

LINE = re.compile(r"^(OK|WARN|FAIL|SKIP) +(\w+): (.*)$")


def url(env, user=SUPERUSER, password=PASSWORD, host="127.0.0.1", **params):
    auth = quote(user, safe="") + (":" + quote(password, safe="") if password is not None else "")
    query = "&".join("%s=%s" % (k, quote(str(v), safe="/")) for k, v in params.items())
    return "postgres://%s@%s:%d/%s%s" % (auth, host, env.pg_port, DBNAME, "?" + query if query else "")


def run_doctor(env, target, *args, extra_env=None):
    """Runs `pgrelay doctor`; returns (exit code, stdout, stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    clean["PGPASSFILE"] = os.path.join(env.base, "no-pgpass")
    clean.update(extra_env or {})
    cmd = [env.pgrelay, "doctor"] + list(args) + ([target] if target else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean)
    return r.returncode, r.stdout, r.stderr


def parse(out):
    """{check name: (status, the check's text: its line and the indented lines under it)}."""
    checks = {}
    current = None
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            current = m.group(2)
            checks[current] = [m.group(1), line]
        elif current and line.startswith("      "):
            checks[current][1] += "\n" + line
        else:
            current = None
    return {k: (v[0], v[1]) for k, v in checks.items()}


def doctor(env, target, expect_code, *args, **kw):
    code, out, err = run_doctor(env, target, *args, **kw)
    expect(code == expect_code, "pgrelay doctor exits %d" % expect_code, got=(code, out, err))
    return parse(out), out


def expect_check(checks, name, status, *needles):
    expect(name in checks, "check %s is reported" % name, got=sorted(checks))
    got_status, text = checks[name]
    expect(got_status == status, "check %s is %s" % (name, status), got=text)
    for n in needles:
        expect(n in text, "check %s says %r" % (name, n), got=text)
    return text


def admin_value(env, sql):
    """One value, read as the superuser over the Unix socket."""
    r = env.pg_cmd(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", env.sock_dir, "-p",
                    str(env.pg_port), "-U", SUPERUSER, "-d", DBNAME, "-c", sql])
    return r.stdout.strip()


def fix_sql(env, target, names):
    """The SQL lines of the fixes doctor --json gives for the named checks."""
    code, out, err = run_doctor(env, target, "--json")
    report = json.loads(out)
    lines = []
    for c in report["checks"]:
        if c["name"] in names:
            for f in c["fixes"]:
                lines += [l for l in f["lines"] if not l.startswith("--")]
    expect(lines, "doctor --json gives fix lines for %s" % names, got=out)
    return lines


def apply_fixes(env, target, names):
    """Runs, as the superuser, every SQL fix doctor printed for the named checks."""
    for sql in fix_sql(env, target, names):
        env.psql_admin(sql)


def serve_starts(env, upstream, while_ready=None, stderr=None):
    """Whether `pgrelay serve` with this upstream prints its ready line (then calls while_ready
    and stops it). stderr: a list that gets what it wrote there."""
    data_dir = os.path.join(env.base, "serve-%d" % time.monotonic_ns())
    err_path = data_dir + ".err"
    err_file = open(err_path, "wb")
    proc = env.spawn([env.pgrelay, "serve", "--upstream", upstream, "--listen",
                      "127.0.0.1:%d" % free_port(), "--data-dir", data_dir, "--no-tls"],
                     stdout=subprocess.PIPE, stderr=err_file, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    out = b""
    while time.monotonic() < deadline and b"\n" not in out:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    ok = out.startswith(b"pgrelay ready: ")
    try:
        if ok and while_ready:
            while_ready()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        err_file.close()
        if stderr is not None:
            with open(err_path, "rb") as f:
                stderr.append(f.read().decode("utf-8", "replace"))
    return ok


def non_loopback_ipv4():
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("198.51.100.1", 9))  # UDP: no packet is sent, this only picks the route
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


class HbaFile:
    """Edits pg_hba.conf (without reloading: doctor reads the file) and restores it."""

    def __init__(self, env):
        self.path = os.path.join(env.pg_dir, "pg_hba.conf")
        with open(self.path) as f:
            self.original = f.read()

    def write(self, before="", after=""):
        with open(self.path, "w") as f:
            f.write(before + self.original + after)

    def restore(self):
        self.write()


def body(env):
    crt = env.make_certificate()
    remote_ip = non_loopback_ipv4()
    conf = ""
    if crt:
        conf += env.ssl_conf()
    if remote_ip:
        conf += "listen_addresses = '127.0.0.1,%s'\n" % remote_ip
    env.start_postgres(conf)
    hba = HbaFile(env)
    if remote_ip:
        hba.original += "host all all %s/32 scram-sha-256\n" % remote_ip
        hba.restore()
        env.psql_admin("SELECT pg_reload_conf()")
    env.psql_admin(SETUP)
    su = url(env)
    user = url(env, USER, USER_PASSWORD)

    def no_publication():
        checks, out = doctor(env, su, 0)
        expect_check(checks, "publications", "WARN", "no publications",
                     "CREATE PUBLICATION pgrelay FOR ALL TABLES;")
        expect_check(checks, "table_privileges", "SKIP")
        checks, out = doctor(env, user, 1)
        expect_check(checks, "publications", "WARN", "CREATE PUBLICATION pgrelay FOR TABLE")

    env.check("no publication: WARN with CREATE PUBLICATION", no_publication)
    env.psql_admin('CREATE PUBLICATION pub_main FOR TABLE items, "Mixed Case", coded')

    def superuser():
        checks, out = doctor(env, su, 0)
        expect_eq(list(checks), CHECKS, "the checks, in order")
        expect_check(checks, "connection", "OK", "127.0.0.1:%d as postgres, database e2e" % env.pg_port)
        expect_check(checks, "server_version", "OK", "PostgreSQL 15.", "tested with")
        expect_check(checks, "writable", "OK")
        if crt:
            expect_check(checks, "tls", "OK", "TLS in use (TLSv1.")
        expect_check(checks, "wal_level", "OK", "wal_level = replica", "captures with triggers",
                     "nothing to change")
        expect_check(checks, "role", "OK", "superuser")
        expect_check(checks, "schema", "OK", "_pgrelay does not exist yet")
        expect_check(checks, "ddl_tracking", "OK", "event trigger")
        expect_check(checks, "publications", "OK", "pub_main", "3 tables")
        expect_check(checks, "publication_filters", "OK")
        expect_check(checks, "table_privileges", "OK", "owns all 3 published tables")
        expect_check(checks, "pg_hba", "OK", "127.0.0.1/32 scram-sha-256) admits postgres from 127.0.0.1")
        expect_check(checks, "prepared_transactions", "OK", "max_prepared_transactions = 0")
        expect_check(checks, "commit_timestamps", "WARN", "track_commit_timestamp = off",
                     "time of the poll", "pgrelay_capture_delay_seconds", "track_commit_timestamp = on")
        expect_check(checks, "replication_slots", "SKIP")
        expect(not any(s == "FAIL" for s, _ in checks.values()), "no FAIL", got=out)
        expect("pgrelay can serve this upstream with trigger capture" in out, "the verdict line", got=out)
        expect(PASSWORD not in out and quote(PASSWORD, safe="") not in out, "no password in the output")

    env.check("superuser on wal_level=replica: exit 0, trigger capture", superuser)

    def replica_identity():
        checks, out = doctor(env, su, 0)
        text = expect_check(checks, "replica_identity", "WARN", "2 published tables have no primary key",
                            "DELETEs", 'ALTER TABLE public."Mixed Case" REPLICA IDENTITY FULL;',
                            "ALTER TABLE public.coded REPLICA IDENTITY USING INDEX coded_code_key;")
        expect("public.items" not in text, "a table with a primary key is not named", got=text)
        apply_fixes(env, su, ["replica_identity"])
        checks, out = doctor(env, su, 0)
        expect_check(checks, "replica_identity", "OK")
        got = admin_value(env, "SELECT string_agg(relname || '=' || relreplident::text, ',' ORDER BY relname) "
                               "FROM pg_class WHERE relname IN ('Mixed Case', 'coded', 'items')")
        expect_eq(got, "Mixed Case=f,coded=i,items=d", "replica identities after the fix")

    env.check("keyless published tables: REPLICA IDENTITY fixes with quoted names, and they work",
              replica_identity)

    def unprivileged():
        checks, out = doctor(env, user, 1)
        expect_check(checks, "role", "OK", "doctor_user")
        expect_check(checks, "schema", "FAIL", "lacks CREATE on database e2e",
                     "GRANT CREATE ON DATABASE e2e TO doctor_user;")
        expect_check(checks, "table_privileges", "FAIL", "may not create triggers on 3 of 3",
                     "ALTER TABLE public.items OWNER TO doctor_user;",
                     'ALTER TABLE public."Mixed Case" OWNER TO doctor_user;',
                     'GRANT TRIGGER, SELECT ON public."Mixed Case", public.coded, public.items TO doctor_user;')
        expect_check(checks, "ddl_tracking", "WARN", "no event trigger")
        expect_check(checks, "pg_hba", "SKIP", "could not be checked", "permission denied",
                     "GRANT SELECT ON pg_hba_file_rules TO doctor_user;")
        expect("cannot serve this upstream" in out, "the verdict line", got=out)
        expect(USER_PASSWORD not in out, "no password in the output")
        expect(not serve_starts(env, user), "pgrelay serve fails where doctor said FAIL")
        apply_fixes(env, user, ["schema", "table_privileges"])
        checks, out = doctor(env, user, 0)
        expect_check(checks, "schema", "OK", "belongs to doctor_user")
        expect_check(checks, "table_privileges", "OK", "owns all 3")
        expect(serve_starts(env, user), "pgrelay serve starts once doctor exits 0")
        checks, out = doctor(env, user, 0)
        installed = admin_value(env, "SELECT value FROM _pgrelay.meta WHERE key = 'version'")
        expect_check(checks, "schema", "OK", "trigger capture version %s is installed" % installed)

    def restore_privileges():
        env.psql_admin("DROP SCHEMA IF EXISTS _pgrelay CASCADE")
        for t in ("items", '"Mixed Case"', "coded"):
            env.psql_admin("ALTER TABLE %s OWNER TO postgres" % t)
        env.psql_admin("REVOKE ALL ON items, \"Mixed Case\", coded FROM %s" % USER)
        env.psql_admin("REVOKE CREATE ON DATABASE e2e FROM %s" % USER)

    env.check("unprivileged role: exit 1 with GRANT CREATE and ALTER TABLE OWNER; after them exit 0 "
              "and serve starts", unprivileged)
    restore_privileges()

    def trigger_only():
        env.psql_admin("GRANT CREATE ON DATABASE e2e TO %s" % USER)
        env.psql_admin('GRANT TRIGGER ON items, "Mixed Case", coded TO %s' % USER)
        env.psql_admin("GRANT SELECT ON items TO %s" % USER)
        checks, out = doctor(env, user, 0)
        expect_check(checks, "table_privileges", "WARN", "does not own 3",
                     'ALTER TABLE public."Mixed Case" OWNER TO doctor_user;',
                     'may not read public."Mixed Case", public.coded',
                     'GRANT SELECT ON public."Mixed Case", public.coded TO doctor_user;')

    env.check("TRIGGER privilege without ownership: WARN", trigger_only)
    restore_privileges()

    def bad_password():
        for target, extra, secret in (
                (url(env, USER, WRONG_PASSWORD), None, WRONG_PASSWORD),
                (url(env, USER, None), {"PGPASSWORD": WRONG_PASSWORD}, WRONG_PASSWORD),
                ("host=127.0.0.1 port=%d dbname=e2e user=%s password=%s sslmode=disable"
                 % (env.pg_port, USER, WRONG_PASSWORD), None, WRONG_PASSWORD)):
            code, out, err = run_doctor(env, target, extra_env=extra)
            expect_eq(code, 2, "exit status on a failed login")
            expect("password authentication failed for user \"doctor_user\"" in out, "libpq's reason",
                   got=out)
            expect("ALTER ROLE \"doctor_user\" PASSWORD" in out, "the fix", got=out)
            expect(secret not in out + err, "the password is not printed", got=out + err)
            code, out, err = run_doctor(env, target, "--json", extra_env=extra)
            report = json.loads(out)
            expect_eq((code, report["exit_status"], report["connected"], report["checks"][0]["name"],
                       report["checks"][0]["status"]), (2, 2, False, "connection", "fail"),
                      "--json on a failed login")
            expect(secret not in out + err, "the password is not printed in JSON", got=out)
        # libpq's parse errors quote parts of the string: the password must not be one of them.
        for target, secret in (("postgres://%s:Leak%%zzPw@127.0.0.1:%d/e2e" % (USER, env.pg_port), "Leak"),
                               (url(env, USER, "Leak-Pw-77", bogus="1"), "Leak-Pw-77"),
                               ("host=127.0.0.1 password='Leak Pw 77' port", "Leak Pw")):
            code, out, err = run_doctor(env, target)
            expect_eq(code, 2, "exit status on a malformed URL %r" % target)
            expect("invalid connection string" in err, "says what is wrong", got=err)
            expect(secret not in out + err, "the password is not printed", got=out + err)

    env.check("bad password or URL: exit 2, and no password in the output", bad_password)

    def json_report():
        code, out, err = run_doctor(env, su, "--json")
        report = json.loads(out)
        expect_eq([c["name"] for c in report["checks"]], CHECKS, "check names in --json")
        expect_eq((code, report["exit_status"], report["can_serve"], report["connected"]), (0, 0, True, True),
                  "exit status in --json")
        expect(all(c["status"] in ("ok", "warn", "fail", "skip") and c["summary"] for c in report["checks"]),
               "every check has a status and a summary", got=report["checks"])
        expect_eq(sum(report["counts"].values()), len(CHECKS), "counts")
        expect(report["server_version"].startswith("15."), "server_version", got=report["server_version"])
        expect(PASSWORD not in out and "postgres@127.0.0.1" in report["target"], "target without password",
               got=report["target"])
        code, out, err = run_doctor(env, user, "--json")
        report = json.loads(out)
        failed = sorted(c["name"] for c in report["checks"] if c["status"] == "fail")
        expect_eq((code, report["exit_status"], failed), (1, 1, ["schema", "table_privileges"]),
                  "failed checks in --json for the unprivileged role")

    env.check("--json: parses, names every check, exit status", json_report)

    def publication_filters():
        # What pgrelay evaluates is OK; a filter outside that subset is a FAIL with a fix.
        env.psql_admin("CREATE PUBLICATION pub_filtered FOR TABLE items WHERE (id > 0), coded (code)")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "publication_filters", "OK", "applies the row filters and column lists",
                     "pub_filtered: a row filter (WHERE) on public.items",
                     "pub_filtered: a column list on public.coded")
        env.psql_admin("ALTER PUBLICATION pub_filtered SET TABLE items WHERE (name LIKE 'a%'), coded (code)")
        checks, out = doctor(env, su, 1)
        expect_check(checks, "publication_filters", "FAIL", "cannot evaluate",
                     "pub_filtered: a row filter (WHERE) on public.items",
                     "ALTER PUBLICATION pub_filtered DROP TABLE public.items;",
                     "ALTER PUBLICATION pub_filtered ADD TABLE public.items;")
        apply_fixes(env, su, ["publication_filters"])
        checks, out = doctor(env, su, 0)
        expect_check(checks, "publication_filters", "OK")
        env.psql_admin("DROP PUBLICATION pub_filtered")

    env.check("row filters and column lists: OK when evaluated, else FAIL with a working fix",
              publication_filters)

    def partitioned():
        env.psql_admin("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        env.psql_admin("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        for via_root in ("true", "false"):
            env.psql_admin("CREATE PUBLICATION pub_part FOR TABLE parted WITH (publish_via_partition_root = %s)"
                           % via_root)
            checks, out = doctor(env, su, 0)
            # Both captures take the partitions; via the root too on PostgreSQL 15.
            expect_check(checks, "publications", "OK", "pub_part", "captures every one of them")
            env.psql_admin("DROP PUBLICATION pub_part")
        # A row filter pgrelay evaluates, on a partition: the filter check judges the filter.
        env.psql_admin("CREATE PUBLICATION pub_part FOR TABLE parted_1 WHERE (id > 0)")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "publication_filters", "OK", "applies the row filters",
                     "pub_part: a row filter (WHERE) on public.parted_1")
        expect_check(checks, "publications", "OK")
        env.psql_admin("DROP PUBLICATION pub_part")
        env.psql_admin("CREATE PUBLICATION pub_part FOR TABLE parted")
        expect(serve_starts(env, su), "pgrelay serve starts")
        env.psql_admin("DROP PUBLICATION pub_part")
        env.psql_admin("DROP TABLE parted")
        env.psql_admin("DROP SCHEMA IF EXISTS _pgrelay CASCADE")

    env.check("a partitioned table, published via its root or as partitions: OK (both captures stream it on "
              "PostgreSQL 15); serve starts", partitioned)

    def foreign_schema_and_read_only():
        env.psql_admin("CREATE SCHEMA _pgrelay")
        env.psql_admin("GRANT CREATE ON DATABASE e2e TO %s" % USER)
        env.psql_admin("ALTER ROLE %s SET default_transaction_read_only = on" % USER)
        checks, out = doctor(env, user, 1)
        expect_check(checks, "schema", "FAIL", "belongs to postgres",
                     "ALTER SCHEMA _pgrelay OWNER TO doctor_user;")
        expect_check(checks, "writable", "FAIL", "read-only",
                     "ALTER ROLE doctor_user RESET default_transaction_read_only;")
        apply_fixes(env, user, ["schema", "writable"])
        checks, out = doctor(env, user, 1)  # the tables still belong to postgres
        expect_check(checks, "schema", "OK")
        expect_check(checks, "writable", "OK")
        checks, out = doctor(env, user, 1, "--schema", "Other Schema")
        expect_check(checks, "schema", "OK", 'schema "Other Schema" does not exist yet')
        env.psql_admin("DROP SCHEMA _pgrelay")
        env.psql_admin("REVOKE CREATE ON DATABASE e2e FROM %s" % USER)

    env.check("a schema owned by another role, read-only sessions: FAIL, and the fixes work",
              foreign_schema_and_read_only)

    def disabled_event_trigger():
        env.psql_admin("CREATE FUNCTION doctor_evt() RETURNS event_trigger LANGUAGE plpgsql AS "
                       "'BEGIN END'")
        env.psql_admin("CREATE EVENT TRIGGER _pgrelay_ddl ON ddl_command_end EXECUTE FUNCTION doctor_evt()")
        env.psql_admin("ALTER EVENT TRIGGER _pgrelay_ddl DISABLE")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "ddl_tracking", "WARN", "disabled", "ALTER EVENT TRIGGER _pgrelay_ddl ENABLE;")
        env.psql_admin("DROP EVENT TRIGGER _pgrelay_ddl")
        env.psql_admin("DROP FUNCTION doctor_evt()")

    env.check("a disabled DDL event trigger: WARN", disabled_event_trigger)

    def pg_hba():
        try:
            hba.write(after="host e2e\n")
            checks, out = doctor(env, su, 0)
            expect_check(checks, "pg_hba", "WARN", "1 error", "would not start with this file",
                         "end-of-line before")
            hba.restore()
            apply_fixes(env, user, ["pg_hba"])  # the grants that let a non-superuser read it
            checks, out = doctor(env, user, 1)
            expect_check(checks, "pg_hba", "OK", "admits doctor_user from 127.0.0.1")
            hba.write(before="host all doctor_user 127.0.0.1/32 reject\n")
            checks, out = doctor(env, user, 1)
            expect_check(checks, "pg_hba", "WARN", "line 1 rejects doctor_user", "before line 1",
                         "e2e doctor_user 127.0.0.1/32 scram-sha-256")
            hba.write(before="host all postgres 127.0.0.2/32 trust\nhost all all 0.0.0.0/0 trust\n")
            checks, out = doctor(env, su, 0)
            expect_check(checks, "pg_hba", "OK", "line 2 (host all all 0.0.0.0/0 trust)")
        finally:
            hba.restore()

    env.check("pg_hba.conf: errors, a reject line, unreadable without grants", pg_hba)

    def tls():
        checks, out = doctor(env, url(env, sslmode="disable"), 0)
        expect_check(checks, "tls", "OK", "not encrypted (sslmode=disable; the server offers TLS)",
                     "fine on loopback")
        checks, out = doctor(env, "host=%s port=%d dbname=e2e user=postgres" % (env.sock_dir, env.pg_port), 0)
        expect_check(checks, "tls", "OK", "Unix socket")
        expect_check(checks, "connection", "OK", "the socket in %s" % env.sock_dir)
        expect_check(checks, "pg_hba", "OK", "local all all trust) admits postgres on the Unix socket")
        if not remote_ip:
            return
        checks, out = doctor(env, url(env, host=remote_ip, sslmode="disable"), 0)
        expect_check(checks, "tls", "WARN", "offers TLS, but this connection is not encrypted",
                     "sslmode=verify-full&sslrootcert=")
        checks, out = doctor(env, url(env, host=remote_ip, sslmode="require"), 0)
        expect_check(checks, "tls", "WARN", "TLS in use", "does not verify the server's certificate")
        checks, out = doctor(env, url(env, host=remote_ip, sslmode="verify-ca", sslrootcert=crt), 0)
        expect_check(checks, "tls", "OK", "verified (sslmode=verify-ca)")
        try:
            hba.write(before="host all postgres %s/32 trust\n" % remote_ip)
            checks, out = doctor(env, url(env, host=remote_ip), 0)
            expect_check(checks, "pg_hba", "WARN", "without a password",
                         "host all postgres %s/32 scram-sha-256" % remote_ip)
        finally:
            hba.restore()

    if crt:
        env.check("TLS: in use, disabled, unverified, verified (and pg_hba trust off loopback)", tls)
    else:
        env.skip("TLS", "openssl could not make a certificate")

    def native_settings():
        for setting in ("wal_level = logical", "max_prepared_transactions = 2", "max_replication_slots = 1",
                        "track_commit_timestamp = on"):
            env.psql_admin("ALTER SYSTEM SET " + setting)
        env.pg_cmd(["pg_ctl", "-D", env.pg_dir, "-l", os.path.join(env.base, "postgres.log"), "-w",
                    "-t", "60", "-m", "fast", "restart"])
        env.psql_admin("SELECT pg_create_logical_replication_slot('doctor_slot', 'pgoutput')")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "wal_level", "OK", "wal_level = logical", "native capture (--capture native or auto) is possible")
        expect_check(checks, "prepared_transactions", "WARN", "max_prepared_transactions = 2", "100 ms",
                     "max_prepared_transactions = 0")
        expect_check(checks, "commit_timestamps", "OK", "track_commit_timestamp = on",
                     "the transaction's own commit time")
        expect_check(checks, "replication_slots", "WARN", "max_replication_slots = 1 (1 in use)",
                     "max_replication_slots = 10")
        checks, out = doctor(env, user, 1)
        expect_check(checks, "role", "WARN", "no REPLICATION right", "ALTER ROLE doctor_user REPLICATION;")
        apply_fixes(env, user, ["role"])
        checks, out = doctor(env, user, 1)
        expect_check(checks, "role", "OK", "REPLICATION right")
        env.psql_admin("SELECT pg_drop_replication_slot('doctor_slot')")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "replication_slots", "OK", "(0 in use)")
        # A FOR ALL TABLES publication: other consumers of upstream slots see pgrelay's rows.
        expect_check(checks, "all_tables_publications", "OK", "no FOR ALL TABLES publication")
        env.psql_admin("CREATE PUBLICATION doctor_all FOR ALL TABLES")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "all_tables_publications", "WARN", "doctor_all", "bookkeeping rows",
                     "point those consumers at pgrelay", "FOR TABLES IN SCHEMA public")
        env.psql_admin("DROP PUBLICATION doctor_all")

    env.check("wal_level=logical: native-side checks (REPLICATION, slots, prepared transactions)",
              native_settings)

    def upstream_parameters():
        # Parameters of the upstream URL reach pgrelay's own connections as given.
        def named_connections():
            names = admin_value(env, "SELECT string_agg(DISTINCT application_name, ',') FROM "
                                     "pg_stat_activity WHERE application_name LIKE 'relay e2e%'")
            expect_eq(names, "relay e2e app", "pgrelay's connections, named by the URL")
        expect(serve_starts(env, url(env, sslmode="disable", application_name="relay e2e app",
                                     connect_timeout=9, options="-c work_mem=77MB"),
                            while_ready=named_connections),
               "serve starts with application_name, connect_timeout and options in its URL")
        # One it cannot honour on every connection is refused by name, not dropped.
        err = []
        expect(not serve_starts(env, url(env, sslmode="require", sslcert="/nonexistent.crt",
                                         sslkey="/nonexistent.key"), stderr=err),
               "serve refuses a client certificate in the upstream URL")
        expect('"sslcert" is not supported' in err[0] and "0A000" in err[0] and
               "Client certificates" in err[0], "the refusal names the parameter", got=err[0])
        expect(PASSWORD not in err[0], "no password in the refusal", got=err[0])
        code, out, err = run_doctor(env, url(env, sslmode="require", sslcert="/nonexistent.crt"))
        expect_eq(code, 2, "doctor's exit status on a URL serve would refuse")
        expect('"sslcert" is not supported' in err and "HINT: Client certificates" in err,
               "doctor says why", got=err)

    env.check("upstream URL: behaviour parameters reach pgrelay's connections, others refused",
              upstream_parameters)

    def databases():
        env.psql_admin("CREATE DATABASE doctor_other", db="postgres")
        checks, out = doctor(env, su, 0)
        expect_check(checks, "databases", "OK", "pgrelay captures doctor_other, e2e, postgres",
                     "every database")
        checks, out = doctor(env, su, 0, "--capture-database=doctor_other")
        text = expect_check(checks, "databases", "OK", "pgrelay captures doctor_other, e2e",
                            "not postgres", "55000", "--capture-database")
        expect("not doctor_other" not in text, "the database named is captured", got=text)
        # A role without CREATE in a database it would capture: the grant that fixes it.
        checks, out = doctor(env, user, 1, "--capture-database=doctor_other")
        expect_check(checks, "databases", "WARN", "may not create pgrelay's schema in doctor_other",
                     "GRANT CREATE ON DATABASE doctor_other TO doctor_user;")
        env.psql_admin("REVOKE CONNECT ON DATABASE doctor_other FROM PUBLIC", db="postgres")
        checks, out = doctor(env, user, 1, "--capture-database=doctor_other")
        expect_check(checks, "databases", "WARN", "cannot connect to doctor_other")
        env.psql_admin("DROP DATABASE doctor_other", db="postgres")

    env.check("databases: which are captured, which are left out, and the grants capture needs",
              databases)


if __name__ == "__main__":
    main("doctor", body)
