#!/usr/bin/env bash
# Soak: differential fuzzing against native pgoutput for hours (tests/e2e/test_differential.py).
#
# Usage: bench/differential.sh [SECONDS] [FIRST_SEED]   (default 3600 s, from seed 1; build
#          first: cmake --preset asan && cmake --build build/asan --target pgrelay)
# Runs seeds in order, both capture modes each, until SECONDS have passed; every failing seed
# is printed with the one command that reproduces (and shrinks) it. PGRELAY chooses another
# binary (the release build runs more seeds an hour; the sanitized one catches more).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_BUDGET=${1:-3600}
FIRST=${2:-1}
PGRELAY=${PGRELAY:-build/asan/src/cli/pgrelay}
[ -x "$PGRELAY" ] || { echo "missing $PGRELAY: cmake --preset asan && cmake --build build/asan" >&2; exit 1; }
cd tests/e2e
exec /usr/bin/python3 -B test_differential.py "../../$PGRELAY" --seconds "$SECONDS_BUDGET" --first "$FIRST"
