// The uint8 → float32 normalize kernel behind Normalize+HWC2CHW: one pass
// that reads an H×W×3 uint8 window (optionally mirrored left-right) and
// writes three float32 H×W planes, out = x * scale[c] + bias[c].
//
// AVX2 (16 pixels per step, pshufb to split the channels) when the CPU has
// it, scalar otherwise; both compute float(x) * scale + bias with two
// roundings, so every path gives the same bits as Normalize's table.
//
//   src row y:  R G B R G B ...  (src_stride bytes apart)
//   out:        [R plane H×W][G plane H×W][B plane H×W]
#ifndef SLUICE_DATA_WORKER_OPS_NORMALIZE_KERNEL_H_
#define SLUICE_DATA_WORKER_OPS_NORMALIZE_KERNEL_H_

#include <cstdint>

namespace sluice::data_worker {

// REQUIRES: src holds height rows of width * 3 bytes, src_stride apart; out
// holds 3 * height * width floats.
void NormalizeHwc3ToChw(const uint8_t* src, int64_t height, int64_t width,
                        int64_t src_stride, bool flip, const float scale[3],
                        const float bias[3], float* out);

// True if NormalizeHwc3ToChw uses AVX2 on this CPU.
bool NormalizeKernelUsesAvx2();

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_NORMALIZE_KERNEL_H_
