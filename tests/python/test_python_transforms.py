"""The example user functions of examples/python_transforms, called as the python op calls
them (``train(image, rng=generator)``), with exact expected values worked out by hand."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python_transforms"))
import augment_lut  # noqa: E402


class FixedRng:
    """Returns the given draws in order: random() from `randoms`, uniform() from `uniforms`."""

    def __init__(self, randoms, uniforms):
        self.randoms = list(randoms)
        self.uniforms = list(uniforms)

    def random(self):
        return self.randoms.pop(0)

    def uniform(self, low, high):
        value = self.uniforms.pop(0)
        assert low <= value <= high
        return value


# One row of three RGB pixels.
IMAGE = np.array([[[0, 101, 200], [255, 10, 100], [7, 8, 9]]], dtype=np.uint8)


def test_lut_brightness_then_contrast_without_flip():
    # b = 1.25, c = 0.75: v -> round(clip((1.25 v - 128) * 0.75 + 128, 0, 255)), ties to even:
    # 0 -> 32, 101 -> 126.6875 -> 127, 200 -> 219.5 -> 220, 255 -> 271.06 -> 255,
    # 10 -> 41.375 -> 41, 100 -> 125.75 -> 126, 7 -> 38.5625 -> 39, 8 -> 39.5 -> 40,
    # 9 -> 40.4375 -> 40.
    rng = FixedRng(randoms=[0.7], uniforms=[1.25, 0.75])
    out = augment_lut.train(IMAGE, rng=rng)
    np.testing.assert_array_equal(out, np.array(
        [[[32, 127, 220], [255, 41, 126], [39, 40, 40]]], dtype=np.uint8))
    assert out.dtype == np.uint8 and out.shape == IMAGE.shape
    assert rng.randoms == [] and rng.uniforms == []  # one flip draw, then b, then c


def test_lut_flips_and_clips():
    # Flipped (0.2 < 0.5): pixels in reverse order. b = 0.6, c = 1.4:
    # v -> round(clip((0.6 v - 128) * 1.4 + 128, 0, 255)): 7 -> -45.32 -> 0, 8, 9 -> 0;
    # 255 -> 163, 10 -> -42.8 -> 0, 100 -> 32.8 -> 33; 0 -> 0, 101 -> 33.64 -> 34,
    # 200 -> 116.8 -> 117.
    out = augment_lut.train(IMAGE, rng=FixedRng(randoms=[0.2], uniforms=[0.6, 1.4]))
    np.testing.assert_array_equal(out, np.array(
        [[[0, 0, 0], [163, 0, 33], [0, 34, 117]]], dtype=np.uint8))


def test_lut_depends_only_on_the_generator():
    image = np.arange(5 * 4 * 3, dtype=np.uint8).reshape(5, 4, 3)
    a = augment_lut.train(image, rng=np.random.Generator(np.random.PCG64(7)))
    b = augment_lut.train(image.copy(), rng=np.random.Generator(np.random.PCG64(7)))
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.uint8 and a.shape == image.shape
