#!/usr/bin/env bash
# The epoch-boundary gap (issue 20 item 1: "the next epoch's slots are assigned before the current
# epoch is reported done"): how long a trainer waits for the first batch of epoch e+1 after it
# returned the last batch of epoch e, against its median wait for a batch within an epoch.
#   cluster  real sluice-dispatcher + 2 sluice-worker (default flags), fresh per round;
#   trainer  `sluice consume --epochs EPOCHS --step-time STEP_MS ms` over IMAGES synthetic JPEGs
#            (bench/pipelines/imagenet_train.yaml; the step stands in for a training step, so that
#            the prefetch hides production within an epoch); its "epoch gaps" line: the wait
#            at each boundary, and the median wait within an epoch.
# ROUNDS rounds (default 3, at least 3). Headlines: the median over rounds of each round's median
# boundary gap, with the range [min-max], and that gap in training steps (what a boundary costs
# the trainer; within an epoch the prefetch hides production, the wait is ~0).
#
#   bench/epoch_gap.sh       IMAGES=2000 EPOCHS=4 STEP_MS=50 ROUNDS=3 (about 2 min on 2 cores)
# Needs build/bin (or SLUICE_BIN_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-2000}"
epochs="${EPOCHS:-4}"
step_ms="${STEP_MS:-50}"
rounds="${ROUNDS:-3}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
if (( epochs < 2 )); then echo "EPOCHS must be >= 2 (a boundary needs two epochs)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start epoch-gap
echo "== data: $images synthetic JPEGs; $epochs epochs, step ${step_ms} ms"
make_dataset "$images" "$work/ds"

median() { sort -g | awk '{v[NR] = $1} END {
  printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for r in $(seq "$rounds"); do
  mkdir -p "$work/r$r"
  start_dispatcher "$work/r$r" --log-level warn
  for w in 1 2; do start_worker "$work/r$r" "worker$w" --data-root "$work" --log-level warn; done
  "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" \
    --job "gap-$r" --epochs "$epochs" --step-time "${step_ms}ms" >"$work/r$r/consume.txt" 2>/dev/null
  stop_cluster
  line="$(grep '^epoch gaps:' "$work/r$r/consume.txt")"
  gaps="$(sed 's/^epoch gaps:\(.*\) s;.*/\1/' <<<"$line")"
  tr ' ' '\n' <<<"$gaps" | sed '/^$/d' | median >"$work/gap.$r"
  sed 's/.*median wait within an epoch \([0-9.]*\) s.*/\1/' <<<"$line" >"$work/wait.$r"
  printf 'round %s  boundary gaps%s s (median %s s)  median wait within an epoch %s s\n' \
    "$r" "$gaps" "$(cat "$work/gap.$r")" "$(cat "$work/wait.$r")"
done

echo
echo "== summary ($rounds rounds, median [min-max]; machine: $(nproc) cores; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "  epoch-boundary gap                $(per_round 'cat $work/gap.$r' | summary 4) s"
echo "  wait for a batch within an epoch  $(per_round 'cat $work/wait.$r' | summary 4) s"
echo "  gap in training steps of $step_ms ms  $(per_round 'awk -v a=$(cat $work/gap.$r) -v s=$step_ms "BEGIN {printf \"%.2f\", 1000 * a / s}"' | summary 2)"
