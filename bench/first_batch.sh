#!/usr/bin/env bash
# A new job's first batch on a warm cluster, and a whole run, through the service vs in-process,
# in one run (issue 20 item 1):
#   cluster  real sluice-dispatcher + 2 sluice-worker with their default 1 s heartbeat, warmed
#            by one job before anything is timed;
#   (a)      JOBS (default 10) jobs started one after another (GAP seconds apart, default 0),
#            each leaving after one batch
#            (`sluice consume --stop-after-batches 1 --save-state`, as a trainer that checkpoints
#            and stops, or an evaluation loop that breaks early): "first batch after" of each,
#            from opening the job; p50 and p90 of the round (goal p90 <= 0.15 s);
#   (b)      the same pipeline in-process (`sluice pipeline run`): its first batch, from building
#            the pipeline, and its whole run;
#   (c)      the whole EPOCHS-epoch run of IMAGES images through the service (`sluice consume`,
#            startup included) vs (b)'s whole run: the ratio (goal >= 0.9), and the CPU-seconds
#            each side used (on one machine the service's processes share its cores); the
#            trainer shares the workers' host, so batches come through its shared-memory rings;
#            the same run with --shared-memory-mb 0 (loopback TCP) is printed beside it.
# ROUNDS rounds (default 3, at least 3); odd rounds run the service first, even rounds
# in-process first. Headlines are the median of the rounds with their range [min-max]; ratios
# are taken within a round.
#
#   bench/first_batch.sh        IMAGES=2000 EPOCHS=2 JOBS=10 ROUNDS=3 (about 2 min on 2 cores)
# SPEC picks the pipeline (default bench/pipelines/imagenet_train.yaml); EXTRA_FLAGS are given
# to the workers and to `pipeline run`, e.g. a python op's:
#   SPEC=bench/pipelines/python_path.yaml \
#     EXTRA_FLAGS="--allow-python-ops --python-path bench" bench/first_batch.sh
# Needs build/bin (or SLUICE_BIN_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-2000}"
epochs="${EPOCHS:-2}"
jobs="${JOBS:-10}"
rounds="${ROUNDS:-3}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
read -r -a extra_flags <<<"${EXTRA_FLAGS:-}"
gap="${GAP:-0}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start first-batch
echo "== data: $images synthetic JPEGs"
make_dataset "$images" "$work/ds"
echo "== cluster: sluice-dispatcher + 2 sluice-worker (default heartbeat interval)"
start_dispatcher "$work"
for w in 1 2; do start_worker "$work" "worker$w" --data-root "$work" "${extra_flags[@]}"; done

# The number after "<name>" on the last line that has it.
field() { sed -n "s/.*$1 *\([0-9.]*\).*/\1/p" "$2" | tail -1; }
# p50 and p90 (nearest rank) of the numbers on stdin: "p50 p90".
percentiles() { sort -g | awk '{v[NR] = $1} END {
  i = int(0.9 * NR); if (i < 0.9 * NR) i++
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "%.4f %.4f\n", m, v[i] }'; }

leave_after_one() {  # job name -> its first-batch seconds
  "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" --job "$1" \
    --epochs 1 --stop-after-batches 1 --save-state "$work/$1.state" >"$work/$1.txt" 2>/dev/null
  field "first batch after" "$work/$1.txt"
}
echo "== warm-up job"
leave_after_one warmup >/dev/null

# CPU-seconds (user + system) the cluster's processes have used so far.
servers_cpu() {
  local ticks=0 p
  for p in "${bench_pids[@]}"; do ticks=$((ticks + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz}'
}
service_round() {  # round
  for j in $(seq "$jobs"); do leave_after_one "fb-$1-$j"; sleep "$gap"; done >"$work/first.$1.txt"
  local before; before=$(servers_cpu)
  /usr/bin/time -f "trainer cpu %U %S" -o "$work/service-time.$1.txt" \
    "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" \
    --job "run-$1" --epochs "$epochs" >"$work/service.$1.txt" 2>/dev/null
  awk -v a="$before" -v b="$(servers_cpu)" 'BEGIN {printf "%.2f\n", b - a}' >"$work/servers-cpu.$1"
  awk '/trainer cpu/ {printf "%.2f\n", $3 + $4}' "$work/service-time.$1.txt" >"$work/trainer-cpu.$1"
  # The same run with the batches through loopback TCP only (no shared-memory ring).
  "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" \
    --job "tcp-$1" --epochs "$epochs" --shared-memory-mb 0 >"$work/service-tcp.$1.txt" 2>/dev/null
  read -r p50 p90 < <(percentiles <"$work/first.$1.txt")
  echo "$p50" >"$work/p50.$1"; echo "$p90" >"$work/p90.$1"
  printf 'round %s  service     first batch p50 %.3f s  p90 %.3f s (%s jobs)  whole run %s images/s\n' \
    "$1" "$p50" "$p90" "$jobs" "$(field "throughput:" "$work/service.$1.txt")"
}
inproc_round() {  # round
  /usr/bin/time -f "inproc cpu %U %S" -o "$work/inproc-time.$1.txt" \
    "$bin/sluice" pipeline run --spec "$spec" --data "$work/ds" --epochs "$epochs" \
    "${extra_flags[@]}" >"$work/inproc.$1.txt" 2>/dev/null
  awk '/inproc cpu/ {printf "%.2f\n", $3 + $4}' "$work/inproc-time.$1.txt" >"$work/inproc-cpu.$1"
  printf 'round %s  in-process  first batch %.3f s  whole run %s images/s\n' "$1" \
    "$(field "first batch after" "$work/inproc.$1.txt")" "$(field "throughput:" "$work/inproc.$1.txt")"
}
for r in $(seq "$rounds"); do
  if (( r % 2 )); then service_round "$r"; inproc_round "$r"; else inproc_round "$r"; service_round "$r"; fi
done

echo
echo "== summary ($rounds rounds, median [min-max]; machine: $(nproc) cores; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "service, $jobs new jobs on a warm cluster, each leaving after one batch"
echo "  first batch p50                 $(per_round 'cat $work/p50.$r' | summary 3) s"
echo "  first batch p90                 $(per_round 'cat $work/p90.$r' | summary 3) s  (goal <= 0.15 s)"
echo "in-process"
echo "  first batch                     $(per_round 'field "first batch after" $work/inproc.$r.txt' | summary 3) s"
echo "  ratio service p50 / in-process first batch   $(per_round 'awk -v a=$(cat $work/p50.$r) -v b=$(field "first batch after" $work/inproc.$r.txt) "BEGIN {printf \"%.3f\", a / b}"' | summary 3)"
echo "whole run, $images images x $epochs epochs (startup included)"
echo "  service images/s                $(per_round 'field "throughput:" $work/service.$r.txt' | summary 3)"
echo "  in-process images/s             $(per_round 'field "throughput:" $work/inproc.$r.txt' | summary 3)"
echo "  ratio service/in-process        $(per_round 'awk -v a=$(field "throughput:" $work/service.$r.txt) -v b=$(field "throughput:" $work/inproc.$r.txt) "BEGIN {printf \"%.3f\", a / b}"' | summary 3)  (goal >= 0.9)"
echo "  through shared memory           $(per_round 'sed -n "s/.* \([0-9]*\)% through shared memory.*/\1/p" $work/service.$r.txt' | summary 0) % of the bytes"
echo "  the same, loopback TCP only     $(per_round 'awk -v a=$(field "throughput:" $work/service-tcp.$r.txt) -v b=$(field "throughput:" $work/inproc.$r.txt) "BEGIN {printf \"%.3f\", a / b}"' | summary 3)  (--shared-memory-mb 0)"
echo "CPU-seconds of the whole run (user + system)"
echo "  in-process                      $(per_round 'cat $work/inproc-cpu.$r' | summary 2)"
echo "  service: workers + dispatcher   $(per_round 'cat $work/servers-cpu.$r' | summary 2)"
echo "  service: the trainer            $(per_round 'cat $work/trainer-cpu.$r' | summary 2)"
