"""sluice.ops.python: the op the workers' Python process pool runs (docs/python.md,
"Python transforms"; the op itself is tested with real processes in
tests/data_worker/python and tests/integration/python_service_test.cc)."""
import json

import pytest

import conftest
import sluice


def test_python_op_carries_only_the_names():
    assert sluice.ops.python("team.augment", "jitter") == {
        "python": {"module": "team.augment", "function": "jitter"}}


def test_python_op_output_dtypes_and_json():
    p = (sluice.Pipeline().dataset("/d").columns(["image", "label"])
         .map(["image", "label"], [sluice.ops.decode(),
                                   sluice.ops.python("m", "f", output_dtypes=["float32", ""])]))
    spec = json.loads(p.to_json())
    assert spec["nodes"][0]["map"]["ops"][1] == {
        "python": {"module": "m", "function": "f", "output_dtypes": ["float32", ""]}}


def test_python_op_output_dtypes_as_one_string_is_an_error():
    with pytest.raises(ValueError, match=r"output_dtypes: a list with one dtype per column, "
                                         r"got the string 'float32' \(write \['float32'\]\)"):
        sluice.ops.python("m", "f", output_dtypes="float32")


def test_python_op_group():
    p = (sluice.Pipeline().dataset("/d").columns(["label"])
         .map(["label"], [sluice.ops.python("m", "f", group=32)]))
    spec = json.loads(p.to_json())
    assert spec["nodes"][0]["map"]["ops"][0] == {
        "python": {"module": "m", "function": "f", "group": 32}}


def test_a_teams_function_runs_on_workers_that_list_its_module(work, dataset, tmp_path, job):
    """`sluice local` with the python-op flags, read through the client: the team's function
    gives each record's value, its generator depends on the seed only, and a module off
    --python-modules is refused by the workers."""
    (tmp_path / "team_aug.py").write_text(
        "def shift(label, rng):\n"
        "    return label + 1000\n"
        "def draw(label, rng):\n"
        "    return label * 0 + rng.integers(0, 1 << 40)\n")
    proc, address, log = conftest.start_cluster(
        work, "python-ops", "--allow-python-ops", "--python-path", str(tmp_path),
        "--python-modules", "team_aug")
    try:
        client = sluice.Client(address)

        def labels(name, ops, seed=0):
            pipeline = sluice.Pipeline().dataset("/unused").columns(["label"])
            if ops:
                pipeline = pipeline.map(["label"], ops)
            path = tmp_path / (name + ".json")
            path.write_text(pipeline.batch(8).to_json())
            out = {}
            with client.open(str(path), data=dataset, job=job + "-" + name, seed=seed) as it:
                for batch in it:
                    out.update(zip(batch["index"].tolist(), batch["label"].tolist()))
            return out

        plain = labels("plain", [])
        assert sorted(plain) == list(range(conftest.NUM_IMAGES))
        assert labels("shift", [sluice.ops.python("team_aug", "shift")]) == {
            i: label + 1000 for i, label in plain.items()}
        draw = [sluice.ops.python("team_aug", "draw")]
        first, again, other = labels("a", draw, 5), labels("b", draw, 5), labels("c", draw, 6)
        assert sorted(first) == list(range(conftest.NUM_IMAGES))
        assert first == again
        assert len(set(first.values())) == conftest.NUM_IMAGES  # one draw per record
        assert all(first[i] != other[i] for i in first)
        with pytest.raises(sluice.FailedPrecondition) as info:
            labels("os", [sluice.ops.python("os", "getpid")])
        assert ("module 'os' is not one this worker runs python ops from "
                "(--python-modules team_aug)") in str(info.value)
    finally:
        conftest.stop_cluster(proc, log)
