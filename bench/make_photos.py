#!/usr/bin/python3
"""Writes a deterministic ImageFolder of photo-like JPEGs larger than `sluice datagen`'s (whose
long side is 300-600 px): the second photo set of bench/compare_pytorch.sh.

    /usr/bin/python3 bench/make_photos.py --output DIR [--images N] [--classes C] [--seed S]
        [--min-side 800] [--max-side 1200] [--quality 90] [--subsampling 420|444]

Each image: long side uniform in [min-side, max-side], aspect 1:1, 4:3, 3:2 or 16:9 (landscape or
portrait), a smooth colour field, 3-12 soft-edged shapes with their own gradients, mid-frequency
texture and sensor-like grain, encoded by PIL at the given quality and chroma subsampling.
The same arguments give the same bytes (numpy's PCG64 seeded per image, no downloads).
"""
import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

ASPECTS = (1.0, 4 / 3, 3 / 2, 16 / 9)


def smooth_field(rng: np.random.Generator, h: int, w: int, cells: int, channels: int) -> np.ndarray:
    """Random values on a cells x cells grid, upsampled bicubically to h x w, in [-1, 1]."""
    grid = rng.uniform(0, 255, size=(cells, cells, channels)).astype(np.uint8)
    img = Image.fromarray(grid if channels == 3 else grid[:, :, 0])
    up = np.asarray(img.resize((w, h), Image.BICUBIC), dtype=np.float32)
    if up.ndim == 2:
        up = up[:, :, None]
    return up / 127.5 - 1.0


def photo(rng: np.random.Generator, h: int, w: int) -> Image.Image:
    base = rng.uniform(40, 215, size=3).astype(np.float32)
    img = base + 70.0 * smooth_field(rng, h, w, int(rng.integers(2, 5)), 3)
    layer = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    for _ in range(int(rng.integers(3, 13))):
        mask = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(mask)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.05, 0.35) * w, rng.uniform(0.05, 0.35) * h
        box = [cx - rx, cy - ry, cx + rx, cy + ry]
        if rng.uniform() < 0.5:
            draw.ellipse(box, fill=255)
        else:
            draw.rectangle(box, fill=255)
        mask = mask.filter(ImageFilter.GaussianBlur(float(rng.uniform(1, 6))))
        colour = rng.uniform(0, 255, size=3).astype(np.float32)
        shade = colour + 50.0 * smooth_field(rng, h, w, 3, 1)
        fill = Image.fromarray(np.clip(shade, 0, 255).astype(np.uint8))
        layer = Image.composite(fill, layer, mask)
    out = np.asarray(layer, dtype=np.float32)
    out += 18.0 * smooth_field(rng, h, w, max(8, w // 24), 1)  # texture
    out += rng.normal(0, 4.0, size=(h, w, 1)).astype(np.float32)  # grain
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--min-side", type=int, default=800)
    ap.add_argument("--max-side", type=int, default=1200)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--subsampling", choices=("420", "444"), default="420")
    args = ap.parse_args()
    if not 16 <= args.min_side <= args.max_side:
        ap.error("need 16 <= --min-side <= --max-side")
    root = Path(args.output)
    for i in range(args.images):
        rng = np.random.Generator(np.random.PCG64([args.seed, i]))
        long_side = int(rng.integers(args.min_side, args.max_side + 1))
        short_side = max(16, round(long_side / ASPECTS[int(rng.integers(len(ASPECTS)))]))
        h, w = (short_side, long_side) if rng.uniform() < 0.7 else (long_side, short_side)
        folder = root / ("class_%03d" % (i % args.classes))
        folder.mkdir(parents=True, exist_ok=True)
        photo(rng, h, w).save(folder / ("photo_%06d.jpg" % i), quality=args.quality,
                              subsampling=2 if args.subsampling == "420" else 0)
    print("make_photos: %d JPEGs in %s" % (args.images, root))


if __name__ == "__main__":
    main()
