#!/usr/bin/env bash
# Runs every test sluice has, from a fresh Debian 12 machine (as root):
#   1. bootstrap: Debian packages + Release build with gcc (build/)
#   2. a clang build with -Wthread-safety -Werror (build-clang/): lock annotations are checked
#   3. the libFuzzer targets on the shard reader and manifest parser, SLUICE_FUZZ_SECONDS each
#   4. the GoogleTest suites through CTest (unit, CLI, and integration tests with real processes)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh

echo "== clang -Wthread-safety build"
cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O0 \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_THREAD_SAFETY=ON >/dev/null
cmake --build build-clang

echo "== fuzzers"
tests/fuzz/run.sh "${SLUICE_FUZZ_SECONDS:-30}"

echo "== unit, CLI and integration tests (ctest)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300
