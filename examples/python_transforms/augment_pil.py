"""A PIL-based augmentation for sluice's python op (PIL is Debian's python3-pil).

    map: {input_columns: [image], ops: [{python: {module: augment_pil, function: train}}]}

``train(image, rng)`` converts the uint8 H×W×3 array to a PIL image, applies a random
rotation, a random Gaussian blur and autocontrast, and returns uint8 H×W×3 of the same size.
Every random choice comes from ``rng`` (seeded from job seed, epoch and record).
"""
import numpy as np
from PIL import Image, ImageFilter, ImageOps


def train(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    img = Image.fromarray(image)
    img = img.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.1, 2.0))))
    img = ImageOps.autocontrast(img)
    return np.asarray(img, dtype=np.uint8)
