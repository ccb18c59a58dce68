#!/usr/bin/env bash
# Runs every test sluice has, from a fresh Debian 12 machine (as root):
#   1. bootstrap: Debian packages + Release build with gcc (build/)
#   2. a clang build with -Wthread-safety -Werror (build-clang/): lock annotations are checked
#   3. the libFuzzer targets (tests/fuzz/run.sh: every parser of untrusted bytes), SLUICE_FUZZ_SECONDS
#      each (default 30)
#   4. an ASan+UBSan build (build-asan/) running every CTest test, unit and integration
#   5. with SLUICE_RUN_TSAN=1 only: a TSan build (build-tsan/) running every CTest test but the heavy
#      end-to-end ones (service_test, payload_test), which already ran under ASan (SLUICE_TSAN_ALL=1
#      runs them too). Off by default: Debian's Abseil is not built with -fsanitize=thread, so TSan
#      cannot see absl::Mutex and reports every access guarded by one as a race (e.g. OrderedQueue
#      Push/Pop, both under mu_). It needs an Abseil (and ideally gRPC) built with TSan first.
#   6. the GoogleTest suites of the Release build through CTest (unit, CLI, and integration tests
#      with real processes), last so that its summary closes the run
# SLUICE_SKIP_SANITIZERS=1 skips 4 and 5 (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh

echo "== clang -Wthread-safety build"
cmake -S . -B build-clang -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O0 \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_THREAD_SAFETY=ON >/dev/null
cmake --build build-clang

echo "== fuzzers"
tests/fuzz/run.sh "${SLUICE_FUZZ_SECONDS:-30}"

if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 1 ]]; then
  # Sanitizer runtime options; the suppression files list third-party code only, with reasons.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1"
  export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

  echo "== ASan+UBSan build and tests (build-asan)"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_SANITIZE=ON -DSLUICE_BENCH=OFF \
    >/dev/null
  cmake --build build-asan
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 600
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
fi
if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 1 && "${SLUICE_RUN_TSAN:-0}" == 1 ]]; then
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"
  echo "== TSan build and tests (build-tsan)"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_TSAN=ON -DSLUICE_BENCH=OFF \
    >/dev/null
  cmake --build build-tsan
  tsan_exclude=(-E '^(ServiceTest|PayloadTest)\.')
  if [[ "${SLUICE_TSAN_ALL:-0}" == 1 ]]; then tsan_exclude=(); fi
  ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" --timeout 600 "${tsan_exclude[@]}"
  unset TSAN_OPTIONS
fi

echo "== unit, CLI and integration tests (ctest)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300
