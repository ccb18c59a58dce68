#!/usr/bin/env bash
# Runs every test sluice has, from a fresh Debian 12 machine (as root):
#   1. bootstrap: Debian packages + Release build with gcc (build/)
#   2. one clang build (build-san/) that is at once
#        - the lock-annotation check (-Wthread-safety -Werror),
#        - the libFuzzer build (coverage instrumentation), and
#        - the ASan+UBSan build (UBSan findings abort)
#   3. the libFuzzer targets from build-san (tests/fuzz/run.sh: every parser of untrusted bytes),
#      SLUICE_FUZZ_SECONDS each (default 30)
#   4. every CTest test (unit, integration with real processes, deploy) under ASan+UBSan
#   5. with SLUICE_RUN_TSAN=1 only: a TSan build (build-tsan/). Off by default: Debian's Abseil is
#      not built with -fsanitize=thread, so TSan cannot see absl::Mutex and reports every access
#      guarded by one as a race. It needs an Abseil (and ideally gRPC) built with TSan first.
#   6. the offline deployment checks (deploy/check.sh: kustomize, schemas, promtool, dashboard)
#   7. the Python client's pytest suite against real local clusters
#   8. the Release build's CTest tests, last, so that its summary closes the run
# SLUICE_SKIP_SANITIZERS=1 skips 2-5 (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh

if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 1 ]]; then
  echo "== clang build: lock annotations, fuzzers, ASan+UBSan (build-san)"
  cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_THREAD_SAFETY=ON \
    -DSLUICE_FUZZ=ON -DSLUICE_BENCH=OFF >/dev/null
  cmake --build build-san

  echo "== fuzzers"
  SLUICE_FUZZ_BUILD_DIR="$PWD/build-san" tests/fuzz/run.sh "${SLUICE_FUZZ_SECONDS:-30}"

  # Sanitizer runtime options; the suppression files list third-party code only, with reasons.
  echo "== every test under ASan+UBSan (build-san)"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1" \
  LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir build-san --output-on-failure -j "$(nproc)" --timeout 600
fi
if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 1 && "${SLUICE_RUN_TSAN:-0}" == 1 ]]; then
  echo "== TSan build and tests (build-tsan)"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_TSAN=ON -DSLUICE_BENCH=OFF \
    >/dev/null
  cmake --build build-tsan
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" --timeout 600
fi

echo "== deployment: manifests, schemas, rules, dashboard (offline)"
deploy/check.sh

echo "== Python client (pytest, real local clusters)"
PYTHONPATH=build/python /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python

echo "== unit, CLI, integration and deploy tests (ctest, Release)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300
