# pgbench through `pgrelay serve` versus direct: same deterministic workload, same final state.
import os
import re
import subprocess
import time

from e2e_support import PASSWORD, PG_BIN, expect, expect_eq, main

SEED = "4242"

# What the default (tpcb-like) script leaves behind, independent of the order in which the
# clients' transactions interleaved: every update adds a delta, history rows are a multiset.
FINGERPRINT = """
SELECT (SELECT sum(abalance) FROM pgbench_accounts),
       (SELECT count(*) FROM pgbench_accounts WHERE abalance <> 0),
       (SELECT md5(string_agg(aid || ':' || abalance, ',' ORDER BY aid)) FROM pgbench_accounts WHERE abalance <> 0),
       (SELECT sum(bbalance) FROM pgbench_branches),
       (SELECT md5(string_agg(tid || ':' || tbalance, ',' ORDER BY tid)) FROM pgbench_tellers),
       (SELECT count(*) FROM pgbench_history),
       (SELECT md5(string_agg(tid || ',' || bid || ',' || aid || ',' || delta, ';' ORDER BY tid, bid, aid, delta))
          FROM pgbench_history)
"""


def pgbench(env, url, args, timeout=120):
    cmd = [os.path.join(PG_BIN, "pgbench")] + list(args) + [url]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, PGPASSWORD=PASSWORD, PGSSLMODE="prefer"))
    took = time.monotonic() - start
    expect(r.returncode == 0, "pgbench %s exited %d\n      stdout: %s\n      stderr: %s" % (
        " ".join(args), r.returncode, r.stdout[-2000:], r.stderr[-2000:]))
    return r.stdout + r.stderr, took


def run_stats(output, expected_tx):
    processed = re.search(r"number of transactions actually processed: (\d+)/(\d+)", output)
    failed = re.search(r"number of failed transactions: (\d+)", output)
    tps = re.search(r"tps = ([\d.]+)", output)
    expect(processed is not None, "pgbench printed its processed count", got=output[-1500:])
    expect_eq((int(processed.group(1)), int(processed.group(2))), (expected_tx, expected_tx),
              "transactions actually processed")
    expect(failed is not None, "pgbench (15) printed its failed transaction count", got=output[-1500:])
    expect_eq(int(failed.group(1)), 0, "failed transactions")
    return float(tps.group(1)) if tps else 0.0


def body(env):
    env.start_postgres()
    relay = env.start_relay()
    direct_url = env.upstream_url()
    state = {}

    def direct_reference():
        pgbench(env, direct_url, ["-i", "-s", "1", "-q"])
        out, _ = pgbench(env, direct_url, ["-t", "100", "-c", "4", "-j", "1", "--random-seed", SEED])
        run_stats(out, 400)
        state["direct"] = env.direct_query(FINGERPRINT)[0]
        expect(state["direct"][0] != 0 and state["direct"][5] == 400,
               "the direct run changed balances and wrote 400 history rows", got=state["direct"])

    def relayed_init():
        out, took = pgbench(env, relay.url, ["-i", "-s", "1", "-q"])
        counts = env.direct_query("SELECT (SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_branches),"
                                  " (SELECT count(*) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history),"
                                  " (SELECT sum(abalance) FROM pgbench_accounts)")[0]
        expect_eq(tuple(counts), (100000, 1, 10, 0, 0), "tables initialised through pgrelay (COPY, DDL, VACUUM), read directly")
        print("    pgbench -i -s 1 through pgrelay: %.1fs" % took)

    def relayed_default():
        expect("direct" in state, "the direct reference run succeeded first")
        out, took = pgbench(env, relay.url, ["-t", "100", "-c", "4", "-j", "1", "--random-seed", SEED])
        run_stats(out, 400)
        got = env.direct_query(FINGERPRINT)[0]
        expect_eq(got, state["direct"], "final table state after the default script, relayed vs direct (same seed)")

    def select_only():
        tps = {}
        for mode in ("simple", "extended", "prepared"):
            out, _ = pgbench(env, relay.url, ["-n", "-S", "-t", "200", "-c", "4", "-j", "1", "-M", mode])
            tps["relay " + mode] = run_stats(out, 800)
        out, _ = pgbench(env, direct_url, ["-n", "-S", "-t", "200", "-c", "4", "-j", "1", "-M", "prepared"])
        tps["direct prepared"] = run_stats(out, 800)
        print("    select-only tps (ASan build, not a benchmark): " +
              ", ".join("%s %.0f" % kv for kv in tps.items()))
        # The read-only run must leave the state of the default run untouched.
        expect_eq(env.direct_query(FINGERPRINT)[0], state.get("direct"), "state unchanged by -S runs")

    env.check("pgbench default script direct (reference)", direct_reference)
    env.check("pgbench -i through pgrelay", relayed_init)
    env.check("pgbench default script through pgrelay = direct", relayed_default)
    env.check("pgbench -S through pgrelay (-M simple/extended/prepared)", select_only)


if __name__ == "__main__":
    main("pgbench", body)
