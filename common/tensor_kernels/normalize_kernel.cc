#include "common/tensor_kernels/normalize_kernel.h"

#include <immintrin.h>

#include <algorithm>

namespace sluice::kernels {
namespace {

void ScalarRow(const uint8_t* row, int64_t x0, int64_t width, bool flip, const float scale[3],
               const float bias[3], float* r, float* g, float* b) {
  for (int64_t x = x0; x < width; ++x) {
    const uint8_t* p = row + 3 * (flip ? width - 1 - x : x);
    r[x] = static_cast<float>(p[0]) * scale[0] + bias[0];
    g[x] = static_cast<float>(p[1]) * scale[1] + bias[1];
    b[x] = static_cast<float>(p[2]) * scale[2] + bias[2];
  }
}

__attribute__((target("avx2"))) void Avx2(const uint8_t* src, int64_t height, int64_t width,
                                          int64_t src_stride, bool flip, const float scale[3],
                                          const float bias[3], float* out) {
  // pshufb masks taking channel c's bytes of 16 RGB pixels (48 bytes in
  // three 16-byte registers) into positions 0..15, in pixel order.
  alignas(16) int8_t masks[3][3][16];
  for (int c = 0; c < 3; ++c) {
    for (int reg = 0; reg < 3; ++reg) {
      for (int i = 0; i < 16; ++i) {
        const int byte = 3 * i + c;  // byte of pixel i, channel c
        masks[c][reg][i] = byte / 16 == reg ? static_cast<int8_t>(byte % 16) : int8_t{-128};
      }
    }
  }
  const __m128i reverse = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m256 vs[3], vb[3];
  for (int c = 0; c < 3; ++c) {
    vs[c] = _mm256_set1_ps(scale[c]);
    vb[c] = _mm256_set1_ps(bias[c]);
  }
  const int64_t plane = height * width;
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* row = src + y * src_stride;
    float* dst[3] = {out + y * width, out + plane + y * width, out + 2 * plane + y * width};
    if (flip && y + 1 < height) {
      // A mirrored row is read right to left, which the hardware prefetcher does not follow from
      // one short row to the next: fetch the next row ahead (twice as fast at 224 pixels).
      const char* next = reinterpret_cast<const char*>(row + src_stride);
      for (int64_t b = 0; b < 3 * width; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    int64_t x = 0;
    for (; x + 16 <= width; x += 16) {
      // Output pixels x..x+15 come from source pixels x..x+15, or mirrored
      // from width-16-x..width-1-x (then reversed).
      const uint8_t* p = row + 3 * (flip ? width - 16 - x : x);
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
      const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32));
      for (int c = 0; c < 3; ++c) {
        __m128i v = _mm_or_si128(
            _mm_or_si128(
                _mm_shuffle_epi8(a, _mm_load_si128(reinterpret_cast<const __m128i*>(masks[c][0]))),
                _mm_shuffle_epi8(m, _mm_load_si128(reinterpret_cast<const __m128i*>(masks[c][1])))),
            _mm_shuffle_epi8(z, _mm_load_si128(reinterpret_cast<const __m128i*>(masks[c][2]))));
        if (flip) v = _mm_shuffle_epi8(v, reverse);
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
        _mm256_storeu_ps(dst[c] + x, _mm256_add_ps(_mm256_mul_ps(lo, vs[c]), vb[c]));
        _mm256_storeu_ps(dst[c] + x + 8, _mm256_add_ps(_mm256_mul_ps(hi, vs[c]), vb[c]));
      }
    }
    ScalarRow(row, x, width, flip, scale, bias, dst[0], dst[1], dst[2]);
  }
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

}  // namespace

bool NormalizeKernelUsesAvx2() { return HasAvx2(); }

void NormalizeHwc3ToChw(const uint8_t* src, int64_t height, int64_t width, int64_t src_stride,
                        bool flip, const float scale[3], const float bias[3], float* out) {
  if (HasAvx2()) {
    Avx2(src, height, width, src_stride, flip, scale, bias, out);
    return;
  }
  const int64_t plane = height * width;
  for (int64_t y = 0; y < height; ++y) {
    ScalarRow(src + y * src_stride, 0, width, flip, scale, bias, out + y * width,
              out + plane + y * width, out + 2 * plane + y * width);
  }
}

NormalizeCoefficients::NormalizeCoefficients(const std::vector<float>& mean,
                                             const std::vector<float>& std) {
  channels_ = static_cast<int>(std::max(mean.size(), std.size()));
  lut_.resize(size_t{256} * channels_);
  for (int c = 0; c < channels_; ++c) {
    const double m = mean.size() == 1 ? mean[0] : mean[c];
    const double s = std.size() == 1 ? std[0] : std[c];
    const float scale8 = static_cast<float>(1.0 / (255.0 * s));
    const float bias = static_cast<float>(-m / s);
    scale_f_.push_back(static_cast<float>(1.0 / s));
    scale8_.push_back(scale8);
    bias_.push_back(bias);
    for (int v = 0; v < 256; ++v) {
      lut_[size_t{256} * c + v] = static_cast<float>(v) * scale8 + bias;
    }
  }
}

void NormalizeImage(const NormalizeCoefficients& norm, const uint8_t* src, int64_t plane,
                    int channels, bool chw, float* out) {
  if (!chw) {
    if (channels == 3) {
      const float *l0 = norm.lut(0), *l1 = norm.lut(1), *l2 = norm.lut(2);
      for (int64_t i = 0; i < plane; ++i, src += 3, out += 3) {
        out[0] = l0[src[0]];
        out[1] = l1[src[1]];
        out[2] = l2[src[2]];
      }
      return;
    }
    for (int64_t i = 0; i < plane; ++i) {
      for (int c = 0; c < channels; ++c) *out++ = norm.lut(c)[*src++];
    }
    return;
  }
  if (channels == 3) {
    // The AVX2 kernel: the same bits as the tables.
    const float scale[3] = {norm.scale8(0), norm.scale8(1), norm.scale8(2)};
    const float bias[3] = {norm.bias(0), norm.bias(1), norm.bias(2)};
    NormalizeHwc3ToChw(src, /*height=*/1, /*width=*/plane,
                       /*src_stride=*/plane * 3, /*flip=*/false, scale, bias, out);
    return;
  }
  for (int c = 0; c < channels; ++c) {
    const float* l = norm.lut(c);
    float* d = out + c * plane;
    for (int64_t p = 0; p < plane; ++p) d[p] = l[src[p * channels + c]];
  }
}

void NormalizeImage(const NormalizeCoefficients& norm, const float* src, int64_t plane,
                    int channels, bool chw, float* out) {
  if (!chw) {
    for (int64_t i = 0; i < plane; ++i) {
      for (int c = 0; c < channels; ++c) {
        *out++ = *src++ * norm.scale(c) + norm.bias(c);
      }
    }
    return;
  }
  for (int c = 0; c < channels; ++c) {
    const float s = norm.scale(c), b = norm.bias(c);
    float* d = out + c * plane;
    for (int64_t p = 0; p < plane; ++p) d[p] = src[p * channels + c] * s + b;
  }
}

}  // namespace sluice::kernels
