#!/usr/bin/python3
"""Trains a small CNN on CPU from a sluice cluster: the PyTorch side of docs/python.md.

    build/bin/sluice datagen --output /tmp/jpegs --images 2000
    build/bin/sluice record convert --input /tmp/jpegs --output /tmp/ds
    build/bin/sluice local --workers 2 --data-root /tmp --address-file /tmp/dispatcher &
    PYTHONPATH=build/python /usr/bin/python3 client/python/examples/train.py \
        --dispatcher $(cat /tmp/dispatcher) --data /tmp/ds --steps 300

Every --log-every steps it prints the loss, images/s and the fraction of the time the trainer
waited for data (time spent getting the next batch / wall time).
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import sluice
from sluice.torch import DataServiceDataset


def small_cnn(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatcher", required=True, help="host:port (sluice local prints it)")
    ap.add_argument("--data", required=True, help="Unirecord dataset folder")
    ap.add_argument("--job", default="train-example-%d" % int(time.time()))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64, help="crop size in pixels")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--loader-workers", type=int, default=0,
                    help="DataLoader workers (each one is its own sluice consumer)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    ops = sluice.ops
    pipeline = (sluice.Pipeline()
                .dataset(args.data)
                .columns(["image", "label"])
                .shuffle(seed=0)
                .map(["image"], [ops.decode(), ops.random_resized_crop(args.size),
                                 ops.random_horizontal_flip(),
                                 ops.normalize(sluice.IMAGENET_MEAN, sluice.IMAGENET_STD),
                                 ops.hwc2chw()])
                .batch(args.batch, drop_remainder=True)
                .prefetch(sluice.AUTOTUNE))
    # One pass over the dataset is one epoch; as many epochs as the steps need.
    dataset = DataServiceDataset(args.dispatcher, pipeline, job=args.job)
    loader = DataLoader(dataset, batch_size=None, num_workers=args.loader_workers)

    def epochs():
        epoch = 0
        while True:
            dataset.set_epoch(epoch)
            yield from loader
            epoch += 1

    model = small_cnn(args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = epochs()
    start = window_start = time.perf_counter()
    waited = window_waited = 0.0
    images = window_images = 0
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = next(batches)
        dt = time.perf_counter() - t0
        waited += dt
        window_waited += dt
        x, y = batch["image"], batch["label"] % args.classes
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        images += x.shape[0]
        window_images += x.shape[0]
        if step % args.log_every == 0 or step == args.steps:
            now = time.perf_counter()
            print("step %4d  loss %.3f  %7.1f images/s  waited %4.1f%%" % (
                step, loss.item(), window_images / (now - window_start),
                100 * window_waited / (now - window_start)), flush=True)
            window_start, window_waited, window_images = now, 0.0, 0
    total = time.perf_counter() - start
    print("done: %d steps, %d images in %.1f s: %.1f images/s, waited %.1f%% of the time"
          % (args.steps, images, total, images / total, 100 * waited / total))
    del batches  # closes the stream


if __name__ == "__main__":
    main()
