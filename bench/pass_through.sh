#!/usr/bin/env bash
# Pass-through overhead: pgbench TPS through pgrelay vs directly against the same upstream,
# side by side in one run (select-only and the default TPC-B-like script). pgrelay runs twice:
# as it starts by default (a new upstream backend per session), and "pgrelay kept" with
# --pool-idle-timeout, which keeps a backend for the next session as pgbouncer does. When
# pgbouncer is installed (apt-get install pgbouncer), it runs too, in session mode, as the
# reference for what any proxy in the path costs on the same machine, twice:
#  - "pgbouncer": its defaults, which keep a server connection after its client leaves and give
#    it to the next client. Each round's pgbench clients then run on backends that earlier
#    rounds warmed (shared buffers already mapped, caches filled), which direct connections and
#    pgrelay (one new upstream backend per session) do not have.
#  - "pgbouncer 1:1": server_lifetime = 0, a new server connection per client, as direct and
#    pgrelay: the like-for-like cost of the proxy in the path.
#
# Usage: bench/pass_through.sh [PGRELAY_BINARY]   (default: build/release/src/cli/pgrelay)
# Settings: CLIENTS (default 8), SECONDS_PER_RUN (default 15), SCALE (default 10), ROUNDS
# (default 3: direct, pgrelay and pgbouncer take turns, and each figure is the median of its
# rounds; on a 2-core machine one run of each swings by 20 points of share or more).
# Besides TPS, each proxy's CPU per transaction (user and system us, from /proc/PID/stat): the
# cost of the proxy itself, steadier than a share of TPS.
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=${1:-build/release/src/cli/pgrelay}
CLIENTS=${CLIENTS:-8}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
SCALE=${SCALE:-10}
ROUNDS=${ROUNDS:-3}
BIN=$(ls -d /usr/lib/postgresql/15/bin)
[ -x "$PGRELAY" ] || { echo "build pgrelay first: cmake --preset release && cmake --build build/release" >&2; exit 1; }

WORK=$(mktemp -d /tmp/pgrelay-bench-XXXXXX)
chmod 755 "$WORK"
PG_PORT=$((20000 + RANDOM % 10000))
RELAY_PORT=$((PG_PORT + 1))
BOUNCER_PORT=$((PG_PORT + 2))
FRESH_PORT=$((PG_PORT + 3))
KEPT_PORT=$((PG_PORT + 4))
AS=()
[ "$(id -u)" -eq 0 ] && { chown postgres "$WORK"; AS=(runuser -u postgres --); }
cleanup() {
  for pid in "${RELAY_PID:-}" "${KEPT_PID:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  for pidfile in "$WORK"/pgbouncer*.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
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

# In a session of its own, as pgbouncer (-d) and PostgreSQL (pg_ctl) are: with the kernel's
# autogroup scheduling (sched_autogroup_enabled, on in Debian), a session is one scheduling
# group, and a proxy left in this script's session would share pgbench's CPU share. Measured:
# 3.6 involuntary context switches per tpcb-like transaction there, 1.9 in its own session.
# Starts one pgrelay: NAME PORT [OPTION...]; its pid is in $STARTED_PID.
start_relay() {
  local name=$1 port=$2; shift 2
  setsid "$PGRELAY" serve --upstream "postgres://postgres:bench@127.0.0.1:$PG_PORT/postgres?sslmode=disable" \
    --listen "127.0.0.1:$port" --data-dir "$WORK/$name" --no-tls "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" &
  STARTED_PID=$!
  for _ in $(seq 100); do grep -q "pgrelay ready" "$WORK/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "pgrelay ready" "$WORK/$name.out" || { cat "$WORK/$name.err" >&2; exit 1; }
}
start_relay relay "$RELAY_PORT"
RELAY_PID=$STARTED_PID
start_relay relay-kept "$KEPT_PORT" --pool-idle-timeout 600  # pgbouncer's server_idle_timeout
KEPT_PID=$STARTED_PID

BOUNCER=$(command -v pgbouncer || true)
# Starts one pgbouncer: NAME PORT [SETTING...] (settings as lines of its ini file).
start_bouncer() {
  local name=$1 port=$2; shift 2
  {
    cat <<EOF
[databases]
postgres = host=127.0.0.1 port=$PG_PORT dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = plain
auth_file = $WORK/pgbouncer.users
pool_mode = session
max_client_conn = 200
default_pool_size = 100
logfile = $WORK/$name.log
pidfile = $WORK/$name.pid
EOF
    printf '%s\n' "$@"
  } > "$WORK/$name.ini"
  [ "$(id -u)" -eq 0 ] && chown postgres "$WORK/$name.ini"
  "${AS[@]}" "$BOUNCER" -d "$WORK/$name.ini"
}
if [ -n "$BOUNCER" ]; then
  echo '"postgres" "bench"' > "$WORK/pgbouncer.users"
  [ "$(id -u)" -eq 0 ] && chown postgres "$WORK/pgbouncer.users"
  start_bouncer pgbouncer "$BOUNCER_PORT" && start_bouncer pgbouncer-fresh "$FRESH_PORT" "server_lifetime = 0" ||
    BOUNCER=""
  sleep 0.5
fi

# One pgbench run against PORT; prints "TPS TRANSACTIONS".
run_pgbench() {  # PORT ARGS...
  local port=$1; shift
  "$BIN/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" "$@" postgres 2>/dev/null |
    awk '/^number of transactions actually processed: / { split($NF, n, "/"); t = n[1] }
         /^tps = / { print $3, t; exit }'
}
cpu_ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }  # user and system clock ticks
TICK_US=$((1000000 / $(getconf CLK_TCK)))
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Appends one round's figures for SYSTEM to $WORK/SYSTEM.MODE: TPS [user_us system_us per tx].
measure_round() {  # SYSTEM PORT PID MODE ARGS...
  local system=$1 port=$2 pid=$3 mode=$4; shift 4
  local u0 s0 u1 s1 tps n
  [ -n "$pid" ] && read -r u0 s0 < <(cpu_ticks "$pid")
  read -r tps n < <(run_pgbench "$port" "$@")
  if [ -n "$pid" ] && [ "${n:-0}" -gt 0 ]; then
    read -r u1 s1 < <(cpu_ticks "$pid")
    echo "$tps $(( (u1 - u0) * TICK_US * 100 / n )) $(( (s1 - s0) * TICK_US * 100 / n ))" >>"$WORK/$system.$mode"
  else
    echo "$tps" >>"$WORK/$system.$mode"
  fi
}
column_median() { awk -v c="$2" '{ print $c }' "$1" | median; }  # FILE COLUMN
share() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f%%", 100 * a / b }'; }
cpu_cell() {  # FILE: median user+system us per transaction (stored in hundredths)
  awk -v u="$(column_median "$1" 2)" -v s="$(column_median "$1" 3)" 'BEGIN { printf "%.1f+%.1f", u / 100, s / 100 }'
}

BOUNCER_PID=""
FRESH_PID=""
[ -n "$BOUNCER" ] && BOUNCER_PID=$(cat "$WORK/pgbouncer.pid") && FRESH_PID=$(cat "$WORK/pgbouncer-fresh.pid")
printf "%-22s %8s %9s %7s %10s %12s %7s %10s" workload direct pgrelay share "cpu us/tx" \
  "pgrelay kept" share "cpu us/tx"
[ -n "$BOUNCER" ] && printf " %9s %7s %10s %13s %7s %10s" pgbouncer share "cpu us/tx" "pgbouncer 1:1" share "cpu us/tx"
printf "   (median of %s rounds; cpu = user+system)\n" "$ROUNDS"
for mode in "select-only:-S" "select-only-prepared:-S -M prepared" "tpcb-like:" ; do
  name=${mode%%:*}; args=${mode#*:}
  for _ in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    measure_round direct "$PG_PORT" "" "$name" $args
    # shellcheck disable=SC2086
    measure_round pgrelay "$RELAY_PORT" "$RELAY_PID" "$name" $args
    # shellcheck disable=SC2086
    measure_round pgrelay-kept "$KEPT_PORT" "$KEPT_PID" "$name" $args
    if [ -n "$BOUNCER" ]; then
      # shellcheck disable=SC2086
      measure_round pgbouncer "$BOUNCER_PORT" "$BOUNCER_PID" "$name" $args
      # shellcheck disable=SC2086
      measure_round pgbouncer-fresh "$FRESH_PORT" "$FRESH_PID" "$name" $args
    fi
  done
  direct=$(column_median "$WORK/direct.$name" 1)
  relayed=$(column_median "$WORK/pgrelay.$name" 1)
  kept=$(column_median "$WORK/pgrelay-kept.$name" 1)
  printf "%-22s %8.0f %9.0f %7s %10s %12.0f %7s %10s" "$name" "$direct" "$relayed" \
    "$(share "$relayed" "$direct")" "$(cpu_cell "$WORK/pgrelay.$name")" \
    "$kept" "$(share "$kept" "$direct")" "$(cpu_cell "$WORK/pgrelay-kept.$name")"
  if [ -n "$BOUNCER" ]; then
    for system in pgbouncer pgbouncer-fresh; do
      bounced=$(column_median "$WORK/$system.$name" 1)
      width=9
      [ "$system" = pgbouncer-fresh ] && width=13
      printf " %${width}.0f %7s %10s" "$bounced" "$(share "$bounced" "$direct")" "$(cpu_cell "$WORK/$system.$name")"
    done
  fi
  printf "\n"
done
