"""A module that appends its process's pid to $SLUICE_TEST_MARKERS/imports when it is imported:
python_op_test sees which processes imported it, and when (before any call, when warmed)."""
import os

with open(os.path.join(os.environ["SLUICE_TEST_MARKERS"], "imports"), "a") as _log:
    _log.write("%d\n" % os.getpid())


def invert(image, label, rng):
    return 255 - image, label
