#!/usr/bin/env bash
# The Python client against its peers, on one machine, in one run (docs/BENCHMARKS.md, "Python
# client"):
#   (1) reader: the same job read through the Python iterator (sluice.Client) and through the C++
#       client (`sluice consume`), alternating, ROUNDS times each; goal: Python >= 0.95 x C++.
#   (2) training-style loop (a tiny model step per batch, so the loop is data-bound) fed by
#       sluice.torch.DataServiceDataset (the cluster's workers preprocess) vs the same loop fed by
#       DataLoader + torchvision ImageFolder with the same transforms (RandomResizedCrop(224),
#       RandomHorizontalFlip, ToTensor, Normalize), num_workers = nproc; both on all of this
#       machine's cores; goal: sluice >= 3 x DataLoader.
#
#   bench/python_client.sh            IMAGES=1000 EPOCHS=2 ROUNDS=2 WORKERS=1 STEPS=150 by default
# Needs build/bin and build/python (SLUICE_BUILD_DIR for another build folder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SLUICE_BUILD_DIR:-$root/build}"
bin="$build/bin"
images="${IMAGES:-1000}"
epochs="${EPOCHS:-2}"
rounds="${ROUNDS:-2}"
workers="${WORKERS:-1}"
steps="${STEPS:-150}"
spec="$root/bench/pipelines/imagenet_train.yaml"
py=/usr/bin/python3
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-pyclient-XXXXXX")"
cluster_pid=""
cleanup() {
  if [[ -n "$cluster_pid" ]]; then kill -TERM "$cluster_pid" 2>/dev/null; wait "$cluster_pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "# $(date -u +%FT%TZ)  nproc=$(nproc)  $(lscpu | sed -n 's/^Model name: *//p')  load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin/sluice" datagen --output "$work/images" --images "$images" --seed 1 >/dev/null 2>&1
"$bin/sluice" record convert --input "$work/images" --output "$work/ds" >/dev/null 2>&1
echo "# data: $images JPEGs, $(du -sm "$work/images" | cut -f1) MB; cluster: sluice local --workers $workers"

"$bin/sluice" local --workers "$workers" --data-root "$work" --address-file "$work/address" \
  --work-dir "$work/cluster" --log-level warn >"$work/local.txt" 2>&1 &
cluster_pid=$!
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
cpp=$(printf '%s\n' "${cpp_rates[@]}" | awk '{s += $1} END {printf "%.1f", s / NR}')
pyr=$(printf '%s\n' "${py_rates[@]}" | awk '{s += $1} END {printf "%.1f", s / NR}')

echo "== (2) training-style loop, $steps steps of batch 64 after 10 warm-up steps"
cat > "$work/loop.py" <<'PY'
import sys, time
import torch
import torchvision
from torch import nn
from torchvision import transforms

mode, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
if mode == "sluice":
    from sluice.torch import DataServiceDataset
    dispatcher, spec, data = sys.argv[3:6]
    ds = DataServiceDataset(dispatcher, spec, data=data, job="loop-%d" % time.time_ns(), epochs=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    key = lambda b: (b["image"], b["label"])
else:
    folder, workers = sys.argv[3], int(sys.argv[4])
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(folder, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers,
                                         persistent_workers=True, drop_last=True)
    key = lambda b: b

def forever():
    while True:
        yield from loader

model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = forever()
n = 0
for step in range(10 + max(steps, 1)):
    if step == 10:
        start, n, waited = time.perf_counter(), 0, 0.0
    t0 = time.perf_counter()
    x, y = key(next(it))
    if step >= 10:
        waited += time.perf_counter() - t0
    loss = nn.functional.cross_entropy(model(x), y % 10)
    opt.zero_grad()
    loss.backward()
    opt.step()
    n += x.shape[0]
secs = time.perf_counter() - start
print("%.1f %.2f" % (n / secs, waited / secs))
import os
os._exit(0)  # skip tearing down the endless loader
PY
read -r torch_rate torch_wait < <("$py" "$work/loop.py" torch "$steps" "$work/images" "$(nproc)")
echo "DataLoader + ImageFolder (num_workers=$(nproc))  $torch_rate images/s, waited $torch_wait of the time"
read -r sl_rate sl_wait < <("$py" "$work/loop.py" sluice "$steps" "$dispatcher" "$spec" "$work/ds")
echo "DataServiceDataset                                $sl_rate images/s, waited $sl_wait of the time"

echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v p="$pyr" -v c="$cpp" 'BEGIN {printf "reader: Python %.1f vs C++ %.1f images/s: ratio %.3f (goal >= 0.95)\n", p, c, p / c}'
awk -v s="$sl_rate" -v t="$torch_rate" 'BEGIN {printf "training loop: sluice %.1f vs DataLoader %.1f images/s: ratio %.2f (goal >= 3)\n", s, t, s / t}'
