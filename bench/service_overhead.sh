#!/usr/bin/env bash
# The same pipeline in-process and through the service, on the same cores, in one run:
#   (a) sluice pipeline run                  (in-process: no gRPC, no dispatcher)
#   (b) sluice local --workers 1 + sluice consume   (worker and trainer as separate processes)
# Prints images/s of both, the ratio (goal >= 0.85), the time to first batch after job creation
# (goal < 1 s), then gRPC batch bandwidth vs a plain TCP copy on loopback (transport_bench).
#
#   bench/service_overhead.sh            IMAGES=2000 EPOCHS=2 by default
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

echo "== (b) service: sluice local --workers 1 + sluice consume"
"$bin/sluice" local --workers 1 --data-root "$work" --address-file "$work/address" \
  --work-dir "$work/cluster" >"$work/local.txt" 2>&1 &
cluster_pid=$!
for _ in $(seq 100); do [[ -s "$work/address" ]] && break; sleep 0.1; done
"$bin/sluice" consume --dispatcher "$(cat "$work/address")" --spec "$spec" --data "$work/ds" \
  --job overhead --epochs "$epochs" | tee "$work/service.txt" | tail -2
service=$(awk '/^throughput:/ {print $2}' "$work/service.txt")
first=$(sed -n 's/.*first batch after \([0-9.]*\)s.*/\1/p' "$work/service.txt")

echo "== (c) transport: gRPC GetBatches vs TCP socket copy"
"$bin/transport_bench"

echo
echo "in-process          $inproc images/s"
echo "service             $service images/s"
awk -v a="$service" -v b="$inproc" 'BEGIN {printf "ratio service/in-process  %.2f  (goal >= 0.85)\n", a / b}'
echo "first batch after job creation  ${first}s  (goal < 1 s)"
