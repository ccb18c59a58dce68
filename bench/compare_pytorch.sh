#!/usr/bin/env bash
# sluice vs PyTorch's DataLoader vs the kernel ceilings, ImageNet train and eval pipelines, 1 and 2
# threads, plus the executor's per-element overhead on small records: all in one run, each
# sluice figure measured right beside its peers. Figures go to docs/BENCHMARKS.md.
#
#   bench/compare_pytorch.sh [--images N] [--epochs E] [--threads "2 1"] [--small N]
#                            [--csv FILE] [--plot FILE.png]
#
# For each workload (train, eval) and thread count T, back to back:
#   pytorch  PyTorch DataLoader + torchvision ImageFolder, num_workers = T, batch 64
#            (bench/pytorch_loader.py [--eval], Debian's /usr/bin/python3);
#   sluice   `sluice pipeline run --spec bench/pipelines/imagenet_<w>.yaml --threads T`
#            on the converted dataset (autotuned within T threads);
#   plan     kernel_ceiling_bench --chain plan: the optimizer's physical plan, images in memory,
#            no reads/queues/ordering, T threads;
#   fast     kernel_ceiling_bench --chain fast: the fastest hand-written chain at equal fidelity.
# sluice/ceiling uses the faster of plan and fast (the strict ceiling). Each system takes one
# warm-up epoch, then E timed epochs.
# Small records: `sluice pipeline run --spec bench/pipelines/small_records.yaml` (label + 16
# floats per element, batch 64) vs small_records_bench's plain loop over the same records, one
# thread each; overhead = 1/sluice - 1/loop, in µs per element.
#
# Needs build/bin/{sluice,kernel_ceiling_bench,small_records_bench} (SLUICE_BUILD_DIR for
# another build folder). Writes ~200 MB under $TMPDIR and removes them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
images=2000
epochs=2
thread_counts="2 1"
small=500000
csv=""
plot=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --images) images="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --threads) thread_counts="$2"; shift 2 ;;
    --small) small="$2"; shift 2 ;;
    --csv) csv="$2"; shift 2 ;;
    --plot) plot="$2"; shift 2 ;;
    *) echo "compare_pytorch.sh: unknown flag $1" >&2; exit 1 ;;
  esac
done
for b in sluice kernel_ceiling_bench small_records_bench; do
  if [[ ! -x "$build/bin/$b" ]]; then
    echo "compare_pytorch.sh: $build/bin/$b not found; build it: cmake --build build --target $b" >&2
    exit 1
  fi
done
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-compare-XXXXXX")"
trap 'rm -rf "$work"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }
echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')" \
     " mem=$(free -g | awk '/^Mem:/{print $2}')GiB  load: $(cut -d' ' -f1-3 /proc/loadavg)"

"$build/bin/sluice" datagen --output "$work/images" --images "$images" --seed 1 2>/dev/null
"$build/bin/sluice" record convert --input "$work/images" --output "$work/ds" --format imagefolder \
  2>/dev/null >/dev/null
echo "# data: $images JPEGs, $(du -sm "$work/images" | cut -f1) MB"

rate() { sed -n "s/^$1: \([0-9.]*\) \(images\|elements\)\/s.*$/\1/p" | tail -1; }
# CPU microseconds per image: "cpu: N us/image" (sluice) or "<chain>: ..., N us CPU/image".
cpu() { sed -n -e "s/^$1: \([0-9.]*\) us\/image$/\1/p" \
               -e "s/^$1: .*, \([0-9.]*\) us CPU\/image.*$/\1/p" | tail -1; }

rows=()
for workload in train eval; do
  spec="$root/bench/pipelines/imagenet_$workload.yaml"
  eval_flag=""
  [[ $workload == eval ]] && eval_flag="--eval"
  for t in $thread_counts; do
    l0="$(load)"
    echo "== $workload, $t thread(s), load $l0"
    out_a="$(/usr/bin/python3 "$root/bench/pytorch_loader.py" --data "$work/images" --workers "$t" \
             --epochs "$epochs" $eval_flag)"
    a="$(echo "$out_a" | rate pytorch)"
    out_b="$("$build/bin/sluice" pipeline run --spec "$spec" --data "$work/ds" --threads "$t" \
             --warmup-epochs 1 --epochs "$epochs" 2>/dev/null)"
    b="$(echo "$out_b" | rate throughput)"
    bc="$(echo "$out_b" | cpu cpu)"
    echo "$out_b" | grep -E '^(plan|rewrites|autotuned)' | sed 's/^/   /'
    out_c="$("$build/bin/kernel_ceiling_bench" --spec "$spec" --data "$work/ds" --threads "$t" \
             --epochs "$epochs")"
    p="$(echo "$out_c" | rate plan)"
    f="$(echo "$out_c" | rate fast)"
    pc="$(echo "$out_c" | cpu plan)"
    fc="$(echo "$out_c" | cpu fast)"
    l1="$(load)"
    printf '   pytorch %s, sluice %s, plan ceiling %s, fast ceiling %s images/s (load %s -> %s)\n' \
      "$a" "$b" "$p" "$f" "$l0" "$l1"
    printf '   CPU per image: sluice %s us, plan %s us, fast %s us\n' "$bc" "$pc" "$fc"
    rows+=("$workload $t $a $b $p $f $l0 $l1 $bc $pc $fc")
  done
done

echo "== small records, 1 thread"
"$build/bin/small_records_bench" --make "$work/small" --records "$small" >/dev/null
l0="$(load)"
out_s="$("$build/bin/sluice" pipeline run --spec "$root/bench/pipelines/small_records.yaml" \
         --data "$work/small" --threads 1 --warmup-epochs 1 --epochs "$epochs" 2>/dev/null)"
s="$(echo "$out_s" | rate throughput)"
out_l="$("$build/bin/small_records_bench" --loop "$work/small" --epochs "$epochs")"
lp="$(echo "$out_l" | rate loop)"
l1="$(load)"

echo
echo "images/s; sluice/ceiling = sluice / max(plan, fast); cpu-eff = min CPU us/image of the"
echo "ceilings / sluice's CPU us/image (robust to the other jobs on the machine)"
echo "workload threads  pytorch   sluice  plan-ceil fast-ceil  sluice/ceiling  cpu-eff  sluice/pytorch  load"
for r in "${rows[@]}"; do
  # shellcheck disable=SC2086
  set -- $r
  awk -v w="$1" -v t="$2" -v a="$3" -v b="$4" -v p="$5" -v f="$6" -v l0="$7" -v l1="$8" \
      -v bc="$9" -v pc="${10}" -v fc="${11}" 'BEGIN {
    c = p > f ? p : f
    m = pc < fc ? pc : fc
    printf "%-8s %7s %8.0f %8.0f %10.0f %9.0f %15.2f %8.2f %15.2f  %s-%s\n", w, t, a, b, p, f, \
           b / c, m / bc, b / a, l0, l1 }'
done
awk -v s="$s" -v l="$lp" -v l0="$l0" -v l1="$l1" 'BEGIN {
  printf "small records, 1 thread: sluice %.0f elements/s, plain loop %.0f elements/s, " \
         "overhead %.2f us/element (load %s-%s)\n", s, l, 1e6 / s - 1e6 / l, l0, l1 }'
echo "targets (train, largest thread count): sluice/ceiling >= 0.85, sluice/pytorch >= 4"

if [[ -n "$csv" ]]; then
  {
    echo "workload,threads,pytorch,sluice,plan_ceiling,fast_ceiling,load_before,load_after,sluice_cpu_us,plan_cpu_us,fast_cpu_us"
    for r in "${rows[@]}"; do echo "${r// /,}"; done
    echo "small,1,,$s,$lp,,$l0,$l1"
  } > "$csv"
fi
if [[ -n "$plot" ]]; then
  printf '%s\n' "${rows[@]}" > "$work/rows.txt"
  /usr/bin/python3 - "$plot" "$work/rows.txt" <<'PY'
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [line.split() for line in open(sys.argv[2]) if line.strip()]
fig, ax = plt.subplots(figsize=(7.5, 3.8))
width = 0.2
labels = [f"{r[0]}\n{r[1]} thread(s)" for r in rows]
series = [("PyTorch DataLoader", 2, "#999999"), ("sluice", 3, "#1f77b4"),
          ("plan ceiling", 4, "#aec7e8"), ("fast ceiling", 5, "#ff7f0e")]
for k, (name, col, color) in enumerate(series):
    xs = [i + (k - 1.5) * width for i in range(len(rows))]
    vals = [float(r[col]) for r in rows]
    ax.bar(xs, vals, width, label=name, color=color)
    for x, v in zip(xs, vals):
        ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=6)
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(labels)
ax.set_ylabel("images/s (higher is better)")
ax.legend(fontsize=7)
ax.set_title("sluice vs PyTorch vs kernel ceilings (same run, same photos)", fontsize=9)
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=110)
PY
  echo "plot: $plot"
fi
