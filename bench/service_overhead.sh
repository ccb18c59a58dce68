#!/usr/bin/env bash
# The same pipeline in-process and through the service, on the same cores, in one run:
#   (a) sluice pipeline run                  (in-process: no gRPC, no dispatcher)
#   (b) sluice local --workers 1 + sluice consume   (worker and trainer as separate processes),
#       finish auto (the worker ships uint8, the trainer's client normalizes), then
#   (b') the same with --finish worker (float32 on the wire, for comparison)
# ROUNDS rounds (default 3); odd rounds run (a) first, even rounds (b) and (b') first, so neither
# side always runs on a warmer machine. Every headline figure is the median of the rounds with
# their range [min-max]; ratios are taken within a round, then their median.
# Each side is timed twice: over the whole run (the command's start to its last batch: job
# creation, the worker's pipeline start and the first batch included) and from the first batch.
# The trainer holds float32 [64, 3, 224, 224] either way.
# Prints images/s, the ratios (goal >= 0.85), bytes on the wire per image (goal <= 151 KB with
# finish auto), CPU-seconds per image of the worker and the trainer, the time to first batch,
# then uint8 batches through the data plane vs a plain TCP copy on loopback (transport_bench,
# median of its own runs; goal >= 0.8).
#
#   bench/service_overhead.sh            IMAGES=2000 EPOCHS=2 ROUNDS=3 by default (about 2 min)
# Needs build/bin from scripts/bootstrap.sh (or SLUICE_BIN_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-2000}"
epochs="${EPOCHS:-2}"
rounds="${ROUNDS:-3}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start overhead
echo "== data: $images synthetic JPEGs"
make_dataset "$images" "$work/ds"

# The number after "<name>:" in a file (the last such line).
field() { sed -n "s/^$1: *\([0-9.]*\).*/\1/p" "$2" | tail -1; }

echo "== cluster: sluice local --workers 1"
"$bin/sluice" local --workers 1 --data-root "$work" --address-file "$work/address" \
  --work-dir "$work/cluster" >"$work/local.txt" 2>&1 &
cluster_pid=$!
bench_pids+=("$cluster_pid")
for _ in $(seq 100); do [[ -s "$work/address" ]] && break; sleep 0.1; done
worker_pid=""
for _ in $(seq 100); do
  for p in $(pgrep -P "$cluster_pid" || true); do
    [[ "$(cat /proc/$p/comm 2>/dev/null)" == sluice-worker ]] && worker_pid=$p
  done
  [[ -n "$worker_pid" ]] && break
  sleep 0.1
done
[[ -n "$worker_pid" ]] || { echo "no sluice-worker under sluice local" >&2; exit 1; }

inproc_run() {  # round
  "$bin/sluice" pipeline run --spec "$spec" --data "$work/ds" --epochs "$epochs" >"$work/inproc.$1.txt"
  echo "round $1  in-process       whole run $(field throughput "$work/inproc.$1.txt")  from first batch $(field "throughput from first batch" "$work/inproc.$1.txt") images/s"
}
service_run() {  # round, finish
  local out="$work/service.$1.$2.txt" before after
  before=$(cpu_seconds "$worker_pid")
  "$bin/sluice" consume --dispatcher "$(cat "$work/address")" --spec "$spec" --data "$work/ds" \
    --job "overhead-$1-$2" --epochs "$epochs" --finish "$2" >"$out"
  after=$(cpu_seconds "$worker_pid")
  awk -v a="$after" -v b="$before" 'BEGIN {printf "worker cpu: %.3f s\n", a - b}' >>"$out"
  printf 'round %s  service %-7s  whole run %s  from first batch %s images/s\n' "$1" "$2" \
    "$(field throughput "$out")" "$(field "throughput from first batch" "$out")"
}
for r in $(seq "$rounds"); do
  if (( r % 2 )); then
    inproc_run "$r"; service_run "$r" auto; service_run "$r" worker
  else
    service_run "$r" auto; service_run "$r" worker; inproc_run "$r"
  fi
done
stop_cluster

echo "== (c) transport: uint8 batches, data plane vs TCP socket copy into fresh memory"
"$bin/transport_bench" | tee "$work/transport.txt"

images_total=$((images * epochs))
# One figure per round, from the files of `kind` (inproc or service.<finish>).
of_rounds() {  # kind, awk program over the round's file(s) -> one number
  local kind=$1 prog=$2
  for r in $(seq "$rounds"); do
    local f="$work/$kind.$r.txt"
    [[ $kind == inproc ]] || f="$work/service.$r.$kind.txt"
    awk "$prog" "$f"
  done
}
val() {  # name: the awk program printing field `name` of a file
  printf '{ if (index($0, "%s:") == 1) { v = substr($0, length("%s:") + 1); sub(/^ */, "", v); x = v + 0 } } END { print x }' "$1" "$1"
}
# Per-round ratio of `name` between service.<finish> and inproc.
ratio() {  # finish, name, [inverse]
  for r in $(seq "$rounds"); do
    local a b
    a=$(awk "$(val "$2")" "$work/service.$r.$1.txt")
    b=$(awk "$(val "$2")" "$work/inproc.$r.txt")
    awk -v a="$a" -v b="$b" 'BEGIN {printf "%.4f\n", a / b}'
  done
}
echo
echo "== summary ($images images x $epochs epochs, $rounds rounds, median [min-max]; machine: $(nproc) cores; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "in-process"
echo "  images/s, whole run             $(of_rounds inproc "$(val throughput)" | summary)"
echo "  images/s from first batch       $(of_rounds inproc "$(val "throughput from first batch")" | summary)"
echo "  cpu from first batch            $(of_rounds inproc "$(val "cpu from first batch")" | summary) us/image"
for f in auto worker; do
  echo "service, finish $f"
  echo "  images/s, whole run             $(of_rounds "$f" "$(val throughput)" | summary)"
  echo "  images/s from first batch       $(of_rounds "$f" "$(val "throughput from first batch")" | summary)"
  echo "  ratio service/in-process, whole run         $(ratio "$f" throughput | summary)  (goal >= 0.85)"
  echo "  ratio service/in-process, from first batch  $(ratio "$f" "throughput from first batch" | summary)  (goal >= 0.85)"
  echo "  wire                            $(of_rounds "$f" "$(val wire)" | awk '{print $1 / 1000}' | summary) KB/image$([[ $f == auto ]] && echo "  (goal <= 151 KB)")"
  echo "  worker cpu                      $(of_rounds "$f" "$(val "worker cpu")" | awk -v n="$images_total" '{print 1e6 * $1 / n}' | summary) us/image (whole run)"
  echo "  trainer cpu                     $(of_rounds "$f" "$(val "cpu from first batch")" | summary) us/image (from first batch)"
  cpu_ratios=$(for r in $(seq "$rounds"); do
    ic=$(awk "$(val "cpu from first batch")" "$work/inproc.$r.txt")
    wc=$(awk "$(val "worker cpu")" "$work/service.$r.$f.txt")
    tc=$(awk "$(val "cpu from first batch")" "$work/service.$r.$f.txt")
    awk -v ic="$ic" -v wc="$wc" -v tc="$tc" -v n="$images_total" 'BEGIN {printf "%.4f\n", ic / (1e6 * wc / n + tc)}'
  done)
  echo "  cpu ratio in-process/service    $(summary <<<"$cpu_ratios")  (in-process cpu / (worker + trainer); robust to load)"
  echo "  first batch after job creation  $(of_rounds "$f" '{ if (match($0, /first batch after [0-9.]+s/)) { s = substr($0, RSTART + 18, RLENGTH - 19); x = s + 0 } } END { print x }' | summary) s"
done
sed -n 's/^ratio grpc\/tcp *\([0-9.]*\).*/transport uint8 data plane \/ tcp   \1  (median of transport_bench'"'"'s runs; goal >= 0.8)/p' "$work/transport.txt"
