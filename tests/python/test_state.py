"""state_dict in one process, load_state_dict in a new one: every record still exactly once."""
import pickle

from conftest import NUM_IMAGES, SPLIT_SIZE, run_python

# Reads `take` batches (all if negative) of `job`, optionally restoring a pickled state first;
# saves the state after them; prints the ids it read as JSON.
_NUMPY_CHILD = r"""
import json, pickle, sys
import sluice
dispatcher, spec, data, job, take, state_in, state_out = sys.argv[1:]
client = sluice.Client(dispatcher)
state = pickle.load(open(state_in, "rb")) if state_in != "-" else None
it = client.open(spec, data=data, job=job, epochs=2, split_size=%d, deterministic=True,
                 restore_state=state)
ids = []
for i, batch in enumerate(it):
    ids.append([it.epoch] + batch["index"].tolist())
    if i + 1 == int(take):
        break
pickle.dump(it.state_dict(), open(state_out, "wb"))
it.close()
print(json.dumps(ids))
""" % SPLIT_SIZE

_TORCH_CHILD = r"""
import json, pickle, sys
from torch.utils.data import DataLoader
from sluice.torch import DataServiceDataset
dispatcher, spec, data, job, take, state_in, state_out = sys.argv[1:]
ds = DataServiceDataset(dispatcher, spec, data=data, job=job, split_size=%d)
if state_in != "-":
    ds.load_state_dict(pickle.load(open(state_in, "rb")))
ids = []
for i, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=0)):
    ids.extend(batch["index"].tolist())
    if i + 1 == int(take):
        break
pickle.dump(ds.state_dict(), open(state_out, "wb"))
print(json.dumps(ids))
""" % SPLIT_SIZE


def test_iterator_state_continues_exactly_once_in_a_new_process(
        own_cluster, dataset, spec_file, work, job):
    cluster = own_cluster
    state = work / (job + ".state")
    first = run_python(_NUMPY_CHILD, cluster, spec_file, dataset, job, 5, "-", state)
    assert len(first) == 5
    saved = pickle.loads(state.read_bytes())
    assert saved["job"] == job and saved["version"] == 1
    rest = run_python(_NUMPY_CHILD, cluster, spec_file, dataset, job, -1, state,
                      work / (job + ".state2"))
    by_epoch = {0: [], 1: []}
    for batch in first + rest:
        by_epoch[batch[0]].extend(batch[1:])
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == list(range(NUM_IMAGES)), epoch


def test_dataset_state_continues_exactly_once_in_a_new_process(
        own_cluster, dataset, spec_file, work, job):
    cluster = own_cluster
    state = work / (job + ".state")
    first = run_python(_TORCH_CHILD, cluster, spec_file, dataset, job, 3, "-", state)
    rest = run_python(_TORCH_CHILD, cluster, spec_file, dataset, job, -1, state,
                      work / (job + ".state2"))
    assert len(first) == 3 * 8
    assert sorted(first + rest) == list(range(NUM_IMAGES))


# Rank `rank` of `world` (DataServiceDataset.consumer() stands in for torch.distributed) reads
# `take` batches (all if negative) of the deterministic job, after loading the list of states
# in `states_in` (comma-separated pickles, "-": none); saves its state_dict() to `state_out`.
_RANK_CHILD = r"""
import json, pickle, sys
from torch.utils.data import DataLoader
from sluice.torch import DataServiceDataset
dispatcher, spec, data, job, rank, world, take, states_in, state_out = sys.argv[1:]
ds = DataServiceDataset(dispatcher, spec, data=data, job=job, split_size=%d, deterministic=True)
ds.consumer = lambda: (int(rank), int(world))
if states_in != "-":
    ds.load_state_dict([pickle.load(open(p, "rb")) for p in states_in.split(",")])
ids = []
for i, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=0)):
    ids.extend(batch["index"].tolist())
    if i + 1 == int(take):
        break
if state_out != "-":
    pickle.dump(ds.state_dict(), open(state_out, "wb"))
print(json.dumps(ids))
""" % SPLIT_SIZE


def test_dataset_states_of_three_ranks_resume_on_two_mid_epoch(
        own_cluster, dataset, spec_file, work, job):
    # 96 records over 3 ranks: 32 each, 4 batches of 8. Each rank stops after 1 batch: 9 batches
    # are left, 5 for new rank 0 and 4 for new rank 1, in the uninterrupted global order.
    cluster = own_cluster
    ref = [run_python(_RANK_CHILD, cluster, spec_file, dataset, job + "-ref", k, 3, -1, "-", "-")
           for k in range(3)]
    assert [len(r) for r in ref] == [32, 32, 32]
    states = [work / ("%s.rank%d" % (job, k)) for k in range(3)]
    first = [run_python(_RANK_CHILD, cluster, spec_file, dataset, job, k, 3, 1, "-", states[k])
             for k in range(3)]
    assert first == [r[:8] for r in ref]
    listed = ",".join(str(s) for s in reversed(states))  # any order
    new = [run_python(_RANK_CHILD, cluster, spec_file, dataset, job, k, 2, -1, listed, "-")
           for k in range(2)]
    assert [len(n) for n in new] == [40, 32]
    assert new[0] + new[1] == ref[0][8:] + ref[1][8:] + ref[2][8:]
    assert sorted(sum(first, []) + new[0] + new[1]) == list(range(NUM_IMAGES))


def test_dataset_refuses_rank_states_of_different_epochs():
    import pytest
    pytest.importorskip("torch")
    import sluice
    from sluice.torch import DataServiceDataset
    ds = DataServiceDataset("127.0.0.1:1", "unused.yaml", job="run")
    with pytest.raises(sluice.InvalidArgument, match=r"epochs \[0, 1\]"):
        ds.load_state_dict([{"job": "run", "epoch": 0, "iterator_state": {"version": 1}},
                            {"job": "run", "epoch": 1}])
    with pytest.raises(sluice.InvalidArgument, match="of job 'other'"):
        ds.load_state_dict([{"job": "other", "epoch": 0}])
