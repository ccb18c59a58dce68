// ColorJitter on uint8 RGB images with torchvision's semantics: each enabled
// component draws a factor, the four are applied in a random order, every step
// clamps to [0, 255].
//
// Computed in float32 and rounded to uint8 once at the end (torchvision rounds
// after every step, so results can differ from torchvision by 1-2 levels);
// grayscale uses OpenCV's 0.299/0.587/0.114 weights (torchvision
// 0.2989/0.587/0.114).
#ifndef SLUICE_DATA_WORKER_OPS_COLOR_H_
#define SLUICE_DATA_WORKER_OPS_COLOR_H_

#include <array>
#include <memory>

#include "absl/status/statusor.h"
#include "common/base/random.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"

namespace sluice::data_worker {

struct ColorJitterParams {
  // Component ids in application order: 0 brightness, 1 contrast, 2 saturation,
  // 3 hue.
  std::array<int, 4> order = {0, 1, 2, 3};
  bool has_brightness = false, has_contrast = false, has_saturation = false, has_hue = false;
  double brightness = 1, contrast = 1, saturation = 1, hue = 0;
};

// The draws torchvision's ColorJitter.get_params makes: a permutation, then one
// factor per enabled component (brightness, contrast, saturation, hue).
ColorJitterParams DrawColorJitterParams(const proto::ColorJitterOp& spec, Rng& rng);

absl::StatusOr<std::unique_ptr<Op>> MakeColorJitter(const proto::ColorJitterOp& spec,
                                                    OpLabel label);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_COLOR_H_
