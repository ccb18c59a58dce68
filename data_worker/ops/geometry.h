// Geometric ops on images (H×W×C or H×W tensors): Resize, CenterCrop,
// RandomResizedCrop, RandomCrop, RandomHorizontalFlip, RandomRotation,
// following torchvision's semantics.
//
// The parameter functions (crop boxes, output sizes) are exposed because the
// fused decode ops (decode.h) compute the same boxes on the full image size
// before decoding a region.
#ifndef SLUICE_DATA_WORKER_OPS_GEOMETRY_H_
#define SLUICE_DATA_WORKER_OPS_GEOMETRY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/base/random.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/ops/tensor.h"
#include "proto/ops.pb.h"

namespace sluice::data_worker {

struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// Validated ResizeOp: either `size` (shorter side) or height × width.
struct ResizeSpec {
  int size = 0;
  int height = 0;
  int width = 0;
  int interpolation = 1;  // cv::INTER_LINEAR
};
struct CenterCropSpec {
  int height = 0;
  int width = 0;
};
struct RandomResizedCropSpec {
  int height = 0;
  int width = 0;
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
  int interpolation = 1;  // cv::INTER_LINEAR
};

absl::StatusOr<ResizeSpec> ParseResize(const proto::ResizeOp& spec, const OpLabel& label);
absl::StatusOr<CenterCropSpec> ParseCenterCrop(const proto::CenterCropOp& spec,
                                               const OpLabel& label);
absl::StatusOr<RandomResizedCropSpec> ParseRandomResizedCrop(const proto::RandomResizedCropOp& spec,
                                                             const OpLabel& label);

// Output height and width of Resize on a height × width image (torchvision's
// _compute_resized_output_size: the longer side is truncated, never below 1).
void ResizeOutputSize(const ResizeSpec& spec, int height, int width, int* out_height,
                      int* out_width);
// torchvision's CenterCrop offsets (Python round, i.e. half to even).
// InvalidArgument naming `label` and both sizes if the crop does not fit.
absl::StatusOr<CropBox> CenterCropBox(const CenterCropSpec& spec, int height, int width,
                                      const OpLabel& label);
// torchvision's RandomResizedCrop.get_params on a height × width image: 10
// attempts, then the center-crop fallback.
CropBox RandomResizedCropBox(const RandomResizedCropSpec& spec, int height, int width, Rng& rng);

// Crops `box` out of image `src` and resizes it to out_height × out_width with
// cv::resize (`cv_interpolation`); a plain copy when the sizes match.
// REQUIRES: IsCvImage(src), box inside.
Tensor CropAndResize(const Tensor& src, const CropBox& box, int out_height, int out_width,
                     int cv_interpolation);

// Factories; the spec is validated (InvalidArgument names `label` and the
// field).
absl::StatusOr<std::unique_ptr<Op>> MakeResize(const proto::ResizeOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeCenterCrop(const proto::CenterCropOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeRandomResizedCrop(const proto::RandomResizedCropOp& spec,
                                                          OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeRandomCrop(const proto::RandomCropOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeRandomHorizontalFlip(
    const proto::RandomHorizontalFlipOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeRandomRotation(const proto::RandomRotationOp& spec,
                                                       OpLabel label);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_GEOMETRY_H_
