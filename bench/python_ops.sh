#!/usr/bin/env bash
# sluice's python op vs PyTorch's DataLoader running the same user function on the same cores,
# one run, ratios printed (issue goals: augment >= 2x, alone >= 0.9x). Figures go to
# docs/BENCHMARKS.md.
#
#   bench/python_ops.sh [--images N] [--epochs E] [--threads T] [--rounds R]
#
# augment: sluice `pipeline run --spec bench/pipelines/python_augment.yaml` (C++ decode +
#          RandomResizedCrop(224), then examples/python_transforms/augment_numpy.train in the
#          worker's Python process pool) vs bench/python_ops_loader.py --mode augment
#          (torchvision ImageFolder decode + RandomResizedCrop, then the same function);
# alone:   bench/pipelines/python_alone.yaml vs --mode alone: only augment_numpy.busy, a pure
#          Python function, on each record's label.
# sluice gets --threads T (its stage threads, each with one Python process busy at a time); the
# DataLoader num_workers = T. Each side takes one warm-up epoch, then E timed epochs. R rounds,
# alternating sides; the median ratio and the range are printed.
# Then the costs: CPU per image of each side's parts, on their own (bench/python_ops_costs.py for
# PIL decode + crop and the augmentation; sluice's decode + crop from `pipeline run` of the augment
# spec without its python op) and the ratio those parts allow the augment mode when both sides
# use the cores fully and nothing else costs: (PIL + augment) / (sluice decode + crop + augment).
# Needs build/bin/sluice and Debian's /usr/bin/python3 with torch, torchvision and numpy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
images=1000
epochs=2
threads=2
rounds=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --images) images="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "python_ops.sh: unknown flag $1" >&2; exit 1 ;;
  esac
done
if [[ ! -x "$build/bin/sluice" ]]; then
  echo "python_ops.sh: $build/bin/sluice not found; build it: cmake --build build --target sluice" >&2
  exit 1
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-pyops-XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')" \
     " load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bin/sluice" datagen --output "$work/images" --images "$images" --seed 1 2>/dev/null
"$build/bin/sluice" record convert --input "$work/images" --output "$work/ds" \
  --format imagefolder >/dev/null 2>&1
echo "# data: $images JPEGs; threads=$threads epochs=$epochs rounds=$rounds"

sluice_rate() {  # spec
  "$build/bin/sluice" pipeline run --spec "$1" --data "$work/ds" --threads "$threads" \
    --epochs "$epochs" --warmup-epochs 1 --allow-python-ops \
    --python-path "$root/examples/python_transforms" 2>/dev/null |
    sed -n 's/^throughput: \([0-9.]*\) images\/s/\1/p'
}
torch_rate() {  # mode
  /usr/bin/python3 "$root/bench/python_ops_loader.py" --data "$work/images" --mode "$1" \
    --workers "$threads" --epochs "$epochs" | sed -n 's/^pytorch: \([0-9.]*\) images\/s/\1/p'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for mode in augment alone; do
  ratios=()
  for ((r = 1; r <= rounds; r++)); do
    s="$(sluice_rate "$root/bench/pipelines/python_$mode.yaml")"
    t="$(torch_rate "$mode")"
    ratio="$(awk -v s="$s" -v t="$t" 'BEGIN {printf "%.2f", s / t}')"
    echo "$mode round $r: sluice $s images/s, pytorch $t images/s, ratio $ratio"
    ratios+=("$ratio")
  done
  med="$(printf '%s\n' "${ratios[@]}" | median)"
  lo="$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)"
  hi="$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)"
  echo "$mode: sluice/pytorch median $med (range $lo-$hi)"
done

noaug="$work/python_augment_cpp_only.yaml"
grep -v 'python:' "$root/bench/pipelines/python_augment.yaml" >"$noaug"
sluice_cpu() {  # spec -> CPU us/image of the sluice process (not its Python processes)
  "$build/bin/sluice" pipeline run --spec "$1" --data "$work/ds" --threads "$threads" \
    --epochs "$epochs" --warmup-epochs 1 --allow-python-ops \
    --python-path "$root/examples/python_transforms" 2>/dev/null |
    sed -n 's/^cpu: \([0-9.]*\) us\/image/\1/p'
}
cpp_us="$(sluice_cpu "$noaug")"
aug_us="$(sluice_cpu "$root/bench/pipelines/python_augment.yaml")"
costs="$(/usr/bin/python3 "$root/bench/python_ops_costs.py" --data "$work/images")"
pil_ms="$(sed -n 's/^pil_decode_crop_ms: //p' <<<"$costs")"
augment_ms="$(sed -n 's/^augment_ms: //p' <<<"$costs")"
echo "costs, CPU ms/image: sluice decode+crop $(awk -v u="$cpp_us" 'BEGIN {printf "%.3f", u / 1e3}')," \
     "sluice process with the python op $(awk -v u="$aug_us" 'BEGIN {printf "%.3f", u / 1e3}')" \
     "(its Python processes not counted), PIL decode+crop $pil_ms, augment $augment_ms"
awk -v c="$cpp_us" -v p="$pil_ms" -v a="$augment_ms" 'BEGIN {
  printf "augment ratio the parts allow: (%.3f + %.3f) / (%.3f + %.3f) = %.2f\n",
         p, a, c / 1e3, a, (p + a) / (c / 1e3 + a) }'
