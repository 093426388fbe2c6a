#!/usr/bin/env bash
# NATS publishing benchmark: pgrelay's JetStream publisher against its own log's append rate.
#
# Usage: bench/nats.sh   (build first: cmake --preset release &&
#          cmake --build build/release --target pgrelay -j2; needs nats-server, node and npm)
#
# It starts a throw-away PG15 (wal_level=logical), a 3-node nats-server cluster with JetStream
# (file storage, data in the work dir) and `pgrelay serve --capture native --nats` against them,
# then, side by side in the one run:
#  1. insert: pgbench writes N single-row transactions unthrottled (CLIENTS connections). From
#     the first write: when pgrelay's log holds them all (pgrelay_captured_transactions_total) and
#     when the stream holds them all (pgrelay_nats_published_transactions_total, counted on
#     JetStream's acks). keep-up = log time / stream time (1.00: the stream is done when the log
#     is). Rates are transactions/s.
#  2. bulk: one transaction of BULK_ROWS rows of BULK_PAYLOAD bytes: commit -> in the log, and
#     commit -> in the stream (its BULK_ROWS change messages and its log entry in parts). Beside
#     it the floor: node publishing as many 300-byte messages into a stream of its own as fast
#     as JetStream acks them, with pgrelay's window of 256 (the last column: pgrelay / floor),
#     and with each window in FLOOR_WINDOWS. For the bulk run and each flood, the CPU seconds the
#     three nats-servers spent per message, and the ceiling that alone sets on this machine
#     (cores / CPU per message): what no client, however cheap, can publish past.
#  3. latency at LAT_RATE transactions/s for LAT_SECONDS: commit (the row's clock_timestamp())
#     -> an npm `nats` consumer's receipt, p50/p99/max; beside it the floor JetStream sets on this
#     machine: the same consumer reading messages node publishes into a stream of its own.
# Settings (environment): N (default 20000), CLIENTS (4), BULK_ROWS (200000; 0 skips),
# BULK_PAYLOAD (200), FLOOR_WINDOWS ("64 4096"), LAT_RATE (1000), LAT_SECONDS (20; 0 skips),
# PGRELAY, NPM_DIR, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=$(realpath "${PGRELAY:-build/release/src/cli/pgrelay}")
N=${N:-20000}
CLIENTS=${CLIENTS:-4}
BULK_ROWS=${BULK_ROWS:-200000}
BULK_PAYLOAD=${BULK_PAYLOAD:-200}
FLOOR_WINDOWS=${FLOOR_WINDOWS:-"64 4096"}
LAT_RATE=${LAT_RATE:-1000}
LAT_SECONDS=${LAT_SECONDS:-20}
NPM_DIR=$(realpath -m "${NPM_DIR:-build/bench-npm}")
BIN=/usr/lib/postgresql/15/bin
HERE=$PWD
[ -x "$PGRELAY" ] || { echo "missing $PGRELAY: cmake --preset release && cmake --build build/release --target pgrelay -j2" >&2; exit 1; }
command -v nats-server >/dev/null || { echo "nats-server is missing: apt-get install nats-server" >&2; exit 1; }
if [ ! -e "$NPM_DIR/node_modules/nats/package.json" ]; then
  mkdir -p "$NPM_DIR"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund nats@2 >/dev/null || { echo "npm install nats@2 failed" >&2; exit 1; }
fi

WORK=$(mktemp -d /tmp/pgrelay-bench-nats-XXXXXX)
chmod 755 "$WORK"
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
PG_PORT=$((20000 + RANDOM % 10000))
RELAY_PORT=$((PG_PORT + 1))
METRICS_PORT=$((PG_PORT + 2))
AS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$WORK"
  AS=(runuser -u postgres --)
fi
RELAY_PID=""
NATS_PIDS=()
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
cleanup() {
  [ -n "$RELAY_PID" ] && kill "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null
  for p in "${NATS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
  log "logs and results kept in $WORK"
}
trap cleanup EXIT
die() {
  echo "BENCHMARK FAILED: $*" >&2
  tail -n 20 "$WORK/relay.err" >&2 2>/dev/null || true
  exit 1
}

log "work dir $WORK; loadavg $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
"${AS[@]}" "$BIN/initdb" -D "$WORK/pg" -U postgres -A trust >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w -o "-p $PG_PORT -k $WORK \
  -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_connections=100" start >/dev/null
PG_CONN="host=127.0.0.1 port=$PG_PORT user=postgres dbname=bench"
"$BIN/psql" -qX -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "CREATE DATABASE bench" postgres
pg() { timeout 300 "$BIN/psql" "$PG_CONN" -X -v ON_ERROR_STOP=1 -qAt "$@"; }
pg -c "CREATE TABLE bench (id bigserial PRIMARY KEY, k integer NOT NULL DEFAULT 0, ts_us bigint NOT NULL,
                           payload text)" -c "CREATE PUBLICATION bench_pub FOR TABLE bench"

# The cluster: three nodes on loopback.
source bench/nats_cluster.sh
start_nats_cluster "$WORK" "$PG_PORT"

"$PGRELAY" serve --upstream "postgres://postgres@127.0.0.1:$PG_PORT/bench" --listen "127.0.0.1:$RELAY_PORT" \
  --data-dir "$WORK/relay" --no-tls --capture native --nats "$SERVERS" --metrics "127.0.0.1:$METRICS_PORT" \
  >"$WORK/relay.out" 2>"$WORK/relay.err" &
RELAY_PID=$!
for _ in $(seq 300); do grep -q "pgrelay ready" "$WORK/relay.out" && break; sleep 0.1; done
grep -q "pgrelay ready" "$WORK/relay.out" || die "pgrelay did not start"

metric() { curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" { print $2; exit }'; }
captured() { metric pgrelay_captured_transactions_total; }
published() { metric pgrelay_nats_published_transactions_total; }
now() { date +%s.%N; }
# Waits until `metric` reaches `target`; prints the time it did.
reach() {  # function target timeout_s
  local deadline=$(( $(date +%s) + $3 )) v
  while :; do
    v=$($1); v=${v%.*}
    [ -n "$v" ] && [ "$v" -ge "$2" ] && { now; return; }
    kill -0 "$RELAY_PID" 2>/dev/null || die "pgrelay exited"
    [ "$(date +%s)" -lt "$deadline" ] || die "$1 stuck at $v, waiting for $2"
    sleep 0.02
  done
}
settle() {  # the stream has everything the log has
  local c
  c=$(captured); c=${c%.*}
  reach published "$c" 120 >/dev/null
}
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", n / s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# CPU seconds (user + system) the three nats-servers have used so far.
nats_cpu() {
  local p t=0
  for p in "${NATS_PIDS[@]}"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
  awk -v t="$t" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'
}
# "µs of server CPU per message, the msgs/s that caps at on this machine's cores"
per_message() {  # cpu_before cpu_after messages
  awk -v a="$1" -v b="$2" -v n="$3" -v cores="$(nproc)" \
    'BEGIN { us = (b - a) * 1e6 / n; printf "%.0f %.0f", us, cores * 1e6 / us }'
}

sleep 2
settle
declare -A R

log "insert: $N single-row transactions, $CLIENTS clients, unthrottled"
cat >"$WORK/insert.sql" <<'EOF'
INSERT INTO bench (k, ts_us, payload) VALUES (1, (extract(epoch from clock_timestamp()) * 1000000)::bigint, 'payload-0123456789-0123456789-0123456789');
EOF
c0=$(captured); c0=${c0%.*}
p0=$(published); p0=${p0%.*}
start=$(now)
per=$(( (N + CLIENTS - 1) / CLIENTS )); N=$((per * CLIENTS))
"$BIN/pgbench" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -c "$CLIENTS" -j 2 -t "$per" -f "$WORK/insert.sql" bench \
  >"$WORK/pgbench-insert.log" 2>&1 || die "pgbench failed"
t_log=$(reach captured $((c0 + N)) 300)
t_pub=$(reach published $((p0 + N)) 300)
R[insert.log_s]=$(elapsed "$start" "$t_log")
R[insert.pub_s]=$(elapsed "$start" "$t_pub")
R[insert.log_rate]=$(rate "$N" "${R[insert.log_s]}")
R[insert.pub_rate]=$(rate "$N" "${R[insert.pub_s]}")
R[insert.keepup]=$(ratio "${R[insert.log_s]}" "${R[insert.pub_s]}")

if [ "$BULK_ROWS" -gt 0 ]; then
  log "bulk: one transaction of $BULK_ROWS rows of $BULK_PAYLOAD bytes"
  settle
  c0=$(captured); c0=${c0%.*}
  p0=$(published); p0=${p0%.*}
  cpu0=$(nats_cpu)
  pg -c "INSERT INTO bench (k, ts_us, payload) SELECT g, 0, repeat('x', $BULK_PAYLOAD) FROM generate_series(1, $BULK_ROWS) g"
  commit=$(now)
  t_log=$(reach captured $((c0 + 1)) 600)
  t_pub=$(reach published $((p0 + 1)) 600)
  read -r "R[bulk.server_us]" "R[bulk.server_cap]" <<<"$(per_message "$cpu0" "$(nats_cpu)" "$BULK_ROWS")"
  R[bulk.log_s]=$(elapsed "$commit" "$t_log")
  R[bulk.pub_s]=$(elapsed "$commit" "$t_pub")
  R[bulk.log_rate]=$(rate "$BULK_ROWS" "${R[bulk.log_s]}")
  R[bulk.pub_rate]=$(rate "$BULK_ROWS" "${R[bulk.pub_s]}")
  R[bulk.keepup]=$(ratio "${R[bulk.log_s]}" "${R[bulk.pub_s]}")
  for w in 256 $FLOOR_WINDOWS; do
    log "floor: JetStream alone, $BULK_ROWS messages of 300 bytes, $w acks outstanding"
    cpu0=$(nats_cpu)
    R[floor.$w]=$(node "$HERE/bench/nats_floor.cjs" "$NPM_DIR/node_modules/nats" "$SERVERS" flood "FLOOD$w" "$BULK_ROWS" 300 "$w" 2>/dev/null | sed 's/msgs_per_s=//')
    read -r "R[floor.$w.server_us]" "R[floor.$w.server_cap]" <<<"$(per_message "$cpu0" "$(nats_cpu)" "$BULK_ROWS")"
  done
fi

if [ "$LAT_SECONDS" -gt 0 ]; then
  settle
  count=$((LAT_RATE * LAT_SECONDS))
  log "latency: $count transactions at $LAT_RATE/s, commit -> JetStream consumer"
  node "$HERE/bench/nats_floor.cjs" "$NPM_DIR/node_modules/nats" "$SERVERS" consume pgrelay.bench.public.bench "$count" \
    >"$WORK/latency.out" 2>"$WORK/latency.err" &
  consumer=$!
  for _ in $(seq 100); do grep -q ready "$WORK/latency.err" && break; sleep 0.1; done
  "$BIN/pgbench" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n -c "$CLIENTS" -j 2 -R "$LAT_RATE" -T "$LAT_SECONDS" \
    -f "$WORK/insert.sql" bench >"$WORK/pgbench-latency.log" 2>&1 || die "pgbench failed"
  # pgbench at a rate may write a few less than rate x seconds: the consumer stops 3 s after
  # the last message that came.
  timeout 60 tail --pid="$consumer" -f /dev/null || kill "$consumer" 2>/dev/null || true
  R[latency.pgrelay]=$(cat "$WORK/latency.out")
  log "baseline: JetStream alone, $count messages at $LAT_RATE/s"
  R[latency.jetstream]=$(node "$HERE/bench/nats_floor.cjs" "$NPM_DIR/node_modules/nats" "$SERVERS" baseline BASELINE "$count" "$LAT_RATE" 2>/dev/null)
fi

{
  echo "pgrelay -> 3-node JetStream ($(nproc) cores; loadavg $(cut -d' ' -f1-3 /proc/loadavg))"
  printf '%-34s %12s %12s %10s\n' "" "log" "stream" "keep-up"
  printf '%-34s %12s %12s %10s\n' "insert: $N tx, time from start (s)" "${R[insert.log_s]}" "${R[insert.pub_s]}" "${R[insert.keepup]}"
  printf '%-34s %12s %12s\n' "insert: transactions/s" "${R[insert.log_rate]}" "${R[insert.pub_rate]}"
  if [ "$BULK_ROWS" -gt 0 ]; then
    printf '%-34s %12s %12s %10s\n' "bulk: $BULK_ROWS rows, commit -> (s)" "${R[bulk.log_s]}" "${R[bulk.pub_s]}" "${R[bulk.keepup]}"
    printf '%-34s %12s %12s\n' "bulk: rows/s" "${R[bulk.log_rate]}" "${R[bulk.pub_rate]}"
    printf '%-34s %12s %12s %10s\n' "floor: node into JetStream, msgs/s" "" "${R[floor.256]:-?}" \
      "$(ratio "${R[bulk.pub_rate]}" "${R[floor.256]:-0}")"
    echo "nats-servers' CPU per message (all three nodes), and the msgs/s it caps at on $(nproc) cores:"
    printf '  %-40s %8s us %10s msgs/s\n' "pgrelay's bulk run" "${R[bulk.server_us]}" "${R[bulk.server_cap]}"
    for w in 256 $FLOOR_WINDOWS; do
      printf '  %-40s %8s us %10s msgs/s  (node published %s msgs/s)\n' "node flood, $w acks outstanding" \
        "${R[floor.$w.server_us]}" "${R[floor.$w.server_cap]}" "${R[floor.$w]:-?}"
    done
  fi
  if [ "$LAT_SECONDS" -gt 0 ]; then
    echo "latency at $LAT_RATE tx/s, commit -> JetStream consumer: ${R[latency.pgrelay]:-none}"
    echo "floor: JetStream publish -> the same consumer:    ${R[latency.jetstream]:-none}"
  fi
} | tee "$OUT/nats.txt"
