"""Two DDP ranks (gloo, two processes) x two DataLoader workers read a real cluster the PyTorch
way: one pass = one epoch (set_epoch, as with a DistributedSampler), every record exactly once
per epoch, the same number of batches on both ranks (DDP's collectives stay in step), and a
restart resumes from the dataset's state_dict at the next epoch."""
import json
import socket
import subprocess
import sys

from conftest import NUM_IMAGES, SPLIT_SIZE, python_env

# One DDP rank. Trains a tiny model with DistributedDataParallel (an all-reduce per step: a
# rank with fewer batches would hang the other), records what each epoch delivered, and saves
# the dataset's state after the last epoch, as a training script checkpoints.
_RANK = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from sluice.torch import DataServiceDataset

dispatcher, spec, data, job, first_epoch, epochs, state_in, out = sys.argv[1:]
dist.init_process_group("gloo")
rank = dist.get_rank()
ds = DataServiceDataset(dispatcher, spec, data=data, job=job, split_size=int(os.environ["SPLIT"]),
                        dispatcher_lost_timeout=60)
if state_in != "-":
    ds.load_state_dict(json.load(open(state_in)))
assert ds.epoch == int(first_epoch), (ds.epoch, first_epoch)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3 * 32 * 32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(ds, batch_size=None, num_workers=2)
seen = {}
for epoch in range(int(first_epoch), int(first_epoch) + int(epochs)):
    ds.set_epoch(epoch)
    ids = seen.setdefault(str(epoch), [])
    for batch in loader:
        assert batch["epoch"] == epoch, (batch["epoch"], epoch)
        loss = torch.nn.functional.cross_entropy(model(batch["image"].flatten(1)),
                                                 batch["label"].long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ids.extend(batch["index"].tolist())
    ds.set_epoch(epoch + 1)  # what the next epoch reads: state_dict() says so
json.dump({"rank": rank, "consumer": list(ds.consumer()), "seen": seen,
           "state": ds.state_dict()}, open(out, "w"))
dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(work, name, args, first_epoch, epochs, state_in="-"):
    """Starts both ranks, waits for them; returns their outputs by rank."""
    env = python_env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               SPLIT=str(SPLIT_SIZE))
    procs = []
    for rank in range(2):
        out = work / ("%s-rank%d.json" % (name, rank))
        log = open(work / ("%s-rank%d.log" % (name, rank)), "w")
        procs.append((subprocess.Popen(
            [sys.executable, "-c", _RANK, *map(str, (*args, first_epoch, epochs, state_in, out))],
            env=dict(env, RANK=str(rank)), stdout=log, stderr=subprocess.STDOUT), out, log))
    results = {}
    for proc, out, log in procs:
        code = proc.wait(timeout=240)
        log.close()
        assert code == 0, (work / (out.stem + ".log")).read_text()
        result = json.loads(out.read_text())
        results[result["rank"]] = result
    return results


def test_two_ddp_ranks_read_each_epoch_once_in_step_and_resume(cluster, dataset, spec_file, job,
                                                               work):
    args = (cluster, spec_file, dataset, job)
    first = _run_ranks(work, job + "-a", args, first_epoch=0, epochs=2)
    # Outside a DataLoader worker each rank is consumer `rank` of 2 (workers: rank*2+id of 4).
    assert [first[r]["consumer"] for r in (0, 1)] == [[0, 2], [1, 2]]
    for epoch in ("0", "1"):
        per_rank = [first[r]["seen"][epoch] for r in (0, 1)]
        assert len(per_rank[0]) == len(per_rank[1]) == NUM_IMAGES // 2
        assert sorted(per_rank[0] + per_rank[1]) == list(range(NUM_IMAGES))
    # Each epoch has its own order.
    assert first[0]["seen"]["0"] != first[0]["seen"]["1"]
    assert first[0]["state"] == first[1]["state"] == {"job": job, "epoch": 2}

    state = work / (job + "-state.json")
    state.write_text(json.dumps(first[0]["state"]))
    resumed = _run_ranks(work, job + "-b", args, first_epoch=2, epochs=1, state_in=state)
    per_rank = [resumed[r]["seen"]["2"] for r in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1]) == NUM_IMAGES // 2
    assert sorted(per_rank[0] + per_rank[1]) == list(range(NUM_IMAGES))
    assert resumed[0]["state"] == {"job": job, "epoch": 3}
