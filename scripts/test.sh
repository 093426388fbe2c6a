#!/usr/bin/env bash
# Quick start, command 2: installs what is missing, builds with ASan+UBSan and runs every test,
# including those against a real PostgreSQL 15 (started by the tests) and the fuzzers.
#
#   PGRELAY_FUZZ_SECONDS=N   seconds per fuzz target (default 20; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
pgrelay_ensure_packages "${PGRELAY_BUILD_PACKAGES[@]}" "${PGRELAY_TEST_PACKAGES[@]}"

jobs=$(nproc)

echo "== build (g++, ASan+UBSan)"
cmake --preset asan >/dev/null
cmake --build build/asan

echo "== tests"
# Golden pgoutput streams recorded by the tests also seed the fuzzers.
export PGRELAY_GOLDEN_DIR="$PWD/build/golden"
mkdir -p "$PGRELAY_GOLDEN_DIR"
ctest --test-dir build/asan --output-on-failure -j "$jobs" | tee build/ctest-tests.log
total=$(grep -o 'tests failed out of [0-9]*' build/ctest-tests.log | grep -o '[0-9]*$')

fuzz_seconds=${PGRELAY_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  echo "== fuzzers (clang libFuzzer, ${fuzz_seconds}s each)"
  cmake --preset fuzz -DPGRELAY_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
  cmake --build build/fuzz
  ctest --test-dir build/fuzz --output-on-failure -j "$jobs" | tee build/ctest-fuzz.log
  grep -h '^fuzz fuzz_' build/fuzz/Testing/Temporary/LastTest.log || true
  total=$((total + $(grep -o 'tests failed out of [0-9]*' build/ctest-fuzz.log | grep -o '[0-9]*$')))
fi
# Every ctest run above passed (set -e and pipefail stop at the first failure).
echo "pgrelay: $total passed, 0 failed"
