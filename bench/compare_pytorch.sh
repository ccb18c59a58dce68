#!/usr/bin/env bash
# sluice pipeline vs PyTorch DataLoader vs the bare kernels, on one synthetic JPEG folder, in one
# run. Figures go to docs/BENCHMARKS.md ("Pipeline vs PyTorch DataLoader").
#
#   bench/compare_pytorch.sh [--images N] [--epochs E] [--csv FILE] [--plot FILE.png]
#
# (a) PyTorch 1.13 DataLoader + torchvision ImageFolder, RandomResizedCrop(224) + flip + ToTensor +
#     Normalize, num_workers = nproc, batch 64 (bench/pytorch_loader.py, Debian's /usr/bin/python3);
# (b) `sluice pipeline run --spec bench/pipelines/imagenet_train.yaml` on the converted dataset,
#     all cores (autotuned);
# (c) kernel_ceiling_bench: the same fused op chain + batching on nproc threads, images already in
#     memory, no queues — the ceiling for (b).
# Each takes one warm-up epoch, then E timed epochs. Prints images/s of each, (b)/(a) (target >= 3)
# and (b)/(c) (target >= 0.85).
#
# Needs build/bin/sluice and build/bin/kernel_ceiling_bench (SLUICE_BUILD_DIR to use another
# build folder). Writes ~90 MB x 2 under $TMPDIR and removes them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
images=2000
epochs=2
csv=""
plot=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --images) images="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --csv) csv="$2"; shift 2 ;;
    --plot) plot="$2"; shift 2 ;;
    *) echo "compare_pytorch.sh: unknown flag $1" >&2; exit 1 ;;
  esac
done
for b in sluice kernel_ceiling_bench; do
  if [[ ! -x "$build/bin/$b" ]]; then
    echo "compare_pytorch.sh: $build/bin/$b not found; build it: cmake --build build --target $b" >&2
    exit 1
  fi
done
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-compare-XXXXXX")"
trap 'rm -rf "$work"' EXIT
nproc="$(nproc)"
echo "# $(date -u +%FT%TZ)  nproc=$nproc  $(lscpu | sed -n 's/^Model name: *//p')" \
     " mem=$(free -g | awk '/^Mem:/{print $2}')GiB  load: $(cut -d' ' -f1-3 /proc/loadavg)"

"$build/bin/sluice" datagen --output "$work/images" --images "$images" --seed 1 2>/dev/null
"$build/bin/sluice" record convert --input "$work/images" --output "$work/ds" --format imagefolder \
  2>/dev/null >/dev/null
echo "# data: $images JPEGs, $(du -sm "$work/images" | cut -f1) MB"

rate() { sed -n "s/^$1: \([0-9.]*\) images\/s$/\1/p" | tail -1; }

echo "== (a) PyTorch DataLoader, num_workers=$nproc"
out_a="$(/usr/bin/python3 "$root/bench/pytorch_loader.py" --data "$work/images" --workers "$nproc" \
         --epochs "$epochs")"
echo "$out_a"
a="$(echo "$out_a" | rate pytorch)"

echo "== (b) sluice pipeline run (all cores, autotune)"
out_b="$("$build/bin/sluice" pipeline run --spec "$root/bench/pipelines/imagenet_train.yaml" \
         --data "$work/ds" --warmup-epochs 1 --epochs "$epochs")"
echo "$out_b"
b="$(echo "$out_b" | rate throughput)"

echo "== (c) bare kernels on $nproc threads"
out_c="$("$build/bin/kernel_ceiling_bench" --spec "$root/bench/pipelines/imagenet_train.yaml" \
         --data "$work/ds" --threads "$nproc" --epochs "$epochs")"
echo "$out_c"
c="$(echo "$out_c" | rate kernels)"

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'pytorch %s images/s\nsluice %s images/s\nkernels %s images/s\n' "$a" "$b" "$c"
awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN {
  printf "sluice/pytorch = %.2f (target >= 3)\nsluice/kernels = %.2f (target >= 0.85)\n", b / a, b / c }'
if [[ -n "$csv" ]]; then
  printf 'system,images_per_s\npytorch,%s\nsluice,%s\nkernels,%s\n' "$a" "$b" "$c" > "$csv"
fi
if [[ -n "$plot" ]]; then
  /usr/bin/python3 - "$a" "$b" "$c" "$plot" <<'PY'
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
a, b, c, out = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
names = ["PyTorch DataLoader\n+ torchvision", "sluice pipeline\n(autotuned)", "bare kernels\n(ceiling)"]
fig, ax = plt.subplots(figsize=(6, 3.6))
bars = ax.bar(names, [a, b, c], color=["#999999", "#1f77b4", "#aec7e8"])
for bar, v in zip(bars, [a, b, c]):
    ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom")
ax.set_ylabel("images/s (higher is better)")
ax.set_title(f"ImageNet train transforms, 2 cores: sluice/PyTorch = {b / a:.2f}x, "
             f"sluice/ceiling = {b / c:.2f}", fontsize=9)
fig.tight_layout()
fig.savefig(out, dpi=110)
PY
  echo "plot: $plot"
fi
