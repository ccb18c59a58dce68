// Trainer-side finishing: the tail of per-element arithmetic (Normalize, HWC2CHW, Cast to float32)
// that a worker may leave to the client, because it only inflates the bytes on the wire (uint8
// pixels become float32: 4x). The worker stops before the tail and ships the uint8 batch; the
// batch header lists the ops (proto::ColumnFinish); the client runs them here, fused with the one
// copy it must do anyway (received slices -> the trainer's float32 tensor), with the same kernels
// as the worker (normalize_kernel.h), so the trainer gets the same bits either way.
//
//   worker:  decode -> crop -> | batch | -> uint8 [64, 224, 224, 3] (9.6 MB on the wire)
//   header:  finish { column: 0 ops: [random_horizontal_flip {}, normalize {...}, hwc2chw {}]
//                     mirrored: [true, false, ...] }
//   client:  Finisher(ops, uint8, [64, 224, 224, 3]).Run(slices, mirrored)
//              -> float32 [64, 3, 224, 224]
//
// What the client can run (ClientTailLength): Normalize (channels-last), optionally followed by
// HWC2CHW, optionally followed by Cast to float32, on uint8 or float32 N×H×W×C; optionally
// preceded by RandomHorizontalFlip. The flip is random, so the worker still draws it (the op's own
// draw, Op::Mirrors) and sends one flag per element (ColumnFinish.mirrored); the client folds the
// mirroring into its normalize pass (the kernel reads the row right to left), where the worker
// would have spent a pass over the pixels on it. This is the one place that decides what a tail
// is: the worker cuts only such a tail, the client refuses anything else.
//
// No OpenCV here: the client links this library, not the ops library.
//
// Seam for device finishing: a GPU trainer would hand the received uint8 column to the device and
// run the same ops there instead of Finisher::Run (client/internal/batch_iterator_impl.cc,
// FinishOnHost).
#ifndef SLUICE_COMMON_TENSOR_KERNELS_FINISH_H_
#define SLUICE_COMMON_TENSOR_KERNELS_FINISH_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/record/schema.h"
#include "common/tensor_kernels/normalize_kernel.h"
#include "proto/ops.pb.h"

namespace sluice::kernels {

// The pipeline's `finish` key (proto/pipeline.proto).
enum class FinishMode { kAuto, kWorker, kClient };
// "" and "auto" -> kAuto, "worker", "client". InvalidArgument naming the field otherwise:
//   finish: 'gpu' is not one of auto, worker, client
absl::StatusOr<FinishMode> ParseFinishMode(std::string_view value);

// How many trailing ops of `ops` form a tail the client can run (0: none).
size_t ClientTailLength(absl::Span<const proto::OpSpec> ops);

// A tail bound to one input column type. Immutable; thread-safe.
class Finisher {
 public:
  // InvalidArgument naming the problem if `ops` is not a tail the client can run (the whole
  // list), its Normalize parameters are invalid, or the column is not uint8/float32
  // [N, H, W, C] with C matching mean/std.
  static absl::StatusOr<Finisher> Create(absl::Span<const proto::OpSpec> ops, record::DType dtype,
                                         absl::Span<const int64_t> shape);

  // The tail begins with RandomHorizontalFlip: Run needs one mirror flag per element.
  bool mirrors() const { return mirrors_; }

  record::DType out_dtype() const { return record::DType::kFloat32; }
  const std::vector<int64_t>& out_shape() const { return out_shape_; }
  size_t out_bytes() const;
  // Bytes of the input column.
  size_t in_bytes() const;

  // Runs the tail on the column whose bytes are `pieces` concatenated (in_bytes() in all) and
  // writes out_bytes() to `out`, element i mirrored left-right first where mirrored[i]. An image
  // that lies in one piece (aligned for its dtype) is read where it is; one that spans pieces is
  // first gathered into a one-image scratch buffer that stays in cache, so the column is read
  // once from memory and the output written once. A mirrored uint8 image with 3 channels going
  // to C×H×W is read right to left by the normalize kernel; any other mirrored image is first
  // mirrored into the scratch buffer. InvalidArgument (and nothing written) unless there is one
  // flag per element if mirrors(), none otherwise.
  absl::Status Run(absl::Span<const absl::Span<const uint8_t>> pieces,
                   absl::Span<const bool> mirrored, float* out) const;

 private:
  Finisher(NormalizeCoefficients norm) : norm_(std::move(norm)) {}

  NormalizeCoefficients norm_;
  bool mirrors_ = false;
  bool chw_ = false;
  bool float_input_ = false;
  int64_t n_ = 0, height_ = 0, width_ = 0, plane_ = 0;
  int channels_ = 0;
  std::vector<int64_t> out_shape_;
};

}  // namespace sluice::kernels

#endif  // SLUICE_COMMON_TENSOR_KERNELS_FINISH_H_
