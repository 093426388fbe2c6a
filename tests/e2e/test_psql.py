# psql through `pgrelay serve`: simple and extended (\gdesc) protocol, fastpath, transactions, COPY, errors.
import os
import signal
import subprocess
import time

from e2e_support import PG_BIN, expect, expect_eq, main, wait_until

TABLE = """
CREATE TABLE t_psql (id int PRIMARY KEY, name text NOT NULL, amount numeric(10,2), note text);
"""


def psql(env, relay, script=None, args=(), stop_on_error=True, verbose=False):
    """Runs psql against pgrelay's URL; returns (exit code, stdout, stderr)."""
    cmd = [os.path.join(PG_BIN, "psql"), "-X", "-A", "-t", "-q"]
    if stop_on_error:
        cmd += ["-v", "ON_ERROR_STOP=1"]
    if verbose:
        cmd += ["-v", "VERBOSITY=verbose"]
    cmd += list(args) + ["-d", relay.url]
    r = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=60,
                       cwd=env.base)
    return r.returncode, r.stdout, r.stderr


def run_ok(env, relay, script, **kw):
    code, out, err = psql(env, relay, script, **kw)
    expect(code == 0, "psql exited %d\n      stdout: %r\n      stderr: %r" % (code, out, err))
    return out


def body(env):
    # TLS on the upstream: pgrelay's default sslmode (prefer) takes it, so every session here
    # reaches its backend over TLS (the other tests' upstreams are plain).
    expect(env.make_certificate() is not None, "openssl made the upstream's certificate")
    env.start_postgres(env.ssl_conf())
    env.psql_admin(TABLE)
    relay = env.start_relay()
    direct_version = env.direct_query("SHOW server_version_num")[0][0]

    def simple():
        out = run_ok(env, relay, None, args=["-c", "SELECT 6 * 7", "-c", "SELECT current_user, current_database()",
                                             "-c", "SHOW server_version_num",
                                             "-c", "SELECT string_agg(g::text, ',') FROM generate_series(1, 5) g"])
        expect_eq(out.splitlines(), ["42", "postgres|e2e", direct_version, "1,2,3,4,5"],
                  "simple-protocol answers through pgrelay")
        # Several statements in one Query message: psql sends the -c string as is.
        out = run_ok(env, relay, None, args=["-c", "SELECT 1; SELECT 'two'; SELECT NULL IS NULL"])
        # PG15 psql shows every result of a multi-statement Query.
        expect_eq(out.splitlines(), ["1", "two", "t"], "a multi-statement simple Query's results")

    def extended():
        # PG15's psql has no \\bind (it came in 16). Its extended-protocol paths are \\gdesc
        # (Parse + Describe of the unnamed statement) and the large-object commands (fastpath
        # function calls); Bind/Execute with parameters is covered by pgbench -M extended/prepared.
        script = ("SELECT $1::int AS a, 'x'::text AS b, 1.5::numeric(4,2) AS c \\gdesc\n"
                  "SELECT id, name FROM t_psql \\gdesc\n"
                  "SELECT 'after gdesc'\n")
        out = run_ok(env, relay, script)
        expect_eq(out.splitlines(), ["a|integer", "b|text", "c|numeric(4,2)", "id|integer", "name|text",
                                     "after gdesc"], "\\gdesc (Parse/Describe/Sync) through pgrelay")
        code, out, err = psql(env, relay, "SELECT no_such_column FROM t_psql \\gdesc\nSELECT 'next';\n",
                              stop_on_error=False, verbose=True)
        expect("42703" in err and out.splitlines() == ["next"],
               "an error in Parse (42703) and the session goes on", got=(code, out, err))
        blob = os.path.join(env.base, "blob.in")
        payload = bytes(range(256)) * 40 + "ünïcødé".encode()
        with open(blob, "wb") as f:
            f.write(payload)
        blob_out = os.path.join(env.base, "blob.out")
        script = ("BEGIN;\n\\lo_import '%s'\n\\set oid :LASTOID\n\\lo_export :oid '%s'\n"
                  "SELECT length(lo_get(:oid));\n\\lo_unlink :oid\nCOMMIT;\n" % (blob, blob_out))
        out = run_ok(env, relay, script)
        expect_eq(out.split(), [str(len(payload))], "large object length through pgrelay")
        with open(blob_out, "rb") as f:
            expect(f.read() == payload, "\\lo_import/\\lo_export (fastpath calls) round-trip the bytes")

    def transaction():
        script = """
BEGIN;
INSERT INTO t_psql VALUES (1, 'one', 1.00, NULL);
INSERT INTO t_psql VALUES (2, 'two', 2.00, 'x');
SAVEPOINT s1;
INSERT INTO t_psql VALUES (3, 'three', 3.00, NULL);
ROLLBACK TO SAVEPOINT s1;
UPDATE t_psql SET amount = amount * 10 WHERE id = 2;
SELECT count(*) FROM t_psql WHERE id < 100;
SELECT pg_current_xact_id() = pg_current_xact_id();
COMMIT;
BEGIN;
INSERT INTO t_psql VALUES (4, 'four', 4.00, NULL);
SELECT count(*) FROM t_psql WHERE id < 100;
ROLLBACK;
SELECT id, name, amount, coalesce(note, '<null>') FROM t_psql WHERE id < 100 ORDER BY id;
"""
        out = run_ok(env, relay, script)
        expect_eq(out.splitlines(), ["2", "t", "3", "1|one|1.00|<null>", "2|two|20.00|x"],
                  "savepoint, rollback and commit through pgrelay")
        rows = env.direct_query("SELECT id, amount::text FROM t_psql WHERE id < 100 ORDER BY id")
        expect_eq(rows, [(1, "1.00"), (2, "20.00")], "upstream sees exactly the committed rows")

    def copy():
        csv_in = os.path.join(env.base, "in.csv")
        lines = ['100,plain,1.50,',
                 '101,"comma, and ""quotes""",2.00,note',
                 '102,"multi\nline",3.25,""',
                 '103,ünïcødé €,0.00,\\N',
                 '104,tab\there,-7.10,x']
        data = "\n".join(lines) + "\n"
        with open(csv_in, "w") as f:
            f.write(data)
        out = run_ok(env, relay, "\\copy t_psql FROM '%s' WITH (FORMAT csv)\n" % csv_in, args=["-v", "QUIET=off"])
        expect_eq(out.strip(), "COPY 5", "COPY FROM STDIN through pgrelay reports its row count")
        rows = env.direct_query("SELECT id, name, amount::text, note FROM t_psql WHERE id >= 100 AND id < 200 ORDER BY id")
        expect_eq(rows, [(100, "plain", "1.50", None), (101, 'comma, and "quotes"', "2.00", "note"),
                         (102, "multi\nline", "3.25", ""), (103, "ünïcødé €", "0.00", "\\N"),
                         (104, "tab\there", "-7.10", "x")], "rows copied in, read directly upstream")
        csv_out = os.path.join(env.base, "out.csv")
        run_ok(env, relay, "\\copy (SELECT * FROM t_psql WHERE id >= 100 AND id < 200 ORDER BY id) TO '%s' WITH (FORMAT csv)\n" % csv_out)
        with open(csv_out) as f:
            got = f.read()
        # Postgres quotes the empty string only (the CSV NULL is an unquoted empty field).
        expect_eq(got, data, "COPY TO STDOUT (csv) through pgrelay")
        # Binary COPY out: byte-identical to the same COPY run directly.
        relayed_bin = os.path.join(env.base, "relayed.bin")
        direct_bin = os.path.join(env.base, "direct.bin")
        query = "\\copy (SELECT * FROM t_psql ORDER BY id) TO '%s' WITH (FORMAT binary)\n"
        run_ok(env, relay, query % relayed_bin)
        r = subprocess.run([os.path.join(PG_BIN, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d",
                            env.upstream_url()], input=query % direct_bin, capture_output=True, text=True)
        expect(r.returncode == 0, "direct binary COPY: " + r.stderr)
        with open(relayed_bin, "rb") as a, open(direct_bin, "rb") as b:
            relayed, direct = a.read(), b.read()
        expect(len(relayed) > 50 and relayed == direct, "binary COPY out through pgrelay equals direct",
               got=len(relayed), expected=len(direct))
        # Binary COPY in: reload the binary file into a copy of the table.
        env.psql_admin("CREATE TABLE t_psql_copy (LIKE t_psql)")
        out = run_ok(env, relay, "\\copy t_psql_copy FROM '%s' WITH (FORMAT binary)\n" % relayed_bin,
                     args=["-v", "QUIET=off"])
        n = env.direct_query("SELECT count(*) FROM t_psql")[0][0]
        expect_eq(out.strip(), "COPY %d" % n, "binary COPY FROM STDIN through pgrelay")
        same = env.direct_query("SELECT count(*) FROM (SELECT * FROM t_psql EXCEPT SELECT * FROM t_psql_copy) d")[0][0]
        expect_eq(same, 0, "rows copied back in binary equal the originals")

    def errors():
        code, out, err = psql(env, relay, "SELECT 1/0;\n", verbose=True)
        expect(code == 3 and "ERROR:  22012: division by zero" in err,
               "division by zero with SQLSTATE 22012 and ON_ERROR_STOP exit 3", got=(code, err))
        code, out, err = psql(env, relay, "INSERT INTO t_psql VALUES (1, 'dup', 0, NULL);\n", verbose=True)
        expect(code == 3 and 'ERROR:  23505: duplicate key value violates unique constraint "t_psql_pkey"' in err
               and "DETAIL:  Key (id)=(1) already exists." in err,
               "unique violation with SQLSTATE 23505 and its DETAIL", got=(code, err))
        # Without ON_ERROR_STOP the session continues after an error, also inside a transaction.
        script = ("SELECT * FROM no_such_table;\nSELECT 'after error';\nBEGIN;\nSELECT 1/0;\nSELECT 1;\n"
                  "ROLLBACK;\nSELECT 'recovered';\n")
        code, out, err = psql(env, relay, script, stop_on_error=False, verbose=True)
        expect("ERROR:  42P01: relation \"no_such_table\" does not exist" in err, "42P01 for a missing table", got=err)
        expect("ERROR:  25P02: current transaction is aborted" in err, "25P02 inside an aborted transaction", got=err)
        expect_eq(out.splitlines(), ["after error", "recovered"], "the session is usable after errors")

    def virtual_settings():
        out = run_ok(env, relay, None, args=["-c", "SHOW wal_level", "-c", "SELECT current_setting('wal_level')"])
        expect_eq(out.splitlines(), ["logical", "logical"], "wal_level through pgrelay (virtual catalog)")
        expect_eq(env.direct_query("SHOW wal_level")[0][0], "replica", "the upstream's own wal_level")
        # The upstream warns that wal_level is insufficient for a publication; through pgrelay
        # publications work, so that warning is dropped (other warnings still show).
        code, out, err = psql(env, relay, "CREATE TABLE t_pub_warn (id int PRIMARY KEY);\n"
                              "CREATE PUBLICATION pub_warn FOR TABLE t_pub_warn;\n"
                              "DO $$BEGIN RAISE WARNING 'a warning of our own'; END$$;\n")
        expect(code == 0 and "wal_level" not in err and "a warning of our own" in err,
               "no false wal_level warning on CREATE PUBLICATION through pgrelay", got=(code, err))

    def shutdown_mid_query():
        # SIGTERM while a query runs: its result still arrives; then the session ends with the
        # FATAL a Postgres backend sends at shutdown, and pgrelay exits.
        cmd = [os.path.join(PG_BIN, "psql"), "-X", "-A", "-t", "-q", "-d", relay.url]
        running = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=env.base)
        running.stdin.write("SELECT pg_sleep(1.5), 'finished';\n")
        running.stdin.flush()
        time.sleep(0.6)
        relay.stop(signal.SIGTERM, timeout=10)
        out, err = running.communicate(input="SELECT 'after shutdown';\n", timeout=30)
        expect(out.strip() == "|finished", "the query in flight at SIGTERM completes", got=(out, err))
        expect("terminating connection due to administrator command" in err,
               "then the session ends with FATAL 57P01", got=err)

    def kept_backends():
        # `pgrelay serve --pool-idle-timeout`: one psql after another gets the same upstream
        # backend, reset; SIGTERM ends the one kept.
        kept = env.start_relay(data_dir=os.path.join(env.base, "relay-kept"),
                               extra_args=("--pool-idle-timeout", "60"))
        first = run_ok(env, kept, None, args=["-c", "SET search_path TO pg_catalog",
                                              "-c", "SELECT pg_backend_pid()"]).strip()
        # The first psql's backend is kept once it is idle after the reset.
        wait_until(lambda: env.direct_query(
            "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (int(first),)) ==
            [("idle", "DISCARD ALL")], 10, "the first session's backend kept")
        second = run_ok(env, kept, None, args=["-c", "SELECT pg_backend_pid()",
                                               "-c", "SHOW search_path"]).split()
        expect_eq(second[0], first, "the second session's backend")
        expect_eq(" ".join(second[1:]), '"$user", public', "its search_path, reset")
        expect_eq(env.direct_query("SELECT ssl FROM pg_stat_ssl WHERE pid = %s", (int(first),)),
                  [(True,)], "the kept backend's connection uses TLS")
        kept.stop(signal.SIGTERM, timeout=15)
        wait_until(lambda: env.direct_query(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (int(first),))[0][0] == 0,
            10, "the kept backend to end with pgrelay")

    env.check("psql simple protocol", simple)
    env.check("psql sees wal_level=logical (upstream has replica)", virtual_settings)
    env.check("psql extended protocol (\\gdesc) and fastpath (\\lo_*)", extended)
    env.check("psql multi-statement transaction", transaction)
    env.check("psql \\copy in and out (csv and binary)", copy)
    env.check("psql errors with SQLSTATE", errors)
    env.check("psql sessions one after another share a kept backend (--pool-idle-timeout)",
              kept_backends)
    env.check("SIGTERM lets the query in flight finish", shutdown_mid_query)  # stops pgrelay: last


if __name__ == "__main__":
    main("psql", body)
