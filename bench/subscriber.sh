#!/usr/bin/env bash
# Subscriber benchmark: PostgreSQL 15's own subscriber through pgrelay vs straight to the upstream.
#
# Usage: bench/subscriber.sh   (build first: cmake --preset release &&
#          cmake --build build/release --target pgrelay -j2)
#
# One run starts two throw-away PG15 clusters, an upstream (wal_level=logical) and a subscriber,
# and measures side by side:
#  1. initial copy: CREATE SUBSCRIPTION (copy_data) of a table of ROWS rows, from
#     CREATE SUBSCRIPTION until its table sync is done ('s' or 'r') with every row, straight from
#     the upstream and through pgrelay;
#  2. apply: a subscription streaming while pgbench writes N_LIVE one-row transactions on
#     CLIENTS connections: apply throughput (changes/s from the first write to the last row
#     applied) and lag (time from the last commit to the last row applied);
#  3. through pgrelay only, text against binary (binary = true): the same apply run, and the
#     bytes of each stream (pg_recvlogical writing a catch-up of N_LIVE transactions to a file).
# The direct runs go first (pgrelay's capture would load their writes otherwise); then pgrelay once per
# capture mode in CAPTURES, each with its own schema and data directory.
#
# Settings (environment): ROWS (default 1000000), COPIES (copies per system, median; default 3),
# N_LIVE (default 20000), CLIENTS (default 4),
# CAPTURES (default "native trigger"), PGRELAY (binary), OUT (results directory).
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=${PGRELAY:-build/release/src/cli/pgrelay}
ROWS=${ROWS:-1000000}
N_LIVE=${N_LIVE:-20000}
CLIENTS=${CLIENTS:-4}
CAPTURES=${CAPTURES:-"native trigger"}
BIN=/usr/lib/postgresql/15/bin
[ -x "$PGRELAY" ] || { echo "missing $PGRELAY: cmake --preset release && cmake --build build/release --target pgrelay -j2" >&2; exit 1; }
PGRELAY=$(realpath "$PGRELAY")

WORK=$(mktemp -d /tmp/pgrelay-sub-bench-XXXXXX)
chmod 755 "$WORK"
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
UP_PORT=$((20000 + RANDOM % 10000))
SUB_PORT=$((UP_PORT + 1))
RELAY_PORT=$((UP_PORT + 2))
AS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$WORK"
  AS=(runuser -u postgres --)
fi
RELAY_PID=""
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
stop_relay() {
  [ -n "$RELAY_PID" ] || return 0
  kill "$RELAY_PID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$RELAY_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$RELAY_PID" 2>/dev/null || true
  RELAY_PID=""
}
cleanup() {
  stop_relay
  for c in up sub; do "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/$c" -m immediate stop >/dev/null 2>&1 || true; done
  log "logs and results kept in $WORK"
}
trap cleanup EXIT
die() {
  echo "BENCHMARK FAILED: $*" >&2
  [ -n "$RELAY_PID" ] && tail -n 20 "$WORK/relay.err" >&2
  tail -n 10 "$WORK/sub.log" >&2 || true
  exit 1
}

start_cluster() {  # name port extra-settings...
  local name=$1 port=$2; shift 2
  "${AS[@]}" "$BIN/initdb" -D "$WORK/$name" -U postgres -A trust --no-sync >/dev/null
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/$name" -l "$WORK/$name.log" -w -o "-p $port -k $WORK \
    -c listen_addresses=127.0.0.1 $*" start >/dev/null
}
log "work dir $WORK; loadavg $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; ROWS=$ROWS N_LIVE=$N_LIVE"
start_cluster up "$UP_PORT" "-c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20"
start_cluster sub "$SUB_PORT" "-c max_replication_slots=20 -c max_logical_replication_workers=8 -c wal_retrieve_retry_interval=100ms"
export PGPASSWORD=bench PGCONNECT_TIMEOUT=10
"$BIN/psql" -qX -h 127.0.0.1 -p "$UP_PORT" -U postgres -c "ALTER USER postgres PASSWORD 'bench'" \
  -c "CREATE DATABASE bench" postgres
up() { timeout 600 "$BIN/psql" "host=127.0.0.1 port=$UP_PORT user=postgres dbname=bench" -X -v ON_ERROR_STOP=1 -qAt "$@"; }
sub() { timeout 600 "$BIN/psql" "host=127.0.0.1 port=$SUB_PORT user=postgres dbname=postgres" -X -v ON_ERROR_STOP=1 -qAt "$@"; }
SCHEMA="CREATE TABLE big (id bigint PRIMARY KEY, k integer NOT NULL, payload text NOT NULL);
        CREATE TABLE live (id bigserial PRIMARY KEY, k integer NOT NULL, payload text NOT NULL)"
up -c "$SCHEMA" \
   -c "INSERT INTO big SELECT g, g % 1000, md5(g::text) || md5((g * 7)::text) FROM generate_series(1, $ROWS) g" \
   -c "CREATE PUBLICATION big_pub FOR TABLE big" -c "CREATE PUBLICATION live_pub FOR TABLE live" -c "VACUUM ANALYZE"
sub -c "$SCHEMA"
cat >"$WORK/insert.sql" <<'EOF'
\set k random(1, 1000000)
INSERT INTO live (k, payload) VALUES (:k, 'payload-0123456789-0123456789-0123456789-0123456789');
EOF
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

declare -A R
# Initial copy of big, straight or through pgrelay: seconds until ready with every row.
copy_run() {  # system conninfo
  sub -c "TRUNCATE big" >/dev/null
  local t0 t1 deadline
  t0=$(now)
  sub -c "CREATE SUBSCRIPTION s_copy CONNECTION '$2' PUBLICATION big_pub" >/dev/null 2>&1 ||
    die "$1: CREATE SUBSCRIPTION failed"
  deadline=$(( $(date +%s) + 1200 ))
  # Copied: the table sync worker is done ('s'). Postgres's apply worker turns it 'r' only once
  # its stream passes the sync's end, which a quiet upstream may not give it for a long time.
  until [ "$(sub -c "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate IN ('s', 'r')")" = 1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$1: the copy did not finish in 20 minutes"
    sleep 0.1
  done
  t1=$(now)
  [ "$(sub -c "SELECT count(*) FROM big")" = "$ROWS" ] || die "$1: the copy holds the wrong number of rows"
  sub -c "DROP SUBSCRIPTION s_copy" >/dev/null
  R[$1.copy_s]=$(secs "$t0" "$t1")
  R[$1.copy_rows_s]=$(awk -v n="$ROWS" -v s="${R[$1.copy_s]}" 'BEGIN { printf "%.0f", n / s }')
  log "$1: copy of $ROWS rows in ${R[$1.copy_s]} s (${R[$1.copy_rows_s]} rows/s)"
}

# COPIES copies (default 3); the median of their rates is the figure.
copy_runs() {  # system conninfo
  local rates=() i
  for i in $(seq "${COPIES:-3}"); do
    copy_run "$1" "$2"
    rates+=("${R[$1.copy_rows_s]}")
  done
  R[$1.copy_rows_s]=$(printf '%s\n' "${rates[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  log "$1: median copy rate ${R[$1.copy_rows_s]} rows/s of ${rates[*]}"
}

# Apply of N_LIVE transactions written while the subscription streams.
apply_run() {  # label conninfo options
  up -c "TRUNCATE live RESTART IDENTITY" >/dev/null
  sub -c "TRUNCATE live" >/dev/null
  sub -c "CREATE SUBSCRIPTION s_live CONNECTION '$2' PUBLICATION live_pub WITH (copy_data = false$3)" \
    >/dev/null 2>&1 || die "$1: CREATE SUBSCRIPTION failed"
  local deadline=$(( $(date +%s) + 60 ))
  until [ -n "$(sub -c "SELECT received_lsn FROM pg_stat_subscription WHERE subname = 's_live' AND received_lsn IS NOT NULL")" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$1: the apply worker did not start streaming"
    sleep 0.1
  done
  local per=$(( (N_LIVE + CLIENTS - 1) / CLIENTS )) n t0 t_written t1
  n=$((per * CLIENTS))
  t0=$(now)
  "$BIN/pgbench" -h 127.0.0.1 -p "$UP_PORT" -U postgres -n -c "$CLIENTS" -j 2 -t "$per" -f "$WORK/insert.sql" bench \
    >"$WORK/pgbench-$1.log" 2>&1 || die "$1: pgbench failed"
  t_written=$(now)
  deadline=$(( $(date +%s) + 600 ))
  until [ "$(sub -c "SELECT count(*) FROM live")" = "$n" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$1: the subscriber did not apply $n rows"
    sleep 0.02
  done
  t1=$(now)
  sub -c "DROP SUBSCRIPTION s_live" >/dev/null
  R[$1.apply_tps]=$(awk -v n="$n" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
  R[$1.lag_s]=$(secs "$t_written" "$t1")
  R[$1.write_tps]=$(awk '/^tps = / { printf "%.0f", $3; exit }' "$WORK/pgbench-$1.log")
  log "$1: $n transactions applied at ${R[$1.apply_tps]}/s (writers ${R[$1.write_tps]} tps), lag after the last commit ${R[$1.lag_s]} s"
}

# Bytes of a catch-up stream of live's N_LIVE rows, text or binary, written by pg_recvlogical.
stream_bytes() {  # label conninfo binary(true|false)
  local slot="bytes_${3}" f="$WORK/stream-$1.bin" end
  up -c "TRUNCATE live RESTART IDENTITY" >/dev/null
  "$BIN/pg_recvlogical" -d "$2" --slot "$slot" --create-slot -P pgoutput >/dev/null 2>&1 || die "$1: slot"
  "$BIN/pgbench" -h 127.0.0.1 -p "$UP_PORT" -U postgres -n -c "$CLIENTS" -j 2 -t $(( (N_LIVE + CLIENTS - 1) / CLIENTS )) \
    -f "$WORK/insert.sql" bench >/dev/null 2>&1 || die "$1: pgbench failed"
  # The stream ends at the log's newest entry once capture has it (pgrelay's keepalives go no
  # further than what it has logged, however far the upstream's WAL has moved).
  local want deadline=$(( $(date +%s) + 120 ))
  want=$(up -c "SELECT max(id) FROM live")
  until [ "$(timeout 30 "$BIN/psql" "$2" -XqAt -c "SELECT count(*) FROM live")" = "$want" ] &&
        [ "$(up -c "SELECT count(*) FROM pgrelay_$CAPTURE.changes" 2>/dev/null || echo 0)" = 0 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$1: capture did not catch up"
    sleep 0.2
  done
  sleep 1
  end=$("$PGRELAY" log stat --data-dir "$WORK/relay-$CAPTURE" --json |
        sed -n 's/.*"newest_lsn":"\([^"]*\)".*/\1/p')
  [ -n "$end" ] || die "$1: no log head"
  local t0 t1
  t0=$(now)
  timeout 300 "$BIN/pg_recvlogical" -d "$2" --slot "$slot" --start --endpos "$end" -o proto_version=1 \
    -o publication_names=live_pub -o binary="$3" -f "$f" 2>"$WORK/recv-$1.err" || die "$1: pg_recvlogical failed"
  t1=$(now)
  "$BIN/pg_recvlogical" -d "$2" --slot "$slot" --drop-slot >/dev/null 2>&1 || true
  R[$1.bytes]=$(stat -c %s "$f")
  R[$1.catchup_s]=$(secs "$t0" "$t1")
  log "$1: stream of $N_LIVE transactions: ${R[$1.bytes]} bytes in ${R[$1.catchup_s]} s"
}

UP_CONN="host=127.0.0.1 port=$UP_PORT user=postgres password=bench dbname=bench"
RELAY_CONN="host=127.0.0.1 port=$RELAY_PORT user=postgres password=bench dbname=bench sslmode=disable"
copy_runs direct "$UP_CONN"
apply_run direct "$UP_CONN" ""

for CAPTURE in $CAPTURES; do
  "$PGRELAY" serve --upstream "postgres://postgres:bench@127.0.0.1:$UP_PORT/bench?sslmode=disable" \
    --listen "127.0.0.1:$RELAY_PORT" --data-dir "$WORK/relay-$CAPTURE" --no-tls --capture "$CAPTURE" \
    --schema "pgrelay_$CAPTURE" >"$WORK/relay.out" 2>"$WORK/relay.err" &
  RELAY_PID=$!
  for _ in $(seq 300); do grep -q "pgrelay ready" "$WORK/relay.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "pgrelay ready" "$WORK/relay.out" || die "pgrelay (capture $CAPTURE) did not become ready"
  copy_runs "$CAPTURE" "$RELAY_CONN"
  apply_run "$CAPTURE" "$RELAY_CONN" ""
  apply_run "$CAPTURE.binary" "$RELAY_CONN" ", binary = true"
  stream_bytes "$CAPTURE.text" "$RELAY_CONN" false
  stream_bytes "$CAPTURE.bin" "$RELAY_CONN" true
  stop_relay
  up -c "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE slot_name LIKE 'pgrelay\_%'" >/dev/null
  up -c "DROP SCHEMA IF EXISTS pgrelay_$CAPTURE CASCADE" >/dev/null 2>&1 || true
  rm -f "$WORK/relay.out"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
{
  printf "%-46s %12s %12s %8s\n" "subscriber" "direct" "pgrelay" "ratio"
  for CAPTURE in $CAPTURES; do
    echo "-- pgrelay, $CAPTURE capture"
    printf "%-46s %12s %12s %8s\n" "initial copy of $ROWS rows, rows/s" "${R[direct.copy_rows_s]}" \
      "${R[$CAPTURE.copy_rows_s]}" "$(ratio "${R[$CAPTURE.copy_rows_s]}" "${R[direct.copy_rows_s]}")"
    printf "%-46s %12s %12s %8s\n" "apply, transactions/s (text)" "${R[direct.apply_tps]}" \
      "${R[$CAPTURE.apply_tps]}" "$(ratio "${R[$CAPTURE.apply_tps]}" "${R[direct.apply_tps]}")"
    printf "%-46s %12s %12s %8s\n" "apply, lag after the last commit, s (text)" "${R[direct.lag_s]}" \
      "${R[$CAPTURE.lag_s]}" "$(ratio "${R[$CAPTURE.lag_s]}" "${R[direct.lag_s]}")"
    printf "%-46s %12s %12s %8s\n" "apply, transactions/s: binary vs text" "${R[$CAPTURE.apply_tps]}" \
      "${R[$CAPTURE.binary.apply_tps]}" "$(ratio "${R[$CAPTURE.binary.apply_tps]}" "${R[$CAPTURE.apply_tps]}")"
    printf "%-46s %12s %12s %8s\n" "stream bytes: binary vs text" "${R[$CAPTURE.text.bytes]}" \
      "${R[$CAPTURE.bin.bytes]}" "$(ratio "${R[$CAPTURE.bin.bytes]}" "${R[$CAPTURE.text.bytes]}")"
    printf "%-46s %12s %12s %8s\n" "stream catch-up, s: binary vs text" "${R[$CAPTURE.text.catchup_s]}" \
      "${R[$CAPTURE.bin.catchup_s]}" "$(ratio "${R[$CAPTURE.bin.catchup_s]}" "${R[$CAPTURE.text.catchup_s]}")"
  done
} | tee "$OUT/summary.txt"
