#!/usr/bin/env bash
# The Python client against its peers, on one machine, in one run (docs/BENCHMARKS.md, "Python
# client"):
#   (1) reader: the same job read through the Python iterator (sluice.Client) and through the C++
#       client (`sluice consume`), alternating, ROUNDS times each; goal: Python >= 0.95 x C++.
#   (2) training-style loop (a tiny model step per batch, so the loop is data-bound) fed by
#       sluice.torch.DataServiceDataset (the cluster's workers preprocess) vs the same loop fed by
#       DataLoader + torchvision ImageFolder with the same transforms (RandomResizedCrop(224),
#       RandomHorizontalFlip, ToTensor, Normalize), num_workers = nproc; both on all of this
#       machine's cores; goal: sluice >= 3 x DataLoader. Both read the same LOOP_EPOCHS epochs,
#       each in its own way: one DataServiceDataset iterator over all of them, the DataLoader
#       iterated once per epoch (persistent workers). Both are timed over the whole run (from
#       before the dataset is made to the last step) and from step 10 on; the images are those
#       the loop stepped on.
# ROUNDS rounds of each (>= 3); odd rounds run the C++ reader and the DataLoader first, even rounds
# the Python reader and sluice first. Headline figures are the median of the rounds with their
# range [min-max]; ratios are taken within a round, then their median.
#
#   bench/python_client.sh            IMAGES=1000 EPOCHS=2 ROUNDS=3 WORKERS=1 LOOP_EPOCHS=3
# Needs build/bin and build/python (SLUICE_BUILD_DIR for another build folder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
bin="$build/bin"
images="${IMAGES:-1000}"
epochs="${EPOCHS:-2}"
rounds="${ROUNDS:-3}"
workers="${WORKERS:-1}"
loop_epochs="${LOOP_EPOCHS:-3}"
if (( rounds < 3 )); then echo "ROUNDS must be >= 3 (a median of fewer is no headline)" >&2; exit 2; fi
spec="$root/bench/pipelines/imagenet_train.yaml"
py=/usr/bin/python3
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
source "$root/bench/lib/cluster.sh"
bench_start pyclient
make_dataset "$images" "$work/ds" 1
echo "# data: $images JPEGs, $(du -sm "$work/ds.jpegs" | cut -f1) MB; cluster: sluice local --workers $workers"

"$bin/sluice" local --workers "$workers" --data-root "$work" --address-file "$work/address" \
  --work-dir "$work/cluster" --log-level warn >"$work/local.txt" 2>&1 &
bench_pids+=($!)
for _ in $(seq 200); do [[ -s "$work/address" ]] && break; sleep 0.1; done
dispatcher="$(cat "$work/address")"

echo "== (1) reader: Python iterator vs C++ client, $epochs epochs of imagenet_train.yaml"
cpp_rates=()
py_rates=()
run_cpp() {
  rate=$("$bin/sluice" consume --dispatcher "$dispatcher" --spec "$spec" --data "$work/ds" \
           --job "cpp-$1" --epochs "$epochs" 2>/dev/null | awk '/^throughput:/ {print $2}')
  echo "round $1  C++     $rate images/s"
  cpp_rates+=("$rate")
}
run_py() {
  rate=$("$py" - "$dispatcher" "$spec" "$work/ds" "py-$1" "$epochs" <<'PY'
import sys, time
import sluice
dispatcher, spec, data, job, epochs = sys.argv[1:]
client = sluice.Client(dispatcher)
start = time.perf_counter()  # as `sluice consume`: from before Open to the last batch
n = 0
for batch in client.open(spec, data=data, job=job, epochs=int(epochs)):
    n += len(batch["index"])
    del batch  # as `sluice consume` does: the buffer goes before the next one arrives
print("%.1f" % (n / (time.perf_counter() - start)))
PY
)
  echo "round $1  Python  $rate images/s"
  py_rates+=("$rate")
}
# Odd rounds run C++ first, even rounds Python first: no order bias.
for r in $(seq "$rounds"); do
  if (( r % 2 )); then run_cpp "$r"; run_py "$r"; else run_py "$r"; run_cpp "$r"; fi
done
reader_ratios=()
for i in "${!cpp_rates[@]}"; do
  reader_ratios+=("$(awk -v p="${py_rates[$i]}" -v c="${cpp_rates[$i]}" 'BEGIN {printf "%.4f", p / c}')")
done

echo "== (2) training-style loop, $loop_epochs epochs of batch 64"
cat > "$work/loop.py" <<'PY'
import sys, time
import torch
import torchvision
from torch import nn
from torchvision import transforms

mode, epochs = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
start = time.perf_counter()  # the whole run: making the dataset and loader included
if mode == "sluice":
    from sluice.torch import DataServiceDataset
    dispatcher, spec, data = sys.argv[3:6]
    ds = DataServiceDataset(dispatcher, spec, data=data, job="loop-%d" % time.time_ns(),
                            epochs=epochs)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    key = lambda b: (b["image"], b["label"])

    def batches():  # one iterator over every epoch
        yield from loader
else:
    folder, workers = sys.argv[3], int(sys.argv[4])
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(folder, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers,
                                         persistent_workers=True, drop_last=True)
    key = lambda b: b

    def batches():  # the DataLoader's own way: iterated again for each epoch
        for _ in range(epochs):
            yield from loader

model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = batches()
n = n10 = 0
waited = 0.0
step = 0
while True:
    t0 = time.perf_counter()
    b = next(it, None)
    if b is None:
        break
    waited += time.perf_counter() - t0
    x, y = key(b)
    loss = nn.functional.cross_entropy(model(x), y % 10)
    opt.zero_grad()
    loss.backward()
    opt.step()
    n += x.shape[0]
    step += 1
    if step == 10:
        t10, n10 = time.perf_counter(), n
secs = time.perf_counter() - start
print("%.1f %.1f %.2f %d" % (n / secs, (n - n10) / (time.perf_counter() - t10), waited / secs, n))
import os
os._exit(0)  # skip tearing down the loader's workers
PY
torch_rates=(); torch_steady=(); sl_rates=(); sl_steady=(); loop_ratios=(); loop_steady_ratios=()
run_torch() {
  read -r rate steady wait n < <("$py" "$work/loop.py" torch "$loop_epochs" "$work/ds.jpegs" "$(nproc)")
  echo "round $1  DataLoader + ImageFolder (num_workers=$(nproc))  $rate images/s whole run, $steady from step 10, waited $wait of the time, $n images"
  torch_rates+=("$rate"); torch_steady+=("$steady")
}
run_sluice() {
  read -r rate steady wait n < <("$py" "$work/loop.py" sluice "$loop_epochs" "$dispatcher" "$spec" "$work/ds")
  echo "round $1  DataServiceDataset                                $rate images/s whole run, $steady from step 10, waited $wait of the time, $n images"
  sl_rates+=("$rate"); sl_steady+=("$steady")
}
for r in $(seq "$rounds"); do
  if (( r % 2 )); then run_torch "$r"; run_sluice "$r"; else run_sluice "$r"; run_torch "$r"; fi
  i=$((r - 1))
  loop_ratios+=("$(awk -v s="${sl_rates[$i]}" -v t="${torch_rates[$i]}" 'BEGIN {printf "%.4f", s / t}')")
  loop_steady_ratios+=("$(awk -v s="${sl_steady[$i]}" -v t="${torch_steady[$i]}" 'BEGIN {printf "%.4f", s / t}')")
done

echo
echo "== summary ($images images, $rounds rounds, median [min-max]; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "reader ($epochs epochs): C++ $(printf '%s\n' "${cpp_rates[@]}" | summary), Python $(printf '%s\n' "${py_rates[@]}" | summary) images/s"
echo "  ratio Python/C++                 $(printf '%s\n' "${reader_ratios[@]}" | summary)  (goal >= 0.95)"
echo "training loop ($loop_epochs epochs each): DataLoader $(printf '%s\n' "${torch_rates[@]}" | summary), sluice $(printf '%s\n' "${sl_rates[@]}" | summary) images/s, whole run"
echo "  ratio sluice/DataLoader, whole run       $(printf '%s\n' "${loop_ratios[@]}" | summary)  (goal >= 3)"
echo "  ratio sluice/DataLoader, from step 10    $(printf '%s\n' "${loop_steady_ratios[@]}" | summary)"
