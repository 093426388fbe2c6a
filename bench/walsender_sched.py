#!/usr/bin/env python3
# Samples the scheduler statistics of a PostgreSQL's walsender processes while a run writes.
"""Usage: walsender_sched.py POSTMASTER_PID OUTFILE

Until SIGTERM, reads /proc/PID/schedstat ("ns on a CPU, ns runnable waiting for one") of every
walsender child of POSTMASTER_PID every 50 ms, so that a walsender that exits before the run ends
(native's, when its consumer has everything) still counts up to its last sample. On SIGTERM it
writes "cpu_pct=N wait_pct=N" to OUTFILE: the walsenders' time on a CPU and waiting for one, as
shares of the sampled time ("-" for both where the kernel does not list the postmaster's
children). Whether a late upstream send was the walsender working or the walsender waiting for
a CPU is what these two tell.
"""
import os
import signal
import sys
import time


def children_of(postmaster):
    """The postmaster's child pids, or None where the kernel does not list them
    (CONFIG_PROC_CHILDREN) or the postmaster is gone."""
    try:
        with open(f"/proc/{postmaster}/task/{postmaster}/children") as f:
            return f.read().split()
    except OSError:
        return None


def walsenders(children):
    for pid in children:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"postgres: walsender"):
                    continue
            with open(f"/proc/{pid}/schedstat") as f:
                run_ns, wait_ns = map(int, f.read().split()[:2])
            yield int(pid), run_ns, wait_ns
        except (OSError, ValueError):
            continue  # it exited meanwhile


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    postmaster, out = int(sys.argv[1]), sys.argv[2]
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    first, last = {}, {}
    start = time.monotonic_ns()
    listed = False
    while not stopping:
        children = children_of(postmaster)
        if children is not None:
            listed = True
            for pid, run_ns, wait_ns in walsenders(children):
                first.setdefault(pid, (run_ns, wait_ns))
                last[pid] = (run_ns, wait_ns)
        time.sleep(0.05)
    elapsed = time.monotonic_ns() - start
    run = sum(last[p][0] - first[p][0] for p in last)
    wait = sum(last[p][1] - first[p][1] for p in last)
    with open(out, "w") as f:
        if listed:
            f.write("cpu_pct=%.0f wait_pct=%.0f\n" % (100 * run / elapsed, 100 * wait / elapsed))
        else:  # nothing could be read: unknown, not 0
            f.write("cpu_pct=- wait_pct=-\n")


if __name__ == "__main__":
    main()
