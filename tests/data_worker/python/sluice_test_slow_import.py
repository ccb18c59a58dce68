"""A module that takes 2 s to import (as one importing a large library may): python_op_test."""
import time

time.sleep(2)


def invert(image, label, rng):
    return 255 - image, label
