#!/usr/bin/python3
"""PyTorch DataLoader + torchvision ImageFolder on the ImageNet transforms: the peer of
`sluice pipeline run --spec bench/pipelines/imagenet_{train,eval}.yaml` in bench/compare_pytorch.sh.

    /usr/bin/python3 bench/pytorch_loader.py --data IMAGE_FOLDER [--workers N] [--epochs E] [--eval]
        [--warmup-epochs W]

Train: RandomResizedCrop(224) → RandomHorizontalFlip → ToTensor → Normalize(ImageNet), shuffled.
Eval (--eval): Resize(256) → CenterCrop(224) → ToTensor → Normalize, in order. Batch 64,
num_workers = nproc by default. W warm-up epochs (default 1: worker start-up, page cache), then E
timed epochs; prints `pytorch: <N> images/s` over the timed epochs. bench/compare_pytorch.sh
passes --warmup-epochs 0 and times the whole process instead (the run as a user sees it).
"""
import argparse
import os
import time

import torch
import torchvision
from torchvision import transforms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="ImageFolder root (class folders of JPEGs)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--eval", action="store_true", help="the evaluation transforms")
    ap.add_argument("--warmup-epochs", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(0)
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    if args.eval:
        tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                                 transforms.ToTensor(), normalize])
    else:
        tf = transforms.Compose([transforms.RandomResizedCrop(224),
                                 transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                 normalize])
    ds = torchvision.datasets.ImageFolder(args.data, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=not args.eval,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0)

    def epoch():
        n = 0
        for images, labels in loader:
            assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.float32
            n += images.shape[0]
        return n

    for _ in range(args.warmup_epochs):
        epoch()
    start = time.perf_counter()
    total = sum(epoch() for _ in range(args.epochs))
    secs = time.perf_counter() - start
    print(f"pytorch: {len(ds)} images, {args.workers} workers, batch {args.batch}")
    print(f"pytorch: {total / secs:.1f} images/s")


if __name__ == "__main__":
    main()
