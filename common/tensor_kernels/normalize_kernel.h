// The batched Normalize kernels, in one home for the worker's ops
// (data_worker/ops/tensor_ops.cc: Normalize, Normalize+HWC2CHW) and the
// client's trainer-side finishing (finish.h), so both give the same bits.
//
// NormalizeCoefficients: per-channel out = x * scale + bias, computed once in
// double and rounded to float (uint8 input: scale8 = 1 / (255 std); float
// input: scale = 1 / std; bias = -mean / std), with 256-entry tables for uint8.
// NormalizeImage: one image, uint8 or float32 H×W×C in, float32 C×H×W (chw) or
// H×W×C out.
//
// NormalizeHwc3ToChw: the uint8 → float32 kernel behind Normalize+HWC2CHW: one pass
// that reads an H×W×3 uint8 window (optionally mirrored left-right) and
// writes three float32 H×W planes, out = x * scale[c] + bias[c].
//
// AVX2 (16 pixels per step, pshufb to split the channels) when the CPU has
// it, scalar otherwise; both compute float(x) * scale + bias with two
// roundings, so every path gives the same bits as Normalize's table.
//
//   src row y:  R G B R G B ...  (src_stride bytes apart)
//   out:        [R plane H×W][G plane H×W][B plane H×W]
#ifndef SLUICE_COMMON_TENSOR_KERNELS_NORMALIZE_KERNEL_H_
#define SLUICE_COMMON_TENSOR_KERNELS_NORMALIZE_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::kernels {

class NormalizeCoefficients {
 public:
  // REQUIRES: mean and std non-empty, of equal size or one of them of size 1;
  // std non-zero (data_worker/ops ParseNormalize checks this).
  NormalizeCoefficients(const std::vector<float>& mean, const std::vector<float>& std);
  // 1 means "the same for every channel".
  int channels() const { return channels_; }
  const float* lut(int c) const { return lut_.data() + size_t{256} * Index(c); }
  float scale(int c) const { return scale_f_[Index(c)]; }
  float bias(int c) const { return bias_[Index(c)]; }
  // The uint8 scale 1 / (255 * std) of channel c.
  float scale8(int c) const { return scale8_[Index(c)]; }
  bool Accepts(int64_t c) const { return channels_ == 1 || c == channels_; }

 private:
  int Index(int c) const { return channels_ == 1 ? 0 : c; }
  int channels_;
  std::vector<float> lut_, scale_f_, scale8_, bias_;
};

// One image of `plane` = H×W pixels of `channels` channels (channels-last,
// contiguous) → float32, C×H×W planes if chw, else H×W×C. The same bits as
// Normalize[+HWC2CHW] on the worker. REQUIRES: coefficients.Accepts(channels).
void NormalizeImage(const NormalizeCoefficients& coefficients, const uint8_t* src, int64_t plane,
                    int channels, bool chw, float* out);
void NormalizeImage(const NormalizeCoefficients& coefficients, const float* src, int64_t plane,
                    int channels, bool chw, float* out);

// REQUIRES: src holds height rows of width * 3 bytes, src_stride apart; out
// holds 3 * height * width floats.
void NormalizeHwc3ToChw(const uint8_t* src, int64_t height, int64_t width, int64_t src_stride,
                        bool flip, const float scale[3], const float bias[3], float* out);

// True if NormalizeHwc3ToChw uses AVX2 on this CPU.
bool NormalizeKernelUsesAvx2();

}  // namespace sluice::kernels

#endif  // SLUICE_COMMON_TENSOR_KERNELS_NORMALIZE_KERNEL_H_
