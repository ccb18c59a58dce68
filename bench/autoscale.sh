#!/usr/bin/env bash
# `sluice local --autoscale` on real processes (docs/autoscaling.md): a pipeline whose cost is
# latency, not CPU (the sleep op: 20 ms per element, 2 threads, 2 splits at a time = ~200 el/s per
# worker), so it fits on 2 cores. One consumer (job A, batch 8, 40 ms step = 200 el/s) from t=0;
# a second job (B, 20 ms step = 400 el/s) joins at t=${JOIN:-30}s; both run a fixed number of
# epochs, ending around t=${END:-75}s; the run is sampled until t=${TOTAL:-100}s.
# Every second `sluice status --json` is recorded; bench/autoscale/plot.py draws workers, desired
# workers, throughput and trainer wait over time into docs/img/autoscale.png, and prints the
# per-step convergence (periods from a load step to the final desired count). Next to the run it
# draws the simulator's prediction for the same trace (autoscale_sim --bench-trace: the same
# demands, join and end times as measured here, a worker start-up of ${STARTUP:-0.5} s: decision
# to registration measured 0.31-0.70 s on the 2026-11-25 run, see the dispatcher log).
#
#   bench/autoscale.sh                 (builds sluice in ${SLUICE_BUILD_DIR:-build})
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
out="${OUT:-/tmp/sluice_autoscale_bench}"
JOIN="${JOIN:-30}"; TOTAL="${TOTAL:-100}"
cmake --build "$build" --target sluice sluice-dispatcher sluice-worker autoscale_sim -j2 >/dev/null
bin="$build/bin"
rm -rf "$out"; mkdir -p "$out"
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin/sluice" datagen --output "$out/jpegs" --images 960 --classes 10 --threads 1 >/dev/null
"$bin/sluice" record convert --input "$out/jpegs" --output "$out/ds" >/dev/null
cat > "$out/sleep.yaml" <<YAML
seed: 1
source:
  dataset: {path: $out/ds}
  columns: [label]
nodes:
  - map:
      input_columns: [label]
      num_parallel_workers: 2
      ops:
        - sleep: {micros: 20000}
  - batch: {size: 8, drop_remainder: false}
YAML
"$bin/sluice" local --autoscale --min-workers 1 --max-workers 6 --scale-interval 2s \
  --threads-per-worker 2 --data-root "$out" --work-dir "$out/cluster" \
  --address-file "$out/addr" > "$out/local.log" 2>&1 &
local_pid=$!
trap 'kill -TERM $local_pid 2>/dev/null || true; wait $local_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -s "$out/addr" ]] && break; sleep 0.2; done
addr="$(cat "$out/addr")"
start=$(date +%s.%N)
# 960 records in splits of 80: 12 splits per epoch, enough for several workers at once.
"$bin/sluice" consume --dispatcher "$addr" --spec "$out/sleep.yaml" --job A --epochs 15 \
  --step-time 40ms --split-size 80 > "$out/consumeA.log" 2>&1 &
a_pid=$!
(sleep "$JOIN"; "$bin/sluice" consume --dispatcher "$addr" --spec "$out/sleep.yaml" --job B \
  --epochs 17 --step-time 20ms --split-size 80 > "$out/consumeB.log" 2>&1) &
b_pid=$!
: > "$out/status.jsonl"
for _ in $(seq "$TOTAL"); do
  now=$(date +%s.%N)
  t=$(awk -v a="$now" -v b="$start" 'BEGIN { printf "%.2f", a - b }')
  if s=$("$bin/sluice" status --dispatcher "$addr" --json 2>/dev/null); then
    echo "{\"t\":$t,\"status\":$s}" >> "$out/status.jsonl"
  fi
  sleep 1
done
wait $a_pid $b_pid || true
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
tail -n 2 "$out/consumeA.log" "$out/consumeB.log"
# When each job ran out of epochs, from its own log ("consumed ... in 79.41s"), in the bench's time.
a_end=$(sed -n 's/.* in \([0-9.]*\)s; first batch.*/\1/p' "$out/consumeA.log")
b_end=$(sed -n 's/.* in \([0-9.]*\)s; first batch.*/\1/p' "$out/consumeB.log")
b_end=$(awk -v j="$JOIN" -v b="$b_end" 'BEGIN { printf "%.2f", j + b }')
"$build/bin/autoscale_sim" --seeds 0 --bench-trace "$out/simulated.csv" --bench-join "$JOIN" \
  --bench-a-end "$a_end" --bench-b-end "$b_end" --bench-startup "${STARTUP:-0.5}" \
  | sed -n '/^bench\/autoscale.sh replayed/,$p'
/usr/bin/python3 "$root/bench/autoscale/plot.py" "$out/status.jsonl" "$root/docs/img/autoscale.png" \
  "$JOIN" "$out/simulated.csv"
