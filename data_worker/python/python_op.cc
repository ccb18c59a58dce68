#include "data_worker/python/python_op.h"

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/random.h"
#include "common/base/status_macros.h"
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

// Elements per request when the spec leaves `group` at 0.
constexpr int kDefaultGroup = 8;
// The largest `group` accepted.
constexpr int kMaxGroup = 1024;

class PythonOpImpl final : public Op {
 public:
  PythonOpImpl(OpLabel label, const proto::PythonOp& spec, std::vector<DType> output_dtypes,
               std::shared_ptr<python::PythonPool> pool)
      : label_(std::move(label)),
        module_(spec.module()),
        function_(spec.function()),
        output_dtypes_(std::move(output_dtypes)),
        group_(spec.group() > 0 ? spec.group() : kDefaultGroup),
        pool_(std::move(pool)),
        owner_(python::PipelineOwnerScope::ForNewOp(*pool_)) {}
  // Its pipeline's processes serve no one else (the pipeline's ops go
  // together: the first to go stops them).
  ~PythonOpImpl() override { pool_->Retire(owner_); }

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
    WarmOnce();
    std::vector<const Tensor*> in;
    for (const Tensor& t : columns) in.push_back(&t);
    return Check(columns, pool_->Call(owner_, module_, function_, Seed(ctx), in));
  }

  int group_size() const override { return group_; }

  // Requests of at most group_ elements and kGroupBytes of inputs (an
  // element larger than that goes alone).
  std::vector<absl::StatusOr<std::vector<Tensor>>> ApplyColumnsGroup(
      std::vector<std::vector<Tensor>> columns, const std::vector<ElementContext>& ctxs,
      bool first_error_ends) const override {
    WarmOnce();
    std::vector<absl::StatusOr<std::vector<Tensor>>> out;
    out.reserve(columns.size());
    bool failed = false;
    for (size_t begin = 0; begin < columns.size();) {
      if (failed) {
        out.push_back(NotComputed());
        ++begin;
        continue;
      }
      std::vector<python::CallInput> group;
      size_t bytes = 0;
      size_t end = begin;
      for (; end < columns.size() && end - begin < static_cast<size_t>(group_); ++end) {
        size_t b = 0;
        for (const Tensor& t : columns[end]) b += t.num_bytes();
        if (end > begin && bytes + b > kGroupBytes) break;
        bytes += b;
        python::CallInput in;
        in.seed = Seed(ctxs[end]);
        for (const Tensor& t : columns[end]) in.columns.push_back(&t);
        group.push_back(std::move(in));
      }
      absl::StatusOr<std::vector<python::CallResult>> results =
          pool_->CallGroup(owner_, module_, function_, group, first_error_ends);
      for (size_t i = begin; i < end; ++i) {
        out.push_back(failed         ? NotComputed()
                      : results.ok() ? Check(columns[i], std::move((*results)[i - begin]))
                                     : Check(columns[i], results.status()));
        failed = failed || (first_error_ends && !out.back().ok());
      }
      begin = end;
    }
    return out;
  }

 private:
  // Inputs of one request at most (unless one element is larger).
  static constexpr size_t kGroupBytes = size_t{1} << 20;

  // At the op's first call, not when it is built: the pool starts (or takes
  // spares for) as many processes as the pipeline may have threads, and has
  // each import the module at once, rather than one by one as the autotuner
  // adds threads. A pipeline built and never run (a worker builds one to
  // validate a job's spec, and another without its client-side tail) starts
  // none.
  void WarmOnce() const {
    std::call_once(warmed_, [this] { pool_->Warm(owner_, module_, function_); });
  }

  uint64_t Seed(const ElementContext& ctx) const {
    return MixSeed({ctx.seed, ctx.epoch, ctx.global_index, static_cast<uint64_t>(label_.position)});
  }

  // The op's error (its label first) or the results, checked against the
  // columns they replace.
  absl::StatusOr<std::vector<Tensor>> Check(const std::vector<Tensor>& columns,
                                            absl::StatusOr<std::vector<Tensor>> out) const {
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

  OpLabel label_;
  std::string module_;
  std::string function_;
  std::vector<DType> output_dtypes_;  // kBytes = the input's dtype
  int group_;
  std::shared_ptr<python::PythonPool> pool_;
  // Its pipeline's processes: what a function leaves in one reaches no other
  // pipeline.
  const python::PythonPool::Owner owner_;
  mutable std::once_flag warmed_;
};

// output_dtypes as DTypes (kBytes: the input's), or InvalidArgument naming the field.
absl::StatusOr<std::vector<DType>> OutputDtypes(const proto::PythonOp& spec, const OpLabel& label) {
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
  return dtypes;
}

// The spec's own fields: its output dtypes, or InvalidArgument naming the field.
absl::StatusOr<std::vector<DType>> CheckedFields(const proto::PythonOp& spec,
                                                 const OpLabel& label) {
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
  if (spec.group() < 0 || spec.group() > kMaxGroup) {
    return label.FieldError("group", absl::StrCat("must be in [0, ", kMaxGroup, "] (0: ",
                                                  kDefaultGroup, "), got ", spec.group()));
  }
  return OutputDtypes(spec, label);
}

}  // namespace

absl::Status CheckPython(const proto::PythonOp& spec, const OpLabel& label) {
  return CheckedFields(spec, label).status();
}

absl::StatusOr<std::unique_ptr<Op>> MakePython(const proto::PythonOp& spec, OpLabel label) {
  ASSIGN_OR_RETURN(std::vector<DType> dtypes, CheckedFields(spec, label));
  std::shared_ptr<python::PythonPool> pool = python::ConfiguredPythonPool();
  if (pool == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(label.ToString(),
                     ": python ops are disabled on this worker; start sluice-worker (or "
                     "sluice pipeline run) with "
                     "--allow-python-ops (and --python-path for the team's modules)"));
  }
  if (!python::ModuleAllowed(pool->options(), spec.module())) {
    return absl::FailedPreconditionError(
        absl::StrCat(label.ToString(), ": module '", spec.module(),
                     "' is not one this worker runs python ops from (--python-modules ",
                     absl::StrJoin(pool->options().modules, ","), ")"));
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
