"""A module whose import ends its process (as a broken C extension may): python_op_test."""
import os

os._exit(5)


def invert(image, label, rng):
    return 255 - image, label
