#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds pgrelay (optimized) and runs it.
# Arguments are passed to pgrelay; with none, pgrelay runs its main job.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
pgrelay_ensure_packages "${PGRELAY_BUILD_PACKAGES[@]}" "${PGRELAY_RUN_PACKAGES[@]}"

# Benchmarks need Google Benchmark, a test-only package: leave them out here.
cmake --preset release -DPGRELAY_BENCH=OFF >/dev/null
cmake --build build/release --target pgrelay
exec build/release/src/cli/pgrelay "$@"
