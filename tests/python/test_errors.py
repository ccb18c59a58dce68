"""Errors: every absl status code maps to its sluice.Error subclass, with the C++ message."""
import socket

import pytest

import sluice
from sluice import _sluice

CODES = {
    1: sluice.Cancelled, 2: sluice.Unknown, 3: sluice.InvalidArgument,
    4: sluice.DeadlineExceeded, 5: sluice.NotFound, 6: sluice.AlreadyExists,
    7: sluice.PermissionDenied, 8: sluice.ResourceExhausted, 9: sluice.FailedPrecondition,
    10: sluice.Aborted, 11: sluice.OutOfRange, 12: sluice.Unimplemented, 13: sluice.Internal,
    14: sluice.Unavailable, 15: sluice.DataLoss, 16: sluice.Unauthenticated,
}


@pytest.mark.parametrize("code,cls", sorted(CODES.items()))
def test_status_code_maps_to_its_class(code, cls):
    with pytest.raises(cls) as info:
        _sluice.raise_status(code, "message of code %d" % code)
    assert type(info.value) is cls
    assert isinstance(info.value, sluice.Error)
    assert info.value.code == code
    assert info.value.message == "message of code %d" % code


def test_builtin_bases():
    assert issubclass(sluice.InvalidArgument, ValueError)
    assert issubclass(sluice.Unimplemented, NotImplementedError)


def test_unreachable_dispatcher_is_unavailable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(sluice.Unavailable) as info:
        sluice.Client("127.0.0.1:%d" % port, timeout=0.5)
    assert "127.0.0.1:%d" % port in info.value.message


def test_missing_spec_file_is_not_found(cluster, dataset, job):
    client = sluice.Client(cluster)
    with pytest.raises(sluice.NotFound) as info:
        client.open("/nonexistent/spec.yaml", data=dataset, job=job)
    assert "/nonexistent/spec.yaml" in info.value.message


def test_bad_spec_is_invalid_argument_naming_the_node(cluster, dataset, job):
    client = sluice.Client(cluster)
    bad = '{"source": {"dataset": {"path": "x"}}, "nodes": [{"map": {"ops": [{"blur": {}}]}}]}'
    with pytest.raises(sluice.InvalidArgument) as info:
        client.open(bad, data=dataset, job=job)
    assert "blur" in info.value.message


def test_bad_consumer_index_is_invalid_argument(cluster, dataset, spec_file, job):
    client = sluice.Client(cluster)
    with pytest.raises(sluice.InvalidArgument):
        client.open(spec_file, data=dataset, job=job, consumer_index=2, num_consumers=2)


@pytest.mark.parametrize("name,value,expected", [
    ("priority", 2**31, "priority must be an integer in [-2147483648, 2147483647], got 2147483648"),
    ("priority", -2**31 - 1, "priority must be an integer in [-2147483648, 2147483647], got "
                             "-2147483649"),
    ("priority", None, "priority must be an integer in [-2147483648, 2147483647], got None"),
    ("priority", True, "priority must be an integer in [-2147483648, 2147483647], got True"),
    ("min_workers", -1, "min_workers must be an integer in [0, 2147483647], got -1"),
    ("min_workers", 1.9, "min_workers must be an integer in [0, 2147483647], got 1.9"),
    ("min_workers", 2**31, "min_workers must be an integer in [0, 2147483647], got 2147483648"),
    ("epochs", "2", "epochs must be an integer in [0, 18446744073709551615], got '2'"),
])
def test_an_integer_option_out_of_range_is_invalid_argument_naming_it(cluster, dataset, spec_file,
                                                                       job, name, value, expected):
    client = sluice.Client(cluster)
    with pytest.raises(sluice.InvalidArgument) as info:
        client.open(spec_file, data=dataset, job=job, **{name: value})
    assert info.value.message == expected


def test_missing_dataset_is_reported(cluster, work, spec_file, job):
    client = sluice.Client(cluster)
    with pytest.raises((sluice.NotFound, sluice.InvalidArgument)) as info:
        it = client.open(spec_file, data=str(work / "no-such-dataset"), job=job)
        next(it)
    assert "no-such-dataset" in info.value.message
