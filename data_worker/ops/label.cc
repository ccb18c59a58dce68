#include "data_worker/ops/label.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::data_worker {
namespace {

class OneHotOpImpl final : public Op {
 public:
  OneHotOpImpl(OpLabel label, int num_classes)
      : label_(std::move(label)), num_classes_(num_classes) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    if (!IsIntegral(input) || input.num_elements() != 1 || input.rank() > 1) {
      return label_.InputError("an int32 or int64 scalar label", input);
    }
    return Run(input, {num_classes_});
  }
  bool has_batched_kernel() const override { return true; }
  absl::StatusOr<Tensor> ApplyBatch(Tensor batch) const override {
    if (!IsIntegral(batch) || batch.rank() != 1) {
      return label_.InputError("an int32 or int64 [N] batch of labels", batch);
    }
    return Run(batch, {batch.dim(0), num_classes_});
  }

 private:
  static bool IsIntegral(const Tensor& t) {
    return t.dtype() == DType::kInt32 || t.dtype() == DType::kInt64;
  }
  absl::StatusOr<Tensor> Run(const Tensor& labels, std::vector<int64_t> shape) const {
    Tensor out = Tensor::Allocate(DType::kFloat32, std::move(shape));
    float* dst = out.data_as<float>();
    const int64_t n = labels.num_elements();
    std::fill(dst, dst + n * num_classes_, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = labels.dtype() == DType::kInt64 ? labels.data_as<int64_t>()[i]
                                                        : labels.data_as<int32_t>()[i];
      if (v < 0 || v >= num_classes_) {
        return absl::InvalidArgumentError(absl::StrCat(label_.ToString(), ": label ", v,
                                                       " is outside [0, ", num_classes_,
                                                       "); check num_classes"));
      }
      dst[i * num_classes_ + v] = 1.0f;
    }
    return out;
  }
  OpLabel label_;
  int64_t num_classes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Op>> MakeOneHot(const proto::OneHotOp& spec, OpLabel label) {
  if (spec.num_classes() <= 0 || spec.num_classes() > kMaxOneHotClasses) {
    return label.FieldError("num_classes", absl::StrCat("must be in [1, ", kMaxOneHotClasses,
                                                        "], got ", spec.num_classes()));
  }
  return std::make_unique<OneHotOpImpl>(std::move(label), spec.num_classes());
}

}  // namespace sluice::data_worker
