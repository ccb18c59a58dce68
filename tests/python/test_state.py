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
