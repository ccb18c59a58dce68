#!/usr/bin/python3
"""CPU per image of the two sides' common parts, for bench/python_ops.sh's "costs" lines.

    /usr/bin/python3 bench/python_ops_costs.py --data IMAGE_FOLDER [--images N]

In this one process (no DataLoader, no IPC), CPU time (time.process_time) per image of:
  pil_decode_crop: torchvision ImageFolder's PIL decode + RandomResizedCrop(224), as the
                   DataLoader side of bench/python_ops.sh does it;
  augment:         examples/python_transforms/augment_numpy.train on those 224x224 crops, with
                   a fresh numpy Generator per image, as both sides call it.
Prints `pil_decode_crop_ms: X` and `augment_ms: Y` (the better of 2 passes over N images).
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
import augment_numpy  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--images", type=int, default=300)
    args = ap.parse_args()
    ds = torchvision.datasets.ImageFolder(args.data, transform=transforms.RandomResizedCrop(224))
    n = min(args.images, len(ds))
    decode, augment = [], []
    for _ in range(2):
        t0 = time.process_time()
        crops = [np.asarray(ds[i][0]) for i in range(n)]
        t1 = time.process_time()
        for i, crop in enumerate(crops):
            augment_numpy.train(crop, np.random.default_rng(i))
        t2 = time.process_time()
        decode.append((t1 - t0) / n)
        augment.append((t2 - t1) / n)
    print("pil_decode_crop_ms: %.3f" % (1e3 * min(decode)))
    print("augment_ms: %.3f" % (1e3 * min(augment)))


if __name__ == "__main__":
    main()
