#!/usr/bin/env bash
# A new job's first batch, two builds side by side under the same load (issue 20 item 1):
# one cluster per build (sluice-dispatcher + 2 sluice-worker, defaults, warmed by one job), and
# JOBS (default 30) rounds of one new job on each cluster in turn, each leaving after one batch
# (`sluice consume --stop-after-batches 1 --save-state`). On a shared, loaded machine the load
# changes from minute to minute; alternating the builds job by job puts both under the same.
# Prints p50, p90 (nearest rank) and max of each build's first batches, and the ratios B/A.
# Caveat: a build's leftover work after its job leaves (production still running into full
# queues) lands on the other build's next job; a change to that (jobs_over, issue 20) is
# measured with bench/first_batch.sh, one build at a time, instead.
#
#   bench/first_batch_ab.sh BIN_DIR_A BIN_DIR_B      (IMAGES=2000 JOBS=30; about 1 min)
# Each BIN_DIR holds sluice, sluice-dispatcher and sluice-worker.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if (( $# != 2 )); then echo "usage: $0 BIN_DIR_A BIN_DIR_B" >&2; exit 2; fi
images="${IMAGES:-2000}"
jobs="${JOBS:-30}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
bin="$1"
source "$root/bench/lib/cluster.sh"
bench_start first-batch-ab
make_dataset "$images" "$work/ds"
consume() {  # bin cluster job -> first-batch seconds
  "$1/sluice" consume --dispatcher "$(cat "$work/$2/dispatcher.address")" --spec "$spec" \
    --data "$work/ds" --job "$3" --epochs 1 --stop-after-batches 1 \
    --save-state "$work/$2/$3.state" 2>/dev/null | sed -n 's/.*first batch after \([0-9.]*\)s.*/\1/p'
}
bins=("$1" "$2")
for c in 0 1; do
  bin="${bins[$c]}"
  start_dispatcher "$work/$c"
  for w in 1 2; do start_worker "$work/$c" "worker$w" --data-root "$work"; done
  consume "${bins[$c]}" "$c" warmup >/dev/null
done
for j in $(seq "$jobs"); do
  for c in 0 1; do consume "${bins[$c]}" "$c" "job-$j" >>"$work/first.$c"; done
done
stats() { sort -g "$1" | awk '{v[NR] = $1} END {
  i = int(0.9 * NR); if (i < 0.9 * NR) i++
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "%.4f %.4f %.4f\n", m, v[i], v[NR] }'; }
read -r a50 a90 amax < <(stats "$work/first.0")
read -r b50 b90 bmax < <(stats "$work/first.1")
echo "== $jobs new jobs per build, alternated (load after: $(cut -d' ' -f1-3 /proc/loadavg))"
printf 'A %s\n  first batch p50 %.3f s  p90 %.3f s  max %.3f s\n' "$1" "$a50" "$a90" "$amax"
printf 'B %s\n  first batch p50 %.3f s  p90 %.3f s  max %.3f s\n' "$2" "$b50" "$b90" "$bmax"
awk -v a="$a50" -v b="$b50" -v c="$a90" -v d="$b90" \
  'BEGIN {printf "ratio B/A  p50 %.2f  p90 %.2f\n", b / a, d / c}'
