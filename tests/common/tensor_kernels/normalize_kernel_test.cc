#include "common/tensor_kernels/normalize_kernel.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

// The kernel (AVX2 here when the CPU has it) gives exactly the bits of the
// plain loop, for every width (vector body + scalar tail), mirrored or not,
// from a window of a wider image.
TEST(NormalizeKernel, MatchesThePlainLoopBitForBit) {
  const float scale[3] = {1.0f / (255 * 0.229f), 1.0f / (255 * 0.224f), 1.0f / (255 * 0.225f)};
  const float bias[3] = {-0.485f / 0.229f, -0.456f / 0.224f, -0.406f / 0.225f};
  const int64_t stride_px = 53, height = 3;
  std::vector<uint8_t> src(height * stride_px * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (i * 37 + 11) & 255;
  for (int64_t width = 1; width <= 50; ++width) {
    for (const bool flip : {false, true}) {
      const uint8_t* window = src.data() + 3 * 2;  // starts at column 2
      std::vector<float> got(3 * height * width), want(3 * height * width);
      NormalizeHwc3ToChw(window, height, width, stride_px * 3, flip, scale, bias, got.data());
      for (int64_t y = 0; y < height; ++y) {
        for (int64_t x = 0; x < width; ++x) {
          const int64_t sx = flip ? width - 1 - x : x;
          for (int c = 0; c < 3; ++c) {
            const float v = static_cast<float>(window[y * stride_px * 3 + sx * 3 + c]);
            want[c * height * width + y * width + x] = v * scale[c] + bias[c];
          }
        }
      }
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
          << "width " << width << " flip " << flip;
    }
  }
}

}  // namespace
}  // namespace sluice::kernels
