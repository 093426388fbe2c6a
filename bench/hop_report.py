#!/usr/bin/env python3
# Per-hop latency of each transaction through pgrelay: `serve --hop-trace` joined with the consumer's --receipts.
"""Usage: hop_report.py TRACE RECEIPTS [--skip-seconds S]
       hop_report.py --sender-only RECEIPTS [--skip-seconds S]

TRACE is what `pgrelay serve --hop-trace FILE` wrote at shutdown ("hop LSN unix_us session"
lines, each saying every transaction ending at or before LSN had passed the hop by then);
RECEIPTS is bench_repl_consumer --receipts ("END_LSN FIRST_TS_US RECEIPT_US SENT_US COMMIT_US").
For each received transaction the time of each hop is the earliest stamp of that hop at or past
its end LSN. Prints, per hop, the time since the transaction's row was written (its ts_us, taken
in the INSERT), since its commit, and the step from the hop before it on the path, as p50 / p99
/ max in ms. The first hop, `commit`, is the commit time the Commit message carries: the
upstream's own, once the upstream has track_commit_timestamp on (under trigger capture pgrelay
reads it with pg_xact_commit_timestamp; without it, pgrelay sends its poll's time). Its step
from the row is the writer's own transaction after the INSERT (under trigger capture, the
capture trigger runs in it); the steps after it are replication.
`durable` is off the readers' path under native capture (entries are shown before their
fdatasync) and on it under trigger capture (shown after): its step is from capture receipt.
The first --skip-seconds (default 1) of receipts are left out (connection warm-up).

--sender-only reads no trace: it splits a consumer's latency at the send time its server put on
each Commit's XLogData (`sender_send`), which for native PostgreSQL is the walsender's, the same
clock as pgrelay's `upstream_send` hop, so the two runs' upstream walsenders can be compared.
"""
import bisect
import sys

PATH = ["commit", "upstream_send", "capture_receipt", "append_visible", "walsender_read", "socket_write", "consumer"]


def lsn(text):
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def read_trace(path):
    hops = {}
    dropped = 0
    with open(path) as f:
        for line in f:
            if line.startswith("# dropped"):
                dropped = int(line.split()[2])
                continue
            hop, through, t, _session = line.split()
            hops.setdefault(hop, []).append((lsn(through), int(t)))
    index = {}
    for hop, stamps in hops.items():
        stamps.sort()
        # Earliest time among the stamps at or past each position: suffix minimum.
        suffix = [0] * len(stamps)
        best = None
        for i in range(len(stamps) - 1, -1, -1):
            best = stamps[i][1] if best is None else min(best, stamps[i][1])
            suffix[i] = best
        index[hop] = ([s[0] for s in stamps], suffix)
    return index, dropped


def first_at_or_past(index, hop, end):
    if hop not in index:
        return None
    keys, suffix = index[hop]
    i = bisect.bisect_left(keys, end)
    return suffix[i] if i < len(keys) else None


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100.0 * len(values)))] / 1000.0


def main():
    args = sys.argv[1:]
    skip = 1.0
    if "--skip-seconds" in args:
        i = args.index("--skip-seconds")
        skip = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    sender_only = args[0] == "--sender-only"
    if sender_only:
        index, dropped, path, extra = {}, 0, ["commit", "sender_send", "consumer"], []
    else:
        index, dropped = read_trace(args[0])
        path, extra = PATH, ["durable"]
    receipts = []
    with open(args[1]) as f:
        for line in f:
            end, first_ts, received, sent, committed = line.split()
            receipts.append((lsn(end), int(first_ts), int(received), int(sent), int(committed)))
    if not receipts:
        sys.exit("hop_report: no receipts in %s" % args[1])
    start = receipts[0][2] + skip * 1e6
    since = {h: [] for h in path + extra}
    since_commit = {h: [] for h in path + extra}
    step = {h: [] for h in path + extra}
    missing = {}
    used = 0
    for end, origin, received, sent, committed in receipts:
        if received < start:
            continue
        if sender_only:
            times = {"sender_send": sent}
        else:
            times = {h: first_at_or_past(index, h, end) for h in path[1:-1] + extra}
        times["commit"] = committed
        times["consumer"] = received
        lost = [h for h, t in times.items() if t is None]
        if lost:
            for h in lost:
                missing[h] = missing.get(h, 0) + 1
            continue
        used += 1
        prev = origin
        for h in path:
            since[h].append(times[h] - origin)
            since_commit[h].append(times[h] - committed)
            step[h].append(times[h] - prev)
            prev = times[h]
        if extra:
            since["durable"].append(times["durable"] - origin)
            since_commit["durable"].append(times["durable"] - committed)
            step["durable"].append(times["durable"] - times["capture_receipt"])
    print("hops of %d transactions (%d left out as warm-up or without every stamp: %s; %d stamps dropped)"
          % (used, len(receipts) - used, missing or "none", dropped))
    columns = [("since the row was written", since), ("since the commit", since_commit),
               ("step from the hop before", step)]
    print("%-16s" % "" + "".join("   %27s" % title for title, _ in columns))
    print("%-16s" % "hop (ms)" + "   %8s %8s %9s" % ("p50", "p99", "max") * len(columns))
    for h in path + extra:
        print("%-16s" % h + "".join("   %8.2f %8.2f %9.2f" % (
            pct(values[h], 50), pct(values[h], 99), pct(values[h], 100)) for _, values in columns))
    if used == 0:
        sys.exit("hop_report: no transaction had every stamp")


if __name__ == "__main__":
    main()
