#!/usr/bin/env bash
# A mid-epoch resume on another number of trainers at hundreds of thousands of one-record slots,
# real processes (issue 20 items 2-3): 3 `sluice consume` trainers of a job with split size 1 and
# batches of 1 (one slot per record) each read S batches, save their states and leave; 2 trainers
# resume from the 3 states (--restore-state s0,s1,s2 --num-consumers 2) and each read S batches.
# Before the re-partition was computed rather than listed, the resumed job could not start past
# ~200,000 slots (its answers passed gRPC's 4 MB limit). In the same run, as the baseline, 2
# trainers of a fresh job of the same dataset and split size read S batches each.
#
#   bench/resize_scale.sh [--records N] [--steps S] [--rounds R]
#
# Per round: a dispatcher and one worker (--capacity 64, heartbeats every 100 ms), then
#   old    the 3 trainers of job "r", S batches each, states saved
#   resume the 2 trainers resuming job "r": wall time to exit and to the first batch
#   fresh  the 2 trainers of a fresh job "f" (2 consumers): the same, for the ratio
#   ref    consumer 0 of 3 of job "ref", 2S batches: the uninterrupted order of its share
# Checks (exit 1 otherwise): every process exits 0; the resumed trainer 0's S records are the
# uninterrupted run's records S..2S-1 of old consumer 0 (the global order continues); no record
# the old trainers returned is returned again. Prints the state sizes (old states and the resumed
# trainers' states, which carry the re-partition) and per round resume/fresh time ratios; the
# median [min-max] over rounds. Needs build/bin/{sluice,sluice-dispatcher,sluice-worker,
# small_records_bench} (SLUICE_BUILD_DIR for another build folder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BUILD_DIR:-$root/build}/bin"
records=300000
steps=2000
rounds=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --records) records="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "resize_scale.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for n in "$records" "$steps" "$rounds"; do
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
    echo "resize_scale.sh: --records, --steps and --rounds must be positive integers" >&2
    exit 2
  fi
done
for b in sluice sluice-dispatcher sluice-worker small_records_bench; do
  [[ -x "$bin/$b" ]] || { echo "resize_scale.sh: $bin/$b is missing" >&2; exit 1; }
done
# shellcheck source=bench/lib/cluster.sh
source "$root/bench/lib/cluster.sh"
bench_start resize-scale
"$bin/small_records_bench" --make "$work/ds" --records "$records" >/dev/null
cat >"$work/spec.yaml" <<EOF
seed: 1
source:
  dataset: {path: $work/ds}
  columns: [label, feature]
nodes:
  - batch: {size: 1}
EOF
echo "# $records records, split size 1, batch 1: $records one-record slots; $steps steps"

# consume OUT JOB INDEX WORLD [FLAG...]: one trainer, its output in $work/OUT.{log,ids}.
consume() {
  local out="$1" job="$2" index="$3" world="$4"
  shift 4
  "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$work/spec.yaml" --job "$job" \
    --deterministic --split-size 1 --consumer-index "$index" --num-consumers "$world" \
    --ids-out "$work/$out.ids" "$@" >"$work/$out.log" 2>&1 || {
    echo "sluice consume ($out) failed:" >&2
    tail -5 "$work/$out.log" >&2
    return 1
  }
}
first_batch() { sed -n 's/.*first batch after \([0-9.]*\)s.*/\1/p' "$work/$1.log"; }
now() { date +%s.%N; }

rows=()
for ((r = 1; r <= rounds; r++)); do
  start_dispatcher "$work/c$r"
  start_worker "$work/c$r" worker --data-root "$work" --capacity 64 --heartbeat-interval 100ms
  pids=()
  for k in 0 1 2; do
    consume "old$r.$k" "r$r" "$k" 3 --stop-after-batches "$steps" \
      --save-state "$work/s$r.$k" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  states="$work/s$r.0,$work/s$r.1,$work/s$r.2"
  t0="$(now)"
  pids=()
  for j in 0 1; do
    consume "new$r.$j" "r$r" "$j" 2 --restore-state "$states" --stop-after-batches "$steps" \
      --save-state "$work/n$r.$j" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  t_resume="$(echo "$(now) - $t0" | bc -l)"
  t0="$(now)"
  pids=()
  for j in 0 1; do
    consume "fresh$r.$j" "f$r" "$j" 2 --stop-after-batches "$steps" --save-state "$work/f$r.$j" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  t_fresh="$(echo "$(now) - $t0" | bc -l)"
  # Last: its consumers 1 and 2 never come, so it holds the worker until their lease ends.
  consume "ref$r" "ref$r" 0 3 --stop-after-batches $((2 * steps)) --save-state "$work/ref$r.state"
  stop_cluster

  # The resumed trainer 0 continues old consumer 0's share where it stopped.
  if ! cmp -s <(sed -n "$((steps + 1)),$((2 * steps))p" "$work/ref$r.ids") "$work/new$r.0.ids"; then
    echo "round $r: resumed trainer 0 did not continue the uninterrupted order" >&2
    exit 1
  fi
  dups="$(cat "$work"/old$r.*.ids "$work"/new$r.*.ids | sort | uniq -d | wc -l)"
  if [[ "$dups" != 0 ]]; then echo "round $r: $dups records returned twice" >&2; exit 1; fi
  got="$(cat "$work"/new$r.*.ids | wc -l)"
  [[ "$got" == $((2 * steps)) ]] || { echo "round $r: resumed $got records" >&2; exit 1; }
  old_bytes="$(stat -c %s "$work/s$r.0" "$work/s$r.1" "$work/s$r.2" | sort -n | tail -1)"
  new_bytes="$(stat -c %s "$work/n$r.0" "$work/n$r.1" | sort -n | tail -1)"
  fb_resume="$(first_batch "new$r.0")"
  fb_fresh="$(first_batch "fresh$r.0")"
  ratio="$(echo "$t_resume / $t_fresh" | bc -l)"
  printf 'round %d  resume %.2fs (first batch %.3fs)  fresh %.2fs (first batch %.3fs)  ratio %.2f  largest state: old %d B, resumed %d B\n' \
    "$r" "$t_resume" "$fb_resume" "$t_fresh" "$fb_fresh" "$ratio" "$old_bytes" "$new_bytes"
  rows+=("$t_resume $t_fresh $ratio $fb_resume $fb_fresh $old_bytes $new_bytes")
done
col() { printf '%s\n' "${rows[@]}" | awk -v c="$1" '{print $c}' | summary "${2:-2}"; }
echo
echo "resumed 2 trainers, $steps batches each:  $(col 1) s  (first batch $(col 4 3) s)"
echo "fresh 2 trainers, $steps batches each:    $(col 2) s  (first batch $(col 5 3) s)"
echo "resume / fresh time:                       $(col 3)"
echo "largest saved state (bytes): old $(col 6 0), resumed $(col 7 0)"
