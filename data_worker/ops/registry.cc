#include "data_worker/ops/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/pipeline_spec/cache_key.h"
#include "common/record/schema.h"
#include "data_worker/ops/color.h"
#include "data_worker/ops/decode.h"
#include "data_worker/ops/geometry.h"
#include "data_worker/ops/label.h"
#include "data_worker/ops/synthetic_load.h"
#include "data_worker/ops/tensor_ops.h"
#include "data_worker/python/python_op.h"

namespace sluice::data_worker {
namespace {

// --- Type inference helpers ---

absl::Status Wrong(const OpLabel& label, const ColumnType& t, std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(label.ToString(), ": expected ", Sv(expected),
                                                 ", the column is ", t.ToString()));
}

bool IsImage(const ColumnType& t) {
  return Tensor::CvDepth(t.dtype) >= 0 && (t.shape.size() == 3 || t.shape.size() == 2);
}

absl::Status NeedImage(const OpLabel& label, const ColumnType& t) {
  if (!IsImage(t)) {
    return Wrong(label, t, "an image (H×W×C of uint8/int32/float16/float32)");
  }
  return absl::OkStatus();
}

absl::Status CropFits(const OpLabel& label, const ColumnType& t, int64_t h, int64_t w) {
  const int64_t H = t.shape[0], W = t.shape[1];
  if ((H >= 0 && h > H) || (W >= 0 && w > W) || (t.min_side >= 0 && std::min(h, w) > t.min_side)) {
    return absl::InvalidArgumentError(absl::StrCat(
        label.ToString(), ": crop ", h, "x", w, " is larger than the image (",
        H >= 0 ? absl::StrCat(H, "x", W) : absl::StrCat("shorter side ", t.min_side), ")"));
  }
  return absl::OkStatus();
}

void SetHw(ColumnType* t, int64_t h, int64_t w) {
  t->shape[0] = h;
  t->shape[1] = w;
  t->min_side = (h >= 0 && w >= 0) ? std::min(h, w) : -1;
}

// `size` (square) or height × width.
void CropSize(int size, int h, int w, int64_t* oh, int64_t* ow) {
  *oh = size > 0 ? size : h;
  *ow = size > 0 ? size : w;
}

// --- Per-op type inference ---

absl::Status InferDecode(const proto::OpSpec&, const OpLabel& label, const InferContext& ctx,
                         ColumnType* t) {
  if (t->dtype != DType::kBytes) return Wrong(label, *t, "encoded image bytes");
  t->dtype = DType::kUint8;
  t->shape = ctx.source_image_shape;
  t->min_side = (t->shape[0] >= 0 && t->shape[1] >= 0) ? std::min(t->shape[0], t->shape[1]) : -1;
  return absl::OkStatus();
}

absl::Status InferResize(const proto::OpSpec& op, const OpLabel& label, const InferContext&,
                         ColumnType* t) {
  RETURN_IF_ERROR(NeedImage(label, *t));
  const auto& r = op.resize();
  if (r.size() > 0) {
    const int64_t H = t->shape[0], W = t->shape[1];
    if (H >= 0 && W >= 0) {
      if (H <= W) {
        SetHw(t, r.size(), W * r.size() / H);
      } else {
        SetHw(t, H * r.size() / W, r.size());
      }
    } else {
      SetHw(t, -1, -1);
      t->min_side = r.size();
    }
  } else {
    SetHw(t, r.height(), r.width());
  }
  return absl::OkStatus();
}

absl::Status InferCenterCrop(const proto::OpSpec& op, const OpLabel& label, const InferContext&,
                             ColumnType* t) {
  RETURN_IF_ERROR(NeedImage(label, *t));
  int64_t h, w;
  const auto& c = op.center_crop();
  CropSize(c.size(), c.height(), c.width(), &h, &w);
  RETURN_IF_ERROR(CropFits(label, *t, h, w));
  SetHw(t, h, w);
  return absl::OkStatus();
}

absl::Status InferRandomCrop(const proto::OpSpec& op, const OpLabel& label, const InferContext&,
                             ColumnType* t) {
  RETURN_IF_ERROR(NeedImage(label, *t));
  int64_t h, w;
  const auto& c = op.random_crop();
  CropSize(c.size(), c.height(), c.width(), &h, &w);
  if (c.padding() == 0 && !c.pad_if_needed()) {
    RETURN_IF_ERROR(CropFits(label, *t, h, w));
  }
  SetHw(t, h, w);
  return absl::OkStatus();
}

absl::Status InferRandomResizedCrop(const proto::OpSpec& op, const OpLabel& label,
                                    const InferContext&, ColumnType* t) {
  RETURN_IF_ERROR(NeedImage(label, *t));
  int64_t h, w;
  const auto& c = op.random_resized_crop();
  CropSize(c.size(), c.height(), c.width(), &h, &w);
  SetHw(t, h, w);
  return absl::OkStatus();
}

absl::Status InferSameImage(const proto::OpSpec&, const OpLabel& label, const InferContext&,
                            ColumnType* t) {
  return NeedImage(label, *t);
}

absl::Status InferColorJitter(const proto::OpSpec&, const OpLabel& label, const InferContext&,
                              ColumnType* t) {
  // -1 channels (after a python op): checked on each element instead.
  if (t->dtype != DType::kUint8 || t->shape.size() != 3 ||
      (t->shape[2] != 3 && t->shape[2] != -1)) {
    return Wrong(label, *t, "a uint8 RGB image H×W×3");
  }
  t->shape[2] = 3;
  return absl::OkStatus();
}

absl::Status InferNormalize(const proto::OpSpec&, const OpLabel& label, const InferContext&,
                            ColumnType* t) {
  if ((t->dtype != DType::kUint8 && t->dtype != DType::kFloat32) || t->shape.empty()) {
    return Wrong(label, *t, "a uint8 or float32 image");
  }
  t->dtype = DType::kFloat32;
  return absl::OkStatus();
}

absl::Status InferHwc2Chw(const proto::OpSpec&, const OpLabel& label, const InferContext&,
                          ColumnType* t) {
  if (!record::IsNumeric(t->dtype) || t->shape.size() != 3) {
    return Wrong(label, *t, "an H×W×C tensor");
  }
  t->shape = {t->shape[2], t->shape[0], t->shape[1]};
  t->min_side = -1;
  return absl::OkStatus();
}

absl::Status InferCast(const proto::OpSpec& op, const OpLabel& label, const InferContext&,
                       ColumnType* t) {
  if (!record::IsNumeric(t->dtype)) return Wrong(label, *t, "a numeric tensor");
  auto d = record::ParseDType(op.cast().dtype());
  if (!d.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label.ToString(), ": ", d.status().message()));
  }
  t->dtype = *d;
  return absl::OkStatus();
}

absl::Status InferOneHot(const proto::OpSpec& op, const OpLabel& label, const InferContext&,
                         ColumnType* t) {
  if ((t->dtype != DType::kInt32 && t->dtype != DType::kInt64) || !t->shape.empty()) {
    return Wrong(label, *t, "an int32/int64 scalar label");
  }
  t->dtype = DType::kFloat32;
  t->shape = {op.one_hot().num_classes()};
  return absl::OkStatus();
}

absl::Status InferPassThrough(const proto::OpSpec&, const OpLabel&, const InferContext&,
                              ColumnType*) {
  return absl::OkStatus();
}

// --- Fusion rules ---

// Decode + Resize / CenterCrop / RandomResizedCrop → a region decode
// (decode.h).
FusedOp FuseDecode(const std::vector<proto::OpSpec>& specs, size_t i,
                   const std::vector<OpLabel>& labels) {
  if (i + 1 >= specs.size()) return {nullptr, 0};
  const proto::OpSpec& b = specs[i + 1];
  const OpLabel& decode = labels[i];
  const OpLabel& next = labels[i + 1];
  if (b.has_resize()) {
    return {MakeDecodeResize(decode, specs[i].decode(), next, *ParseResize(b.resize(), next)), 2};
  }
  if (b.has_center_crop()) {
    return {MakeDecodeCenterCrop(decode, specs[i].decode(), next,
                                 *ParseCenterCrop(b.center_crop(), next)),
            2};
  }
  if (b.has_random_resized_crop()) {
    return {MakeDecodeRandomResizedCrop(decode, specs[i].decode(), next,
                                        *ParseRandomResizedCrop(b.random_resized_crop(), next)),
            2};
  }
  return {nullptr, 0};
}

// Normalize (channels last) + HWC2CHW [+ Cast to float32/float16] → one pass
// (tensor_ops.h).
FusedOp FuseNormalize(const std::vector<proto::OpSpec>& specs, size_t i,
                      const std::vector<OpLabel>& labels) {
  const proto::OpSpec& a = specs[i];
  if (i + 1 >= specs.size() || a.normalize().channels_first() || !specs[i + 1].has_hwc2chw()) {
    return {nullptr, 0};
  }
  NormalizeSpec norm = *ParseNormalize(a.normalize(), labels[i]);
  if (i + 2 < specs.size() && specs[i + 2].has_cast()) {
    const CastSpec cast = *ParseCast(specs[i + 2].cast(), labels[i + 2]);
    // Normalize outputs float32, so Cast's `scale` (uint8 only) does not
    // apply.
    if (cast.dtype == DType::kFloat32 || cast.dtype == DType::kFloat16) {
      return {MakeNormalizeHwc2Chw(labels[i], labels[i + 1], std::move(norm), cast.dtype,
                                   "Normalize+HWC2CHW+Cast"),
              3};
    }
  }
  return {MakeNormalizeHwc2Chw(labels[i], labels[i + 1], std::move(norm), DType::kFloat32,
                               "Normalize+HWC2CHW"),
          2};
}

// Factories: unwrap the oneof.
#define SLUICE_FACTORY(Make, accessor) \
  [](const proto::OpSpec& s, OpLabel l) { return Make(s.accessor(), std::move(l)); }

const std::vector<OpRegistration>& Table() {
  using S = proto::OpSpec;
  static const auto* table = new std::vector<OpRegistration>{
      // clang-format off
      // case                     type                    field
      //   factory, type inference, batched kernel, fusion rule
      {S::kDecode, "Decode", "decode",
       SLUICE_FACTORY(MakeDecode, decode), InferDecode, false, FuseDecode},
      {S::kResize, "Resize", "resize",
       SLUICE_FACTORY(MakeResize, resize), InferResize, false},
      {S::kCenterCrop, "CenterCrop", "center_crop",
       SLUICE_FACTORY(MakeCenterCrop, center_crop), InferCenterCrop, false},
      {S::kRandomResizedCrop, "RandomResizedCrop", "random_resized_crop",
       SLUICE_FACTORY(MakeRandomResizedCrop, random_resized_crop),
       InferRandomResizedCrop, false},
      {S::kRandomCrop, "RandomCrop", "random_crop",
       SLUICE_FACTORY(MakeRandomCrop, random_crop), InferRandomCrop, false},
      {S::kRandomHorizontalFlip, "RandomHorizontalFlip", "random_horizontal_flip",
       SLUICE_FACTORY(MakeRandomHorizontalFlip, random_horizontal_flip),
       InferSameImage, false},
      {S::kRandomRotation, "RandomRotation", "random_rotation",
       SLUICE_FACTORY(MakeRandomRotation, random_rotation), InferSameImage,
       false},
      {S::kColorJitter, "ColorJitter", "color_jitter",
       SLUICE_FACTORY(MakeColorJitter, color_jitter), InferColorJitter, false},
      {S::kNormalize, "Normalize", "normalize",
       SLUICE_FACTORY(MakeNormalize, normalize), InferNormalize, true,
       FuseNormalize},
      {S::kHwc2Chw, "HWC2CHW", "hwc2chw",
       SLUICE_FACTORY(MakeHwc2Chw, hwc2chw), InferHwc2Chw, true},
      {S::kCast, "Cast", "cast",
       SLUICE_FACTORY(MakeCast, cast), InferCast, true},
      {S::kOneHot, "OneHot", "one_hot",
       SLUICE_FACTORY(MakeOneHot, one_hot), InferOneHot, true},
      {S::kSpin, "Spin", "spin",
       SLUICE_FACTORY(MakeSpin, spin), InferPassThrough, false},
      {S::kSleep, "Sleep", "sleep",
       SLUICE_FACTORY(MakeSleep, sleep), InferPassThrough, false},
      {S::kPython, "Python", "python",
       SLUICE_FACTORY(MakePython, python), InferPython, false},
      // clang-format on
  };
  return *table;
}

#undef SLUICE_FACTORY

}  // namespace

std::string ColumnType::ToString() const {
  if (!record::IsNumeric(dtype)) return std::string(record::DTypeName(dtype));
  return absl::StrCat(record::DTypeName(dtype), ShapeToString(shape));
}

const std::vector<OpRegistration>& RegisteredOps() { return Table(); }

const OpRegistration* FindOp(proto::OpSpec::OpCase op_case) {
  for (const OpRegistration& r : Table()) {
    if (r.op_case == op_case) return &r;
  }
  return nullptr;
}

std::string_view OpTypeName(proto::OpSpec::OpCase op_case) {
  const OpRegistration* r = FindOp(op_case);
  return r != nullptr ? r->type : "unknown";
}

absl::Status InferOpType(const proto::OpSpec& spec, const OpLabel& label, const InferContext& ctx,
                         ColumnType* t) {
  const OpRegistration* r = FindOp(spec.op_case());
  if (r == nullptr) return label.SpecError("no op set");
  return r->infer(spec, label, ctx, t);
}

bool DrawsPerEpochRandomness(proto::OpSpec::OpCase op_case) {
  return pipeline_spec::DrawsPerEpochRandomness(op_case);  // one home, shared with the dispatcher
}

}  // namespace sluice::data_worker
