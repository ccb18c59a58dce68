#!/usr/bin/python3
"""Does a model trained on torchvision's preprocessing see the same pixels from sluice?

    PYTHONPATH=build/python /usr/bin/python3 bench/fidelity.py [--images N] [--jpegs DIR]
    /usr/bin/python3 bench/fidelity.py --train [--images N] [--jpegs DIR] [--draws 10000]

Eval (default): runs bench/pipelines/imagenet_eval.yaml (Decode → Resize(256) → CenterCrop(224) → Normalize →
HWC2CHW) through a local cluster and the Python client, and torchvision's Resize(256),
CenterCrop(224), ToTensor(), Normalize(ImageNet) on the same JPEG bytes (read back from the
dataset, decoded by PIL). Differences are in pixel units (the normalized value times std, times
255): mean absolute difference (goal <= 2/255), max, and PSNR over [0, 1].

Train (--train): bench/pipelines/imagenet_train.yaml (Decode → RandomResizedCrop(224) →
RandomHorizontalFlip → Normalize → HWC2CHW) through the engine's own physical plan
(`kernel_ceiling_bench --chain plan --dump`: the optimizer's fused Decode+RandomResizedCrop and
flip ops, epoch 0, dataset order), with the crop box and flip sluice drew for each image
(`--dump-boxes`). torchvision applies the same boxes: `F.resized_crop(img, top, left, h, w, 224,
BILINEAR)`, `F.hflip` when sluice flipped, ToTensor, on the PIL decode of the same JPEG bytes.
Prints the same pixel statistics (goal: mean <= 2/255). Then the box distribution on image 0's
size, compared by two-sample Kolmogorov-Smirnov tests on the area scale (h·w / H·W) and the log
aspect ratio (log w/h): for each torch seed in --tv-seeds, --draws `RandomResizedCrop.get_params`
boxes against --draws sluice boxes of their own (elements k·D .. (k+1)·D-1 for the k-th seed, so
the pairs are independent and, if the distributions are the same, each p is uniform on [0, 1]);
goal: median p > 0.01 for both (indistinguishable). A control line compares torchvision with
itself (seed s against seed s + 1000) to show how p spreads when the distributions are equal.
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

# ImageNet's normalization (sluice.IMAGENET_MEAN/STD; the train path needs no client package).
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float64).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float64).reshape(3, 1, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200, help="synthetic JPEGs (sluice datagen)")
    ap.add_argument("--jpegs", help="an ImageFolder of real JPEGs instead of synthetic ones")
    ap.add_argument("--spec", default=None,
                    help="pipeline spec (default bench/pipelines/imagenet_{eval,train}.yaml)")
    ap.add_argument("--train", action="store_true", help="the train pipeline and its crop boxes")
    ap.add_argument("--draws", type=int, default=10000,
                    help="crop boxes per side of the distribution test (--train)")
    ap.add_argument("--tv-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                    help="torch seeds of the torchvision samples (--train)")
    args = ap.parse_args()
    bin_dir = BUILD / "bin"
    if args.spec is None:
        args.spec = str(ROOT / "bench/pipelines" /
                        ("imagenet_train.yaml" if args.train else "imagenet_eval.yaml"))
    if args.train:
        with tempfile.TemporaryDirectory(prefix="sluice-fidelity-") as tmp:
            train(bin_dir, Path(tmp), args)
        return
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
    import sluice
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


def make_dataset(bin_dir: Path, work: Path, args) -> str:
    """Writes (or takes) the JPEG ImageFolder, converts it; returns the ImageFolder path."""
    jpegs = args.jpegs
    if jpegs is None:
        jpegs = str(work / "images")
        subprocess.run([str(bin_dir / "sluice"), "datagen", "--output", jpegs, "--images",
                        str(args.images), "--seed", "3"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(bin_dir / "sluice"), "record", "convert", "--input", jpegs,
                    "--output", str(work / "ds"), "--format", "imagefolder"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return jpegs


def train(bin_dir: Path, work: Path, args) -> None:
    import torchvision
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    jpegs = make_dataset(bin_dir, work, args)
    dataset = torchvision.datasets.ImageFolder(jpegs)  # the order `record convert` numbers
    count = min(args.images, len(dataset))
    dump, boxes_file = work / "train.f32", work / "boxes.txt"
    subprocess.run([str(bin_dir / "kernel_ceiling_bench"), "--spec", args.spec, "--data",
                    str(work / "ds"), "--chain", "plan", "--epochs", "0", "--threads", "1",
                    "--dump", str(dump), "--dump-count", str(count),
                    "--dump-boxes", str(boxes_file),
                    "--box-draws", str(args.draws * len(args.tv_seeds))],
                   check=True, stdout=subprocess.DEVNULL)
    boxes, draws, size = [], [], None
    for line in boxes_file.read_text().splitlines():
        f = line.split()
        if f[0] == "index":
            boxes.append(tuple(int(v) for v in f[2:7]))
        elif f[0] == "size":
            size = (int(f[1]), int(f[2]))
        elif f[0] == "draw":
            draws.append(tuple(int(v) for v in f[1:5]))
    ours_all = np.fromfile(dump, dtype=np.float32).reshape(-1, 3, 224, 224)
    abs_sum = sq_sum = 0.0
    n_values = 0
    worst = 0.0
    per_image = []
    for i, (top, left, h, w, flip) in enumerate(boxes):
        img = Image.open(dataset.samples[i][0]).convert("RGB")
        ref = F.resized_crop(img, top, left, h, w, [224, 224], InterpolationMode.BILINEAR)
        if flip:
            ref = F.hflip(ref)
        theirs = F.to_tensor(ref).numpy().astype(np.float64)
        ours = ours_all[i].astype(np.float64) * STD + MEAN
        diff = np.abs(ours - theirs)
        abs_sum += diff.sum()
        sq_sum += (diff ** 2).sum()
        n_values += diff.size
        worst = max(worst, diff.max())
        per_image.append(diff.mean())
    mean = abs_sum / n_values
    mse = sq_sum / n_values
    psnr = 10 * math.log10(1.0 / mse) if mse > 0 else float("inf")
    first = Image.open(dataset.samples[0][0])
    print("train images: %d (first %dx%d), same boxes and flips as sluice drew" % (
        len(per_image), *first.size))
    print("mean abs diff: %.3f/255 (goal <= 2/255)  worst image %.3f/255" % (
        mean * 255, max(per_image) * 255))
    print("max abs diff: %.1f/255" % (worst * 255))
    print("PSNR: %.1f dB" % psnr)

    # The box distribution on image 0's size, sluice vs torchvision: the k-th torch seed's sample
    # against the k-th block of sluice's draws, so the pairs are independent and, under the
    # hypothesis that the distributions are the same, each p is uniform on [0, 1]; the verdict
    # reads the median. The control pairs torchvision with itself (seed s vs s + 1000).
    H, W = size
    D = args.draws
    ours_all_b = np.array(draws, dtype=np.float64)  # top, left, h, w
    dummy = torch.empty((3, H, W), dtype=torch.uint8)

    def torchvision_boxes(seed):
        torch.manual_seed(seed)
        return np.array([transforms.RandomResizedCrop.get_params(
            dummy, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)) for _ in range(D)],
            dtype=np.float64)  # i, j, h, w

    features = (("scale", lambda b: b[:, 2] * b[:, 3] / (H * W)),
                ("log-ratio", lambda b: np.log(b[:, 3] / b[:, 2])))
    pvalues = {name: [] for name, _ in features}
    control = {name: [] for name, _ in features}
    for k, seed in enumerate(args.tv_seeds):
        ours_b = ours_all_b[k * D:(k + 1) * D]
        tv_b, tv_other = torchvision_boxes(seed), torchvision_boxes(seed + 1000)
        for name, fn in features:
            stat, p = ks_2samp(fn(ours_b), fn(tv_b))
            _, p_control = ks_2samp(fn(tv_other), fn(tv_b))
            pvalues[name].append(p)
            control[name].append(p_control)
            print("box %s: sluice draws %d..%d vs torch seed %d: KS D=%.4f p=%.3f on %dx%d "
                  "(control, torch seed %d vs %d: p=%.3f)" % (
                      name, k * D, (k + 1) * D - 1, seed, stat, p, W, H, seed + 1000, seed,
                      p_control))
    medians = {name: float(np.median(ps)) for name, ps in pvalues.items()}
    for name, m in medians.items():
        print("box %s: median p %.3f over %d independent pairs of %d draws (goal p > 0.01); "
              "control median p %.3f" % (name, m, len(pvalues[name]), D,
                                         float(np.median(control[name]))))
    ok = mean <= 2 / 255 and min(medians.values()) > 0.01
    print("verdict: %s" % ("PASS" if ok else "FAIL"))


def ks_2samp(a: np.ndarray, b: np.ndarray):
    """Two-sample Kolmogorov-Smirnov statistic and asymptotic p-value (scipy's when present)."""
    try:
        from scipy import stats
        r = stats.ks_2samp(a, b)
        return float(r.statistic), float(r.pvalue)
    except ImportError:
        pass
    a, b = np.sort(a), np.sort(b)
    values = np.concatenate([a, b])
    d = float(np.max(np.abs(np.searchsorted(a, values, side="right") / a.size -
                            np.searchsorted(b, values, side="right") / b.size)))
    en = math.sqrt(a.size * b.size / (a.size + b.size))
    lam = (en + 0.12 + 0.11 / en) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * (k * lam) ** 2) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def _size(data: str, bin_dir: Path):
    jpeg = subprocess.run([str(bin_dir / "sluice"), "record", "cat", data, "--index", "0",
                           "--column", "image"], check=True, stdout=subprocess.PIPE).stdout
    return Image.open(io.BytesIO(jpeg)).size


if __name__ == "__main__":
    main()
