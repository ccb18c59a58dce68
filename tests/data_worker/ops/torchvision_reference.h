// Test references written from torchvision's documented algorithms, independent of the code
// under test, so that tests need not compute their expected values with it.
#ifndef SLUICE_TESTS_DATA_WORKER_OPS_TORCHVISION_REFERENCE_H_
#define SLUICE_TESTS_DATA_WORKER_OPS_TORCHVISION_REFERENCE_H_

#include <cmath>

#include "common/base/random.h"
#include "data_worker/ops/geometry.h"

namespace sluice::data_worker::testing {

// The expected box, independent of RandomResizedCropBox: torchvision's
// RandomResizedCrop.get_params (scale [0.08, 1], ratio [3/4, 4/3], 10 attempts
// of area x U(scale) and exp(U(log ratio)), sides rounded half to even, then
// top and left uniform; otherwise the central crop with the ratio clamped),
// drawing from the element's generator as the op is documented to.
inline CropBox TorchvisionBox(int height, int width, Rng& rng) {
  const double area = static_cast<double>(height) * width;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(0.08, 1.0);
    const double aspect = std::exp(rng.Uniform(std::log(3.0 / 4.0), std::log(4.0 / 3.0)));
    // std::nearbyint in the default rounding mode rounds half to even, as
    // Python's round() does.
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = static_cast<int>(rng.UniformInt(height - h + 1));
      const int left = static_cast<int>(rng.UniformInt(width - w + 1));
      return {top, left, h, w};
    }
  }
  int w = width, h = height;
  const double ratio = static_cast<double>(width) / height;
  if (ratio < 3.0 / 4.0) {
    h = static_cast<int>(std::nearbyint(w / (3.0 / 4.0)));
  } else if (ratio > 4.0 / 3.0) {
    w = static_cast<int>(std::nearbyint(h * (4.0 / 3.0)));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

}  // namespace sluice::data_worker::testing

#endif  // SLUICE_TESTS_DATA_WORKER_OPS_TORCHVISION_REFERENCE_H_
