#!/usr/bin/env bash
# Startup benchmark: `pgrelay` (the embedded default) to its ready line, cold and warm, median of N.
#
# cold: a fresh directory, so the run includes initdb; warm: the same directory again. Beside
# it, in the same run, the native baseline: initdb + pg_ctl start -w (cold) and pg_ctl start -w
# (warm) of the same PostgreSQL. Usage: bench/startup.sh [PATH_TO_PGRELAY] (default: the
# release build); RUNS=N changes the number of runs (5).
set -euo pipefail
cd "$(dirname "$0")/.."
PGRELAY=$(realpath "${1:-build/release/src/cli/pgrelay}")
RUNS=${RUNS:-5}
PG_BIN=${PGRELAY_PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
work=$(mktemp -d /tmp/pgrelay-startup.XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

as_pg() {  # PostgreSQL's own programs refuse root
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# Milliseconds from starting pgrelay in $1 to its ready line; then stops it.
pgrelay_start_ms() {
  local dir=$1 fifo="$work/ready.fifo" t0 t1 pid line port
  rm -f "$fifo"
  mkfifo "$fifo"
  port=$(free_port)
  t0=$(now_ms)
  (cd "$dir" && exec "$PGRELAY" --listen "127.0.0.1:$port" >"$fifo" 2>>"$work/pgrelay.log") &
  pid=$!
  read -r line <"$fifo" || true
  t1=$(now_ms)
  case "$line" in "pgrelay ready: "*) ;; *) echo "no ready line (see $work/pgrelay.log)" >&2; exit 1 ;; esac
  kill -TERM "$pid"
  wait "$pid"
  echo $((t1 - t0))
}

# Milliseconds for the native baseline in $1: initdb when $2 = cold, then pg_ctl start -w.
native_start_ms() {
  local dir=$1 mode=$2 t0 t1
  t0=$(now_ms)
  if [ "$mode" = cold ]; then
    as_pg "$PG_BIN/initdb" -D "$dir" -U postgres -E UTF8 --no-locale -A trust --no-sync >/dev/null
  fi
  as_pg "$PG_BIN/pg_ctl" -D "$dir" -w -s -l "$dir.log" \
    -o "-c listen_addresses='' -c unix_socket_directories='$dir'" start >/dev/null
  t1=$(now_ms)
  as_pg "$PG_BIN/pg_ctl" -D "$dir" -w -s -m fast stop >/dev/null
  echo $((t1 - t0))
}

declare -a cold warm native_cold native_warm
mkdir -m 777 "$work/native"
for i in $(seq "$RUNS"); do
  mkdir -m 755 "$work/cold$i"
  cold+=("$(pgrelay_start_ms "$work/cold$i")")
  native_cold+=("$(native_start_ms "$work/native/c$i" cold)")
done
for i in $(seq "$RUNS"); do
  warm+=("$(pgrelay_start_ms "$work/cold1")")
  native_warm+=("$(native_start_ms "$work/native/c1" warm)")
done

report() {
  local name=$1 base=$2; shift 2
  local m b
  m=$(printf '%s\n' "$@" | median)
  b=$(printf '%s\n' ${base} | median)
  printf '%-6s pgrelay median %6s ms (runs: %s)   native PostgreSQL median %6s ms   ratio %.2f\n' \
    "$name" "$m" "$*" "$b" "$(awk -v m="$m" -v b="$b" 'BEGIN { print m / b }')"
}
echo "startup to ready, $RUNS runs each, $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
report cold "${native_cold[*]}" "${cold[@]}"
report warm "${native_warm[*]}" "${warm[@]}"
