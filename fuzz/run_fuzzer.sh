#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time, seeded from fuzz/seeds/NAME and from golden
# streams recorded by the tests ($PGRELAY_GOLDEN_DIR/NAME); fails on any crash, leak or
# sanitizer report, and prints the number of executions.
set -euo pipefail
binary=$1 name=$2 seconds=$3 corpus_root=$4
here=$(cd "$(dirname "$0")" && pwd)
work="$corpus_root/$name"
mkdir -p "$work" "$corpus_root/artifacts"
seeds=()
[ -d "$here/seeds/$name" ] && seeds+=("$here/seeds/$name")
[ -n "${PGRELAY_GOLDEN_DIR:-}" ] && [ -d "$PGRELAY_GOLDEN_DIR/$name" ] && seeds+=("$PGRELAY_GOLDEN_DIR/$name")
log="$corpus_root/$name.log"
status=0
"$binary" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$corpus_root/artifacts/$name-" "$work" "${seeds[@]}" >"$log" 2>&1 || status=$?
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
if [ "$status" -ne 0 ]; then
  tail -n 60 "$log"
  echo "fuzz $name: FAILED after $execs executions (exit $status); reproducer in $corpus_root/artifacts/"
  exit 1
fi
echo "fuzz $name: $execs executions in ${seconds}s, no crash"
