#!/usr/bin/env bash
# The eval pipeline's epochs from a cache node vs its first epoch, in one run (issue 21 item 4):
#   cluster  real sluice-dispatcher + 1 sluice-worker with --cache-root;
#   job      bench/pipelines/imagenet_eval_cached.yaml (decode, resize 256, center crop 224 |
#            cache | normalize, hwc2chw; batches of 64) over IMAGES synthetic JPEGs, 3 epochs,
#            read by one consumer (bench/cache/cache_bench.cc);
#   measure  per epoch: the worker's CPU seconds (utime + stime from /proc/<pid>/stat) per image
#            and the images per second; epoch 1 computes and writes the cache, epochs 2-3 read
#            it. Ratio = mean of epochs 2-3 / epoch 1 (goal CPU <= 1/3). Each epoch's output is
#            digested per element (XXH3) and the cached epochs must equal the computed one.
# ROUNDS rounds (default 3, at least 3), each a new job after `sluice cache rm eval`; headlines
# are the median of the rounds with their range [min-max].
#
#   bench/cache.sh        IMAGES=1000 ROUNDS=3 (about 2 min on 2 cores)
# Needs build/bin (or SLUICE_BIN_DIR) with cache_bench.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-1000}"
rounds="${ROUNDS:-3}"
spec="$root/bench/pipelines/imagenet_eval_cached.yaml"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start cache-bench
echo "== data: $images synthetic JPEGs"
make_dataset "$images" "$work/ds"
echo "== cluster: sluice-dispatcher + 1 sluice-worker --cache-root $work/cache"
mkdir -p "$work/cache"
start_dispatcher "$work"
start_worker "$work" worker --data-root "$work" --cache-root "$work/cache"
worker=$worker_pid

: >"$work/rounds"
for r in $(seq "$rounds"); do
  "$bin/cache_bench" --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" --job "eval-$r" \
    --worker-pid "$worker" --epochs 3 >"$work/round$r" 2>"$work/round$r.err" \
    || { cat "$work/round$r.err" >&2; exit 1; }
  # epoch E images N wall_s W cpu_s C digest D
  read -r e0 n0 w0 c0 d0 < <(awk '$2==0 {print $2, $4, $6, $8, $10}' "$work/round$r")
  read -r e1 n1 w1 c1 d1 < <(awk '$2==1 {print $2, $4, $6, $8, $10}' "$work/round$r")
  read -r e2 n2 w2 c2 d2 < <(awk '$2==2 {print $2, $4, $6, $8, $10}' "$work/round$r")
  same=no; [[ "$d0" == "$d1" && "$d0" == "$d2" && "$n0" == "$images" ]] && same=yes
  awk -v n="$images" -v w0="$w0" -v c0="$c0" -v w1="$w1" -v c1="$c1" -v w2="$w2" -v c2="$c2" \
      -v r="$r" -v same="$same" 'BEGIN {
    cpu0 = 1000 * c0 / n; cpuc = 1000 * (c1 + c2) / (2 * n);
    tp0 = n / w0; tpc = 2 * n / (w1 + w2);
    printf "round %d: epoch 1 %.3f ms CPU/img %.0f img/s | epochs 2-3 %.3f ms CPU/img %.0f img/s | CPU ratio %.3f, throughput x%.2f | byte-identical %s\n",
      r, cpu0, tp0, cpuc, tpc, cpuc / cpu0, tpc / tp0, same;
    print cpu0, cpuc, cpuc / cpu0, tp0, tpc, tpc / tp0, same >> "/dev/stderr" }' 2>>"$work/rounds"
  [[ "$same" == yes ]] || { echo "cached output differs from the computed output" >&2; exit 1; }
  # The job left when its iterator closed; remove the cache so the next round computes again.
  for _ in $(seq 50); do "$bin/sluice" cache rm --dispatcher "$dispatcher" eval >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 0.5  # the worker deletes the folder at its next heartbeat (1 s) ...
  for _ in $(seq 50); do [[ -z "$(ls -A "$work/cache")" ]] && break; sleep 0.1; done
done

echo "== median [range] over $rounds rounds"
echo "worker CPU per image, epoch 1 (computes, writes the cache): $(awk '{print $1}' "$work/rounds" | summary 3) ms"
echo "worker CPU per image, epochs 2-3 (read the cache):          $(awk '{print $2}' "$work/rounds" | summary 3) ms"
echo "CPU ratio cached / computed:                                 $(awk '{print $3}' "$work/rounds" | summary 3)  (goal <= 0.333)"
echo "throughput, epoch 1:                                         $(awk '{print $4}' "$work/rounds" | summary 3) img/s"
echo "throughput, epochs 2-3:                                      $(awk '{print $5}' "$work/rounds" | summary 3) img/s"
echo "throughput ratio cached / computed:                          $(awk '{print $6}' "$work/rounds" | summary 3)"
echo "cached output byte-identical to computed in every round:     $(awk '$7!="yes"{bad=1} END{print bad ? "NO" : "yes"}' "$work/rounds")"
