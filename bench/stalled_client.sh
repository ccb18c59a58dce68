#!/usr/bin/env bash
# A client that stops reading: does the worker's resident memory keep growing? (The integration
# test ServiceTest.ClientThatStopsReadingKeepsWorkerMemoryBounded checks the deterministic part:
# the worker's producers block and production stops far short of the epoch. RSS is the
# allocator's business, so its growth is measured here, not asserted there.)
#
# One sluice-dispatcher and one sluice-worker (--memory-mb 64 --queue-batches 4, 1 thread);
# a Python client opens a job of 25 MB float32 batches (8 x 3 x 512 x 512; the epoch is
# IMAGES / 8 batches, 1.5 GB at the default 480), reads one batch, then reads nothing for
# STALL seconds while the worker's RSS is sampled every 0.25 s. Per round: the RSS once the
# stall is 2 s old (as the test measured), the growth over the rest of the stall, and the peak;
# ROUNDS rounds (>= 3), each with a fresh worker; the figures are the median [min-max] of the
# rounds.
# Reference: the 1.5 GB an unbounded worker would hold; the test's old bound was 30 MB of growth.
#
#   bench/stalled_client.sh          IMAGES=480 STALL=4 ROUNDS=3 by default (about 1 min)
# Needs build/bin and build/python (SLUICE_BUILD_DIR for another build folder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
bin="$build/bin"
images="${IMAGES:-480}"
stall="${STALL:-4}"
rounds="${ROUNDS:-3}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
source "$root/bench/lib/cluster.sh"
bench_start stalled
make_dataset "$images" "$work/ds" 1
cat >"$work/spec.yaml" <<EOF
seed: 1
source: {dataset: {path: $work/ds}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 512, width: 512}}, {cast: {dtype: float32}}]}
  - batch: {size: 8}
EOF

rss_mb=(); growth_mb=(); peak_mb=()
for r in $(seq "$rounds"); do
  start_dispatcher "$work/round$r" --log-level warn
  start_worker "$work/round$r" worker --data-root "$work" --threads 1 --memory-mb 64 \
    --queue-batches 4 --log-level warn
  wpid=$worker_pid
  read -r rss growth peak < <(/usr/bin/python3 - "$dispatcher" "$work/spec.yaml" "$wpid" "$stall" <<'PY'
import sys, time
import sluice
dispatcher, spec, pid, stall = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

def rss():
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1.0

client = sluice.Client(dispatcher)
it = iter(client.open(spec, job="stall", epochs=1))
next(it)  # one batch, then nothing
start = time.monotonic()
samples = []
while time.monotonic() - start < stall:
    samples.append((time.monotonic() - start, rss()))
    time.sleep(0.25)
at2 = next(v for t, v in samples if t >= 2.0)
print("%.1f %.1f %.1f" % (at2, samples[-1][1] - at2, max(v for _, v in samples)))
import os
os._exit(0)
PY
)
  echo "round $r  worker RSS after 2 s of stall $rss MB, growth over the next $((${stall%.*} - 2)) s $growth MB, peak $peak MB"
  rss_mb+=("$rss"); growth_mb+=("$growth"); peak_mb+=("$peak")
  stop_cluster
done
echo
echo "== summary ($images images, $rounds rounds, median [min-max]; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "worker RSS, stall 2 s old       $(printf '%s\n' "${rss_mb[@]}" | summary 1) MB"
echo "growth over the rest of the stall $(printf '%s\n' "${growth_mb[@]}" | summary 1) MB  (the test's old bound: 30 MB)"
echo "peak                             $(printf '%s\n' "${peak_mb[@]}" | summary 1) MB  (unbounded: the $((images / 8 * 25)) MB epoch)"
