#!/usr/bin/env bash
# Pass-through overhead: pgbench TPS through pgrelay vs directly against the same upstream,
# side by side in one run (select-only and the default TPC-B-like script). When pgbouncer is
# installed (apt-get install pgbouncer), it runs too, in session mode, as the reference for
# what any proxy in the path costs on the same machine.
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
BOUNCER_PORT=$((PG_PORT + 2))
AS=()
[ "$(id -u)" -eq 0 ] && { chown postgres "$WORK"; AS=(runuser -u postgres --); }
cleanup() {
  [ -n "${RELAY_PID:-}" ] && kill "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null || true
  [ -f "$WORK/pgbouncer.pid" ] && kill "$(cat "$WORK/pgbouncer.pid")" 2>/dev/null || true
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

BOUNCER=$(command -v pgbouncer || true)
if [ -n "$BOUNCER" ]; then
  cat > "$WORK/pgbouncer.ini" <<EOF
[databases]
postgres = host=127.0.0.1 port=$PG_PORT dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER_PORT
unix_socket_dir =
auth_type = plain
auth_file = $WORK/pgbouncer.users
pool_mode = session
max_client_conn = 200
default_pool_size = 100
logfile = $WORK/pgbouncer.log
pidfile = $WORK/pgbouncer.pid
EOF
  echo '"postgres" "bench"' > "$WORK/pgbouncer.users"
  [ "$(id -u)" -eq 0 ] && chown postgres "$WORK/pgbouncer.ini" "$WORK/pgbouncer.users"
  "${AS[@]}" "$BOUNCER" -d "$WORK/pgbouncer.ini" || BOUNCER=""
  sleep 0.5
fi

tps() {  # PORT ARGS...
  local port=$1; shift
  "$BIN/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" "$@" postgres 2>/dev/null |
    awk '/^tps = / { print $3; exit }'
}
printf "%-24s %9s %12s %8s" workload direct via-pgrelay ratio
[ -n "$BOUNCER" ] && printf " %13s %8s" via-pgbouncer ratio
printf "\n"
for mode in "select-only:-S" "select-only-prepared:-S -M prepared" "tpcb-like:" ; do
  name=${mode%%:*}; args=${mode#*:}
  # shellcheck disable=SC2086
  direct=$(tps "$PG_PORT" $args)
  # shellcheck disable=SC2086
  relayed=$(tps "$RELAY_PORT" $args)
  ratio=$(awk -v a="$relayed" -v b="$direct" 'BEGIN { printf "%.1f%%", 100 * a / b }')
  printf "%-24s %9.0f %12.0f %8s" "$name" "$direct" "$relayed" "$ratio"
  if [ -n "$BOUNCER" ]; then
    # shellcheck disable=SC2086
    bounced=$(tps "$BOUNCER_PORT" $args)
    printf " %13.0f %8s" "$bounced" "$(awk -v a="$bounced" -v b="$direct" 'BEGIN { printf "%.1f%%", 100 * a / b }')"
  fi
  printf "\n"
done
