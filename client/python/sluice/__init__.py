"""sluice: read a sluice data service job from Python (numpy) and PyTorch.

    import sluice
    client = sluice.Client("127.0.0.1:7000")
    for batch in client.open("bench/pipelines/imagenet_train.yaml", data="/data/ds",
                             job="run1", epochs=2):
        images, labels, ids = batch["image"], batch["label"], batch["index"]

PyTorch: sluice.torch.DataServiceDataset. Pipelines in Python: sluice.Pipeline and sluice.ops.
Errors: sluice.Error and one subclass per status code (sluice.errors). See docs/python.md.
"""
from sluice._interpreter import check_interpreter as _check_interpreter

_check_interpreter()

from sluice import errors  # noqa: E402
from sluice.client import TLS, BatchIterator, Client  # noqa: E402
from sluice.errors import (  # noqa: E402
    Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error, FailedPrecondition,
    Internal, InvalidArgument, NotFound, OutOfRange, PermissionDenied, ResourceExhausted,
    Unauthenticated, Unavailable, Unimplemented, Unknown)
from sluice.pipeline import AUTOTUNE, IMAGENET_MEAN, IMAGENET_STD, Pipeline, ops  # noqa: E402

__all__ = [
    "AUTOTUNE", "IMAGENET_MEAN", "IMAGENET_STD", "BatchIterator", "Client", "Pipeline", "TLS",
    "errors", "ops", "Error", "Aborted", "AlreadyExists", "Cancelled", "DataLoss",
    "DeadlineExceeded", "FailedPrecondition", "Internal", "InvalidArgument", "NotFound",
    "OutOfRange", "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable",
    "Unimplemented", "Unknown"]
