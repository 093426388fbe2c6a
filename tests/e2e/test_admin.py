# End-to-end test of the operator commands: pgrelay status, pgrelay slots, pgrelay capture.
import json
import os
import signal
import subprocess
import time

from e2e_support import PASSWORD, PG_BIN, expect, expect_eq, lsn_to_int, main, wait_until
from pgoutput_decode import decode_recvlogical, session_of

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, name text, qty int);
CREATE TABLE other (id int PRIMARY KEY, note text);
CREATE PUBLICATION pub_admin FOR TABLE items, other;
"""

TRANSACTIONS = 20
ROWS_PER_TRANSACTION = 3


def pgrelay(env, *args, timeout=120):
    return subprocess.run([env.pgrelay] + list(args), capture_output=True, text=True, timeout=timeout)


def json_of(r, what):
    try:
        return json.loads(r.stdout)
    except ValueError:
        raise AssertionError("%s did not print JSON (exit %d):\n%s\n%s" % (what, r.returncode, r.stdout, r.stderr))


def by_name(slots):
    return {s["slot_name"]: s for s in slots}


def body(env):
    env.start_postgres()
    env.psql_admin(SCHEMA)
    data_dir = os.path.join(env.base, "relay-data")
    relay = env.start_relay(data_dir=data_dir)
    upstream = env.upstream_url()
    state = {}

    def recvlogical(slot, *args):
        return [os.path.join(PG_BIN, "pg_recvlogical"), "-d", relay.url, "--slot", slot] + list(args)

    def slot_rows(r):
        return {row[0]: row[1:] for row in env.relay_query(
            r, "SELECT slot_name, active, active_pid, confirmed_flush_lsn::text FROM pg_replication_slots")}

    def setup():
        r = subprocess.run(recvlogical("slot_a", "--create-slot", "-P", "pgoutput"), capture_output=True,
                           text=True, timeout=60)
        expect(r.returncode == 0, "pg_recvlogical --create-slot: " + r.stderr)
        for name in ("slot_b", "slot_c", "slot_d"):
            env.relay_query(relay, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        wait_until(lambda: set(slot_rows(relay)) == {"slot_a", "slot_b", "slot_c", "slot_d"}, 10,
                   "four slots in pg_replication_slots")
        conn = env.direct(autocommit=False)
        with conn.cursor() as cur:
            for t in range(TRANSACTIONS):
                for i in range(ROWS_PER_TRANSACTION):
                    n = t * ROWS_PER_TRANSACTION + i
                    cur.execute("INSERT INTO items VALUES (%s, %s, %s)", (n, "row %d" % n, n))
                conn.commit()
        conn.close()
        # slot_a's consumer reads everything and stays connected; slot_b lags behind.
        out = os.path.join(env.base, "slot_a.bin")
        err = open(out + ".stderr", "wb")
        state["consumer"] = env.spawn(recvlogical("slot_a", "--start", "-o", "proto_version=1", "-o",
                                                  "publication_names=pub_admin", "-f", out, "-F", "1", "-s", "1",
                                                  "--no-loop"), stdout=subprocess.DEVNULL, stderr=err)

        def commits():
            try:
                with open(out, "rb") as f:
                    messages = decode_recvlogical(f.read(), allow_partial=True)
            except FileNotFoundError:
                return None
            session = session_of(messages)
            return session.transactions[-1]["end_lsn"] if len(session.transactions) == TRANSACTIONS else None
        last_end = wait_until(commits, 60, "%d transactions from pg_recvlogical" % TRANSACTIONS)
        wait_until(lambda: lsn_to_int(slot_rows(relay)["slot_a"][2]) >= last_end, 15,
                   "slot_a's confirmed_flush_lsn to reach the last commit")
        time.sleep(1.5)  # slot_b's oldest unconfirmed transaction is now over a second old
        pid = wait_until(lambda: env.relay_query(relay, "SELECT pid FROM pg_stat_replication"), 10,
                         "pg_recvlogical in pg_stat_replication")
        state["walsender_pid"] = pid[0][0]
        state["last_end"] = last_end
        state["ready"] = True

    def status_running_json():
        expect(state.get("ready"), "setup finished")
        r = pgrelay(env, "status", "-D", data_dir, "--json")
        expect_eq(r.returncode, 0, "status exit code while running (stderr: %s)" % r.stderr)
        j = json_of(r, "status --json")
        expect_eq(j["server"]["running"], True, "server.running")
        expect_eq(j["server"]["pid"], relay.proc.pid, "server.pid is the serve process")
        expect(PASSWORD not in r.stdout and ":****@" in j["server"]["url"], "the URL's password is masked",
               got=j["server"]["url"])
        expect_eq(j["server"]["url"], relay.url.replace(":" + relay.url.split(":")[2].split("@")[0] + "@", ":****@"),
                  "the masked URL is the ready URL")
        head = lsn_to_int(j["log"]["head_lsn"])
        expect(head >= state["last_end"], "log head at or past the last streamed commit", got=j["log"]["head_lsn"])
        expect(j["log"]["bytes"] > 0 and j["log"]["segments"] >= 1, "log size", got=j["log"])
        slots = by_name(j["slots"])
        expect_eq(sorted(slots), ["slot_a", "slot_b", "slot_c", "slot_d"], "slots in status")
        a, b = slots["slot_a"], slots["slot_b"]
        expect_eq((a["active"], a["active_pid"]), (True, state["walsender_pid"]), "slot_a active, its walsender pid")
        expect_eq((b["active"], b["active_pid"]), (False, None), "slot_b inactive")
        expect_eq(a["lag_seconds"], 0.0, "slot_a (caught up) lags 0 s")
        expect(b["lag_seconds"] is not None and b["lag_seconds"] >= 1.0, "slot_b lags over a second", got=b)
        expect(b["lag_bytes"] > a["lag_bytes"], "slot_b lags more bytes than slot_a", got=(b["lag_bytes"], a["lag_bytes"]))
        expect_eq(b["lag_bytes"], head - lsn_to_int(b["confirmed_flush_lsn"]), "slot_b lag_bytes = head - confirmed_flush")
        expect(lsn_to_int(a["confirmed_flush_lsn"]) >= state["last_end"], "slot_a's confirmed_flush_lsn", got=a)
        consumers = j["consumers"]
        expect_eq([(c["pid"], c["application_name"], c["state"], c["slot_name"]) for c in consumers],
                  [(state["walsender_pid"], "pg_recvlogical", "streaming", "slot_a")], "consumers")
        rate = j["capture_rate"]
        expect_eq((rate["transactions"], rate["changes"]), (TRANSACTIONS, TRANSACTIONS * ROWS_PER_TRANSACTION),
                  "transactions and row changes committed in the last minute")
        expect(abs(rate["transactions_per_second"] - TRANSACTIONS / 60.0) < 1e-9 and rate["changes_per_second"] > 0,
               "capture rate per second", got=rate)
        # As in Postgres, pg_stat_replication.flush_lsn is the consumer's last reported flush position.
        expect(lsn_to_int(consumers[0]["flush_lsn"]) >= state["last_end"],
               "pg_stat_replication.flush_lsn has the consumer's confirmed position", got=consumers)

    def status_running_text():
        expect(state.get("ready"), "setup finished")
        r = pgrelay(env, "status", "-D", data_dir)
        expect_eq(r.returncode, 0, "status exit code (stderr: %s)" % r.stderr)
        out = r.stdout
        expect("running (pid %d)" % relay.proc.pid in out, "status names the running pid", got=out)
        expect(PASSWORD not in out, "no password in the output", got=out)
        expect("capture rate:" in out and "%.2f transactions/s" % (TRANSACTIONS / 60.0) in out,
               "the capture rate line", got=out)
        lines = [l for l in out.splitlines() if "pg_recvlogical" in l]
        expect(len(lines) == 1 and "slot_a" in lines[0] and str(state["walsender_pid"]) in lines[0],
               "the consumer line", got=out)

    def slots_list_running():
        expect(state.get("ready"), "setup finished")
        r = pgrelay(env, "slots", "list", "-D", data_dir)
        expect_eq(r.returncode, 0, "slots list exit code (stderr: %s)" % r.stderr)
        lines = r.stdout.splitlines()
        expect(lines[0].split("|")[0].strip() == "slot_name" and lines[-1] == "(4 rows)", "a psql-like table", got=r.stdout)
        row_a = [l for l in lines if l.startswith(" slot_a ")]
        expect(len(row_a) == 1 and [c.strip() for c in row_a[0].split("|")][3:5] == ["t", str(state["walsender_pid"])],
               "slot_a active with its pid", got=r.stdout)
        j = json_of(pgrelay(env, "slots", "--json", "-D", data_dir), "slots --json")
        slots = by_name(j["slots"])
        expect_eq((j["server_running"], j["source"]), (True, "server"), "slots read through the server")
        expect_eq(sorted(slots), ["slot_a", "slot_b", "slot_c", "slot_d"], "slots --json names")
        expect(slots["slot_b"]["lag_bytes"] > slots["slot_a"]["lag_bytes"], "lag_bytes differ", got=j)
        expect_eq([slots[n]["plugin"] for n in sorted(slots)], ["pgoutput"] * 4, "plugin")

    def slots_drop_running():
        expect(state.get("ready"), "setup finished")
        r = pgrelay(env, "slots", "drop", "slot_c", "-D", data_dir)
        expect_eq(r.returncode, 0, "slots drop slot_c exit code (stderr: %s)" % r.stderr)
        expect_eq(r.stdout.strip(), 'replication slot "slot_c" dropped', "slots drop output")
        expect("slot_c" not in slot_rows(relay), "slot_c gone from pg_replication_slots through pgrelay")
        r = pgrelay(env, "slots", "drop", "no_such", "-D", data_dir)
        expect(r.returncode != 0 and '42704: replication slot "no_such" does not exist' in r.stderr,
               "dropping a missing slot fails with 42704", got=(r.returncode, r.stderr))
        r = pgrelay(env, "slots", "drop", "slot_a", "-D", data_dir)
        expect(r.returncode != 0 and '55006: replication slot "slot_a" is active for PID %d' % state["walsender_pid"]
               in r.stderr and "HINT:" in r.stderr, "dropping the active slot fails with 55006 and a hint",
               got=(r.returncode, r.stderr))
        expect("slot_a" in slot_rows(relay), "slot_a is still there")
        state["dropped_online"] = True

    def capture_uninstall_refused_while_running():
        r = pgrelay(env, "capture", "uninstall", "--upstream", upstream, "-D", data_dir)
        expect(r.returncode != 0 and "55006" in r.stderr and "pgrelay serve (pid %d)" % relay.proc.pid in r.stderr
               and "HINT:" in r.stderr, "uninstall refused while the server runs", got=(r.returncode, r.stderr))
        expect_eq(env.direct_query("SELECT count(*) FROM pg_namespace WHERE nspname = '_pgrelay'")[0][0], 1,
                  "schema _pgrelay still there")

    def stop_server():
        expect(state.get("ready"), "setup finished")
        state["consumer"].send_signal(signal.SIGINT)
        state["consumer"].wait(15)
        # Once pg_replication_slots shows slot_a released, it shows its final position.
        row = wait_until(lambda: slot_rows(relay)["slot_a"][0] is False and slot_rows(relay)["slot_a"], 10,
                         "slot_a to be released")
        confirmed = row[2]
        code, _ = relay.stop()
        expect_eq(code, 0, "pgrelay serve exit code after SIGTERM")
        state["confirmed_a"] = confirmed
        state["stopped"] = True

    def status_stopped():
        expect(state.get("stopped"), "the server stopped")
        r = pgrelay(env, "status", "-D", data_dir)
        expect_eq(r.returncode, 3, "status exit code when not running (pg_ctl's 3)")
        expect("server:        not running" in r.stdout, "status says not running", got=r.stdout)
        r = pgrelay(env, "status", "-D", data_dir, "--json")
        expect_eq(r.returncode, 3, "status --json exit code when not running")
        j = json_of(r, "status --json")
        expect_eq((j["server"]["running"], j["consumers"], j["slots_source"]), (False, [], "data directory"),
                  "not running: no consumers, slots from the data directory")
        slots = by_name(j["slots"])
        expect_eq(sorted(slots), ["slot_a", "slot_b", "slot_d"], "the online drop of slot_c reached the registry")
        expect(lsn_to_int(slots["slot_a"]["confirmed_flush_lsn"]) >= lsn_to_int(state["confirmed_a"]),
               "slot_a's position was persisted", got=(slots["slot_a"], state["confirmed_a"]))
        expect_eq([s["active"] for s in j["slots"]], [False] * len(j["slots"]), "no slot active offline")
        r = pgrelay(env, "status", "-D", os.path.join(env.base, "nowhere"))
        expect_eq(r.returncode, 4, "status of a missing data directory exits 4")

    def slots_offline():
        expect(state.get("stopped"), "the server stopped")
        r = pgrelay(env, "slots", "-D", data_dir)
        expect_eq(r.returncode, 0, "slots (list) offline exit code (stderr: %s)" % r.stderr)
        names = [l.split("|")[0].strip() for l in r.stdout.splitlines()[2:-1]]
        expect_eq(names, ["slot_a", "slot_b", "slot_d"], "slots listed offline")
        r = pgrelay(env, "slots", "drop", "slot_d", "-D", data_dir)
        expect_eq(r.returncode, 0, "offline drop exit code (stderr: %s)" % r.stderr)
        expect("dropped" in r.stdout and "not running" in r.stdout, "offline drop output", got=r.stdout)
        r = pgrelay(env, "slots", "drop", "slot_d", "-D", data_dir)
        expect(r.returncode != 0 and '42704: replication slot "slot_d" does not exist' in r.stderr,
               "dropping it again fails with 42704", got=(r.returncode, r.stderr))
        j = json_of(pgrelay(env, "slots", "list", "--json", "-D", data_dir), "slots list --json")
        expect_eq(sorted(by_name(j["slots"])), ["slot_a", "slot_b"], "slots after the offline drop")
        state["dropped_offline"] = True

    def restart_sees_drops():
        expect(state.get("dropped_offline"), "the offline drop ran")
        r2 = env.start_relay(data_dir=data_dir)
        state["relay2"] = r2
        try:
            rows = slot_rows(r2)
            j = json_of(pgrelay(env, "slots", "list", "--json", "-D", data_dir), "slots list --json")
        finally:
            code, _ = r2.stop()
        offline = json_of(pgrelay(env, "slots", "list", "--json", "-D", data_dir), "slots list --json")
        expect_eq(sorted(by_name(offline["slots"])), ["slot_a", "slot_b"], "the registry after the second run")
        expect_eq(sorted(rows), ["slot_a", "slot_b"], "pg_replication_slots through pgrelay after restart")
        expect_eq(sorted(by_name(j["slots"])), ["slot_a", "slot_b"], "slots list after restart")
        expect_eq(rows["slot_a"][2], state["confirmed_a"], "slot_a resumes where it was confirmed")
        expect_eq(code, 0, "second serve exit code")

    def capture_uninstall_install():
        relay2 = state.get("relay2")
        expect(relay2 is not None and relay2.proc.poll() is not None, "no server runs")

        def objects():
            return env.direct_query(
                "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = '_pgrelay'),"
                " (SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN ('items'::regclass, 'other'::regclass)),"
                " (SELECT count(*) FROM pg_event_trigger WHERE evtname = '_pgrelay_ddl'),"
                " (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '_pgrelay')")[0]
        before = objects()
        expect(before[0] == 1 and before[1] > 0 and before[2] == 1, "serve installed capture", got=before)
        r = pgrelay(env, "capture", "uninstall", "--upstream", upstream, "-D", data_dir)
        expect_eq(r.returncode, 0, "capture uninstall exit code (stderr: %s)" % r.stderr)
        expect('schema "_pgrelay": dropped' in r.stdout and "trigger capture: removed" in r.stdout
               and "virtual catalog: removed" in r.stdout, "uninstall report", got=r.stdout)
        expect(PASSWORD not in r.stdout + r.stderr, "no password in the output")
        expect_eq(objects(), (0, 0, 0, 0), "schema, triggers, event trigger and functions gone")
        r = pgrelay(env, "capture", "uninstall", "--upstream", upstream, "-D", data_dir)
        expect(r.returncode == 0 and "nothing to uninstall" in r.stdout, "uninstalling again is a no-op",
               got=(r.returncode, r.stdout, r.stderr))

        r = pgrelay(env, "capture", "install", "--upstream", upstream, "--publication", "pub_admin")
        expect_eq(r.returncode, 0, "capture install exit code (stderr: %s)" % r.stderr)
        lines = r.stdout.splitlines()
        expect(any(l.split("|")[:2] == [" public ", " items "] for l in lines)
               and any(l.split("|")[:2] == [" public ", " other "] for l in lines) and "(2 rows)" in lines,
               "the captured tables are listed", got=r.stdout)
        expect("DDL tracking:  event trigger" in r.stdout and "publication pub_admin" in r.stdout,
               "DDL tracking mode and sources", got=r.stdout)
        after = objects()
        expect(after[0] == 1 and after[1] == before[1] and after[2] == 1, "schema, triggers and event trigger back",
               got=(before, after))
        # Capture works without a server: a write lands in the change table.
        env.direct_query("INSERT INTO other VALUES (1, 'captured')")
        rows = env.direct_query("SELECT count(*) FROM _pgrelay.changes WHERE rel = 'other'::regclass")[0][0]
        expect_eq(rows, 1, "a captured row in _pgrelay.changes")

        # A foreign object in the schema pgrelay created: refused, then removed and uninstalled.
        env.direct_query("CREATE TABLE _pgrelay.mine (x int)")
        r = pgrelay(env, "capture", "uninstall", "--upstream", upstream, "-D", data_dir)
        expect(r.returncode != 0 and "2BP01" in r.stderr and "table _pgrelay.mine" in r.stderr,
               "uninstall refuses to drop a foreign table with the schema", got=(r.returncode, r.stderr))
        expect_eq(objects()[0], 1, "the schema is still there after the refusal")
        env.direct_query("DROP TABLE _pgrelay.mine")
        r = pgrelay(env, "capture", "uninstall", "--upstream", upstream, "-D", data_dir)
        expect_eq(r.returncode, 0, "uninstall after removing it (stderr: %s)" % r.stderr)
        expect_eq(objects(), (0, 0, 0, 0), "everything gone again")

    def help_texts():
        for args, words in ((["slots", "--help"], "pg_drop_replication_slot"), (["status", "--help"], "pg_ctl"),
                            (["capture", "install", "--help"], "--all-publications")):
            r = pgrelay(env, *args)
            expect(r.returncode == 0 and words in r.stdout, "%s mentions %s" % (" ".join(args), words), got=r.stdout)

    env.check("setup: slots, writes, a streaming consumer", setup)
    env.check("status --json while running", status_running_json)
    env.check("status (text) while running", status_running_text)
    env.check("slots list while running", slots_list_running)
    env.check("slots drop while running: inactive, missing, active", slots_drop_running)
    env.check("capture uninstall refused while serve runs", capture_uninstall_refused_while_running)
    env.check("stop the consumer and the server", stop_server)
    env.check("status when not running", status_stopped)
    env.check("slots list and drop offline", slots_offline)
    env.check("the next serve start sees both drops", restart_sees_drops)
    env.check("capture uninstall, then install, against the upstream", capture_uninstall_install)
    env.check("--help texts", help_texts)


if __name__ == "__main__":
    main("admin", body)
