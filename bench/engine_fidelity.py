#!/usr/bin/python3
"""How close sluice's eval pipeline is to torchvision's: mean absolute difference (in 0..255
levels) and PSNR of sluice's Decode → Resize(256) → CenterCrop(224) against torchvision's
Resize(256) → CenterCrop(224) → ToTensor on PIL, image by image.

    build/bin/kernel_ceiling_bench --spec bench/pipelines/imagenet_eval.yaml --data DS \\
        --chain plan --epochs 0 --dump /tmp/eval.f32 --dump-count 200
    /usr/bin/python3 bench/engine_fidelity.py --images IMAGE_FOLDER --dump /tmp/eval.f32 [--count 200]

DS is the Unirecord conversion of IMAGE_FOLDER (`sluice record convert --format imagefolder`),
which numbers images as ImageFolder does (sorted classes, sorted files), so dump element i is
ImageFolder sample i. The dump holds float32 [N,3,224,224] normalized with ImageNet's mean/std;
it is mapped back to 0..255 before comparing. Prints `fidelity: mean <x>/255, max-image mean
<y>/255, PSNR <z> dB` (target: mean <= 2/255).
"""
import argparse
import math

import numpy as np
import torchvision
from torchvision import transforms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--count", type=int, default=200)
    args = ap.parse_args()
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
    ours = np.fromfile(args.dump, dtype=np.float32)
    n = min(args.count, ours.size // (3 * 224 * 224))
    ours = ours[: n * 3 * 224 * 224].reshape(n, 3, 224, 224)
    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                             transforms.ToTensor()])
    ds = torchvision.datasets.ImageFolder(args.images, transform=tf)
    diffs, sq = [], 0.0
    for i in range(n):
        ref = ds[i][0].numpy() * 255.0
        got = (ours[i] * std + mean) * 255.0
        d = np.abs(got - ref)
        diffs.append(float(d.mean()))
        sq += float((d ** 2).mean())
    mse = sq / n
    psnr = 10 * math.log10(255.0 ** 2 / mse) if mse > 0 else float("inf")
    print(f"fidelity: {n} images, mean {np.mean(diffs):.2f}/255, "
          f"max-image mean {np.max(diffs):.2f}/255, PSNR {psnr:.1f} dB")


if __name__ == "__main__":
    main()
