"""sluice.ops covers exactly the ops the worker knows: one function per case of OpSpec (the
worker's op registry has one row per case: registry_test; the C++ builder one function per row:
builder_test)."""
import inspect
import json

import sluice
from sluice import _sluice


def _op_functions():
    return {name for name, _ in inspect.getmembers(sluice.ops, inspect.isfunction)
            if not name.startswith("_")}


def test_every_op_has_a_python_function_and_every_function_is_an_op():
    fields = set(_sluice.op_fields())
    assert "decode" in fields and "random_resized_crop" in fields  # the list is not empty
    functions = _op_functions()
    assert sorted(fields - functions) == [], "ops without a sluice.ops function"
    assert sorted(functions - fields) == [], "sluice.ops functions that are no op"


def test_each_function_builds_a_spec_the_parser_accepts_under_its_own_name():
    required = {"resize": dict(size=8), "center_crop": dict(size=8),
                "random_resized_crop": dict(size=8), "random_crop": dict(size=8),
                "random_rotation": dict(degrees=10.0),
                "normalize": dict(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]),
                "cast": dict(dtype="float32"), "one_hot": dict(num_classes=10),
                "spin": dict(cpu_micros=1), "sleep": dict(micros=1)}
    for name in sorted(_op_functions()):
        try:
            op = getattr(sluice.ops, name)(**required.get(name, {}))
        except TypeError:
            continue  # needs arguments this test does not know (an op added later)
        assert list(op) == [name]
        spec = sluice.Pipeline().synthetic(4).map(["image"], [op]).batch(2)
        parsed = json.loads(_sluice.pipeline_json(spec.to_json(), False))
        assert name in json.dumps(parsed), (name, parsed)
