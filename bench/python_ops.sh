#!/usr/bin/env bash
# sluice's python op vs PyTorch's DataLoader running the same user function on the same cores,
# one run, ratios printed (issue goals: augment >= 2x, alone >= 0.9x), for user functions of
# different costs. Figures go to docs/BENCHMARKS.md.
#
#   bench/python_ops.sh [--images N] [--epochs E] [--threads T] [--rounds R]
#                       [--modes "augment pil lut alone"]
#
# augment: sluice `pipeline run --spec bench/pipelines/python_augment.yaml` (C++ decode +
#          RandomResizedCrop(224), then examples/python_transforms/augment_numpy.train in the
#          worker's Python process pool) vs bench/python_ops_loader.py --mode augment
#          (torchvision ImageFolder decode + RandomResizedCrop, then the same function);
# pil:     the same with augment_pil.train (PIL rotation, blur, autocontrast: about as costly);
# lut:     the same with augment_lut.train (flip + brightness/contrast through a uint8 table:
#          a cheap function);
# alone:   bench/pipelines/python_alone.yaml vs --mode alone: only augment_numpy.busy, a pure
#          Python function, on each record's label.
# sluice gets --threads T (its stage threads, each with one Python process busy at a time); the
# DataLoader num_workers = T. Two ratios per round, sides alternating: the whole run as a user
# sees it (E epochs with no warm-up; sluice: the `sluice pipeline run` command from its start to
# its exit; DataLoader: from making the dataset and the loader to the last batch, the script's
# `import torch` left out), and the steady state (one untimed warm-up epoch, then E timed epochs).
# E is 5E for alone. R rounds; the median ratio and the range are printed per mode, whole run
# first (the headline).
# Then the costs, CPU per image of each side's parts on their own: PIL decode + crop and each
# function (bench/python_ops_costs.py); sluice's decode + crop (`pipeline run` of the augment
# spec without its python op); sluice's python-op path (bench/pipelines/python_path.yaml: the
# same with a function that returns its input; the sluice process's and its Python processes'
# CPU minus decode + crop). And per mode the ratio those parts allow when both sides use the
# cores fully and nothing else costs: (PIL + f) / (sluice decode + crop + path + f).
# Needs build/bin/sluice and Debian's /usr/bin/python3 with torch, torchvision, numpy and PIL.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
images=1000
epochs=2
threads=2
rounds=3
modes="augment pil lut alone"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --images) images="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
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
echo "# data: $images JPEGs; threads=$threads epochs=$epochs rounds=$rounds modes=$modes"

sluice_rate() {  # spec epochs
  "$build/bin/sluice" pipeline run --spec "$1" --data "$work/ds" --threads "$threads" \
    --epochs "$2" --warmup-epochs 1 --allow-python-ops \
    --python-path "$root/examples/python_transforms" --python-path "$root/bench" 2>/dev/null |
    sed -n 's/^throughput: \([0-9.]*\) images\/s/\1/p'
}
# The whole command, start-up included: images delivered / its wall time.
sluice_whole_rate() {  # spec epochs
  local t0 t1 n
  t0="$(date +%s.%N)"
  n="$("$build/bin/sluice" pipeline run --spec "$1" --data "$work/ds" --threads "$threads" \
    --epochs "$2" --warmup-epochs 0 --allow-python-ops \
    --python-path "$root/examples/python_transforms" --python-path "$root/bench" 2>/dev/null |
    sed -n 's/^\([0-9]*\) images in .*/\1/p')"
  t1="$(date +%s.%N)"
  awk -v n="$n" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", n / (b - a)}'
}
torch_rate() {  # mode epochs [--whole]
  /usr/bin/python3 "$root/bench/python_ops_loader.py" --data "$work/images" --mode "$1" \
    --workers "$threads" --epochs "$2" ${3:-} | sed -n 's/^pytorch: \([0-9.]*\) images\/s/\1/p'
}
ratio_of() { awk -v s="$1" -v t="$2" 'BEGIN {printf "%.2f", s / t}'; }
summary() {  # ratios...
  local med lo hi
  med="$(printf '%s\n' "$@" | median)"
  lo="$(printf '%s\n' "$@" | sort -g | head -1)"
  hi="$(printf '%s\n' "$@" | sort -g | tail -1)"
  echo "$med ($lo-$hi)"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A medians
for mode in $modes; do
  whole=()
  steady=()
  # alone reads no image and is ~10x faster per record: 5x the epochs, so that a timed run
  # lasts seconds, not a fraction of one.
  e="$epochs"
  if [[ "$mode" == alone ]]; then e=$((epochs * 5)); fi
  spec="$root/bench/pipelines/python_$mode.yaml"
  for ((r = 1; r <= rounds; r++)); do
    sw="$(sluice_whole_rate "$spec" "$e")"
    tw="$(torch_rate "$mode" "$e" --whole)"
    s="$(sluice_rate "$spec" "$e")"
    t="$(torch_rate "$mode" "$e")"
    whole+=("$(ratio_of "$sw" "$tw")")
    steady+=("$(ratio_of "$s" "$t")")
    echo "$mode round $r: whole run sluice $sw images/s, pytorch $tw images/s, ratio ${whole[-1]};" \
         "steady sluice $s images/s, pytorch $t images/s, ratio ${steady[-1]}"
  done
  medians[$mode]="$(summary "${whole[@]}")"
  echo "$mode: sluice/pytorch whole run median ${medians[$mode]}; steady state median" \
       "$(summary "${steady[@]}")"
done

noaug="$work/python_augment_cpp_only.yaml"
grep -v 'python:' "$root/bench/pipelines/python_augment.yaml" >"$noaug"
sluice_cpu() {  # spec -> "<sluice process us/image> <its Python processes' us/image>"
  "$build/bin/sluice" pipeline run --spec "$1" --data "$work/ds" --threads "$threads" \
    --epochs "$epochs" --warmup-epochs 1 --allow-python-ops \
    --python-path "$root/examples/python_transforms" --python-path "$root/bench" 2>/dev/null |
    awk '/^cpu: / {c = $2} /^python cpu: / {p = $3} END {printf "%s %s\n", c, p + 0}'
}
cpp_us="$(sluice_cpu "$noaug" | cut -d' ' -f1)"
read -r path_sluice_us path_python_us <<<"$(sluice_cpu "$root/bench/pipelines/python_path.yaml")"
costs="$(/usr/bin/python3 "$root/bench/python_ops_costs.py" --data "$work/images")"
cost() { sed -n "s/^$1_ms: //p" <<<"$costs"; }
pil_ms="$(cost pil_decode_crop)"
awk -v c="$cpp_us" -v s="$path_sluice_us" -v p="$path_python_us" -v pil="$pil_ms" 'BEGIN {
  printf "costs, CPU ms/image: sluice decode+crop %.3f; sluice python-op path %.3f (sluice side %.3f, Python side %.3f); PIL decode+crop %.3f\n",
         c / 1e3, (s + p - c) / 1e3, (s - c) / 1e3, p / 1e3, pil }'
for mode in augment pil lut; do
  f_ms="$(cost "$mode")"
  awk -v m="$mode" -v c="$cpp_us" -v s="$path_sluice_us" -v p="$path_python_us" -v pil="$pil_ms" \
      -v f="$f_ms" -v r="${medians[$mode]:-not run}" 'BEGIN {
    path = (s + p - c) / 1e3
    printf "%s: function %.3f ms; ratio the parts allow (%.3f + %.3f) / (%.3f + %.3f + %.3f) = %.2f; measured (whole run) %s\n",
           m, f, pil, f, c / 1e3, path, f, (pil + f) / (c / 1e3 + path + f), r }'
done
