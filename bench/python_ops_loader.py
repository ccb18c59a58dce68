#!/usr/bin/python3
"""PyTorch DataLoader peer of bench/python_ops.sh: the same user function as sluice's python op.

    /usr/bin/python3 bench/python_ops_loader.py --data IMAGE_FOLDER
        --mode augment|pil|lut|alone [--workers N] [--epochs E]

augment: torchvision ImageFolder decode (PIL) + RandomResizedCrop(224), then
         examples/python_transforms/augment_numpy.train on the uint8 array; batch 64.
pil:     the same with augment_pil.train (PIL rotation, blur, autocontrast);
lut:     the same with augment_lut.train (flip, brightness/contrast through a uint8 table);
alone:   only augment_numpy.busy on each record's label (no image is read); batch 64.
One warm-up epoch, then E timed epochs; prints `pytorch: <N> images/s`. With --whole, no
warm-up: the clock starts before the dataset and the DataLoader are made (worker start-up and the
first batch included; the interpreter's start and `import torch`, which a training script pays
anyway, are not).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torchvision
from torchvision import transforms

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "python_transforms"))
import augment_lut  # noqa: E402
import augment_numpy  # noqa: E402
import augment_pil  # noqa: E402

FUNCTIONS = {"augment": augment_numpy.train, "pil": augment_pil.train, "lut": augment_lut.train}


class Augmented(torch.utils.data.Dataset):
    def __init__(self, root, fn):
        self.ds = torchvision.datasets.ImageFolder(root, transform=transforms.RandomResizedCrop(224))
        self.fn = fn

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        img, label = self.ds[i]
        rng = np.random.default_rng(i)
        return self.fn(np.asarray(img), rng), label


class Alone(torch.utils.data.Dataset):
    def __init__(self, root):
        self.labels = [label for _, label in torchvision.datasets.ImageFolder(root).samples]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return augment_numpy.busy(np.int64(self.labels[i]), rng)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--mode", choices=["augment", "pil", "lut", "alone"], required=True)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--whole", action="store_true",
                    help="time the whole run: no warm-up epoch, start-up included")
    args = ap.parse_args()
    t0 = time.perf_counter()
    ds = Alone(args.data) if args.mode == "alone" else Augmented(args.data, FUNCTIONS[args.mode])
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0)

    def epoch():
        n = 0
        for batch in loader:
            n += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)
        return n

    if not args.whole:
        epoch()
        t0 = time.perf_counter()
    n = sum(epoch() for _ in range(args.epochs))
    print("pytorch: %.1f images/s" % (n / (time.perf_counter() - t0)))


if __name__ == "__main__":
    main()
