#include "data_worker/python/python_op.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/random.h"
#include "data_worker/python/python_pool.h"

namespace sluice::data_worker {
namespace {

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return false;
    }
  }
  return true;
}

class PythonOpImpl final : public Op {
 public:
  PythonOpImpl(OpLabel label, const proto::PythonOp& spec, std::vector<DType> output_dtypes,
               std::shared_ptr<python::PythonPool> pool)
      : label_(std::move(label)),
        module_(spec.module()),
        function_(spec.function()),
        output_dtypes_(std::move(output_dtypes)),
        pool_(std::move(pool)) {}

  std::string_view name() const override { return label_.name; }

  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    std::vector<Tensor> columns;
    columns.push_back(std::move(input));
    absl::StatusOr<std::vector<Tensor>> out = ApplyColumns(std::move(columns), ctx);
    if (!out.ok()) return out.status();
    return std::move((*out)[0]);
  }

  bool takes_all_columns() const override { return true; }

  absl::StatusOr<std::vector<Tensor>> ApplyColumns(std::vector<Tensor> columns,
                                                   const ElementContext& ctx) const override {
    std::vector<const Tensor*> in;
    for (const Tensor& t : columns) in.push_back(&t);
    const uint64_t seed =
        MixSeed({ctx.seed, ctx.epoch, ctx.global_index, static_cast<uint64_t>(label_.position)});
    absl::StatusOr<std::vector<Tensor>> out = pool_->Call(module_, function_, seed, in);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat(label_.ToString(), ": ", module_, ".", function_, ": ",
                                       out.status().message()));
    }
    if (out->size() != columns.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label_.ToString(), ": ", module_, ".", function_, " returned ", out->size(),
          " arrays for ", columns.size(), " columns; return one array per input column, in order"));
    }
    for (size_t k = 0; k < out->size(); ++k) {
      const DType want =
          k < output_dtypes_.size() && output_dtypes_[k] != DType::kBytes
              ? output_dtypes_[k]
              : (record::IsNumeric(columns[k].dtype()) ? columns[k].dtype() : DType::kUint8);
      const Tensor& got = (*out)[k];
      if (got.dtype() != want ||
          (record::IsNumeric(columns[k].dtype()) && got.rank() != columns[k].rank())) {
        return absl::InvalidArgumentError(
            absl::StrCat(label_.ToString(), ": ", module_, ".", function_, " returned ",
                         record::DTypeName(got.dtype()), ShapeToString(got.shape()), " for column ",
                         k, ", expected ", record::DTypeName(want), " of rank ", columns[k].rank(),
                         " (cast with .astype, or declare output_dtypes)"));
      }
    }
    return out;
  }

 private:
  OpLabel label_;
  std::string module_;
  std::string function_;
  std::vector<DType> output_dtypes_;  // kBytes = the input's dtype
  std::shared_ptr<python::PythonPool> pool_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Op>> MakePython(const proto::PythonOp& spec, OpLabel label) {
  for (absl::string_view part : absl::StrSplit(spec.module(), '.')) {
    if (!IsIdentifier(part)) {
      return label.FieldError(
          "module", absl::StrCat("must be a dotted Python module name, got '", spec.module(), "'"));
    }
  }
  if (!IsIdentifier(spec.function())) {
    return label.FieldError(
        "function", absl::StrCat("must be a Python identifier, got '", spec.function(), "'"));
  }
  std::vector<DType> dtypes;
  for (const std::string& d : spec.output_dtypes()) {
    if (d.empty()) {
      dtypes.push_back(DType::kBytes);
      continue;
    }
    absl::StatusOr<DType> t = record::ParseDType(d);
    if (!t.ok() || !record::IsNumeric(*t)) {
      return label.FieldError("output_dtypes",
                              absl::StrCat("'", d,
                                           "' is not one of uint8, int32, int64, float16, "
                                           "float32"));
    }
    dtypes.push_back(*t);
  }
  std::shared_ptr<python::PythonPool> pool = python::ConfiguredPythonPool();
  if (pool == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(label.ToString(),
                     ": python ops are disabled on this worker; start sluice-worker (or "
                     "sluice pipeline run) with "
                     "--allow-python-ops (and --python-path for the team's modules)"));
  }
  return std::make_unique<PythonOpImpl>(std::move(label), spec, std::move(dtypes), std::move(pool));
}

absl::Status InferPython(const proto::OpSpec& spec, const OpLabel& label, const InferContext& ctx,
                         ColumnType* t) {
  if (!record::IsNumeric(t->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label.ToString(),
                     ": expected a numeric column (decode it first), the "
                     "column is ",
                     t->ToString()));
  }
  const auto& dtypes = spec.python().output_dtypes();
  if (ctx.column < dtypes.size() && !dtypes[ctx.column].empty()) {
    t->dtype = *record::ParseDType(dtypes[ctx.column]);
  }
  for (int64_t& d : t->shape) d = -1;
  t->min_side = -1;
  return absl::OkStatus();
}

}  // namespace sluice::data_worker
