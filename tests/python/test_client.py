"""sluice.Client and its iterator against a real local cluster."""
import collections
import json
import logging
import sys
import threading

import numpy as np
import pytest

import conftest
from conftest import BATCH, BIN, NUM_IMAGES, SPLIT_SIZE, run, small_pipeline

import sluice


def drain(it):
    """Reads the rest of a job. (Each test finishes its jobs: a worker whose consumer went away
    mid-job may hold batches that block other jobs; see docs/python.md.)"""
    for _ in it:
        pass


def test_every_record_once_per_epoch(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    seen = collections.defaultdict(list)
    with client.open(spec_file, data=dataset, job=job, epochs=2, split_size=SPLIT_SIZE) as it:
        for batch in it:
            assert set(batch) == {"image", "label", "index"}
            assert batch["image"].shape == (len(batch["index"]), 3, 32, 32)
            assert batch["image"].dtype == np.float32
            assert batch["label"].dtype == np.int64
            assert batch["index"].dtype == np.int64
            seen[it.epoch].extend(batch["index"].tolist())
    assert sorted(seen) == [0, 1]
    for epoch, ids in seen.items():
        assert sorted(ids) == list(range(NUM_IMAGES)), epoch


def test_arrays_are_the_received_buffers_without_copy(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    it = client.open(spec_file, data=dataset, job=job, split_size=SPLIT_SIZE)
    batch = next(it)
    addresses = it._live().last_addresses()
    for name in ("image", "label"):
        array = batch[name]
        assert array.ctypes.data == addresses[name], name
        assert not array.flags.owndata
        assert array.flags.writeable
        assert type(array.base).__name__ == "PyCapsule"
    # Writable, and still valid after the iterator and client are gone.
    image = batch["image"]
    expected = image.copy()
    drain(it)
    it.close()
    del it, client, batch
    image[0, 0, 0, 0] = 42.0
    assert image[0, 0, 0, 0] == 42.0
    np.testing.assert_array_equal(image.ravel()[1:], expected.ravel()[1:])


def test_bytes_equal_the_cpp_client_in_deterministic_mode(cluster, dataset, work, job):
    spec = work / "random_ops.json"
    spec.write_text(small_pipeline(random_ops=True).to_json())
    cpp_out = work / (job + ".cpp.bin")
    run(BIN / "sluice_python_reference", cluster, spec, dataset, job + "-cpp", 2, 7, cpp_out)

    stream = bytearray()
    client = sluice.Client(cluster)
    batches = 0
    for batch in client.open(str(spec), data=dataset, job=job + "-py", epochs=2, seed=7,
                             deterministic=True):
        for name in ("image", "label"):
            stream += batch[name].tobytes()
        stream += batch["index"].astype("<i8").tobytes()
        batches += 1
    expected = cpp_out.read_bytes()
    assert batches == 2 * NUM_IMAGES // BATCH
    assert len(stream) == len(expected)
    assert bytes(stream) == expected


def test_another_thread_runs_while_next_waits(cluster, dataset, job):
    # A slow pipeline: next() has to wait for the workers.
    slow = (sluice.Pipeline().dataset("/unused").columns(["label"])
            .map(["label"], [sluice.ops.sleep(20_000)], num_parallel_workers=1).batch(1))
    client = sluice.Client(cluster)
    it = client.open(slow, data=dataset, job=job, split_size=SPLIT_SIZE)
    started, go, progressed = threading.Event(), threading.Event(), threading.Event()

    def other():
        started.set()
        go.wait()
        progressed.set()

    old = sys.getswitchinterval()
    thread = threading.Thread(target=other)
    try:
        thread.start()
        started.wait()
        # From here on this thread keeps the GIL (no forced switch for 100 s) unless it
        # releases it: the other thread can set `progressed` only while next() waits.
        sys.setswitchinterval(100)
        go.set()
        batch = next(it)
        done_while_waiting = progressed.is_set()
    finally:
        sys.setswitchinterval(old)
        go.set()
        thread.join()
    drain(it)
    it.close()
    assert batch["label"].shape == (1,)
    assert done_while_waiting


def test_pipeline_builder_matches_the_yaml_spec():
    yaml_path = str(conftest.ROOT / "bench/pipelines/imagenet_eval.yaml")
    ops = sluice.ops
    built = (sluice.Pipeline().seed(0).on_error("fail")
             .dataset("/data/imagenet-val").columns(["image", "label"])
             .map(["image"], [ops.decode(), ops.resize(256), ops.center_crop(224),
                              ops.normalize(sluice.IMAGENET_MEAN, sluice.IMAGENET_STD),
                              ops.hwc2chw()])
             .batch(64).prefetch(sluice.AUTOTUNE))
    from sluice import _sluice
    assert (_sluice.pipeline_json(built.to_json(), False) ==
            _sluice.pipeline_json(yaml_path, True))



def test_decode_settings_reach_the_spec():
    ops = sluice.ops
    assert ops.decode() == {"decode": {}}
    assert ops.decode(idct="fast", fast_upsampling=True) == {
        "decode": {"idct": "IDCT_FAST", "fast_upsampling": True}}
    built = sluice.Pipeline().synthetic(8).map(["image"], [ops.decode(idct="float")])
    from sluice import _sluice
    assert '{"decode":{"idct":"IDCT_FLOAT"}}' in _sluice.pipeline_json(built.to_json(), False)


def test_spec_as_text_dict_and_builder_are_the_same(cluster, dataset, spec_file, job):
    pipeline = small_pipeline()
    client = sluice.Client(cluster)
    firsts = []
    for i, spec in enumerate([spec_file, pipeline, pipeline.to_json(), pipeline.to_dict()]):
        with client.open(spec, data=dataset, job="%s-%d" % (job, i), deterministic=True) as it:
            firsts.append(next(it)["index"].tolist())
            drain(it)
    assert all(f == firsts[0] for f in firsts), firsts


def test_finish_in_client_or_worker_gives_the_same_arrays(cluster, dataset, work, job):
    spec = work / "random_ops_finish.json"
    spec.write_text(small_pipeline(random_ops=True).to_json())
    client = sluice.Client(cluster)
    streams = {}
    for finish in ("client", "worker"):
        stream = bytearray()
        for batch in client.open(str(spec), data=dataset, job=f"{job}-{finish}", epochs=1,
                                 seed=7, deterministic=True, finish=finish):
            assert batch["image"].dtype == np.float32
            assert batch["image"].shape[1:] == (3, 32, 32)
            stream += batch["image"].tobytes()
            stream += batch["index"].astype("<i8").tobytes()
        streams[finish] = bytes(stream)
    assert len(streams["client"]) == NUM_IMAGES * (3 * 32 * 32 * 4 + 8)
    assert streams["client"] == streams["worker"]


def test_a_bad_finish_is_invalid_argument_naming_the_field(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    with pytest.raises(sluice.InvalidArgument, match="finish: 'gpu' is not one of"):
        client.open(spec_file, data=dataset, job=job, finish="gpu")
    assert sluice.Pipeline().finish("client").to_dict()["finish"] == "client"


def test_the_lost_dispatcher_timeout_is_settable_and_checked(cluster, dataset, spec_file, job):
    with pytest.raises(sluice.InvalidArgument, match="dispatcher_lost_timeout must be > 0"):
        sluice.Client(cluster, dispatcher_lost_timeout=0)
    client = sluice.Client(cluster, dispatcher_lost_timeout=900.0)
    with client.open(spec_file, data=dataset, job=job, split_size=SPLIT_SIZE) as it:
        ids = [i for batch in it for i in batch["index"].tolist()]
    assert sorted(ids) == list(range(NUM_IMAGES))


def test_shared_memory_or_not_the_bytes_are_the_same(cluster, dataset, work, job):
    with pytest.raises(sluice.InvalidArgument, match="shared_memory_mb must be 0 .off. or"):
        sluice.Client(cluster, shared_memory_mb=-1)
    spec = work / "random_ops.json"
    spec.write_text(small_pipeline(random_ops=True).to_json())
    streams = {}
    for mb in (64, 0):
        stream = bytearray()
        for batch in sluice.Client(cluster, shared_memory_mb=mb).open(
                str(spec), data=dataset, job="%s-%d" % (job, mb), epochs=2, seed=7,
                deterministic=True):
            stream += batch["image"].tobytes() + batch["label"].tobytes()
            stream += batch["index"].astype("<i8").tobytes()
        streams[mb] = bytes(stream)
    assert len(streams[64]) == 2 * NUM_IMAGES * (3 * 32 * 32 * 4 + 8 + 8)
    assert streams[64] == streams[0]


def test_two_jobs_with_sharing_auto_share_production(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    first = client.open(spec_file, data=dataset, job=job + "-a", split_size=SPLIT_SIZE,
                        sharing="auto")
    second = client.open(spec_file, data=dataset, job=job + "-b", split_size=SPLIT_SIZE,
                         sharing="auto")
    with first, second:
        a, b = next(first), next(second)
        status = json.loads(run(BIN / "sluice", "status", "--dispatcher", cluster,
                                "--json").stdout)
        ids_a = a["index"].tolist() + [i for batch in first for i in batch["index"].tolist()]
        ids_b = b["index"].tolist() + [i for batch in second for i in batch["index"].tolist()]
    assert sorted(ids_a) == list(range(NUM_IMAGES))
    assert sorted(ids_b) == list(range(NUM_IMAGES))
    jobs = {j["job_name"]: j for j in status["jobs"]}
    ja, jb = jobs[job + "-a"], jobs[job + "-b"]
    assert ja["share_group"] != 0 and ja["share_group"] == jb["share_group"]
    assert ja["shares_with"] == [jb["job_id"]]


def test_a_bad_sharing_value_is_invalid_argument(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    with pytest.raises(sluice.InvalidArgument, match="sharing 'always' must be 'auto' or 'off'"):
        client.open(spec_file, data=dataset, job=job, sharing="always")


def test_a_bad_cache_value_is_invalid_argument(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    with pytest.raises(sluice.InvalidArgument, match="cache 'always' must be 'auto' or 'off'"):
        client.open(spec_file, data=dataset, job=job, cache="always")


def job_status_after_first_batch(cluster, dataset, spec_file, job, **options):
    """The job's entry of `sluice status --json`, taken after its first batch (opened with
    `options`); the job is then read to the end."""
    client = sluice.Client(cluster)
    with client.open(spec_file, data=dataset, job=job, split_size=SPLIT_SIZE, **options) as it:
        next(it)
        status = json.loads(run(BIN / "sluice", "status", "--dispatcher", cluster,
                                "--json").stdout)
        drain(it)
    jobs = [j for j in status["jobs"] if j["job_name"] == job]
    assert len(jobs) == 1, status
    return jobs[0]


def test_cache_auto_shows_its_decision_in_status(cluster, dataset, spec_file, job):
    entry = job_status_after_first_batch(cluster, dataset, spec_file, job, cache="auto")
    decision = entry["cache_decision"]
    assert decision is not None, entry
    assert decision["reason"] != ""


def test_priority_and_min_workers_reach_the_dispatcher(cluster, dataset, spec_file, job):
    entry = job_status_after_first_batch(cluster, dataset, spec_file, job, priority=2,
                                         min_workers=1)
    assert entry["priority"] == 2
    assert entry["min_workers"] == 1


def test_joining_a_finished_job_is_a_warning_on_the_sluice_logger(cluster, dataset, spec_file,
                                                                   job, caplog):
    client = sluice.Client(cluster)
    with client.open(spec_file, data=dataset, job=job, epochs=1, split_size=SPLIT_SIZE) as it:
        assert sum(len(b["index"]) for b in it) == NUM_IMAGES
    assert not [r for r in caplog.records if r.name == "sluice"]
    # The same name again, while the dispatcher keeps the finished job for late readers.
    with caplog.at_level("WARNING", logger="sluice"):
        with client.open(spec_file, data=dataset, job=job, epochs=1,
                         split_size=SPLIT_SIZE) as it:
            assert sum(len(b["index"]) for b in it) == 0
    warnings = [r for r in caplog.records if r.name == "sluice"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].levelname == "WARNING"
    assert warnings[0].getMessage().startswith(
        "sluice client: job '%s' had already read all its epochs when this consumer joined: "
        "it reads nothing." % job)


def test_a_logging_filter_that_raises_loses_no_batch(cluster, dataset, spec_file, job,
                                                     monkeypatch):
    client = sluice.Client(cluster)
    with client.open(spec_file, data=dataset, job=job, epochs=1, split_size=SPLIT_SIZE) as it:
        drain(it)

    def raising_filter(record):
        raise RuntimeError("a filter that raises")

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    logger = logging.getLogger("sluice")
    logger.addFilter(raising_filter)
    try:
        # The warning is logged on open(): the open still returns its iterator.
        with client.open(spec_file, data=dataset, job=job, epochs=1,
                         split_size=SPLIT_SIZE) as it:
            assert list(it) == []
    finally:
        logger.removeFilter(raising_filter)
    assert [str(u.exc_value) for u in unraisable] == ["a filter that raises"]
