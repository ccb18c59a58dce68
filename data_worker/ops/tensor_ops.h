// Tensor-layout and value ops: Normalize (ToTensor + Normalize), HWC2CHW, Cast,
// and the fused Normalize+HWC2CHW[+Cast] kernel. All have batched kernels (a
// leading batch dimension is just more pixels), so the optimizer may run them
// after batching.
//
// Normalize computes x * scale[c] + bias[c] in float32 with scale = 1 / (255 *
// std) (1 / std for float input) and bias = -mean / std; uint8 input goes
// through a 256-entry table per channel. The fused kernel evaluates the same
// expression, so fused and unfused outputs are bit-identical.
#ifndef SLUICE_DATA_WORKER_OPS_TENSOR_OPS_H_
#define SLUICE_DATA_WORKER_OPS_TENSOR_OPS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"

namespace sluice::data_worker {

// Validated NormalizeOp: one (scale, bias) per channel, or one for all
// channels.
struct NormalizeSpec {
  std::vector<float> mean, std;
  bool channels_first = false;
};
absl::StatusOr<NormalizeSpec> ParseNormalize(const proto::NormalizeOp& spec, const OpLabel& label);
struct CastSpec {
  DType dtype = DType::kFloat32;
  bool scale = false;
};
absl::StatusOr<CastSpec> ParseCast(const proto::CastOp& spec, const OpLabel& label);

absl::StatusOr<std::unique_ptr<Op>> MakeNormalize(const proto::NormalizeOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeHwc2Chw(const proto::HWC2CHWOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeCast(const proto::CastOp& spec, OpLabel label);
// Normalize (channels last) + HWC2CHW, then optionally a Cast to `out_dtype`
// (float32 or float16), in one pass over the pixels. REQUIRES:
// !normalize.channels_first.
std::unique_ptr<Op> MakeNormalizeHwc2Chw(OpLabel normalize, OpLabel hwc2chw, NormalizeSpec spec,
                                         DType out_dtype, std::string name);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_TENSOR_OPS_H_
