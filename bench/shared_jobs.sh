#!/usr/bin/env bash
# Shared production (issue 21 item 4, docs/sharing.md): what 4 concurrent jobs with the same spec
# cost the workers, against 1 job, in one run:
#   (1)  1 job                            (`sluice consume`, EPOCHS epochs of IMAGES images)
#   (4s) 4 jobs at once, --sharing auto   (a hyperparameter sweep's trials: same spec and seed)
#   (4)  4 jobs at once, sharing off      (the reference: each job produces its own batches)
# Each case runs on a fresh cluster (sluice-dispatcher + 2 sluice-worker); its cost is the
# workers' CPU seconds (utime + stime from /proc/<pid>/stat, read when the jobs are done). Every
# job must get every record exactly once per epoch (checked from its --ids-out), or the run fails.
# The workers' own counters say how many slot productions ran (sluice_worker_splits_total
# {event="started"}) and how many tasks of other jobs they served (sluice_worker_shared_splits_
# total{event="joined"}); a slot a job missed while it started (the trials start a few ms apart)
# is produced again for it alone, at the end of its epoch (docs/sharing.md).
# Ratios: (4s)/(1) (goal <= 1.3) and (4)/(1). ROUNDS rounds (default 3, at least 3), the order of
# the cases rotating; headlines are the median of the rounds with their range [min-max].
#
#   bench/shared_jobs.sh        IMAGES=2000 EPOCHS=2 SPLIT=64 ROUNDS=3 (about 5 min on 2 cores)
# Needs build/bin (or SLUICE_BIN_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-2000}"
epochs="${EPOCHS:-2}"
split="${SPLIT:-64}"
rounds="${ROUNDS:-3}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start shared-jobs
echo "== data: $images synthetic JPEGs; spec $(basename "$spec"); $epochs epochs; split size $split"
make_dataset "$images" "$work/ds"

worker_pids=()
metrics_ports=()
# The sum over the workers of metric $1 with label event="$2".
worker_count() {
  local total=0 v
  for port in "${metrics_ports[@]}"; do
    v=$( (exec 3<>"/dev/tcp/127.0.0.1/$port"; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3) |
      awk -v m="$1" -v e="event=\"$2\"" 'index($0, m "{") == 1 && index($0, e) {s += $NF} END {print s + 0}')
    total=$(awk -v a="$total" -v b="$v" 'BEGIN {print a + b}')
  done
  echo "$total"
}
start_cluster() {  # name
  local dir="$work/$1"
  start_dispatcher "$dir"
  worker_pids=()
  metrics_ports=()
  for w in 1 2; do
    local port; port=$(free_port)
    metrics_ports+=("$port")
    start_worker "$dir" "worker$w" --metrics-port "$port" --data-root "$work"
    worker_pids+=("$worker_pid")
  done
}
run_case() {  # round case(1|4s|4) -> prints the workers' CPU seconds
  local name="r$1-$2" n=1 sharing=off
  [[ "$2" != 1 ]] && n=4
  [[ "$2" == 4s ]] && sharing=auto
  start_cluster "$name"
  local before; before=$(cpu_seconds "${worker_pids[@]}")
  local consumers=()
  for j in $(seq "$n"); do
    "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" \
      --job "trial-$j" --seed 1 --epochs "$epochs" --split-size "$split" --sharing "$sharing" \
      --ids-out "$work/$name/ids$j.txt" >"$work/$name/job$j.txt" 2>"$work/$name/job$j.err" &
    consumers+=($!)
  done
  for p in "${consumers[@]}"; do wait "$p"; done
  local after; after=$(cpu_seconds "${worker_pids[@]}")
  for j in $(seq "$n"); do
    # Each of the $images records exactly $epochs times.
    local bad
    bad=$(sort -n "$work/$name/ids$j.txt" | uniq -c |
      awk -v e="$epochs" -v n="$images" '$1 != e {bad++} END {print (bad > 0 || NR != n) ? "yes" : ""}')
    if [[ -n "$bad" ]]; then
      echo "case $2 job $j did not get every record exactly once per epoch:" >&2
      cat "$work/$name/job$j.txt" "$work/$name/job$j.err" >&2
      exit 1
    fi
  done
  awk -v a="$after" -v b="$before" 'BEGIN {printf "%.2f\n", a - b}' >"$work/cpu.$2.$1"
  local started joined
  started=$(worker_count sluice_worker_splits_total started)
  joined=$(worker_count sluice_worker_shared_splits_total joined)
  echo "$started" >"$work/started.$2.$1"
  stop_cluster
  printf 'round %s  %-3s %d job(s), sharing %-4s  worker CPU %6.2f s  slot productions %s (+%s tasks served by them)\n' \
    "$1" "$2" "$n" "$sharing" "$(cat "$work/cpu.$2.$1")" "$started" "$joined"
}

cases=(1 4s 4)
for r in $(seq "$rounds"); do
  for i in 0 1 2; do run_case "$r" "${cases[$(( (i + r) % 3 ))]}"; done
done

ratio() { awk -v a="$(cat "$work/cpu.$1.$r")" -v b="$(cat "$work/cpu.1.$r")" 'BEGIN {printf "%.3f", a / b}'; }
echo
echo "== summary ($rounds rounds, median [min-max]; machine: $(nproc) cores; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "worker CPU seconds, $images images x $epochs epochs per job"
echo "  1 job                           $(per_round 'cat $work/cpu.1.$r' | summary) s"
echo "  4 jobs, sharing auto            $(per_round 'cat $work/cpu.4s.$r' | summary) s"
echo "  4 jobs, sharing off             $(per_round 'cat $work/cpu.4.$r' | summary) s"
echo "  ratio 4 sharing / 1             $(per_round 'ratio 4s' | summary)  (goal <= 1.3)"
echo "  ratio 4 not sharing / 1         $(per_round 'ratio 4' | summary)"
echo "slot productions (sluice_worker_splits_total{event=\"started\"})"
echo "  1 job                           $(per_round 'cat $work/started.1.$r' | summary)"
echo "  4 jobs, sharing auto            $(per_round 'cat $work/started.4s.$r' | summary)"
echo "  4 jobs, sharing off             $(per_round 'cat $work/started.4.$r' | summary)"
