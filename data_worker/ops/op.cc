#include "data_worker/ops/op.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "data_worker/ops/color.h"
#include "data_worker/ops/decode.h"
#include "data_worker/ops/geometry.h"
#include "data_worker/ops/label.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/ops/synthetic_load.h"
#include "data_worker/ops/tensor_ops.h"
#include "opencv2/core/utility.hpp"

namespace sluice::data_worker {
namespace {

std::string_view TypeName(proto::OpSpec::OpCase c) {
  switch (c) {
    case proto::OpSpec::kDecode:
      return "Decode";
    case proto::OpSpec::kResize:
      return "Resize";
    case proto::OpSpec::kCenterCrop:
      return "CenterCrop";
    case proto::OpSpec::kRandomResizedCrop:
      return "RandomResizedCrop";
    case proto::OpSpec::kRandomCrop:
      return "RandomCrop";
    case proto::OpSpec::kRandomHorizontalFlip:
      return "RandomHorizontalFlip";
    case proto::OpSpec::kRandomRotation:
      return "RandomRotation";
    case proto::OpSpec::kColorJitter:
      return "ColorJitter";
    case proto::OpSpec::kNormalize:
      return "Normalize";
    case proto::OpSpec::kHwc2Chw:
      return "HWC2CHW";
    case proto::OpSpec::kCast:
      return "Cast";
    case proto::OpSpec::kOneHot:
      return "OneHot";
    case proto::OpSpec::kSpin:
      return "Spin";
    case proto::OpSpec::kSleep:
      return "Sleep";
    case proto::OpSpec::OP_NOT_SET:
      break;
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Op>> MakeOne(const proto::OpSpec& spec,
                                            OpLabel label) {
  switch (spec.op_case()) {
    case proto::OpSpec::kDecode:
      return MakeDecode(spec.decode(), std::move(label));
    case proto::OpSpec::kResize:
      return MakeResize(spec.resize(), std::move(label));
    case proto::OpSpec::kCenterCrop:
      return MakeCenterCrop(spec.center_crop(), std::move(label));
    case proto::OpSpec::kRandomResizedCrop:
      return MakeRandomResizedCrop(spec.random_resized_crop(),
                                   std::move(label));
    case proto::OpSpec::kRandomCrop:
      return MakeRandomCrop(spec.random_crop(), std::move(label));
    case proto::OpSpec::kRandomHorizontalFlip:
      return MakeRandomHorizontalFlip(spec.random_horizontal_flip(),
                                      std::move(label));
    case proto::OpSpec::kRandomRotation:
      return MakeRandomRotation(spec.random_rotation(), std::move(label));
    case proto::OpSpec::kColorJitter:
      return MakeColorJitter(spec.color_jitter(), std::move(label));
    case proto::OpSpec::kNormalize:
      return MakeNormalize(spec.normalize(), std::move(label));
    case proto::OpSpec::kHwc2Chw:
      return MakeHwc2Chw(spec.hwc2chw(), std::move(label));
    case proto::OpSpec::kCast:
      return MakeCast(spec.cast(), std::move(label));
    case proto::OpSpec::kOneHot:
      return MakeOneHot(spec.one_hot(), std::move(label));
    case proto::OpSpec::kSpin:
      return MakeSpin(spec.spin(), std::move(label));
    case proto::OpSpec::kSleep:
      return MakeSleep(spec.sleep(), std::move(label));
    case proto::OpSpec::OP_NOT_SET:
      break;
  }
  return label.SpecError(
      "no op set (empty OpSpec, or an op this worker does not know)");
}

// Tries to fuse the ops starting at specs[i]; returns the fused op and how many
// specs it covers, or {nullptr, 0}. The specs are already validated.
std::pair<std::unique_ptr<Op>, int> TryFuse(
    const std::vector<proto::OpSpec>& specs, size_t i,
    const std::vector<OpLabel>& labels) {
  if (i + 1 >= specs.size()) return {nullptr, 0};
  const proto::OpSpec& a = specs[i];
  const proto::OpSpec& b = specs[i + 1];
  if (a.has_decode()) {
    if (b.has_resize()) {
      return {MakeDecodeResize(labels[i], labels[i + 1],
                               *ParseResize(b.resize(), labels[i + 1])),
              2};
    }
    if (b.has_center_crop()) {
      return {MakeDecodeCenterCrop(
                  labels[i], labels[i + 1],
                  *ParseCenterCrop(b.center_crop(), labels[i + 1])),
              2};
    }
    if (b.has_random_resized_crop()) {
      return {
          MakeDecodeRandomResizedCrop(
              labels[i], labels[i + 1],
              *ParseRandomResizedCrop(b.random_resized_crop(), labels[i + 1])),
          2};
    }
  }
  if (a.has_normalize() && !a.normalize().channels_first() && b.has_hwc2chw()) {
    NormalizeSpec norm = *ParseNormalize(a.normalize(), labels[i]);
    if (i + 2 < specs.size() && specs[i + 2].has_cast()) {
      const CastSpec cast = *ParseCast(specs[i + 2].cast(), labels[i + 2]);
      // Normalize outputs float32, so Cast's `scale` (uint8 only) does not
      // apply.
      if (cast.dtype == DType::kFloat32 || cast.dtype == DType::kFloat16) {
        return {MakeNormalizeHwc2Chw(labels[i], labels[i + 1], std::move(norm),
                                     cast.dtype, "Normalize+HWC2CHW+Cast"),
                3};
      }
    }
    return {MakeNormalizeHwc2Chw(labels[i], labels[i + 1], std::move(norm),
                                 DType::kFloat32, "Normalize+HWC2CHW"),
            2};
  }
  return {nullptr, 0};
}

}  // namespace

absl::StatusOr<Tensor> Op::ApplyBatch(Tensor) const {
  return absl::UnimplementedError(
      absl::StrCat(Sv(name()), " has no batched kernel; apply it per element"));
}

absl::StatusOr<std::vector<std::unique_ptr<Op>>> BuildOps(
    const std::vector<proto::OpSpec>& specs, int first_position, bool fuse) {
  // OpenCV must not start its own thread pool: the pipeline owns parallelism.
  static std::once_flag cv_threads_once;
  std::call_once(cv_threads_once, [] { cv::setNumThreads(0); });

  std::vector<OpLabel> labels;
  std::vector<std::unique_ptr<Op>> unfused;
  for (size_t i = 0; i < specs.size(); ++i) {
    labels.push_back(OpLabel{first_position + static_cast<int>(i),
                             std::string(TypeName(specs[i].op_case()))});
    ASSIGN_OR_RETURN(std::unique_ptr<Op> op, MakeOne(specs[i], labels.back()));
    unfused.push_back(std::move(op));
  }
  if (!fuse) return unfused;
  std::vector<std::unique_ptr<Op>> out;
  for (size_t i = 0; i < specs.size();) {
    auto [fused, covered] = TryFuse(specs, i, labels);
    if (fused != nullptr) {
      out.push_back(std::move(fused));
      i += covered;
    } else {
      out.push_back(std::move(unfused[i]));
      ++i;
    }
  }
  return out;
}

}  // namespace sluice::data_worker
