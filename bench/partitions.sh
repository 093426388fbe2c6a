#!/usr/bin/env bash
# Capture of a partitioned table against a plain one, side by side in one run, in each mode.
#
# Usage: bench/partitions.sh   (build first: cmake --preset release &&
#          cmake --build build/release --target pgrelay)
#
# One throw-away PG15 (wal_level=logical) holds two tables of the same shape: `plain` and
# `parted`, hash-partitioned into PARTITIONS leaves, both in one publication. For each capture
# mode in CAPTURES, pgrelay serves that cluster, and for each table, in turn (plain, parted,
# plain, parted... ROUNDS times):
#   - bulk: one INSERT of ROWS rows (PAYLOAD-byte text each); its time with capture on
#     (trigger capture's triggers run inside it), then commit to the last change received by
#     pg_recvlogical through pgrelay (slot made before the INSERT, --endpos at pgrelay's
#     pg_current_wal_lsn() after the commit), and changes/s over that;
#   - single-row: SINGLE one-row INSERT transactions from pgbench (4 clients): write TPS with
#     capture on.
# Each figure is the median over the rounds; the table gives partitioned/plain ratios. The
# "capture off" rows (the same writes before pgrelay installs anything) are the writers'
# baseline. Any error fails the run loudly.
#
# Settings (environment): ROWS (default 200000), PAYLOAD (default 200), PARTITIONS (default 4),
# SINGLE (default 20000), ROUNDS (default 3), CAPTURES (default "native trigger"),
# PGRELAY (default build/release/src/cli/pgrelay).
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=${ROWS:-200000}
PAYLOAD=${PAYLOAD:-200}
PARTITIONS=${PARTITIONS:-4}
SINGLE=${SINGLE:-20000}
ROUNDS=${ROUNDS:-3}
CAPTURES=${CAPTURES:-"native trigger"}
PGRELAY=${PGRELAY:-build/release/src/cli/pgrelay}
BIN=/usr/lib/postgresql/15/bin
[ -x "$PGRELAY" ] || { echo "missing $PGRELAY: cmake --preset release && cmake --build build/release --target pgrelay" >&2; exit 1; }
PGRELAY=$(realpath "$PGRELAY")

WORK=$(mktemp -d /tmp/pgrelay-partitions-bench-XXXXXX)
chmod 755 "$WORK"
PG_PORT=$((20000 + RANDOM % 10000))
RELAY_PORT=$((PG_PORT + 1))
AS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$WORK"
  AS=(runuser -u postgres --)
fi
RELAY_PID=""
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
cleanup() {
  [ -n "$RELAY_PID" ] && kill "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
  log "logs kept in $WORK"
}
trap cleanup EXIT
die() {
  echo "BENCHMARK FAILED: $*" >&2
  [ -f "$WORK/relay.err" ] && tail -n 20 "$WORK/relay.err" >&2
  tail -n 10 "$WORK/pg.log" >&2 || true
  exit 1
}

"${AS[@]}" "$BIN/initdb" -D "$WORK/pg" -U postgres -A trust >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w -o "-p $PG_PORT -k $WORK \
  -c listen_addresses=127.0.0.1 -c wal_level=logical -c max_replication_slots=20 \
  -c max_wal_senders=20" start >/dev/null
export PGPASSWORD=bench PGCONNECT_TIMEOUT=10
"$BIN/psql" -qX -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "ALTER USER postgres PASSWORD 'bench'" \
  -c "CREATE DATABASE bench" postgres
PG_CONN="host=127.0.0.1 port=$PG_PORT user=postgres dbname=bench password=bench"
RELAY_CONN="host=127.0.0.1 port=$RELAY_PORT user=postgres dbname=bench password=bench"
pg() { timeout 300 "$BIN/psql" "$PG_CONN" -X -v ON_ERROR_STOP=1 -qAt "$@"; }
relay() { timeout 300 "$BIN/psql" "$RELAY_CONN" -X -v ON_ERROR_STOP=1 -qAt "$@"; }

pg -c "CREATE TABLE plain (id bigserial PRIMARY KEY, payload text)" \
   -c "CREATE TABLE parted (id bigserial PRIMARY KEY, payload text) PARTITION BY HASH (id)" \
   -c "DO \$b\$ BEGIN FOR i IN 0 .. $PARTITIONS - 1 LOOP EXECUTE format('CREATE TABLE parted_%s
         PARTITION OF parted FOR VALUES WITH (MODULUS %s, REMAINDER %s)', i, $PARTITIONS, i);
       END LOOP; END \$b\$" \
   -c "CREATE PUBLICATION bench_pub FOR TABLE plain, parted"

declare -A R  # R[system.table.metric] = space-separated samples

now() { date +%s.%N; }
median() {  # of the numbers on stdin (space-separated); nothing for none
  tr ' ' '\n' | sort -g | awk 'NF {a[++n] = $1} END {if (n) print (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2}'
}

# bulk SYSTEM TABLE: one ROWS-row INSERT, written to the upstream, and (SYSTEM a capture mode)
# the delivery of its changes through pgrelay.
bulk() {
  local sys=$1 table=$2 t0 t1 t2 endpos
  pg -c "TRUNCATE $table" >/dev/null
  if [ "$sys" != off ]; then
    relay -c "SELECT 1" >/dev/null || die "pgrelay not answering"
    "$BIN/pg_recvlogical" -d "$RELAY_CONN" --slot "s_$table" --create-slot -P pgoutput >/dev/null 2>&1 ||
      die "could not create a slot through pgrelay"
  fi
  t0=$(now)
  pg -c "INSERT INTO $table (payload) SELECT repeat('x', $PAYLOAD) FROM generate_series(1, $ROWS)" >/dev/null ||
    die "bulk INSERT into $table failed"
  t1=$(now)
  R[$sys.$table.insert_s]+=" $(echo "$t1 - $t0" | bc -l)"
  [ "$sys" = off ] && return 0
  endpos=$(relay -c "SELECT pg_current_wal_lsn()") || die "pgrelay not answering"
  # A transaction after it, so that the stream passes endpos however idle the upstream is
  # afterwards (native capture learns the upstream's position past its last commit only from
  # later WAL: see the note on pg_recvlogical --endpos).
  relay -c "SELECT pg_logical_emit_message(true, 'bench', 'after')" >/dev/null || die "pgrelay not answering"
  timeout 600 "$BIN/pg_recvlogical" -d "$RELAY_CONN" --slot "s_$table" --start --endpos "$endpos" \
    -o proto_version=1 -o publication_names=bench_pub -f "$WORK/recv.bin" --no-loop 2>"$WORK/recv.err" ||
    die "pg_recvlogical through pgrelay failed: $(tail -3 "$WORK/recv.err")"
  t2=$(now)
  R[$sys.$table.deliver_s]+=" $(echo "$t2 - $t1" | bc -l)"
  R[$sys.$table.changes_per_s]+=" $(echo "$ROWS / ($t2 - $t1)" | bc -l)"
  "$BIN/pg_recvlogical" -d "$RELAY_CONN" --slot "s_$table" --drop-slot >/dev/null 2>&1 || die "drop slot"
}

# single SYSTEM TABLE: SINGLE one-row INSERT transactions, 4 clients.
single() {
  local sys=$1 table=$2 tps
  echo "INSERT INTO $table (payload) VALUES (repeat('y', $PAYLOAD));" >"$WORK/single.sql"
  tps=$("$BIN/pgbench" -n -c 4 -j 2 -t $((SINGLE / 4)) -f "$WORK/single.sql" "$PG_CONN" 2>&1 |
        awk '/^tps/ {print $3; exit}') || die "pgbench failed"
  [ -n "$tps" ] || die "pgbench printed no tps"
  R[$sys.$table.single_tps]+=" $tps"
}

measure() {
  local sys=$1
  for round in $(seq "$ROUNDS"); do
    for table in plain parted; do
      bulk "$sys" "$table"
      single "$sys" "$table"
    done
    log "$sys round $round done"
  done
}

log "PostgreSQL on port $PG_PORT: $ROWS rows x $PAYLOAD B, $PARTITIONS hash partitions, $ROUNDS rounds"
measure off
for CAPTURE in $CAPTURES; do
  "$PGRELAY" serve --upstream "postgres://postgres:bench@127.0.0.1:$PG_PORT/bench?sslmode=disable" \
    --listen "127.0.0.1:$RELAY_PORT" --data-dir "$WORK/relay-$CAPTURE" --no-tls \
    --capture "$CAPTURE" --schema "pgrelay_$CAPTURE" >"$WORK/relay.out" 2>"$WORK/relay.err" &
  RELAY_PID=$!
  for _ in $(seq 300); do grep -q "pgrelay ready" "$WORK/relay.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "pgrelay ready" "$WORK/relay.out" || die "pgrelay serve --capture $CAPTURE did not become ready"
  measure "$CAPTURE"
  kill "$RELAY_PID"; wait "$RELAY_PID" 2>/dev/null || true
  RELAY_PID=""
  pg -c "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots
         WHERE slot_name LIKE 'pgrelay\_%'" >/dev/null
  pg -c "DROP SCHEMA IF EXISTS pgrelay_$CAPTURE CASCADE" >/dev/null 2>&1 || true
done

m() { echo "${R[$1]:-}" | median; }
printf '\nPartitioned (%s hash partitions) against plain, one run, medians of %s rounds; %s rows x %s B\n\n' \
  "$PARTITIONS" "$ROUNDS" "$ROWS" "$PAYLOAD"
printf '%-34s %12s %12s %8s\n' "metric" "plain" "partitioned" "ratio"
row() {  # label key
  local a b
  a=$(m "$2".plain."$3"); b=$(m "$2".parted."$3")
  [ -n "$a" ] && [ -n "$b" ] || return 0
  printf '%-34s %12.3f %12.3f %8.2f\n' "$1" "$a" "$b" "$(echo "$b / $a" | bc -l)"
}
row "bulk INSERT s, capture off" off insert_s
row "single-row tps, capture off" off single_tps
for CAPTURE in $CAPTURES; do
  row "bulk INSERT s, $CAPTURE" "$CAPTURE" insert_s
  row "bulk commit -> received s, $CAPTURE" "$CAPTURE" deliver_s
  row "bulk changes/s, $CAPTURE" "$CAPTURE" changes_per_s
  row "single-row tps, $CAPTURE" "$CAPTURE" single_tps
done
