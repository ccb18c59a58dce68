#!/usr/bin/env bash
# A trainer that stops reading without leaving (issue 20 item 1): how long does another job wait
# for the worker it holds, and what does the paused trainer pay when it reads again?
#   cluster  real sluice-dispatcher + 1 sluice-worker --capacity 1 (one split produced at a time:
#            the worker's whole capacity is the paused trainer's), fresh for each configuration;
#   job A    `sluice consume` of IMAGES images (default 4000, slots of 1024) that reads 2 batches
#            and then reads nothing for STALL seconds (default 15) with its iterator open and
#            heartbeating (`--pause-after-batches 2 --pause-for STALL`: a long evaluation or
#            checkpoint), then reads the rest of its epoch; its ids are checked exactly once;
#   job B    started as soon as A stops reading: one epoch of B_IMAGES images (default 1000);
#            its first batch (from opening the job) and its whole epoch.
# Configurations, in the same round: `off` = --pause-unread-after 0, the worker as before this
# change (A's producer waits on A's full queue as long as A does, so B waits for A; with a trainer
# that never reads again, for its lease) vs `on` = --pause-unread-after PAUSE_AFTER (default 2s).
# ROUNDS rounds (default 3, at least 3), alternating which configuration goes first. Headlines are
# the median of the rounds with their range [min-max]; ratios are taken within a round.
#
#   bench/paused_consumer.sh     IMAGES=4000 B_IMAGES=1000 STALL=15 PAUSE_AFTER=2s ROUNDS=3
#                                (about 3 min on 2 cores)
# Needs build/bin (or SLUICE_BIN_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SLUICE_BIN_DIR:-$root/build/bin}"
images="${IMAGES:-4000}"
b_images="${B_IMAGES:-1000}"
stall="${STALL:-15}"
pause_after="${PAUSE_AFTER:-2s}"
rounds="${ROUNDS:-3}"
spec="${SPEC:-$root/bench/pipelines/imagenet_train.yaml}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
source "$root/bench/lib/cluster.sh"
bench_start paused-consumer
echo "== data: $images + $b_images synthetic JPEGs"
make_dataset "$images" "$work/a"
make_dataset "$b_images" "$work/b" 1

# The number after "<name>" on the last line that has it.
field() { sed -n "s/.*$1 *\([0-9.]*\).*/\1/p" "$2" | tail -1; }

run_config() {  # round config flag-value
  local dir="$work/$1-$2"
  mkdir -p "$dir"
  start_dispatcher "$dir" --log-level warn
  start_worker "$dir" worker --data-root "$work" --capacity 1 --pause-unread-after "$3" \
    --log-level warn
  "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/a" --job a \
    --epochs 1 --split-size 1024 --ids-out "$dir/a.ids" --pause-after-batches 2 \
    --pause-for "${stall}s" >"$dir/a.txt" 2>/dev/null &
  local a_pid=$!
  for _ in $(seq 1200); do grep -q "pausing reads" "$dir/a.txt" 2>/dev/null && break; sleep 0.05; done
  "$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/b" --job b \
    --epochs 1 >"$dir/b.txt" 2>/dev/null
  wait "$a_pid"
  stop_cluster
  local exact=no
  if [[ "$(sort -n "$dir/a.ids" | uniq | wc -l)" == "$images" &&
        "$(wc -l <"$dir/a.ids")" == "$images" ]]; then exact=yes; fi
  field "first batch after" "$dir/b.txt" >"$work/bfirst.$1.$2"
  sed -n 's/.* in \([0-9.]*\)s; first.*/\1/p' "$dir/b.txt" | tail -1 >"$work/bepoch.$1.$2"
  sed -n 's/.* in \([0-9.]*\)s; first.*/\1/p' "$dir/a.txt" | tail -1 >"$work/aall.$1.$2"
  echo "$exact" >"$work/exact.$1.$2"
  printf 'round %s  %-3s  B first batch %7.3f s  B epoch %7.3f s  A whole run %7.3f s (stall %s s)  A exactly once: %s\n' \
    "$1" "$2" "$(cat "$work/bfirst.$1.$2")" "$(cat "$work/bepoch.$1.$2")" \
    "$(cat "$work/aall.$1.$2")" "$stall" "$exact"
}

for r in $(seq "$rounds"); do
  if (( r % 2 )); then
    run_config "$r" off 0; run_config "$r" on "$pause_after"
  else
    run_config "$r" on "$pause_after"; run_config "$r" off 0
  fi
done

ratio() { awk -v a="$(cat "$1")" -v b="$(cat "$2")" 'BEGIN {printf "%.2f", a / b}'; }
echo
echo "== summary ($rounds rounds, median [min-max]; machine: $(nproc) cores; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "A reads 2 batches, then nothing for $stall s; B starts then (1 worker, capacity 1)"
echo "  B first batch, pause off            $(per_round 'cat $work/bfirst.$r.off' | summary 3) s"
echo "  B first batch, pause on ($pause_after)       $(per_round 'cat $work/bfirst.$r.on' | summary 3) s"
echo "  ratio off / on                      $(per_round 'ratio $work/bfirst.$r.off $work/bfirst.$r.on' | summary 2)"
echo "  B whole epoch, off                  $(per_round 'cat $work/bepoch.$r.off' | summary 3) s"
echo "  B whole epoch, on                   $(per_round 'cat $work/bepoch.$r.on' | summary 3) s"
echo "  A whole run (incl. its $stall s stall), off  $(per_round 'cat $work/aall.$r.off' | summary 3) s"
echo "  A whole run (incl. its $stall s stall), on   $(per_round 'cat $work/aall.$r.on' | summary 3) s"
echo "  A exactly once, every round and configuration: $(cat "$work"/exact.* | sort -u | tr '\n' ' ')"
