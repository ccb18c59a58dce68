#!/usr/bin/python3
"""Does a model trained on torchvision's preprocessing see the same pixels from sluice?

    PYTHONPATH=build/python /usr/bin/python3 bench/fidelity.py [--images N] [--jpegs DIR]

Runs bench/pipelines/imagenet_eval.yaml (Decode → Resize(256) → CenterCrop(224) → Normalize →
HWC2CHW) through a local cluster and the Python client, and torchvision's Resize(256),
CenterCrop(224), ToTensor(), Normalize(ImageNet) on the same JPEG bytes (read back from the
dataset, decoded by PIL). Differences are in pixel units (the normalized value times std, times
255): mean absolute difference (goal <= 2/255), max, and PSNR over [0, 1].
"""
import argparse
import io
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SLUICE_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(BUILD / "python"))
import sluice  # noqa: E402

MEAN = np.array(sluice.IMAGENET_MEAN, dtype=np.float64).reshape(3, 1, 1)
STD = np.array(sluice.IMAGENET_STD, dtype=np.float64).reshape(3, 1, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200, help="synthetic JPEGs (sluice datagen)")
    ap.add_argument("--jpegs", help="an ImageFolder of real JPEGs instead of synthetic ones")
    ap.add_argument("--spec", default=str(ROOT / "bench/pipelines/imagenet_eval.yaml"))
    args = ap.parse_args()
    bin_dir = BUILD / "bin"
    with tempfile.TemporaryDirectory(prefix="sluice-fidelity-") as tmp:
        work = Path(tmp)
        jpegs = args.jpegs
        if jpegs is None:
            jpegs = str(work / "images")
            subprocess.run([str(bin_dir / "sluice"), "datagen", "--output", jpegs, "--images",
                            str(args.images), "--seed", "3"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([str(bin_dir / "sluice"), "record", "convert", "--input", jpegs,
                        "--output", str(work / "ds")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cluster = subprocess.Popen(
            [str(bin_dir / "sluice"), "local", "--workers", "1", "--data-root", str(work),
             "--address-file", str(work / "address"), "--work-dir", str(work / "cluster"),
             "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not (work / "address").exists():
                if cluster.poll() is not None:
                    sys.exit("fidelity: sluice local exited")
                time.sleep(0.05)
            compare(bin_dir, (work / "address").read_text().strip(), args.spec,
                    str(work / "ds"))
        finally:
            cluster.send_signal(signal.SIGTERM)
            cluster.wait()


def compare(bin_dir: Path, dispatcher: str, spec: str, data: str) -> None:
    reference = transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
        transforms.Normalize(mean=list(sluice.IMAGENET_MEAN), std=list(sluice.IMAGENET_STD))])
    client = sluice.Client(dispatcher)
    abs_sum = sq_sum = 0.0
    count = 0
    worst = 0.0
    per_image = []
    for batch in client.open(spec, data=data, job="fidelity-%d" % time.time_ns(),
                             deterministic=True):
        for row, index in enumerate(batch["index"].tolist()):
            jpeg = subprocess.run([str(bin_dir / "sluice"), "record", "cat", data, "--index",
                                   str(index), "--column", "image"], check=True,
                                  stdout=subprocess.PIPE).stdout
            ours = batch["image"][row].astype(np.float64) * STD + MEAN
            theirs = reference(Image.open(io.BytesIO(jpeg)).convert("RGB")).numpy()
            theirs = theirs.astype(np.float64) * STD + MEAN
            diff = np.abs(ours - theirs)
            abs_sum += diff.sum()
            sq_sum += (diff ** 2).sum()
            count += diff.size
            worst = max(worst, diff.max())
            per_image.append(diff.mean())
    mean = abs_sum / count
    mse = sq_sum / count
    psnr = 10 * math.log10(1.0 / mse) if mse > 0 else float("inf")
    print("images: %d (%dx%d JPEGs)" % (len(per_image), *_size(data, bin_dir)))
    print("mean abs diff: %.3f/255 (goal <= 2/255)  worst image %.3f/255" % (
        mean * 255, max(per_image) * 255))
    print("max abs diff: %.1f/255" % (worst * 255))
    print("PSNR: %.1f dB" % psnr)
    print("verdict: %s" % ("PASS" if mean <= 2 / 255 else "FAIL"))


def _size(data: str, bin_dir: Path):
    jpeg = subprocess.run([str(bin_dir / "sluice"), "record", "cat", data, "--index", "0",
                           "--column", "image"], check=True, stdout=subprocess.PIPE).stdout
    return Image.open(io.BytesIO(jpeg)).size


if __name__ == "__main__":
    main()
