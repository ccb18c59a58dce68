#!/usr/bin/env bash
# Control-plane scale of one sluice-dispatcher (issue: "A control plane you can trust").
#   1. journal_bench: Append latency/throughput of the SQLite journal alone, 1/8/32 threads,
#      synchronous=FULL (the default) and NORMAL.
#   2. dispatcher_scale: simulated workers (1 Hz) and consumers (5 Hz) making real gRPC heartbeats
#      with real progress to one real sluice-dispatcher, stepping the number of workers; per step
#      heartbeat latency p50/p99/max, errors, the dispatcher's CPU (cores, /proc/PID/stat) and RSS.
#      Goal: 2,000 workers + 200 consumers with p99 < 50 ms and the dispatcher under one core.
#
#   bench/dispatcher_scale.sh                    all steps, 15 s measured each, SQLite journal on
#   WORKERS=2000 DURATION=30s bench/dispatcher_scale.sh
#   JOURNAL_BENCH=0 ...                          skip journal_bench
#   DISPATCHER=/path/to/sluice-dispatcher ...    another build (e.g. before a change)
#   FULL_LISTS=1 ...                             consumers echo no list versions (old clients)
#   PERF_WORKERS=2000 bench/dispatcher_scale.sh  also `perf record -g` the dispatcher in that step
#   JOURNAL=0 ...                                no --work-dir (in-memory journal)
#   NICE=-10 ...                                 run bench + dispatcher at that niceness (needs root):
#                                                on a shared machine, keeps others' jobs from starving it
# The bench client runs on the same machine: its own CPU is printed too.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
workers="${WORKERS:-250,500,1000,1500,2000,3000}"
consumers="${CONSUMERS:-200}"
duration="${DURATION:-15s}"
warmup="${WARMUP:-5s}"
journal="${JOURNAL:-1}"
out="${OUT:-/tmp/dispatcher_scale}"
mkdir -p "$out"

if [[ -z "${SKIP_BUILD:-}" ]]; then
  cmake --build "$build" --target sluice-dispatcher dispatcher_scale journal_bench -j2 >/dev/null
fi

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ "${JOURNAL_BENCH:-1}" == 1 ]]; then
  echo "== journal_bench (SQLite journal Append, $out/journal)"
  for sync in full normal; do
    for threads in 1 8 32; do
      appends=$([[ $sync == full ]] && echo 1600 || echo 32000)
      "$build/bin/journal_bench" --work-dir "$out/journal" --threads "$threads" \
        --appends "$appends" --sync "$sync"
    done
  done
  rm -rf "$out/journal"
fi

echo "== dispatcher_scale (load $(cut -d' ' -f1-3 /proc/loadavg))"
args=(--dispatcher "${DISPATCHER:-$build/bin/sluice-dispatcher}" --workers "$workers" --consumers "$consumers"
      --duration "$duration" --warmup "$warmup" --log-dir "$out")
[[ "$journal" == 1 ]] && args+=(--work-root "$out/work")
[[ "${FULL_LISTS:-0}" == 1 ]] && args+=(--full-lists)
[[ -n "${PERF_WORKERS:-}" ]] && args+=(--perf-workers "$PERF_WORKERS" --perf-out "$out/perf.data")
nice_cmd=()
[[ -n "${NICE:-}" ]] && nice_cmd=(nice -n "$NICE")
echo "== niceness: ${NICE:-0}"
"${nice_cmd[@]}" "$build/bin/dispatcher_scale" "${args[@]}"
if [[ -n "${PERF_WORKERS:-}" && -s "$out/perf.data" ]]; then
  echo "== perf report (dispatcher, $PERF_WORKERS workers): top symbols"
  perf report -i "$out/perf.data" --no-children --sort symbol --stdio 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -40 || true
fi
