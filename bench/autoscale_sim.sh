#!/usr/bin/env bash
# Autoscaling policies side by side in the discrete-event simulator (bench/autoscale_sim/): sluice's
# (the dispatcher's own dispatcher/autoscaler code), Cachew's, tf.data service's and a CPU HPA, on
# the same load steps. Prints the table recorded in docs/BENCHMARKS.md ("Autoscaling policies").
#
#   bench/autoscale_sim.sh [autoscale_sim flags]        e.g. --seed 2, --headroom 1.1
#
# Then it replays the traces in bench/autoscale_sim/traces/: tune/ (the ones sluice's policy was
# tuned on first), then every heldout*/ set (each reported blind before any tuning on it),
# separately, over ${SEEDS:-5} noise seeds:
# worker-seconds / oracle, trainer wait, periods to converge, direction changes, mean/p90 job
# completion time, and the goals' ratios against the best faithful peer.
#
# Builds the autoscale_sim target in ${SLUICE_BUILD_DIR:-build} (configure it first:
# cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release), writes the table as CSV and the combined
# trace to ${OUT:-/tmp/autoscale_sim}/, and plots it into docs/img/autoscale_sim.png with Debian's
# matplotlib (/usr/bin/python3). The simulation is deterministic and takes well under a second.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
out="${OUT:-/tmp/autoscale_sim}"
mkdir -p "$out"
cmake --build "$build" --target autoscale_sim -j2 >/dev/null
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bin/autoscale_sim" --csv "$out/table.csv" --series "$out/series.csv" "$@"
/usr/bin/python3 "$root/bench/autoscale_sim/plot.py" "$out/series.csv" "$root/docs/img/autoscale_sim.png"
echo "wrote $out/table.csv $out/series.csv docs/img/autoscale_sim.png"
for dir in "$root"/bench/autoscale_sim/traces/tune "$root"/bench/autoscale_sim/traces/heldout*/; do
  set_name="$(basename "$dir")"
  echo
  echo "## traces/$set_name"
  "$build/bin/autoscale_sim" --seeds "${SEEDS:-5}" --trace "$dir"/*.trace
done
