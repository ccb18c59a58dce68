"""sluice.torch.DataServiceDataset with torch's DataLoader."""
import collections

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import NUM_IMAGES, SPLIT_SIZE, run_python

from sluice.torch import DataServiceDataset


# Runs in a new process, as a training script would: the DataLoader forks its workers before
# anything in that process touched gRPC (this test process has, in other tests).
_LOADER_CHILD = r"""
import json, sys
import torch
from torch.utils.data import DataLoader
from sluice.torch import DataServiceDataset
dispatcher, spec, data, job, num_workers, split_size = sys.argv[1:]
ds = DataServiceDataset(dispatcher, spec, data=data, job=job, split_size=int(split_size))
ids, shapes = [], set()
for batch in DataLoader(ds, batch_size=None, num_workers=int(num_workers)):
    assert set(batch) == {"image", "label", "index", "epoch"}, set(batch)
    assert batch["epoch"] == 0
    assert isinstance(batch["image"], torch.Tensor)
    assert batch["image"].dtype == torch.float32 and batch["index"].dtype == torch.int64
    shapes.add(tuple(batch["image"].shape[1:]))
    ids.extend(batch["index"].tolist())
assert ds._iterator is None  # nothing of gRPC stays in the parent
print(json.dumps({"ids": ids, "shapes": sorted(shapes)}))
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_record_once_through_dataloader(cluster, dataset, spec_file, job, num_workers):
    out = run_python(_LOADER_CHILD, cluster, spec_file, dataset, job, num_workers, SPLIT_SIZE)
    assert out["shapes"] == [[3, 32, 32]]
    assert sorted(out["ids"]) == list(range(NUM_IMAGES))


def test_each_loader_worker_is_a_consumer(cluster, dataset, spec_file, job):
    ds = DataServiceDataset(cluster, spec_file, data=dataset, job=job, split_size=SPLIT_SIZE)
    assert ds.consumer() == (0, 1)
    # Each worker reports its consumer index with its first batch only.
    loader = DataLoader(_Consumers(ds), batch_size=None, num_workers=2)
    assert sorted(list(c) for c in loader) == [[0, 2], [1, 2]]


class _Consumers(torch.utils.data.IterableDataset):
    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        yield self.ds.consumer()


def test_tensors_share_the_arrays_memory(cluster, dataset, spec_file, job):
    ds = DataServiceDataset(cluster, spec_file, data=dataset, job=job, split_size=SPLIT_SIZE)
    it = iter(ds)
    batch = next(it)
    addresses = ds._iterator._live().last_addresses()
    assert batch["image"].data_ptr() == addresses["image"]
    assert batch["label"].data_ptr() == addresses["label"]
    for _ in it:  # finish the job
        pass


def test_dataset_is_picklable_and_useful_in_help():
    import pickle
    ds = DataServiceDataset("127.0.0.1:1", "x.yaml", job="j")
    assert pickle.loads(pickle.dumps(ds)).job == "j"
    assert "num_workers" in DataServiceDataset.__doc__


def test_epoch_state_round_trips_without_a_cluster():
    ds = DataServiceDataset("127.0.0.1:1", "x.yaml", job="j")
    assert ds.state_dict() == {"job": "j", "epoch": 0}
    ds.set_epoch(5)
    assert ds.state_dict() == {"job": "j", "epoch": 5}
    assert ds.job_name(5) == "j/epoch-5"
    other = DataServiceDataset("127.0.0.1:1", "x.yaml", job="j")
    other.load_state_dict(ds.state_dict())
    assert other.epoch == 5
    import sluice
    with pytest.raises(sluice.InvalidArgument, match="state of job 'j', this dataset reads 'k'"):
        DataServiceDataset("127.0.0.1:1", "x.yaml", job="k").load_state_dict({"job": "j"})
    with pytest.raises(sluice.InvalidArgument, match="epoch must be >= 0"):
        ds.set_epoch(-1)


def test_a_pass_after_the_last_epoch_yields_nothing():
    ds = DataServiceDataset("127.0.0.1:1", "x.yaml", job="j", epochs=2)
    ds.set_epoch(2)
    assert list(ds) == []  # no connection attempted either


def test_bad_dispatcher_lost_timeout_is_invalid_argument():
    import sluice
    with pytest.raises(sluice.InvalidArgument, match="dispatcher_lost_timeout must be > 0"):
        sluice.Client("127.0.0.1:1", dispatcher_lost_timeout=0)


def test_tls_from_env(monkeypatch):
    import sluice
    monkeypatch.delenv("SLUICE_TLS_CA", raising=False)
    assert sluice.TLS.from_env() is None
    monkeypatch.setenv("SLUICE_TLS_CA", "/t/ca.crt")
    monkeypatch.setenv("SLUICE_TLS_SERVER_NAME", "sluice.sluice.svc")
    monkeypatch.setenv("SLUICE_AUTH_TOKEN_FILE", "/t/token")
    monkeypatch.delenv("SLUICE_TLS_CERT", raising=False)
    monkeypatch.delenv("SLUICE_TLS_KEY", raising=False)
    assert sluice.TLS.from_env() == sluice.TLS(ca="/t/ca.crt", token_file="/t/token",
                                               server_name="sluice.sluice.svc")


def test_each_epoch_draws_its_own_augmentation(cluster, dataset, work, job):
    """Epoch e is its own service job (seed mixed from seed and e): its random crops and flips
    must differ from the other epochs' (they were the same in every epoch while workers drew
    from the spec's seed only), and a rerun of an epoch under the same seed draws the same."""
    from conftest import small_pipeline
    spec = work / "random_ops.json"
    spec.write_text(small_pipeline(random_ops=True).to_json())

    def images(name, epoch, seed=3):
        ds = DataServiceDataset(cluster, str(spec), data=dataset, job=name, seed=seed,
                                split_size=SPLIT_SIZE)
        ds.set_epoch(epoch)
        out = {}
        for batch in ds:
            for index, image in zip(batch["index"].tolist(), batch["image"]):
                out[index] = image.clone()
        assert sorted(out) == list(range(NUM_IMAGES))
        return out

    first, second = images(job, 0), images(job, 1)
    again = images(job + "-again", 0)
    other_seed = images(job + "-seed", 0, seed=4)
    for index in range(NUM_IMAGES):
        assert not torch.equal(first[index], second[index]), index
        assert torch.equal(first[index], again[index]), index
        assert not torch.equal(first[index], other_seed[index]), index
