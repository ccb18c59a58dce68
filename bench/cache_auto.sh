#!/usr/bin/env bash
# `cache: auto` vs an explicit cache node vs no cache, in one run (issue 21 item 3):
#   cluster  real sluice-dispatcher + 1 sluice-worker with --cache-root;
#   jobs     per round, three 3-epoch jobs over IMAGES synthetic JPEGs, one consumer each
#            (bench/cache/cache_bench.cc):
#              none      bench/pipelines/imagenet_eval_split.yaml (decode, resize 256, center
#                        crop 224 | normalize, hwc2chw; batches of 64), no cache;
#              auto      the same pipeline with `--cache auto`: epoch 1 measures, the dispatcher
#                        decides where to cache, epoch 2 writes, epoch 3 reads;
#              explicit  bench/pipelines/imagenet_eval_cached.yaml (the same with a cache node
#                        after the crop): epoch 1 writes, epochs 2-3 read.
#   measure  the worker's CPU seconds (utime + stime from /proc/<pid>/stat) per image, per epoch;
#            headline = epochs 2-3 and epoch 3 alone, ratios auto / none and auto / explicit.
#            Every epoch's output digest (XXH3 per element) must equal the no-cache job's.
# Every cache is removed between jobs (`sluice cache rm`), so each job starts without files (the
# auto job's cut has the explicit node's fingerprint: they would share files otherwise).
# ROUNDS rounds (default 3, at least 3); median of the rounds with their range [min-max].
#
#   bench/cache_auto.sh        IMAGES=1000 ROUNDS=3 (about 6 min on 2 cores)
# Needs build/bin (or SLUICE_BIN_DIR) with cache_bench, sluice, sluice-dispatcher, sluice-worker.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-1000}"
rounds="${ROUNDS:-3}"
py=/usr/bin/python3
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start cache-auto-bench
echo "== data: $images synthetic JPEGs"
make_dataset "$images" "$work/ds"
echo "== cluster: sluice-dispatcher + 1 sluice-worker --cache-root $work/cache"
mkdir -p "$work/cache"
start_dispatcher "$work"
start_worker "$work" worker --data-root "$work" --cache-root "$work/cache"
worker=$worker_pid

# Removes every cache (once the job that used it has left) and waits for the folder to empty.
remove_caches() {
  local names
  for _ in $(seq 50); do
    names="$("$bin/sluice" cache list --dispatcher "$dispatcher" --json \
      | "$py" -c 'import json,sys; print(" ".join(c["name"] for c in json.load(sys.stdin)["caches"]))')"
    [[ -z "$names" ]] && break
    for n in $names; do "$bin/sluice" cache rm --dispatcher "$dispatcher" "$n" >/dev/null 2>&1 || true; done
    sleep 0.1
  done
  [[ -z "$names" ]] || { echo "caches not removed: $names" >&2; exit 1; }
  for _ in $(seq 100); do [[ -z "$(ls -A "$work/cache")" ]] && break; sleep 0.1; done
}

# run NAME SPEC CACHE ROUND: writes "cpu_ms_epoch1 cpu_ms_epoch2 cpu_ms_epoch3 d1 d2 d3" to
# $work/NAME-ROUND.result, then removes every cache (in this shell: the next job starts after).
run() {
  "$bin/cache_bench" --dispatcher "$dispatcher" --spec "$root/bench/pipelines/$2" --data "$work/ds" \
    --job "$1-$4" --worker-pid "$worker" --epochs 3 --cache "$3" >"$work/$1-$4" 2>"$work/$1-$4.err" \
    || { cat "$work/$1-$4.err" >&2; exit 1; }
  awk -v n="$images" '{cpu[$2] = 1000 * $8 / n; d[$2] = $10; if ($4 != n) bad = 1}
    END {if (bad) {print "short epoch" > "/dev/stderr"; exit 1}
         print cpu[0], cpu[1], cpu[2], d[0], d[1], d[2]}' "$work/$1-$4" >"$work/$1-$4.result"
  remove_caches
}

: >"$work/rounds"
for r in $(seq "$rounds"); do
  run none imagenet_eval_split.yaml off "$r"
  run auto imagenet_eval_split.yaml auto "$r"
  run explicit imagenet_eval_cached.yaml off "$r"
  read -r n1 n2 n3 nd1 nd2 nd3 <"$work/none-$r.result"
  read -r a1 a2 a3 ad1 ad2 ad3 <"$work/auto-$r.result"
  read -r e1 e2 e3 ed1 ed2 ed3 <"$work/explicit-$r.result"
  same=yes
  for d in "$nd2" "$nd3" "$ad1" "$ad2" "$ad3" "$ed1" "$ed2" "$ed3"; do [[ "$d" == "$nd1" ]] || same=no; done
  decision="$(grep -o "cache: auto decided.*" "$work/dispatcher.log" | tail -1)"
  awk -v r="$r" -v n1="$n1" -v n2="$n2" -v n3="$n3" -v a1="$a1" -v a2="$a2" -v a3="$a3" \
      -v e1="$e1" -v e2="$e2" -v e3="$e3" -v same="$same" 'BEGIN {
    n23 = (n2 + n3) / 2; a23 = (a2 + a3) / 2; e23 = (e2 + e3) / 2;
    printf "round %d: ms CPU/img by epoch 1/2/3: none %.3f/%.3f/%.3f | auto %.3f/%.3f/%.3f | explicit %.3f/%.3f/%.3f | epochs 2-3 auto/none %.3f auto/explicit %.3f | epoch 3 auto/none %.3f auto/explicit %.3f | byte-identical %s\n",
      r, n1, n2, n3, a1, a2, a3, e1, e2, e3, a23 / n23, a23 / e23, a3 / n3, a3 / e3, same;
    print n23, a23, e23, a23 / n23, a23 / e23, n3, a3, e3, a3 / n3, a3 / e3, same >> "/dev/stderr" }' 2>>"$work/rounds"
  echo "  dispatcher: $decision"
  [[ "$same" == yes ]] || { echo "outputs differ between the jobs or epochs" >&2; exit 1; }
done

col() { awk -v c="$1" '{print $c}' "$work/rounds" | summary 3; }
echo "== median [range] over $rounds rounds, worker CPU ms per image"
echo "epochs 2-3:  none $(col 1)  auto $(col 2)  explicit $(col 3)"
echo "             auto / none $(col 4)   auto / explicit $(col 5)"
echo "epoch 3:     none $(col 6)  auto $(col 7)  explicit $(col 8)"
echo "             auto / none $(col 9)   auto / explicit $(col 10)"
echo "every epoch of every job byte-identical to the no-cache job's epoch 1: $(awk '$11!="yes"{bad=1} END{print bad ? "NO" : "yes"}' "$work/rounds")"
