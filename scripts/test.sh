#!/usr/bin/env bash
# Runs every test sluice has, from a fresh Debian 12 machine (as root):
#   1. bootstrap: Debian packages + Release build with gcc (build/); the format check
#      (scripts/format.sh --check: every C++ file as clang-format writes it, 100 columns)
#   2. one clang build (build-san/) that is at once
#        - the lock-annotation check (-Wthread-safety -Werror),
#        - the libFuzzer build (coverage instrumentation), and
#        - the ASan+UBSan build (UBSan findings abort)
#   3. the libFuzzer targets from build-san (tests/fuzz/run.sh: every parser of untrusted bytes),
#      a fixed number of inputs each after their kept corpus (SLUICE_FUZZ_RUNS, default 5000),
#      with a fixed seed: the same inputs on every machine, whatever its load
#   4. every CTest test (unit, integration with real processes, deploy) under ASan+UBSan
#   5. a TSan build (build-tsan/) of the threaded components' unit tests, run against Debian's
#      own Abseil rebuilt with -fsanitize=thread (scripts/build_tsan_abseil.sh; the programs'
#      RPATH picks it, so absl::Mutex is visible to TSan). Only tests whose threads do not
#      cross gRPC: gRPC itself stays uninstrumented, and its hand-offs (completion queues,
#      reactor ref counts) are invisible to TSan, so every gRPC test reports false races
#      (docs/security.md, "ThreadSanitizer"). SLUICE_RUN_TSAN=all builds and runs every test.
#      SLUICE_RUN_TSAN=0 skips it.
#   6. the offline deployment checks (deploy/check.sh: kustomize, schemas, promtool, dashboard)
#   7. the Python client's pytest suite against real local clusters
#   8. the Release build's CTest tests, last, so that its summary closes the run
# SLUICE_SKIP_SANITIZERS=1 skips 2-5 (a quick local run). Under CI (CI=true, which .ci/run
# sets) neither it nor SLUICE_RUN_TSAN=0 is accepted: the run stops instead of passing without
# its sanitizer stages.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${CI:-false}" != false && "${CI:-}" != 0 ]]; then
  if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 0 || "${SLUICE_RUN_TSAN:-1}" == 0 ]]; then
    echo "scripts/test.sh: CI=${CI} runs every sanitizer stage; unset SLUICE_SKIP_SANITIZERS" \
      "(=${SLUICE_SKIP_SANITIZERS:-}) and SLUICE_RUN_TSAN (=${SLUICE_RUN_TSAN:-})" \
      "(they are for local runs)" >&2
    exit 2
  fi
fi
# Each stage's header carries the time since the start, so a CI log shows what each one took.
stage() { echo "== [+${SECONDS}s] $*"; }

stage "bootstrap: packages and the Release build (build/)"
scripts/bootstrap.sh

stage "format: clang-format --dry-run (scripts/format.sh --check)"
scripts/format.sh --check

if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 1 ]]; then
  stage "clang build: lock annotations, fuzzers, ASan+UBSan (build-san)"
  cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_THREAD_SAFETY=ON \
    -DSLUICE_FUZZ=ON -DSLUICE_BENCH=OFF >/dev/null
  cmake --build build-san

  stage "fuzzers"
  SLUICE_FUZZ_BUILD_DIR="$PWD/build-san" tests/fuzz/run.sh "${SLUICE_FUZZ_RUNS:-5000}"

  # Sanitizer runtime options; the suppression files list third-party code only, with reasons.
  stage "every test under ASan+UBSan (build-san)"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1" \
  LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir build-san --output-on-failure -j "$(nproc)" --timeout 600
fi
if [[ "${SLUICE_SKIP_SANITIZERS:-0}" != 1 && "${SLUICE_RUN_TSAN:-1}" != 0 ]]; then
  stage "TSan: Debian's Abseil instrumented (build-tsan/absl)"
  absl_lib="$(scripts/build_tsan_abseil.sh build-tsan | tail -1)"
  stage "TSan build and tests of the threaded components (build-tsan)"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_TSAN=ON -DSLUICE_BENCH=OFF \
    -DSLUICE_TSAN_ABSL_LIB="$absl_lib" >/dev/null
  tsan_env=(TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp")
  if [[ "${SLUICE_RUN_TSAN:-1}" == all ]]; then
    cmake --build build-tsan
    env "${tsan_env[@]}" ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" \
      --timeout 600 -E '^deploy_'
  else
    # Worker: ConsumerQueues, TaskRunner, JobRegistry, WorkerImpl (fake dispatcher); the
    # executor and its queues; the dispatcher's handlers and state; the client's iterator state
    # and buffer pool.
    tsan_tests=(worker_impl_test pipeline_executor_test batch_assembler_test ordered_queue_test
                dispatcher_impl_test dispatcher_state_test iterator_state_test buffer_pool_test)
    cmake --build build-tsan --target "${tsan_tests[@]}"
    for t in "${tsan_tests[@]}"; do
      echo "-- $t (TSan)"
      env "${tsan_env[@]}" SLUICE_BIN_DIR="$PWD/build-tsan/bin" timeout 900 \
        "build-tsan/bin/$t" --gtest_brief=1
    done
  fi
fi

stage "deployment: manifests, schemas, rules, dashboard (offline)"
deploy/check.sh

stage "Python client (pytest, real local clusters)"
PYTHONPATH=build/python /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python

stage "unit, CLI, integration and deploy tests (ctest, Release)"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300
stage "done"
