"""torchvision-style augmentation written in numpy, for sluice's python op.

A worker started with ``--allow-python-ops --python-path examples/python_transforms`` runs

    map: {input_columns: [image], ops: [{python: {module: augment_numpy, function: train}}]}

as ``train(image, rng=generator)``: ``image`` is the uint8 H×W×3 array the C++ ops before it
produced (a view of shared memory: do not keep it), ``rng`` a ``numpy.random.Generator`` seeded
from (job seed, epoch, record), so the same record gets the same augmentation on any worker.
Draw every random number from ``rng``, never from ``numpy.random`` or ``random``.
"""
import numpy as np

_GRAY = np.float32([0.299, 0.587, 0.114])  # ITU-R 601 luma, as torchvision


def color_jitter(image: np.ndarray, rng: np.random.Generator, brightness: float = 0.4,
                 contrast: float = 0.4, saturation: float = 0.4) -> np.ndarray:
    """ColorJitter(brightness, contrast, saturation) in a random order: float32 H×W×3 in
    [0, 255]. In place on one float32 copy (numpy's temporaries cost more than the math)."""
    x = image.astype(np.float32)
    for op in rng.permutation(3):
        if op == 0:
            x *= np.float32(rng.uniform(1 - brightness, 1 + brightness))
        elif op == 1:  # blend with the mean gray level
            mean = np.float32(x.mean(axis=(0, 1)) @ _GRAY)
            f = np.float32(rng.uniform(1 - contrast, 1 + contrast))
            x *= f
            x += (1 - f) * mean
        else:  # blend with the per-pixel gray image
            gray = (x @ _GRAY)[..., None]
            f = np.float32(rng.uniform(1 - saturation, 1 + saturation))
            x *= f
            gray *= 1 - f
            x += gray
        np.clip(x, 0, 255, out=x)
    return x


def random_erasing(x: np.ndarray, rng: np.random.Generator, p: float = 0.5,
                   scale=(0.02, 0.33), ratio=(0.3, 3.3)) -> np.ndarray:
    """RandomErasing: with probability p, a random rectangle becomes random noise."""
    if rng.random() >= p:
        return x
    h, w = x.shape[:2]
    for _ in range(10):
        area = h * w * rng.uniform(*scale)
        r = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
        eh, ew = int(round(np.sqrt(area * r))), int(round(np.sqrt(area / r)))
        if 0 < eh < h and 0 < ew < w:
            top, left = rng.integers(0, h - eh + 1), rng.integers(0, w - ew + 1)
            x[top:top + eh, left:left + ew] = rng.uniform(0, 255, (eh, ew, x.shape[2]))
            break
    return x


def train(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Color jitter, then random erasing; returns uint8 H×W×3 (the input's dtype and shape)."""
    x = color_jitter(image, rng)
    x = random_erasing(x, rng)
    return x.astype(np.uint8)


def busy(label: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pure Python work (no numpy kernels): the benchmark's "function alone"."""
    acc = int(label)
    for i in range(2000):
        acc = (acc * 1103515245 + 12345 + i) & 0x7FFFFFFF
    return np.int64(acc % 1000)
