#!/usr/bin/env bash
# The same pipeline in-process and through the service, on the same cores, in one run:
#   (a) sluice pipeline run                  (in-process: no gRPC, no dispatcher)
#   (b) sluice local --workers 1 + sluice consume   (worker and trainer as separate processes),
#       finish auto (the worker ships uint8, the trainer's client normalizes), then
#   (b') the same with --finish worker (float32 on the wire, for comparison)
# Both timed from the first batch; the trainer holds float32 [64, 3, 224, 224] either way.
# Prints images/s, the ratio (goal >= 0.85), bytes on the wire per image (goal <= 151 KB with
# finish auto), CPU-seconds per image of the worker and the trainer, the time to first batch,
# then uint8 batches through the data plane vs a plain TCP copy on loopback (transport_bench,
# goal >= 0.8).
#
#   bench/service_overhead.sh            IMAGES=2000 EPOCHS=2 by default (about 40 s)
# Needs build/bin from scripts/bootstrap.sh (or SLUICE_BIN_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-2000}"
epochs="${EPOCHS:-2}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
work="$(mktemp -d /tmp/sluice-overhead-XXXXXX)"
cluster_pid=""
cleanup() {
  [[ -n "$cluster_pid" ]] && kill -TERM "$cluster_pid" 2>/dev/null && wait "$cluster_pid" || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== data: $images synthetic JPEGs"
"$bin/sluice" datagen --output "$work/jpegs" --images "$images" >/dev/null 2>&1
"$bin/sluice" record convert --input "$work/jpegs" --output "$work/ds" >/dev/null 2>&1

echo "== (a) in-process: sluice pipeline run"
"$bin/sluice" pipeline run --spec "$spec" --data "$work/ds" --epochs "$epochs" | tee "$work/inproc.txt" | tail -3
inproc=$(awk '/^throughput:/ {print $2}' "$work/inproc.txt")

# CPU seconds (user + system) of a process so far.
cpu_of() { awk -v tck="$(getconf CLK_TCK)" '{printf "%.3f", ($14 + $15) / tck}' "/proc/$1/stat"; }

echo "== (b) service: sluice local --workers 1 + sluice consume"
"$bin/sluice" local --workers 1 --data-root "$work" --address-file "$work/address" \
  --work-dir "$work/cluster" >"$work/local.txt" 2>&1 &
cluster_pid=$!
for _ in $(seq 100); do [[ -s "$work/address" ]] && break; sleep 0.1; done
worker_pid=""
for _ in $(seq 100); do
  for p in $(pgrep -P "$cluster_pid" || true); do
    [[ "$(cat /proc/$p/comm 2>/dev/null)" == sluice-worker ]] && worker_pid=$p
  done
  [[ -n "$worker_pid" ]] && break
  sleep 0.1
done
service_run() {  # finish, output file
  local before after
  before=$(cpu_of "$worker_pid")
  "$bin/sluice" consume --dispatcher "$(cat "$work/address")" --spec "$spec" --data "$work/ds" \
    --job "overhead-$1" --epochs "$epochs" --finish "$1" | tee "$2" | tail -5
  after=$(cpu_of "$worker_pid")
  awk -v a="$after" -v b="$before" 'BEGIN {printf "worker cpu: %.3f s\n", a - b}' >>"$2"
}
service_run auto "$work/service.txt"
echo "== (b') service, --finish worker (float32 on the wire)"
service_run worker "$work/service_worker.txt"
kill -TERM "$cluster_pid" 2>/dev/null && wait "$cluster_pid" || true
cluster_pid=""

echo "== (c) transport: uint8 batches, data plane vs TCP socket copy into fresh memory"
"$bin/transport_bench" | tee "$work/transport.txt"

field() { sed -n "s/^$1: *\([0-9.]*\).*/\1/p" "$2" | tail -1; }
inproc=$(field "throughput from first batch" "$work/inproc.txt")
inproc_cpu=$(field "cpu from first batch" "$work/inproc.txt")
images_total=$((images * epochs))
echo
echo "== summary ($images images x $epochs epochs; machine: $(nproc) cores; load: $(uptime | sed 's/.*load average: //'))"
echo "in-process                       $inproc images/s   cpu $inproc_cpu us/image"
for f in auto worker; do
  out="$work/service.txt"; [[ $f == worker ]] && out="$work/service_worker.txt"
  service=$(field "throughput from first batch" "$out")
  trainer_cpu=$(field "cpu from first batch" "$out")
  wire=$(field "wire" "$out")
  worker_cpu=$(field "worker cpu" "$out")
  first=$(sed -n 's/.*first batch after \([0-9.]*\)s.*/\1/p' "$out")
  echo "service, finish $f"
  awk -v a="$service" -v b="$inproc" -v w="$wire" -v wc="$worker_cpu" -v tc="$trainer_cpu" \
      -v n="$images_total" -v fb="$first" -v f="$f" -v ic="$inproc_cpu" 'BEGIN {
    printf "  images/s from first batch     %s\n", a
    printf "  ratio service/in-process      %.2f  (goal >= 0.85)\n", a / b
    printf "  wire                          %.1f KB/image%s\n", w / 1000,
           (f == "auto" ? "  (goal <= 151 KB)" : "")
    printf "  worker cpu                    %.0f us/image (whole run)\n", 1e6 * wc / n
    printf "  trainer cpu                   %s us/image (from first batch)\n", tc
    printf "  cpu ratio in-process/service  %.2f  (in-process cpu / (worker + trainer); robust to load)\n",
           ic / (1e6 * wc / n + tc)
    printf "  first batch after job creation %ss\n", fb }'
done
sed -n 's/^ratio grpc\/tcp *\([0-9.]*\).*/transport uint8 data plane \/ tcp   \1  (goal >= 0.8)/p' "$work/transport.txt"
