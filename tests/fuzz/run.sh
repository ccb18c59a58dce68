#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in a separate build folder and runs each of them.
#
#   tests/fuzz/run.sh [RUNS] [FUZZER...]   default 5000 inputs per fuzzer, all fuzzers
#
# A run is deterministic: libFuzzer's seed is fixed (SLUICE_FUZZ_SEED, default 1) and each fuzzer
# executes a fixed number of inputs (RUNS) after replaying its corpus, so CI explores exactly the
# inputs the same command explores here, however loaded the machine is. To hunt for new bugs in a
# development run, give a time budget and a random seed instead:
#   SLUICE_FUZZ_SECONDS=600 SLUICE_FUZZ_SEED=0 tests/fuzz/run.sh 0 decode_fuzzer
# and keep every crash input found in tests/fuzz/corpus/<fuzzer>/ so every later run replays it.
#
# Env: SLUICE_FUZZ_BUILD_DIR (default build-fuzz), JOBS (build parallelism, default 2),
# FUZZ_ARGS (extra libFuzzer flags; e.g. FUZZ_ARGS="-fork=1 -ignore_crashes=1" keeps fuzzing past
# a crash, to survey every distinct crash in one run; the script still exits non-zero).
#
# Corpora: each fuzzer reads the checked-in seeds in tests/fuzz/corpus/<fuzzer>/ (written by
# tests/fuzz/make_seeds.sh; every crash input found is kept there too, so every run replays it
# first) and grows its own corpus in $SLUICE_FUZZ_BUILD_DIR/fuzz/corpus/<fuzzer>/ (the shard and
# manifest fuzzers are also seeded by fuzz_corpus_gen on every run). A crashing input is saved as
# $SLUICE_FUZZ_BUILD_DIR/fuzz/artifacts/<fuzzer>/crash-* and the script exits non-zero.
# Reproduce one with: <build>/bin/<fuzzer> <crash file>.
#
set -euo pipefail
runs="${1:-5000}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${SLUICE_FUZZ_BUILD_DIR:-$root/build-fuzz}"
fuzzers=(shard_reader_fuzzer manifest_fuzzer pipeline_spec_fuzzer worker_pipeline_fuzzer
  filter_fuzzer decode_fuzzer tfrecord_fuzzer webdataset_fuzzer dispatcher_fuzzer batch_fuzzer
  journal_fuzzer restore_state_fuzzer get_batches_fuzzer image_folder_fuzzer)
if (($#)); then fuzzers=("$@"); fi

# A build folder configured already (scripts/test.sh's build-san: SLUICE_FUZZ plus the lock
# annotations) is used as it is.
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_FUZZ=ON >/dev/null
fi
cmake --build "$build" --target "${fuzzers[@]}" fuzz_corpus_gen -j "${JOBS:-2}"

work="$build/fuzz"
# A counted run starts from the kept seeds alone (a corpus grown by an earlier run would make it
# explore other inputs than CI's); a time-budgeted hunt keeps growing its corpus.
if [[ -z "${SLUICE_FUZZ_SECONDS:-}" ]]; then
  for f in "${fuzzers[@]}"; do rm -rf "$work/corpus/$f"; done
fi
for f in "${fuzzers[@]}"; do mkdir -p "$work/corpus/$f"; done
mkdir -p "$work/corpus/shard_reader_fuzzer" "$work/corpus/manifest_fuzzer"
"$build/bin/fuzz_corpus_gen" "$work/corpus/shard_reader_fuzzer" "$work/corpus/manifest_fuzzer"

failed=()
for f in "${fuzzers[@]}"; do
  mkdir -p "$work/artifacts/$f"
  touch "$work/$f.started"
  if [[ -n "${SLUICE_FUZZ_SECONDS:-}" ]]; then
    budget=(-max_total_time="$SLUICE_FUZZ_SECONDS")
    echo "=== $f: ${SLUICE_FUZZ_SECONDS}s (time budget)"
  else
    budget=(-runs="$runs")
    echo "=== $f: $runs inputs"
  fi
  count() { find "$work/artifacts/$f" -type f | wc -l; }
  before=$(count)
  seeds=()
  if [[ -d "$root/tests/fuzz/corpus/$f" ]]; then seeds=("$root/tests/fuzz/corpus/$f"); fi
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  if ! "$build/bin/$f" "${budget[@]}" -max_len=1048576 -timeout=60 -rss_limit_mb=2048 \
      -print_final_stats=1 -seed="${SLUICE_FUZZ_SEED:-1}" -artifact_prefix="$work/artifacts/$f/" ${FUZZ_ARGS:-} \
      "$work/corpus/$f" "${seeds[@]}" 2>"$work/$f.log" || (($(count) > before)); then
    failed+=("$f")
    grep -E '^(==[0-9]+==ERROR|SUMMARY|[a-z_]+_fuzzer:|terminate|.*runtime error|    #[0-9]+ )' \
      "$work/$f.log" | cut -c1-200 | head -40 || true
    find "$work/artifacts/$f" -type f -newer "$work/$f.started" | sed "s|^|crash input: |"
  fi
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ *DONE)' "$work/$f.log" || true
done
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]} (logs in $work/)" >&2
  exit 1
fi
echo "OK: ${fuzzers[*]} ran without a crash"
