#!/usr/bin/python3
"""CPU per image of the two sides' common parts, for bench/python_ops.sh's "costs" lines.

    /usr/bin/python3 bench/python_ops_costs.py --data IMAGE_FOLDER [--images N]

In this one process (no DataLoader, no IPC), CPU time (time.process_time) per image of:
  pil_decode_crop: torchvision ImageFolder's PIL decode + RandomResizedCrop(224), as the
                   DataLoader side of bench/python_ops.sh does it;
  augment, pil, lut: the user functions of the modes of the same names
                   (examples/python_transforms/augment_numpy, augment_pil, augment_lut .train)
                   on those 224x224 crops, with a fresh numpy Generator per image, as both
                   sides call them.
Prints `pil_decode_crop_ms: X`, `augment_ms: Y`, `pil_ms: Z`, `lut_ms: W` (the better of 2
passes over N images).
"""
import argparse
import os
import sys
import time

import numpy as np
import torchvision
from torchvision import transforms

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "python_transforms"))
import augment_lut  # noqa: E402
import augment_numpy  # noqa: E402
import augment_pil  # noqa: E402

FUNCTIONS = {"augment": augment_numpy.train, "pil": augment_pil.train, "lut": augment_lut.train}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--images", type=int, default=300)
    args = ap.parse_args()
    ds = torchvision.datasets.ImageFolder(args.data, transform=transforms.RandomResizedCrop(224))
    n = min(args.images, len(ds))
    costs = {"pil_decode_crop": [], **{name: [] for name in FUNCTIONS}}
    for _ in range(2):
        t0 = time.process_time()
        crops = [np.asarray(ds[i][0]) for i in range(n)]
        costs["pil_decode_crop"].append((time.process_time() - t0) / n)
        for name, fn in FUNCTIONS.items():
            t0 = time.process_time()
            for i, crop in enumerate(crops):
                fn(crop, np.random.default_rng(i))
            costs[name].append((time.process_time() - t0) / n)
    for name, values in costs.items():
        print("%s_ms: %.3f" % (name, 1e3 * min(values)))


if __name__ == "__main__":
    main()
