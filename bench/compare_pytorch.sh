#!/usr/bin/env bash
# sluice vs the strict kernel ceiling vs PyTorch's DataLoader, on two photo sets, in rounds; plus
# the executor's per-element overhead on small records. Figures go to docs/BENCHMARKS.md.
#
#   bench/compare_pytorch.sh [--rounds R] [--images N] [--large-images M] [--epochs E]
#                            [--threads T] [--workloads "train eval"] [--small N] [--csv FILE]
#
# Photo sets: `repo` = N JPEGs from `sluice datagen` (long side 300-600 px); `large` = M photo-like
# JPEGs from bench/make_photos.py (long side 800-1,200 px, deterministic, never seen by the code's
# tuning). For each round, photo set and workload (default train only), back to back:
#   pytorch  bench/pytorch_loader.py (DataLoader + torchvision ImageFolder, num_workers = T,
#            batch 64), no warm-up epoch: E epochs over the wall time of the whole process,
#            interpreter start and imports included (the run as a user sees it);
#   sluice   `sluice pipeline run --spec bench/pipelines/imagenet_<w>.yaml --threads T
#            --warmup-epochs 0 --epochs E`: E epochs over the wall time of the whole process;
#   strict   kernel_ceiling_bench --chain strict: T processes (one per core) decoding the JPEGs
#            from memory at the DCT scale the engine picks, fused flip+normalize into a reused
#            batch buffer; one untimed epoch, then E timed epochs (kernels only: strictly less
#            than the engine does, and none of its start-up).
# Reports per round sluice/strict and sluice/pytorch, then per photo set and workload the median
# over the rounds with the range [min-max], and the 1-minute load before and after each round.
# cpu-eff = the strict ceiling's CPU µs per image / the whole sluice run's (user + system time of
# the process over the images it delivered): the figure that other jobs on the machine disturb
# least.
# Small records: `sluice pipeline run --spec bench/pipelines/small_records.yaml` vs
# small_records_bench's plain loop, one thread; overhead = 1/sluice - 1/loop, µs per element.
#
# Needs build/bin/{sluice,kernel_ceiling_bench,small_records_bench} (SLUICE_BUILD_DIR for another
# build folder) and Debian's /usr/bin/python3 with torch, torchvision and PIL. Writes ~300 MB
# under $TMPDIR and removes them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
rounds=3
images=2000
large_images=400
epochs=2
threads="$(nproc)"
workloads="train"
small=500000
csv=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --images) images="$2"; shift 2 ;;
    --large-images) large_images="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --workloads) workloads="$2"; shift 2 ;;
    --small) small="$2"; shift 2 ;;
    --csv) csv="$2"; shift 2 ;;
    *) echo "compare_pytorch.sh: unknown flag $1" >&2; exit 1 ;;
  esac
done
if [[ ! "$rounds" =~ ^[1-9][0-9]*$ || ! "$epochs" =~ ^[1-9][0-9]*$ ]]; then
  echo "compare_pytorch.sh: --rounds and --epochs must be positive integers" >&2
  exit 1
fi
for b in sluice kernel_ceiling_bench small_records_bench; do
  if [[ ! -x "$build/bin/$b" ]]; then
    echo "compare_pytorch.sh: $build/bin/$b not found; build it: cmake --build build --target $b" >&2
    exit 1
  fi
done
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-compare-XXXXXX")"
trap 'rm -rf "$work"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }
now() { date +%s.%N; }
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')" \
     " mem=$(free -g | awk '/^Mem:/{print $2}')GiB  load: $(cut -d' ' -f1-3 /proc/loadavg)"

"$build/bin/sluice" datagen --output "$work/repo/images" --images "$images" --seed 1 \
  >/dev/null 2>&1
/usr/bin/python3 "$root/bench/make_photos.py" --output "$work/large/images" \
  --images "$large_images" --seed 7 >/dev/null
for set in repo large; do
  "$build/bin/sluice" record convert --input "$work/$set/images" --output "$work/$set/ds" \
    --format imagefolder >/dev/null 2>&1
  n="$(find "$work/$set/images" -name '*.jpg' | wc -l)"
  echo "# photo set $set: $n JPEGs, $(du -sm "$work/$set/images" | cut -f1) MB," \
       "first $(/usr/bin/python3 -c "import sys; from PIL import Image; \
print('%dx%d' % Image.open(sys.argv[1]).size)" "$(find "$work/$set/images" -name '*.jpg' | sort | head -1)")"
  echo "$n" > "$work/$set/count"
done

rate() { sed -n "s/^$1: \([0-9.]*\) \(images\|elements\)\/s.*$/\1/p" | tail -1; }
rows=()
for ((r = 1; r <= rounds; r++)); do
  for set in repo large; do
    n="$(cat "$work/$set/count")"
    for workload in $workloads; do
      spec="$root/bench/pipelines/imagenet_$workload.yaml"
      eval_flag=""
      [[ $workload == eval ]] && eval_flag="--eval"
      l0="$(load)"
      t0="$(now)"
      /usr/bin/python3 "$root/bench/pytorch_loader.py" --data "$work/$set/images" \
        --workers "$threads" --epochs "$epochs" --warmup-epochs 0 $eval_flag >/dev/null
      t1="$(now)"
      /usr/bin/time -f "%U %S" -o "$work/time" "$build/bin/sluice" pipeline run --spec "$spec" \
        --data "$work/$set/ds" --threads "$threads" --warmup-epochs 0 --epochs "$epochs" \
        >/dev/null 2>&1
      t2="$(now)"
      bc="$(awk -v n="$n" -v e="$epochs" '{printf "%.0f", 1e6*($1+$2)/(n*e)}' "$work/time")"
      out_c="$("$build/bin/kernel_ceiling_bench" --spec "$spec" --data "$work/$set/ds" \
               --threads "$threads" --epochs "$epochs" --chain strict)"
      c="$(echo "$out_c" | rate strict)"
      cc="$(echo "$out_c" | sed -n 's/^strict: .*, \([0-9.]*\) us CPU\/image.*$/\1/p')"
      l1="$(load)"
      a="$(awk -v n="$n" -v e="$epochs" -v s="$t0" -v t="$t1" 'BEGIN{printf "%.1f", n*e/(t-s)}')"
      b="$(awk -v n="$n" -v e="$epochs" -v s="$t1" -v t="$t2" 'BEGIN{printf "%.1f", n*e/(t-s)}')"
      printf 'round %d %-5s %-5s pytorch %7.1f  sluice %7.1f  strict %7.1f images/s' \
        "$r" "$set" "$workload" "$a" "$b" "$c"
      awk -v a="$a" -v b="$b" -v c="$c" -v l0="$l0" -v l1="$l1" -v bc="$bc" -v cc="$cc" \
        'BEGIN{printf "  sluice/strict %.3f  sluice/pytorch %.2f  cpu-eff %.3f (%s/%s us)  (load %s -> %s)\n",
               b/c, b/a, cc/bc, cc, bc, l0, l1}'
      rows+=("$set $workload $r $a $b $c $l0 $l1 $bc $cc")
    done
  done
done

# Median (the middle value; the mean of the two middle ones for an even count) and range.
stats() { sort -g | awk '{v[NR]=$1} END{m = NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
                                       printf "%.3f [%.3f-%.3f]", m, v[1], v[NR]}'; }
echo
echo "median [range] over $rounds rounds, $threads thread(s)/process(es), $epochs epochs per run:"
for set in repo large; do
  for workload in $workloads; do
    sel="$(printf '%s\n' "${rows[@]}" | awk -v s="$set" -v w="$workload" '$1==s && $2==w')"
    printf '%-5s %-5s pytorch %s  sluice %s  strict %s images/s\n' "$set" "$workload" \
      "$(echo "$sel" | awk '{print $4}' | stats)" "$(echo "$sel" | awk '{print $5}' | stats)" \
      "$(echo "$sel" | awk '{print $6}' | stats)"
    printf '%-5s %-5s sluice/strict %s  sluice/pytorch %s  cpu-eff %s  load %s\n' "$set" \
      "$workload" "$(echo "$sel" | awk '{print $5/$6}' | stats)" \
      "$(echo "$sel" | awk '{print $5/$4}' | stats)" "$(echo "$sel" | awk '{print $10/$9}' | stats)" \
      "$(echo "$sel" | awk '{print $7; print $8}' | stats)"
  done
done
echo "goals (train, both photo sets): sluice/strict >= 0.9, sluice/pytorch >= 4 in the median"

if [[ "$small" -gt 0 ]]; then
  "$build/bin/small_records_bench" --make "$work/small" --records "$small" >/dev/null
  l0="$(load)"
  out_s="$("$build/bin/sluice" pipeline run --spec "$root/bench/pipelines/small_records.yaml" \
           --data "$work/small" --threads 1 --warmup-epochs 1 --epochs "$epochs" 2>/dev/null)"
  s="$(echo "$out_s" | rate throughput)"
  out_l="$("$build/bin/small_records_bench" --loop "$work/small" --epochs "$epochs")"
  lp="$(echo "$out_l" | rate loop)"
  l1="$(load)"
  awk -v s="$s" -v l="$lp" -v l0="$l0" -v l1="$l1" 'BEGIN {
    printf "small records, 1 thread: sluice %.0f elements/s, plain loop %.0f elements/s, " \
           "overhead %.2f us/element (load %s-%s)\n", s, l, 1e6 / s - 1e6 / l, l0, l1 }'
fi

if [[ -n "$csv" ]]; then
  {
    echo "set,workload,round,pytorch,sluice,strict,load_before,load_after,sluice_cpu_us,strict_cpu_us"
    for r in "${rows[@]}"; do echo "${r// /,}"; done
  } > "$csv"
fi
