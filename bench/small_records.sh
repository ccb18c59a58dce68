#!/usr/bin/env bash
# The executor's per-element cost on small records, for one sluice binary or two compared in the
# same run (e.g. a build of main and a build of a branch): the CPU each spends per element and its
# overhead over small_records_bench's plain loop.
#
#   bench/small_records.sh [--sluice BIN] [--baseline BIN] [--rounds R] [--records N] [--epochs E]
#
# Per round, back to back: `BIN pipeline run --spec bench/pipelines/small_records.yaml --threads 1
# --warmup-epochs 1 --epochs E` (and the same with the baseline binary if given), then the plain
# loop (`small_records_bench --loop`, one thread, E epochs). Reports per binary the median over the
# rounds with the range [min-max] of: throughput (elements/s, timed epochs), CPU µs per element
# (user + system time of the whole process over the (E + 1) × N elements it read: the figure other
# jobs on the machine disturb least) and overhead = 1/throughput - 1/loop (µs per element), and the
# 1-minute load before and after. Needs build/bin/{sluice,small_records_bench} (SLUICE_BUILD_DIR
# for another build folder) and /usr/bin/time. Writes ~50 MB under $TMPDIR and removes them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
sluice="$build/bin/sluice"
baseline=""
rounds=3
records=500000
epochs=6
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sluice) sluice="$2"; shift 2 ;;
    --baseline) baseline="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --records) records="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    *) echo "small_records.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for n in "$rounds" "$records" "$epochs"; do
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
    echo "small_records.sh: --rounds, --records and --epochs must be positive integers" >&2
    exit 2
  fi
done
for b in "$sluice" ${baseline:+"$baseline"} "$build/bin/small_records_bench" /usr/bin/time; do
  [[ -x "$b" ]] || { echo "small_records.sh: $b is missing or not executable" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$build/bin/small_records_bench" --make "$work/small" --records "$records" >/dev/null

load() { cut -d' ' -f1 /proc/loadavg; }
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')" \
     " load: $(cut -d' ' -f1-3 /proc/loadavg)"
# One pipeline run: "<elements/s> <cpu us/element>".
run() {
  /usr/bin/time -o "$work/time" -f 'TIME %U %S' "$1" pipeline run \
    --spec "$root/bench/pipelines/small_records.yaml" --data "$work/small" --threads 1 \
    --warmup-epochs 1 --epochs "$epochs" >"$work/out" 2>/dev/null
  awk -v t="$(sed -n 's/^throughput: \([0-9.]*\) images\/s.*$/\1/p' "$work/out")" \
      -v n="$(( (epochs + 1) * records ))" \
      '/^TIME/ { printf "%s %.4f\n", t, ($2 + $3) * 1e6 / n }' "$work/time"
}
names=(sluice)
bins=("$sluice")
if [[ -n "$baseline" ]]; then names=(baseline sluice); bins=("$baseline" "$sluice"); fi
rows=()
for ((r = 1; r <= rounds; r++)); do
  l0="$(load)"
  res=()
  for i in "${!bins[@]}"; do res+=("$(run "${bins[$i]}")"); done
  lp="$("$build/bin/small_records_bench" --loop "$work/small" --epochs "$epochs" |
        sed -n 's/^loop: \([0-9.]*\) elements\/s$/\1/p')"
  l1="$(load)"
  for i in "${!bins[@]}"; do
    read -r t c <<<"${res[$i]}"
    rows+=("${names[$i]} $r $t $c $lp $l0 $l1")
    printf 'round %d %-8s %10.0f elements/s  cpu %.3f us/element  loop %10.0f elements/s  load %s-%s\n' \
      "$r" "${names[$i]}" "$t" "$c" "$lp" "$l0" "$l1"
  done
done

stats() { sort -g | awk '{v[NR]=$1} END{m = NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
                                       printf "%.3f [%.3f-%.3f]", m, v[1], v[NR]}'; }
echo
echo "median [range] over $rounds rounds, 1 thread, $records records, $epochs timed epochs:"
for name in "${names[@]}"; do
  sel="$(printf '%s\n' "${rows[@]}" | awk -v n="$name" '$1==n')"
  printf '%-8s throughput %s M elements/s  cpu %s us/element  overhead %s us/element\n' "$name" \
    "$(echo "$sel" | awk '{print $3/1e6}' | stats)" "$(echo "$sel" | awk '{print $4}' | stats)" \
    "$(echo "$sel" | awk '{print 1e6/$3 - 1e6/$5}' | stats)"
done
echo "load $(printf '%s\n' "${rows[@]}" | awk '{print $6; print $7}' | stats)"
