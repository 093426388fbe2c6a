#!/usr/bin/env bash
# Databases benchmark: pgrelay capturing 1, 4 and 16 databases of one upstream, against native
# PostgreSQL slots in the same databases, and what each captured database costs while idle.
#
# Usage: bench/databases.sh   (build first: cmake --preset release &&
#          cmake --build build/release --target pgrelay -j2; run as root or as a user that can
#          run PostgreSQL 15's programs from /usr/lib/postgresql/15/bin; needs /usr/bin/python3
#          with psycopg2 (Debian's python3-psycopg2) and ss (iproute2))
#
# What a run does. Each measurement gets a throw-away PG15 upstream of its own (initdb, then
# wal_level=logical, fsync and synchronous_commit at their defaults) holding D databases
# db01..dbDD, each with the same table t (id bigserial, db int, ts timestamptz default
# clock_timestamp(), payload text) and publication bench_pub FOR TABLE t. Systems, in this order:
#   direct  native PostgreSQL: the consumers connect to the upstream itself, one slot per database;
#   trigger pgrelay serve --capture trigger against that upstream (triggers it installs);
#   native  pgrelay serve --capture native (a logical slot per captured database upstream).
# pgrelay runs with its defaults (--capture-database '*'), its upstream URL naming db01: db01 is
# captured from startup, every other database from the first CREATE_REPLICATION_SLOT in it.
#
#  1. Throughput, for D in DBS. One consumer stream per database (psycopg2 replication
#     connections, CONSUMER_PROCS python processes sharing the streams round-robin) creates a
#     persistent pgoutput slot in its database (CREATE_REPLICATION_SLOT: through pgrelay this
#     is what makes pgrelay capture the database) and starts streaming; then one pgbench per
#     database writes to the upstream, CLIENTS connections each, N one-row INSERT transactions
#     per database (or DURATION seconds each), every database at once. Each stream reads
#     until it has every row of its database and checks them: its own database's rows only
#     (the db column), each id once, no more rows than were written. Figures:
#       aggregate changes/s = all databases' rows / (last row received - first write), the
#         first write being min(ts) over the databases, the last receipt the consumers' clock;
#       write TPS = all rows / (last commit's ts - first write), lag = last receipt - last ts;
#       pgrelay CPU s per 1000 changes = pgrelay's utime+stime (/proc/PID/stat) from just
#         before the writes to the last row received, divided by the rows / 1000.
#  2. Idle cost, for D in IDLE_DBS (each also in DBS), pgrelay only: right after the
#     throughput run of D (slots kept, consumers disconnected, nothing written), after
#     IDLE_SETTLE s, pgrelay's CPU seconds over IDLE_SECONDS, given per minute; then the
#     upstream connections pgrelay holds, per database (pg_stat_activity rows whose client
#     port is one of the TCP connections pgrelay's pid has open to the upstream port, as ss
#     shows them: this does not depend on the application_name pgrelay sets; the table lists
#     the application_name/backend_type pairs found), and the upstream's slots per database
#     (pg_replication_slots).
# The results table goes to stdout (and OUT/summary.txt with OUT=DIR, which also keeps the
# logs); any failed step (pgrelay not ready, slot, pgbench, consumer error, wrong or missing
# rows, a stall of STALL_SECONDS) stops the run with its symptom and the logs' tails.
#
# Settings (environment), defaults chosen to finish in about 10 minutes on 2 cores:
#   DBS="1 4 16"  CAPTURES="trigger native"  N=20000 (transactions per database, for every D:
#     16 databases write 320000; on a 2-core machine writing ~10000 one-row transactions/s a
#     D=1 run takes ~2 s and a D=16 run ~30 s; the idle runs, native slots' included, take
#     6 x IDLE_SECONDS)
#   DURATION= (seconds of writes per database instead of N)  CLIENTS=2 (per database)
#   IDLE_SECONDS=60  IDLE_DBS="1 16"  IDLE_SETTLE=5  CONSUMER_PROCS=2  STALL_SECONDS=60
#   DIRECT=1 (0 skips the native-PostgreSQL baseline)  PGRELAY (binary)  OUT (results dir)
#   KEEP_WORK=1 (keep the temporary directory, with every log, instead of removing it)
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=${PGRELAY:-build/release/src/cli/pgrelay}
DBS=${DBS:-"1 4 16"}
CAPTURES=${CAPTURES-"trigger native"}
N=${N:-20000}
DURATION=${DURATION:-}
CLIENTS=${CLIENTS:-2}
IDLE_SECONDS=${IDLE_SECONDS:-60}
IDLE_DBS=${IDLE_DBS-"1 16"}
IDLE_SETTLE=${IDLE_SETTLE:-5}
CONSUMER_PROCS=${CONSUMER_PROCS:-2}
STALL_SECONDS=${STALL_SECONDS:-60}
DIRECT=${DIRECT:-1}
KEEP_WORK=${KEEP_WORK:-0}
OUT=${OUT:-}
BIN=/usr/lib/postgresql/15/bin
PY=/usr/bin/python3

fail_early() { echo "bench/databases.sh: $*" >&2; exit 1; }
[ -x "$PGRELAY" ] || fail_early "missing $PGRELAY: cmake --preset release && cmake --build build/release --target pgrelay -j2"
[ -x "$BIN/postgres" ] || fail_early "missing PostgreSQL 15 in $BIN"
"$PY" -c 'import psycopg2.extras' 2>/dev/null || fail_early "$PY has no psycopg2 (apt-get install python3-psycopg2)"
command -v ss >/dev/null || fail_early "missing ss (apt-get install iproute2)"
for d in $DBS $IDLE_DBS; do [[ $d =~ ^[1-9][0-9]?$ ]] || fail_early "DBS and IDLE_DBS take numbers 1..99, not '$d'"; done
for d in $IDLE_DBS; do [[ " $DBS " == *" $d "* ]] || fail_early "IDLE_DBS ($IDLE_DBS) must be among DBS ($DBS)"; done
for c in $CAPTURES; do [[ $c == trigger || $c == native ]] || fail_early "CAPTURES takes trigger and native, not '$c'"; done
[[ $N =~ ^[1-9][0-9]*$ && $CLIENTS =~ ^[1-9][0-9]*$ && $CONSUMER_PROCS =~ ^[1-9][0-9]*$ ]] ||
  fail_early "N, CLIENTS and CONSUMER_PROCS must be positive integers"
[ -z "$DURATION" ] || [[ $DURATION =~ ^[1-9][0-9]*$ ]] || fail_early "DURATION must be a positive number of seconds"

WORK=$(mktemp -d /tmp/pgrelay-db-bench-XXXXXX)
chmod 755 "$WORK"
# A private copy: a rebuild of build/release while the benchmark runs must not change it midway.
cp "$(realpath "$PGRELAY")" "$WORK/pgrelay"
PGRELAY_SRC=$(realpath "$PGRELAY")
PGRELAY=$WORK/pgrelay
UP_PORT=$((20000 + RANDOM % 10000))
RELAY_PORT=$((UP_PORT + 1))
AS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$WORK"
  AS=(runuser -u postgres --)
fi
export PGPASSWORD=bench PGCONNECT_TIMEOUT=10
CLK_TCK=$(getconf CLK_TCK)

RELAY_PID=""
CLUSTER=""      # data directory of the running upstream
RUN=""          # the measurement running now, e.g. trigger.d4
BG_PIDS=()      # pgbench and consumer processes of the measurement running now
FAILED=0
T_START=$(date +%s)
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
# Prints the log lines at WARNING or worse kept per run in the associative array named $2.
print_odd() {
  local -n lines=$2
  local k shown=0
  for k in "${!lines[@]}"; do
    [ -n "${lines[$k]}" ] || continue
    [ "$shown" = 1 ] || { echo; echo "$1 log lines at WARNING or worse (first 5 per run):"; shown=1; }
    echo "  $k:"; sed 's/^/    /' <<<"${lines[$k]}"
  done
}

stop_relay() {
  [ -n "$RELAY_PID" ] || return 0
  if kill -0 "$RELAY_PID" 2>/dev/null; then
    kill "$RELAY_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$RELAY_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$RELAY_PID" 2>/dev/null; then
      log "pgrelay (pid $RELAY_PID) ignored SIGTERM for 10 s: SIGKILL"
      kill -9 "$RELAY_PID" 2>/dev/null || true
    fi
  fi
  wait "$RELAY_PID" 2>/dev/null || true
  RELAY_PID=""
}
stop_bg() {
  local p
  for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${BG_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  BG_PIDS=()
}
stop_cluster() {
  [ -n "$CLUSTER" ] || return 0
  "${AS[@]}" "$BIN/pg_ctl" -D "$CLUSTER" -m immediate stop >/dev/null 2>&1 || true
  CLUSTER=""
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_bg
  stop_relay
  stop_cluster
  if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    cp "$WORK"/*.err "$WORK"/*.out "$WORK"/*.log "$OUT"/ 2>/dev/null || true
  fi
  if [ "$KEEP_WORK" = 1 ]; then
    log "logs kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  [ "$rc" = 0 ] || [ "$FAILED" = 1 ] || echo "bench/databases.sh: stopped (exit $rc)" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Fails the benchmark loudly with the symptom and the tails of the logs that explain it.
die() {
  FAILED=1
  echo >&2
  echo "BENCHMARK FAILED ($RUN): $*" >&2
  local f
  if [ -n "$RELAY_PID" ]; then
    kill -0 "$RELAY_PID" 2>/dev/null || echo "pgrelay (pid $RELAY_PID) is not running any more" >&2
    echo "--- pgrelay stderr (tail) ---" >&2
    tail -n 25 "$WORK/relay-$RUN.err" >&2 || true
  fi
  for f in "$WORK"/consumer-"$RUN"-*.err; do
    [ -s "$f" ] || continue
    echo "--- $(basename "$f") (tail) ---" >&2
    tail -n 10 "$f" >&2
  done
  if [ -e "$WORK/up-$RUN.log" ]; then
    echo "--- upstream postgres log (tail) ---" >&2
    tail -n 12 "$WORK/up-$RUN.log" >&2
  fi
  [ "$KEEP_WORK" = 1 ] || echo "(KEEP_WORK=1 keeps every log in the temporary directory)" >&2
  exit 1
}

now() { date +%s.%N; }
cpu_s() {  # pid: utime + stime in seconds
  [ -r "/proc/$1/stat" ] || die "process $1 is gone (reading its CPU time)"
  awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); split($0, f, " "); printf "%.2f", (f[12] + f[13]) / t }' "/proc/$1/stat"
}
upstream_cpu_s() {  # the upstream's CPU seconds: the postmaster, its live children and those it reaped
  local pm c
  pm=$(head -n 1 "$CLUSTER/postmaster.pid")
  [ -r "/proc/$pm/stat" ] || die "the upstream postmaster $pm is gone (reading its CPU time)"
  { sed 's/^/postmaster /' "/proc/$pm/stat"
    for c in $(pgrep -P "$pm"); do cat "/proc/$c/stat" 2>/dev/null || true; done
  } | awk -v t="$CLK_TCK" '{ pm = ($1 == "postmaster"); sub(/^.*\) /, ""); split($0, f, " ");
        s += f[12] + f[13]; if (pm) s += f[14] + f[15] } END { printf "%.2f", s / t }'
}
calc() { awk "BEGIN { $1 }"; }
dbname() { printf 'db%02d' "$1"; }
upq() {  # database sql...: one query against the upstream, unaligned, tuples only
  local db=$1; shift
  timeout 120 "$BIN/psql" "host=127.0.0.1 port=$UP_PORT user=postgres dbname=$db" -X -v ON_ERROR_STOP=1 -qAt "$@"
}

# The consumer: one process reads the streams of the databases it is given, in one select loop.
cat >"$WORK/consumer.py" <<'PYEOF'
import argparse, os, select, sys, time
import psycopg2, psycopg2.extras

ap = argparse.ArgumentParser()
ap.add_argument("--dsn", required=True, help="conninfo with {db} for the database name")
ap.add_argument("--db", action="append", required=True, help="NAME:INDEX, the db column's value")
ap.add_argument("--ready", required=True)
ap.add_argument("--expect-file", required=True, help="lines NAME COUNT, written once the writes end")
ap.add_argument("--stall", type=float, default=60)
ap.add_argument("--timeout", type=float, default=1200)
a = ap.parse_args()

def fail(msg):
    print("consumer: " + msg, file=sys.stderr, flush=True)
    sys.exit(3)

class Stream:
    pass

streams = []
for spec in a.db:
    s = Stream()
    s.name, idx = spec.rsplit(":", 1)
    s.tag = idx.encode()
    s.n = 0
    s.expect = None
    s.ids = set()
    s.slot = "bench_" + s.name
    try:
        s.conn = psycopg2.connect(a.dsn.format(db=s.name),
                                  connection_factory=psycopg2.extras.LogicalReplicationConnection)
        s.cur = s.conn.cursor()
        s.cur.create_replication_slot(s.slot, output_plugin="pgoutput")
        s.cur.start_replication(slot_name=s.slot, decode=False, status_interval=1,
                                options={"proto_version": "1", "publication_names": "bench_pub"})
    except psycopg2.Error as e:
        fail("%s: slot %s: %s" % (s.name, s.slot, str(e).strip()))
    streams.append(s)
open(a.ready, "w").close()

def values(p):  # Insert 'I' relid 'N' ncols, then id and db as text columns
    off, out = 8, []
    for _ in range(2):
        kind = p[off]; off += 1
        if kind != 116:  # 't'
            raise ValueError("column kind %r" % chr(kind))
        ln = int.from_bytes(p[off:off + 4], "big"); off += 4
        out.append(p[off:off + ln]); off += ln
    return out

first_rx = None
last_rx = 0.0
t_begin = time.time()
last_progress = t_begin
expect_read = False
by_fd = {s.cur.fileno(): s for s in streams}
while True:
    if not expect_read and os.path.exists(a.expect_file):
        want = dict(line.split() for line in open(a.expect_file) if line.strip())
        for s in streams:
            if s.name not in want:
                fail("%s: no row count in %s" % (s.name, a.expect_file))
            s.expect = int(want[s.name])
            if s.n > s.expect:
                fail("%s: %d rows received, %d written" % (s.name, s.n, s.expect))
        expect_read = True
    if expect_read and all(s.n >= s.expect for s in streams):
        break
    progressed = False
    for s in streams:
        while True:
            try:
                msg = s.cur.read_message()
            except psycopg2.Error as e:
                fail("%s: stream ended after %d rows: %s" % (s.name, s.n, str(e).strip()))
            if msg is None:
                break
            p = msg.payload
            if p[:1] == b"I":
                try:
                    rid, tag = values(p)
                except (ValueError, IndexError) as e:
                    fail("%s: undecodable insert (%s): %r" % (s.name, e, p[:60]))
                if tag != s.tag:
                    fail("%s: a row of database #%s in this database's stream" % (s.name, tag.decode()))
                if rid in s.ids:
                    fail("%s: row id %s received twice" % (s.name, rid.decode()))
                s.ids.add(rid)
                s.n += 1
                last_rx = time.time()
                if first_rx is None:
                    first_rx = last_rx
                if s.expect is not None and s.n > s.expect:
                    fail("%s: %d rows received, %d written" % (s.name, s.n, s.expect))
                progressed = True
            s.cur.send_feedback(flush_lsn=msg.data_start)
    t = time.time()
    if progressed:
        last_progress = t
    elif t - last_progress > a.stall:
        fail("stalled for %.0f s; rows per stream: %s" % (a.stall, ", ".join(
            "%s %d/%s" % (s.name, s.n, s.expect if s.expect is not None else "?") for s in streams)))
    if t - t_begin > a.timeout:
        fail("timed out after %.0f s" % a.timeout)
    if not progressed:
        select.select(list(by_fd), [], [], 0.1)
for s in streams:
    try:
        s.cur.send_feedback(flush_lsn=s.cur.wal_end, force=True)
    except psycopg2.Error:
        pass
    s.conn.close()
print("rows=%d first_rx=%.6f last_rx=%.6f" % (sum(s.n for s in streams), first_rx or 0, last_rx))
PYEOF

cat >"$WORK/insert.sql" <<'EOF'
INSERT INTO t (db, payload) VALUES (:dbidx, 'payload-0123456789-0123456789-0123456789-0123456789');
EOF

declare -A R        # results: R[system.dD.metric]
declare -A ODD      # pgrelay log lines at WARNING or worse, per run
declare -A UPODD    # the upstream's log lines at WARNING or worse, per run
PER_CLIENT=$(( (N + CLIENTS - 1) / CLIENTS ))
N_DB=$((PER_CLIENT * CLIENTS))   # transactions per database with -t

# A fresh upstream with D databases, each with table t and publication bench_pub.
start_cluster() {  # D
  local d=$1 i slots=$(( $1 + 16 ))
  CLUSTER=$WORK/up-$RUN
  "${AS[@]}" "$BIN/initdb" -D "$CLUSTER" -U postgres -A trust --no-sync >"$WORK/initdb-$RUN.log" 2>&1 ||
    die "initdb failed: $(tail -3 "$WORK/initdb-$RUN.log")"
  "${AS[@]}" "$BIN/pg_ctl" -D "$CLUSTER" -l "$WORK/up-$RUN.log" -w -t 60 -o "-p $UP_PORT -k $WORK \
    -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_replication_slots=$slots \
    -c max_wal_senders=$slots -c max_connections=$((100 + d * (CLIENTS + 8)))" start >/dev/null ||
    die "the upstream did not start"
  upq postgres -c "ALTER USER postgres PASSWORD 'bench'" >/dev/null || die "upstream: ALTER USER failed"
  for i in $(seq "$d"); do
    upq postgres -c "CREATE DATABASE $(dbname "$i")" >/dev/null || die "CREATE DATABASE $(dbname "$i") failed"
    upq "$(dbname "$i")" \
      -c "CREATE TABLE t (id bigserial PRIMARY KEY, db integer NOT NULL,
                          ts timestamptz NOT NULL DEFAULT clock_timestamp(), payload text NOT NULL)" \
      -c "CREATE PUBLICATION bench_pub FOR TABLE t" >/dev/null || die "schema in $(dbname "$i") failed"
  done
}

start_relay() {  # capture D
  local capture=$1 d=$2
  "$PGRELAY" serve --upstream "postgres://postgres:bench@127.0.0.1:$UP_PORT/db01?sslmode=disable" \
    --listen "127.0.0.1:$RELAY_PORT" --data-dir "$WORK/relay-$RUN" --no-tls --capture "$capture" \
    --max-replication-slots $((d + 8)) >"$WORK/relay-$RUN.out" 2>"$WORK/relay-$RUN.err" &
  RELAY_PID=$!
  for _ in $(seq 600); do
    grep -q "pgrelay ready" "$WORK/relay-$RUN.out" 2>/dev/null && break
    kill -0 "$RELAY_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "pgrelay ready" "$WORK/relay-$RUN.out" || die "pgrelay serve --capture $capture did not become ready in 60 s"
}

# pgrelay's TCP connections to the upstream: their local ports, one a line.
relay_ports() {
  ss -tnpH "( dport = :$UP_PORT )" 2>/dev/null | grep "pid=$RELAY_PID," | awk '{ n = split($4, a, ":"); print a[n] }'
}

# The throughput measurement of one system with D databases (the upstream already running).
throughput() {  # system D
  local sys=$1 d=$2 port=$UP_PORT procs i p dsn
  [ "$sys" = direct ] || port=$RELAY_PORT
  dsn="host=127.0.0.1 port=$port user=postgres password=bench dbname={db} sslmode=disable"
  procs=$(( d < CONSUMER_PROCS ? d : CONSUMER_PROCS ))
  rm -f "$WORK/expect-$RUN"
  local cpids=()
  for p in $(seq 0 $((procs - 1))); do
    local args=()
    for i in $(seq "$d"); do [ $(( (i - 1) % procs )) = "$p" ] && args+=(--db "$(dbname "$i"):$i"); done
    "$PY" -u "$WORK/consumer.py" --dsn "$dsn" "${args[@]}" --ready "$WORK/ready-$RUN-$p" \
      --expect-file "$WORK/expect-$RUN" --stall "$STALL_SECONDS" \
      >"$WORK/consumer-$RUN-$p.out" 2>"$WORK/consumer-$RUN-$p.err" &
    cpids+=($!)
    BG_PIDS+=($!)
  done
  local deadline=$(( $(date +%s) + 180 ))
  for p in $(seq 0 $((procs - 1))); do
    until [ -e "$WORK/ready-$RUN-$p" ]; do
      kill -0 "${cpids[$p]}" 2>/dev/null || { wait "${cpids[$p]}" || true; die "consumer $p could not create its slots or start streaming: $(tail -2 "$WORK/consumer-$RUN-$p.err")"; }
      [ "$(date +%s)" -lt "$deadline" ] || die "consumer $p not streaming after 180 s"
      sleep 0.05
    done
  done
  log "$RUN: $d slot(s) created, streams started; writing"
  local cpu0=""
  if [ -n "$RELAY_PID" ]; then cpu0=$(cpu_s "$RELAY_PID"); fi
  local wpids=() mode=(-t "$PER_CLIENT")
  [ -n "$DURATION" ] && mode=(-T "$DURATION")
  for i in $(seq "$d"); do
    timeout 1200 "$BIN/pgbench" -h 127.0.0.1 -p "$UP_PORT" -U postgres -n -M prepared -c "$CLIENTS" -j 1 \
      "${mode[@]}" -D dbidx="$i" -f "$WORK/insert.sql" "$(dbname "$i")" >"$WORK/pgbench-$RUN-$i.log" 2>&1 &
    wpids+=($!)
    BG_PIDS+=($!)
  done
  for i in $(seq "$d"); do
    wait "${wpids[$((i - 1))]}" || die "pgbench on $(dbname "$i") failed: $(tail -3 "$WORK/pgbench-$RUN-$i.log")"
  done
  local total=0 c f l line firsts=() lasts=()
  : >"$WORK/expect-$RUN.tmp"
  for i in $(seq "$d"); do
    line=$(upq "$(dbname "$i")" -F ' ' -c "SELECT count(*), extract(epoch FROM min(ts)), extract(epoch FROM max(ts)) FROM t") ||
      die "could not count $(dbname "$i")'s rows"
    read -r c f l <<<"$line"
    [ "${c:-0}" -gt 0 ] || die "$(dbname "$i") holds no rows after pgbench"
    [ -n "$DURATION" ] || [ "$c" = "$N_DB" ] || die "$(dbname "$i") holds $c rows, not $N_DB"
    echo "$(dbname "$i") $c" >>"$WORK/expect-$RUN.tmp"
    total=$((total + c))
    firsts+=("$f")
    lasts+=("$l")
  done
  local first lastw
  first=$(printf '%s\n' "${firsts[@]}" | sort -g | head -n 1)
  lastw=$(printf '%s\n' "${lasts[@]}" | sort -g | tail -n 1)
  mv "$WORK/expect-$RUN.tmp" "$WORK/expect-$RUN"
  log "$RUN: $total rows written; waiting for every stream to have them"
  for p in $(seq 0 $((procs - 1))); do
    wait "${cpids[$p]}" || die "consumer $p: $(tail -3 "$WORK/consumer-$RUN-$p.err")"
  done
  BG_PIDS=()
  local cpu1="" lastrx rows=0 kv rxs=()
  if [ -n "$RELAY_PID" ]; then
    kill -0 "$RELAY_PID" 2>/dev/null || die "pgrelay exited during the run"
    cpu1=$(cpu_s "$RELAY_PID")
  fi
  for p in $(seq 0 $((procs - 1))); do
    for kv in $(cat "$WORK/consumer-$RUN-$p.out"); do
      case $kv in
        rows=*) rows=$((rows + ${kv#rows=})) ;;
        last_rx=*) rxs+=("${kv#last_rx=}") ;;
      esac
    done
  done
  lastrx=$(printf '%s\n' "${rxs[@]}" | sort -g | tail -n 1)
  [ "$rows" = "$total" ] || die "the consumers report $rows rows, $total were written"
  local k=$sys.d$d
  R[$k.rows]=$total
  R[$k.changes_s]=$(calc "printf \"%.0f\", $total / ($lastrx - $first)")
  R[$k.write_tps]=$(calc "printf \"%.0f\", $total / ($lastw - $first)")
  R[$k.lag_s]=$(calc "printf \"%.3f\", $lastrx - $lastw")
  R[$k.elapsed_s]=$(calc "printf \"%.1f\", $lastrx - $first")
  if [ -n "$cpu0" ]; then
    R[$k.cpu_s]=$(calc "printf \"%.2f\", $cpu1 - $cpu0")
    R[$k.cpu_per_1k]=$(calc "printf \"%.3f\", ($cpu1 - $cpu0) / ($total / 1000)")
  fi
  log "$RUN: $total changes in ${R[$k.elapsed_s]} s: ${R[$k.changes_s]} changes/s (writes ${R[$k.write_tps]} tps," \
      "lag ${R[$k.lag_s]} s)${cpu0:+; pgrelay CPU ${R[$k.cpu_s]} s = ${R[$k.cpu_per_1k]} s per 1000 changes}"
}

# Idle cost with D databases after the writes: the upstream's CPU over IDLE_SECONDS (native
# slots: the baseline, the same writes having come before), and pgrelay's CPU, connections and
# slots.
idle() {  # system D
  local sys=$1 d=$2 k=$1.d$2 a b ua ub ports i
  sleep "$IDLE_SETTLE"
  if [ "$sys" = direct ]; then
    log "$RUN: idle for $IDLE_SECONDS s"
    ua=$(upstream_cpu_s); sleep "$IDLE_SECONDS"; ub=$(upstream_cpu_s)
    R[$k.idle_up_cpu_min]=$(calc "printf \"%.3f\", ($ub - $ua) * 60 / $IDLE_SECONDS")
    log "$RUN: idle: upstream CPU ${R[$k.idle_up_cpu_min]} s/min"
    return
  fi
  kill -0 "$RELAY_PID" 2>/dev/null || die "pgrelay exited before the idle measurement"
  log "$RUN: idle for $IDLE_SECONDS s"
  a=$(cpu_s "$RELAY_PID"); ua=$(upstream_cpu_s)
  sleep "$IDLE_SECONDS"
  b=$(cpu_s "$RELAY_PID"); ub=$(upstream_cpu_s)
  R[$k.idle_cpu_min]=$(calc "printf \"%.3f\", ($b - $a) * 60 / $IDLE_SECONDS")
  R[$k.idle_cpu_min_db]=$(calc "printf \"%.4f\", ($b - $a) * 60 / $IDLE_SECONDS / $d")
  R[$k.idle_up_cpu_min]=$(calc "printf \"%.3f\", ($ub - $ua) * 60 / $IDLE_SECONDS")
  ports=$(relay_ports | paste -sd, -)
  [ -n "$ports" ] || ports=0
  local activity
  activity=$(upq postgres -F '|' -c "SELECT coalesce(datname, '-'), count(*),
      string_agg(DISTINCT coalesce(nullif(application_name, ''), '''''') || '/' || backend_type, ',')
      FROM pg_stat_activity WHERE client_port IN ($ports) GROUP BY 1 ORDER BY 1") ||
    die "could not read pg_stat_activity"
  echo "$activity" >"$WORK/idle-$RUN-connections.txt"
  local captured=0 outside=0 mn="" mx=0 slots_mn="" slots_mx=0 slots_total=0 c s name
  for i in $(seq "$d"); do
    name=$(dbname "$i")
    c=$(awk -F'|' -v n="$name" '$1 == n { print $2 }' <<<"$activity"); c=${c:-0}
    captured=$((captured + c))
    if [ -z "$mn" ] || [ "$c" -lt "$mn" ]; then mn=$c; fi
    if [ "$c" -gt "$mx" ]; then mx=$c; fi
    s=$(upq postgres -c "SELECT count(*) FROM pg_replication_slots WHERE database = '$name'") || die "pg_replication_slots"
    slots_total=$((slots_total + s))
    if [ -z "$slots_mn" ] || [ "$s" -lt "$slots_mn" ]; then slots_mn=$s; fi
    if [ "$s" -gt "$slots_mx" ]; then slots_mx=$s; fi
  done
  outside=$(awk -F'|' -v d="$d" '{ if ($1 !~ /^db[0-9][0-9]$/ || substr($1, 3) + 0 > d) n += $2 } END { print n + 0 }' <<<"$activity")
  R[$k.idle_conns]=$captured
  R[$k.idle_conns_db]=$( [ "$mn" = "$mx" ] && echo "$mn" || echo "$mn-$mx")
  R[$k.idle_conns_other]=$outside
  R[$k.idle_slots]=$slots_total
  R[$k.idle_slots_db]=$( [ "$slots_mn" = "$slots_mx" ] && echo "$slots_mn" || echo "$slots_mn-$slots_mx")
  R[$k.idle_apps]=$(awk -F'|' '{ print $3 }' <<<"$activity" | tr ',' '\n' | sort -u | paste -sd, -)
  log "$RUN: idle: pgrelay CPU ${R[$k.idle_cpu_min]} s/min, upstream CPU ${R[$k.idle_up_cpu_min]} s/min; upstream connections: $(tr '\n' ';' <<<"$activity")" \
      "slots: $slots_total"
}

measure() {  # system D
  local sys=$1 d=$2
  RUN=$sys.d$d
  log "== $RUN: $( [ "$sys" = direct ] && echo "native PostgreSQL slots" || echo "pgrelay, $sys capture"), $d database(s)"
  start_cluster "$d"
  if [ "$sys" != direct ]; then start_relay "$sys" "$d"; fi
  throughput "$sys" "$d"
  if [[ " $IDLE_DBS " == *" $d "* ]]; then idle "$sys" "$d"; fi
  if [ -n "$RELAY_PID" ]; then
    kill -0 "$RELAY_PID" 2>/dev/null || die "pgrelay exited"
    stop_relay
    ODD[$RUN]=$(grep -E '(\] (WARNING|ERROR|FATAL|PANIC):|"level":"(warning|error)")' "$WORK/relay-$RUN.err" | head -n 5 || true)
  fi
  UPODD[$RUN]=$(grep -E '\] (WARNING|ERROR|FATAL|PANIC): ' "$WORK/up-$RUN.log" | head -n 5 || true)
  stop_cluster
  rm -rf "$WORK/up-$RUN" "$WORK/relay-$RUN"
}

log "work dir $WORK; $(nproc) cores; loadavg $(cut -d' ' -f1-3 /proc/loadavg); pgrelay $("$PGRELAY" --version 2>/dev/null | head -1)"
log "DBS='$DBS' CAPTURES='$CAPTURES' $( [ -n "$DURATION" ] && echo "DURATION=${DURATION}s" || echo "N=$N_DB") per database, CLIENTS=$CLIENTS per database, IDLE_DBS='$IDLE_DBS' IDLE_SECONDS=$IDLE_SECONDS"
SYSTEMS=$CAPTURES
[ "$DIRECT" = 1 ] && SYSTEMS="direct $CAPTURES"
for sys in $SYSTEMS; do
  for d in $DBS; do measure "$sys" "$d"; done
done
RUN=report

# ---- the table ----
v() { echo "${R[$1]:--}"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
row() {  # label values...
  local label=$1; shift
  printf "%-46s" "$label"
  for x in "$@"; do printf " %10s" "$x"; done
  printf "\n"
}
ELAPSED=$(( $(date +%s) - T_START ))
{
  echo
  echo "Databases benchmark, $(date -u +%FT%TZ), $(nproc) cores; PostgreSQL $("$BIN/postgres" --version | awk '{print $3}')" \
       "(wal_level=logical, fsync/synchronous_commit on); pgrelay $("$PGRELAY" --version 2>/dev/null | head -1) ($PGRELAY_SRC)"
  echo "workload per database: $( [ -n "$DURATION" ] && echo "$DURATION s" || echo "$N_DB") one-row INSERT transactions, pgbench -c $CLIENTS;" \
       "one pgoutput stream per database read by $CONSUMER_PROCS python consumer process(es); took ${ELAPSED} s"
  echo
  hdr=(); for d in $DBS; do hdr+=("D=$d"); done
  row "throughput (D databases at once)" "${hdr[@]}"
  if [ "$DIRECT" = 1 ]; then
    echo "-- native PostgreSQL, one slot per database"
    vals=(); for d in $DBS; do vals+=("$(v direct.d$d.changes_s)"); done; row "aggregate changes/s" "${vals[@]}"
    vals=(); for d in $DBS; do vals+=("$(v direct.d$d.write_tps)"); done; row "  write TPS, all databases" "${vals[@]}"
    vals=(); for d in $DBS; do vals+=("$(v direct.d$d.lag_s)"); done; row "  lag after the last commit, s" "${vals[@]}"
  fi
  for c in $CAPTURES; do
    echo "-- pgrelay, $c capture"
    vals=(); for d in $DBS; do vals+=("$(v $c.d$d.changes_s)"); done; row "aggregate changes/s" "${vals[@]}"
    if [ "$DIRECT" = 1 ]; then
      vals=(); for d in $DBS; do vals+=("$(ratio "$(v $c.d$d.changes_s)" "$(v direct.d$d.changes_s)")"); done
      row "  vs native PostgreSQL" "${vals[@]}"
    fi
    vals=(); for d in $DBS; do vals+=("$(v $c.d$d.write_tps)"); done; row "  write TPS, all databases" "${vals[@]}"
    vals=(); for d in $DBS; do vals+=("$(v $c.d$d.lag_s)"); done; row "  lag after the last commit, s" "${vals[@]}"
    vals=(); for d in $DBS; do vals+=("$(v $c.d$d.cpu_per_1k)"); done; row "pgrelay CPU s per 1000 changes" "${vals[@]}"
  done
  echo
  hdr=(); for d in $IDLE_DBS; do hdr+=("D=$d"); done
  row "idle ${IDLE_SECONDS} s, no writes, no consumers" "${hdr[@]}"
  if [ "$DIRECT" = 1 ]; then
    echo "-- native PostgreSQL, one slot per database"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v direct.d$d.idle_up_cpu_min)"); done; row "upstream CPU s per minute" "${vals[@]}"
  fi
  for c in $CAPTURES; do
    echo "-- pgrelay, $c capture"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_conns_db)"); done; row "upstream connections per captured database" "${vals[@]}"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_conns)"); done; row "  in all captured databases" "${vals[@]}"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_conns_other)"); done; row "  elsewhere (other databases)" "${vals[@]}"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_slots_db)"); done; row "upstream slots per captured database" "${vals[@]}"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_cpu_min)"); done; row "pgrelay CPU s per minute" "${vals[@]}"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_cpu_min_db)"); done; row "  per captured database" "${vals[@]}"
    vals=(); for d in $IDLE_DBS; do vals+=("$(v $c.d$d.idle_up_cpu_min)"); done; row "upstream CPU s per minute" "${vals[@]}"
    if [ "$DIRECT" = 1 ]; then
      vals=(); for d in $IDLE_DBS; do
        vals+=("$(awk -v a="$(v $c.d$d.idle_up_cpu_min)" -v b="$(v direct.d$d.idle_up_cpu_min)" -v d="$d" \
          'BEGIN { if (a == "-" || b == "-") print "-"; else printf "%.4f", (a - b) / d }')")
      done
      row "  above native's, per captured database" "${vals[@]}"
    fi
    for d in $IDLE_DBS; do echo "  D=$d connections' application_name/backend_type: $(v $c.d$d.idle_apps)"; done
  done
  print_odd "pgrelay" ODD
  print_odd "upstream" UPODD
} | tee "$WORK/summary.txt"
[ -z "$OUT" ] || { mkdir -p "$OUT"; cp "$WORK/summary.txt" "$OUT/"; }
