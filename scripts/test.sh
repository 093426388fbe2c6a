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

fuzz_seconds=${PGRELAY_FUZZ_SECONDS:-20}
fuzz_build=
if [ "$fuzz_seconds" -gt 0 ]; then
  # The fuzz build runs beside the tests at the lowest priority: it takes the CPU the tests
  # leave idle while they wait on servers and timers, and hardly any they could use. It runs in
  # a session of its own (so that it can be killed as a group), and with the kernel's autogroup
  # scheduling (on in Debian) a session is a scheduling group that gets an equal share of the
  # CPU whatever its processes' nice: the group's own nice is what makes it yield. Measured on
  # 2 cores: without it, CPU-bound work beside a nice 19 session ran at half speed.
  cmake --preset fuzz -DPGRELAY_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
  setsid bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; exec nice -n 19 cmake --build build/fuzz' \
    >build/fuzz-build.log 2>&1 &
  fuzz_build=$!
  # A failed test run stops the script: the build's process group goes with it.
  trap 'kill -- -"$fuzz_build" 2>/dev/null || true' EXIT
fi

echo "== tests"
# Golden pgoutput streams recorded by the tests also seed the fuzzers.
export PGRELAY_GOLDEN_DIR="$PWD/build/golden"
mkdir -p "$PGRELAY_GOLDEN_DIR"
ctest --test-dir build/asan --output-on-failure -j "$jobs" | tee build/ctest-tests.log
total=$(grep -o 'tests failed out of [0-9]*' build/ctest-tests.log | grep -o '[0-9]*$')

if [ -n "$fuzz_build" ]; then
  echo "== fuzzers (clang libFuzzer, ${fuzz_seconds}s each)"
  if ! wait "$fuzz_build"; then
    cat build/fuzz-build.log
    echo "pgrelay: the fuzz build failed (above)" >&2
    exit 1
  fi
  tail -1 build/fuzz-build.log
  ctest --test-dir build/fuzz --output-on-failure -j "$jobs" | tee build/ctest-fuzz.log
  grep -h '^fuzz fuzz_' build/fuzz/Testing/Temporary/LastTest.log || true
  total=$((total + $(grep -o 'tests failed out of [0-9]*' build/ctest-fuzz.log | grep -o '[0-9]*$')))
fi
# Every ctest run above passed (set -e and pipefail stop at the first failure).
echo "pgrelay: $total passed, 0 failed"
