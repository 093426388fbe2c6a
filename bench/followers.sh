#!/usr/bin/env bash
# Fan-out benchmark: consumers served by two pgrelay followers of a JetStream stream, against
# the same number per server on one pgrelay, in one run.
#
# Usage: bench/followers.sh   (build first: cmake --preset release &&
#          cmake --build build/release --target pgrelay bench_repl_consumer -j2; needs nats-server)
#
# It starts a throw-away PG15 (wal_level=logical), a 3-node nats-server cluster with JetStream,
# a primary `pgrelay serve --capture native --nats` and two followers (`--follow`, their
# --upstream the same PG), then measures, each from a backlog of N single-row transactions
# (TRUNCATE ... RESTART IDENTITY first, so the consumer checks ids 1..N exactly):
#  1. one: M consumers on the primary (slots, backlog, then the streams start);
#  2. followers: M consumers on each follower (2 x M in all), the streams started once both
#     followers hold the backlog.
# For each: aggregate changes/s (all consumers' changes over the longest drain), seconds to
# drain, CPU seconds of the upstream's process tree and of each pgrelay during the read, and
# for the followers the seconds from the primary holding the backlog to both followers holding
# it. The upstream's CPU should stay flat: the followers read the stream, not the upstream.
# Settings (environment): N (default 20000), M (consumers per server, default 32), CLIENTS (4),
# CONSUMER_THREADS (2), PGRELAY, CONSUMER, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=${PGRELAY:-build/release/src/cli/pgrelay}
CONSUMER=${CONSUMER:-build/release/bench/bench_repl_consumer}
N=${N:-20000}
M=${M:-32}
CLIENTS=${CLIENTS:-4}
CONSUMER_THREADS=${CONSUMER_THREADS:-2}
BIN=/usr/lib/postgresql/15/bin
PAYLOAD="payload-0123456789-0123456789-0123456789-0123456789-0123456789"
for b in "$PGRELAY" "$CONSUMER"; do
  [ -x "$b" ] || {
    echo "missing $b: cmake --preset release && cmake --build build/release --target pgrelay bench_repl_consumer -j2" >&2
    exit 1
  }
done
command -v nats-server >/dev/null || { echo "nats-server is missing: apt-get install nats-server" >&2; exit 1; }
PGRELAY=$(realpath "$PGRELAY")
CONSUMER=$(realpath "$CONSUMER")

WORK=$(mktemp -d /tmp/pgrelay-bench-followers-XXXXXX)
chmod 755 "$WORK"
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
PG_PORT=$((20000 + RANDOM % 10000))
SLOTS=$((M + 16))
AS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$WORK"
  AS=(runuser -u postgres --)
fi
declare -A PID PORT MPORT  # the pgrelays: primary, f1, f2
NATS_PIDS=()
CONSUMER_PIDS=()
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
cleanup() {
  for p in "${CONSUMER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for name in "${!PID[@]}"; do kill "${PID[$name]}" 2>/dev/null && wait "${PID[$name]}" 2>/dev/null || true; done
  for p in "${NATS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
  log "logs and results kept in $WORK"
}
trap cleanup EXIT
die() {
  echo "BENCHMARK FAILED: $*" >&2
  for name in primary f1 f2; do
    [ -e "$WORK/$name.err" ] && { echo "--- $name stderr (tail) ---" >&2; tail -n 15 "$WORK/$name.err" >&2; }
  done
  exit 1
}

log "work dir $WORK; loadavg $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
"${AS[@]}" "$BIN/initdb" -D "$WORK/pg" -U postgres -A trust >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w -o "-p $PG_PORT -k $WORK \
  -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_replication_slots=$SLOTS \
  -c max_wal_senders=$SLOTS -c max_connections=$((SLOTS + 100))" start >/dev/null
PG_PID=$(head -1 "$WORK/pg/postmaster.pid")
PG_CONN="host=127.0.0.1 port=$PG_PORT user=postgres dbname=bench"
UPSTREAM="postgres://postgres@127.0.0.1:$PG_PORT/bench"
"$BIN/psql" -qX -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "CREATE DATABASE bench" postgres
pg() { timeout 300 "$BIN/psql" "$PG_CONN" -X -v ON_ERROR_STOP=1 -qAt "$@"; }
pg -c "CREATE TABLE bench (id bigserial PRIMARY KEY, k integer NOT NULL DEFAULT 0, ts_us bigint NOT NULL,
                           payload text)" -c "CREATE PUBLICATION bench_pub FOR TABLE bench"
cat >"$WORK/insert.sql" <<EOF
\set k random(1, 1000000)
INSERT INTO bench (k, ts_us, payload) VALUES (:k, (extract(epoch from clock_timestamp()) * 1000000)::bigint, '$PAYLOAD');
EOF

# The cluster: three nodes on loopback.
source bench/nats_cluster.sh
start_nats_cluster "$WORK" "$PG_PORT"

start_relay() {  # name port_offset args...
  local name=$1 offset=$2
  shift 2
  PORT[$name]=$((PG_PORT + offset))
  MPORT[$name]=$((PG_PORT + offset + 1))
  "$PGRELAY" serve --upstream "$UPSTREAM" --listen "127.0.0.1:${PORT[$name]}" --data-dir "$WORK/$name" --no-tls \
    --max-replication-slots "$SLOTS" --metrics "127.0.0.1:${MPORT[$name]}" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PID[$name]=$!
  for _ in $(seq 300); do grep -q "pgrelay ready" "$WORK/$name.out" && return 0; sleep 0.1; done
  die "$name did not start"
}
start_relay primary 30 --capture native --nats "$SERVERS"
start_relay f1 40 --follow "$SERVERS"
start_relay f2 50 --follow "$SERVERS"

metric() {  # relay name
  curl -s "http://127.0.0.1:${MPORT[$1]}/metrics" | awk -v n="$2" '$1 ~ "^"n"({|$)" { print $2; exit }'
}
head_of() { local v; v=$(metric "$1" pgrelay_log_head_lsn); echo "${v%.*}"; }
# Waits until native capture confirmed everything written so far (its log holds it), then
# until both followers' logs reach the primary's head; prints the seconds the followers took.
wait_held() {
  local target deadline t0 target_head
  target=$(pg -c "SELECT pg_current_wal_lsn()")
  deadline=$(( $(date +%s) + 300 ))
  while [ "$(pg -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgrelay\_%'
                   AND NOT temporary AND confirmed_flush_lsn < '$target'")" != 0 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "capture stalled"
    sleep 0.05
  done
  t0=$(date +%s.%N)
  target_head=$(head_of primary)
  for f in f1 f2; do
    while [ "$(head_of $f)" -lt "$target_head" ]; do
      kill -0 "${PID[$f]}" 2>/dev/null || die "$f exited"
      [ "$(date +%s)" -lt "$deadline" ] || die "$f stuck at $(head_of $f), the primary at $target_head"
      sleep 0.05
    done
  done
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
}

declare -A R
PER=$(( (N + CLIENTS - 1) / CLIENTS )); N=$((PER * CLIENTS))
# One measurement: M consumers on each of the servers named, all started at once.
measure() {  # run servers...
  local run=$1
  shift
  local servers=("$@") s dir cpus
  pg -c "TRUNCATE bench RESTART IDENTITY" >/dev/null
  wait_held >/dev/null
  CONSUMER_PIDS=()
  for s in "${servers[@]}"; do
    dir="$OUT/$run.$s"
    mkdir -p "$dir"
    rm -f "$dir/ready" "$OUT/$run.go"
    cpus=(--cpu-pid "upstream=$PG_PID")
    for name in primary f1 f2; do cpus+=(--cpu-pid "$name=${PID[$name]}"); done
    "$CONSUMER" --conninfo "host=127.0.0.1 port=${PORT[$s]} user=postgres dbname=bench" --consumers "$M" \
      --slot-prefix "b_${run}_$s" --publication bench_pub --expect "$N" --ready-file "$dir/ready" \
      --wait-file "$OUT/$run.go" --payload "$PAYLOAD" "${cpus[@]}" --stall-seconds 60 --timeout-seconds 900 \
      --threads "$CONSUMER_THREADS" >"$dir/consumer.out" 2>"$dir/consumer.err" &
    CONSUMER_PIDS+=($!)
  done
  for s in "${servers[@]}"; do
    for _ in $(seq 3000); do [ -e "$OUT/$run.$s/ready" ] && break; sleep 0.1; done
    [ -e "$OUT/$run.$s/ready" ] || die "$run: consumers on $s did not get ready: $(tail -3 "$OUT/$run.$s/consumer.err")"
  done
  "$BIN/pgbench" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -M simple -c "$CLIENTS" -j 2 -t "$PER" \
    -f "$WORK/insert.sql" bench >"$OUT/$run.pgbench.log" 2>&1 || die "pgbench failed"
  R[$run.follow_s]=$(wait_held)
  touch "$OUT/$run.go"
  local i=0 kv total=0 longest=0
  for s in "${servers[@]}"; do
    wait "${CONSUMER_PIDS[$i]}" || die "$run: consumers on $s: $(tail -5 "$OUT/$run.$s/consumer.err")"
    i=$((i + 1))
    for kv in $(cat "$OUT/$run.$s/consumer.out"); do R[$run.$s.${kv%%=*}]=${kv#*=}; done
    total=$((total + R[$run.$s.changes]))
    longest=$(awk -v a="$longest" -v b="${R[$run.$s.start_to_last_s]}" 'BEGIN { print (b > a ? b : a) }')
    log "$run on $s: $(cat "$OUT/$run.$s/consumer.out")"
  done
  CONSUMER_PIDS=()
  R[$run.changes_per_s]=$(awk -v n="$total" -v s="$longest" 'BEGIN { printf "%.0f", n / s }')
  R[$run.drain_s]=$longest
  # CPU: each consumer process measured the same read; the longest one's figures cover it.
  local widest=${servers[0]}
  for s in "${servers[@]}"; do
    [ "${R[$run.$s.start_to_last_s]}" = "$longest" ] && widest=$s
  done
  for name in upstream primary f1 f2; do R[$run.cpu_$name]=${R[$run.$widest.cpu_${name}_s]}; done
}

log "one: $M consumers on the primary, a backlog of $N transactions"
measure one primary
log "followers: $M consumers on each of two followers"
measure followers f1 f2

{
  echo "fan-out through followers ($(nproc) cores; loadavg $(cut -d' ' -f1-3 /proc/loadavg)); backlog $N transactions"
  printf '%-44s %14s %18s\n' "" "primary x $M" "2 followers x $M"
  printf '%-44s %14s %18s\n' "consumers" "$M" "$((2 * M))"
  printf '%-44s %14s %18s\n' "aggregate changes/s" "${R[one.changes_per_s]}" "${R[followers.changes_per_s]}"
  printf '%-44s %14s %18s\n' "seconds to drain" "${R[one.drain_s]}" "${R[followers.drain_s]}"
  printf '%-44s %14s %18s\n' "upstream CPU s during the read" "${R[one.cpu_upstream]}" "${R[followers.cpu_upstream]}"
  printf '%-44s %14s %18s\n' "primary pgrelay CPU s during the read" "${R[one.cpu_primary]}" "${R[followers.cpu_primary]}"
  printf '%-44s %14s %18s\n' "followers' CPU s during the read (f1 + f2)" "-" \
    "$(awk -v a="${R[followers.cpu_f1]}" -v b="${R[followers.cpu_f2]}" 'BEGIN { printf "%.2f", a + b }')"
  printf '%-44s %14s %18s\n' "backlog held by both followers after (s)" "-" "${R[followers.follow_s]}"
} | tee "$OUT/followers.txt"
