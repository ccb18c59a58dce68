// Image decoding: the Decode op and the fused Decode+Resize / Decode+CenterCrop
// / Decode+RandomResizedCrop ops.
//
// JPEGs go through libjpeg-turbo directly (straight to RGB, JDCT_ISLOW, fancy
// upsampling). The fused ops read the header, compute the crop box on the full
// W×H exactly as the unfused op would (same random draws), pick a
// DCT scale n/8 by DctScaleRule (below) among those keeping the box at least as
// large as the output, and decode
// only the box's rows (jpeg_skip_scanlines) and columns (jpeg_crop_scanline,
// widened to iMCU boundaries), then cv::resize the box to the output size
// (INTER_LINEAR, or INTER_AREA when still shrinking by 2× or more). Against
// crop-then-resize of a full decode the result differs only by the DCT-domain
// downscale (a box filter instead of bilinear sampling) and a sub-pixel
// rounding of the box at scales below 1; at scale 1 the output is the same
// crop/resize of the same decoded pixels.
//
// PNG, BMP and WebP go through cv::imdecode (BGR → RGB, alpha dropped, 16-bit → 8-bit, EXIF
// orientation ignored), followed by the unfused crop/resize. Corrupt or truncated data → DataLoss
// "cannot decode image: <reason>"; any other format is DataLoss "unsupported image format"
// (OpenCV's other readers, DICOM, JPEG 2000, TIFF, ..., abort or over-allocate on corrupt data).
// Before a PNG reaches OpenCV its chunk list is walked: a chunk running past the end of the data is
// DataLoss (libpng would otherwise allocate the declared length, up to 2 GiB, first). An image
// (JPEG, PNG, BMP) whose header declares more than kMaxImagePixels pixels is DataLoss too, before
// any pixel buffer is allocated.
#ifndef SLUICE_DATA_WORKER_OPS_DECODE_H_
#define SLUICE_DATA_WORKER_OPS_DECODE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "data_worker/ops/geometry.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/ops/tensor.h"

namespace sluice::data_worker {

// The largest image (height × width, from its header) the decoder accepts:
// 2^28 pixels, a 768 MiB RGB buffer (16384 × 16384 fits).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

// How the DCT scale n/8 of a region decode is chosen. Every rule keeps the
// fidelity bound: the decoded box is at least as large as the output on both
// axes (nothing is upsampled after the IDCT), so the resize only shrinks.
//   kCostModel:       the scale with the lowest modelled cost among those that
//                     keep the bound: the measured CPU time per source pixel
//                     of decoding at that scale, with the table for the
//                     image's chroma sampling, plus the resize of the decoded
//                     pixels (kDctDecodeCost*, decode.cc). The default. With
//                     4:2:0 it decodes at 4/8 where the n/8 rule would use 3/8
//                     and at 8/8 where it would use 6/8 or 7/8.
//   kPowerOfTwo:      the smallest of 1/8, 1/4, 1/2, 1 (libjpeg-turbo's fast
//                     IDCT paths; the rest of the reduction is left to the
//                     resize). The rule before kCostModel.
//   kSmallestEighth:  the smallest n/8 (fewest decoded pixels, slow odd-size
//                     IDCTs).
// docs/BENCHMARKS.md ("The engine at the hardware limit" and "The strict
// ceiling") has the measured rates and errors of each.
enum class DctScaleRule { kPowerOfTwo, kSmallestEighth, kCostModel };

// The n (1..8) of the DCT scale n/8 `rule` picks to decode a box_height ×
// box_width region that is then resized to out_height × out_width, for a JPEG
// whose largest sampling factors are max_h_samp × max_v_samp (2 × 2 for
// 4:2:0, 1 × 1 for 4:4:4). 8 when no scale keeps the bound (the output is
// larger than the box). REQUIRES: all sizes > 0.
int ChooseDctScale(DctScaleRule rule, int box_height, int box_width, int out_height, int out_width,
                   int max_h_samp, int max_v_samp);

// The DecodeOp setting as a rule (DCT_SCALE_COST → kCostModel, ...).
DctScaleRule DctScaleRuleOf(proto::DecodeOp::DctScale setting);

// What to produce from an image once its full size is known.
struct DecodePlan {
  CropBox box;         // in full-image pixels
  int out_height = 0;  // box is resized to out_height × out_width
  int out_width = 0;
  int interpolation = 1;  // cv::INTER_*
  // Whether the box may be downscaled in the DCT domain (only for bilinear/area
  // resizes).
  bool allow_dct_scaling = false;
  // How to pick the DCT scale (see DctScaleRule).
  DctScaleRule dct_rule = DctScaleRule::kCostModel;
  // JPEG decoding settings (proto::DecodeOp): the IDCT and chroma upsampling.
  proto::DecodeOp::Idct idct = proto::DecodeOp::IDCT_ACCURATE;
  bool fast_upsampling = false;
};
// Computes the plan from the full image height and width; an error aborts the
// decode.
using PlanFn = std::function<absl::StatusOr<DecodePlan>(int height, int width)>;

// Decodes `encoded` to uint8 H×W×3 RGB.
absl::StatusOr<Tensor> DecodeImage(std::string_view encoded);
// Decodes the region `plan` selects and resizes it, as described above.
absl::StatusOr<Tensor> DecodeImageRegion(std::string_view encoded, const PlanFn& plan);

absl::StatusOr<std::unique_ptr<Op>> MakeDecode(const proto::DecodeOp& spec, OpLabel label);
// Fused ops; `decode` and the second op keep their own labels/positions.
std::unique_ptr<Op> MakeDecodeResize(OpLabel decode, const proto::DecodeOp& decode_spec,
                                     OpLabel resize, ResizeSpec spec);
std::unique_ptr<Op> MakeDecodeCenterCrop(OpLabel decode, const proto::DecodeOp& decode_spec,
                                         OpLabel crop, CenterCropSpec spec);
std::unique_ptr<Op> MakeDecodeRandomResizedCrop(OpLabel decode, const proto::DecodeOp& decode_spec,
                                                OpLabel crop, RandomResizedCropSpec spec);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_DECODE_H_
