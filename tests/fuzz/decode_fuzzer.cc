// libFuzzer target for image decoding on arbitrary bytes: the region JPEG
// decode fused with crop and resize (DecodeImageRegion, the path of the fused
// Decode+CenterCrop/RandomResizedCrop/Resize ops) and the plain DecodeImage.
// The first 8 input bytes choose the crop box (always inside the image, as the
// real ops' plans are), the output size, the interpolation and whether DCT
// scaling is allowed; the rest is the encoded image. Corrupt data must give
// DataLoss, never a crash; a decoded tensor must have the planned shape.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "absl/status/status.h"
#include "data_worker/ops/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::data_worker::DecodePlan;
  if (size < 8) return 0;
  const uint8_t* p = data;
  const std::string_view encoded(reinterpret_cast<const char*>(data + 8), size - 8);
  const int out_h = 1 + p[4] % 48;
  const int out_w = 1 + p[5] % 48;
  static constexpr int kInterpolations[] = {0, 1, 2, 3};  // cv::INTER_*
  auto plan = [&](int height, int width) -> absl::StatusOr<DecodePlan> {
    if (height <= 0 || width <= 0) return absl::DataLossError("empty image");
    DecodePlan plan;
    plan.box.top = p[0] % height;
    plan.box.left = p[1] % width;
    plan.box.height = 1 + p[2] % (height - plan.box.top);
    plan.box.width = 1 + p[3] % (width - plan.box.left);
    plan.out_height = out_h;
    plan.out_width = out_w;
    plan.interpolation = kInterpolations[p[6] % 4];
    plan.allow_dct_scaling = (p[7] & 1) != 0;
    return plan;
  };
  auto region = sluice::data_worker::DecodeImageRegion(encoded, plan);
  if (region.ok() && (region->rank() != 3 || region->dim(0) != out_h || region->dim(1) != out_w ||
                      region->dim(2) != 3)) {
    std::abort();
  }
  if ((p[7] & 2) != 0) (void)sluice::data_worker::DecodeImage(encoded);
  return 0;
}
