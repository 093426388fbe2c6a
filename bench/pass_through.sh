#!/usr/bin/env bash
# Pass-through overhead: pgbench TPS through pgrelay vs directly against the same upstream,
# side by side in one run (select-only and the default TPC-B-like script).
#
# Usage: bench/pass_through.sh [PGRELAY_BINARY]   (default: build/release/src/cli/pgrelay)
# Settings: CLIENTS (default 8), SECONDS_PER_RUN (default 15), SCALE (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=${1:-build/release/src/cli/pgrelay}
CLIENTS=${CLIENTS:-8}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
SCALE=${SCALE:-10}
BIN=$(ls -d /usr/lib/postgresql/15/bin)
[ -x "$PGRELAY" ] || { echo "build pgrelay first: cmake --preset release && cmake --build build/release" >&2; exit 1; }

WORK=$(mktemp -d /tmp/pgrelay-bench-XXXXXX)
chmod 755 "$WORK"
PG_PORT=$((20000 + RANDOM % 10000))
RELAY_PORT=$((PG_PORT + 1))
AS=()
[ "$(id -u)" -eq 0 ] && { chown postgres "$WORK"; AS=(runuser -u postgres --); }
cleanup() {
  [ -n "${RELAY_PID:-}" ] && kill "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null || true
  "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"${AS[@]}" "$BIN/initdb" -D "$WORK/pg" -U postgres -A trust >/dev/null
"${AS[@]}" "$BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w \
  -o "-p $PG_PORT -k $WORK -c listen_addresses=127.0.0.1 -c wal_level=replica -c max_connections=200 -c fsync=off" start >/dev/null
"$BIN/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "ALTER USER postgres PASSWORD 'bench'" postgres
export PGPASSWORD=bench
"$BIN/pgbench" -q -i -s "$SCALE" -h 127.0.0.1 -p "$PG_PORT" -U postgres postgres >/dev/null 2>&1

"$PGRELAY" serve --upstream "postgres://postgres:bench@127.0.0.1:$PG_PORT/postgres?sslmode=disable" \
  --listen "127.0.0.1:$RELAY_PORT" --data-dir "$WORK/relay" --no-tls > "$WORK/relay.out" 2> "$WORK/relay.err" &
RELAY_PID=$!
for _ in $(seq 100); do grep -q "pgrelay ready" "$WORK/relay.out" 2>/dev/null && break; sleep 0.1; done
grep -q "pgrelay ready" "$WORK/relay.out" || { cat "$WORK/relay.err" >&2; exit 1; }

tps() {  # PORT ARGS...
  local port=$1; shift
  "$BIN/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" "$@" postgres 2>/dev/null |
    awk '/^tps = / { print $3; exit }'
}
printf "%-28s %12s %12s %8s\n" workload direct via-pgrelay ratio
for mode in "select-only:-S" "select-only-prepared:-S -M prepared" "tpcb-like:" ; do
  name=${mode%%:*}; args=${mode#*:}
  # shellcheck disable=SC2086
  direct=$(tps "$PG_PORT" $args)
  # shellcheck disable=SC2086
  relayed=$(tps "$RELAY_PORT" $args)
  ratio=$(awk -v a="$relayed" -v b="$direct" 'BEGIN { printf "%.1f%%", 100 * a / b }')
  printf "%-28s %12.0f %12.0f %8s\n" "$name" "$direct" "$relayed" "$ratio"
done
