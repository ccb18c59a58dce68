"""sluice.ops.python: the op the workers' Python process pool runs (docs/python.md,
"Python transforms"; the op itself is tested with real processes in
tests/data_worker/python and tests/integration/python_service_test.cc)."""
import json

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


def test_python_op_group():
    p = (sluice.Pipeline().dataset("/d").columns(["label"])
         .map(["label"], [sluice.ops.python("m", "f", group=32)]))
    spec = json.loads(p.to_json())
    assert spec["nodes"][0]["map"]["ops"][0] == {
        "python": {"module": "m", "function": "f", "group": 32}}
