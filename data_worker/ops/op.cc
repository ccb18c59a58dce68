#include "data_worker/ops/op.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/ops/registry.h"
#include "opencv2/core/utility.hpp"

namespace sluice::data_worker {

absl::StatusOr<Tensor> Op::ApplyBatch(Tensor) const {
  return absl::UnimplementedError(
      absl::StrCat(Sv(name()), " has no batched kernel; apply it per element"));
}

absl::StatusOr<std::vector<Tensor>> Op::ApplyColumns(std::vector<Tensor>,
                                                     const ElementContext&) const {
  return absl::UnimplementedError(absl::StrCat(Sv(name()), " works on one column at a time"));
}

absl::StatusOr<TensorType> Op::OutputType(const Tensor&) const {
  return absl::UnimplementedError(absl::StrCat(Sv(name()), " cannot write into a batch"));
}

std::vector<absl::StatusOr<std::vector<Tensor>>> Op::ApplyColumnsGroup(
    std::vector<std::vector<Tensor>> columns, const std::vector<ElementContext>& ctxs,
    bool first_error_ends) const {
  std::vector<absl::StatusOr<std::vector<Tensor>>> out;
  out.reserve(columns.size());
  bool failed = false;
  for (size_t i = 0; i < columns.size(); ++i) {
    out.push_back(failed ? NotComputed() : ApplyColumns(std::move(columns[i]), ctxs[i]));
    failed = failed || (first_error_ends && !out.back().ok());
  }
  return out;
}

absl::Status NotComputed() {
  return absl::AbortedError(
      "not computed: an element before it in its group failed, which ends the run "
      "(on_error: fail)");
}

absl::StatusOr<std::vector<std::unique_ptr<Op>>> BuildOps(const std::vector<proto::OpSpec>& specs,
                                                          int first_position, bool fuse) {
  std::vector<OpLabel> labels;
  for (size_t i = 0; i < specs.size(); ++i) {
    labels.push_back(
        OpLabel{first_position + static_cast<int>(i), std::string(OpTypeName(specs[i].op_case()))});
  }
  return BuildOps(specs, labels, fuse);
}

absl::StatusOr<std::vector<std::unique_ptr<Op>>> BuildOps(const std::vector<proto::OpSpec>& specs,
                                                          const std::vector<OpLabel>& labels,
                                                          bool fuse) {
  // OpenCV must not start its own thread pool: the pipeline owns parallelism.
  static std::once_flag cv_threads_once;
  std::call_once(cv_threads_once, [] { cv::setNumThreads(0); });

  std::vector<std::unique_ptr<Op>> unfused;
  for (size_t i = 0; i < specs.size(); ++i) {
    const OpRegistration* r = FindOp(specs[i].op_case());
    if (r == nullptr) {
      return labels[i].SpecError("no op set (empty OpSpec, or an op this worker does not know)");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Op> op, r->make(specs[i], labels[i]));
    unfused.push_back(std::move(op));
  }
  if (!fuse) return unfused;
  std::vector<std::unique_ptr<Op>> out;
  for (size_t i = 0; i < specs.size();) {
    const OpRegistration* r = FindOp(specs[i].op_case());
    FusedOp fused = r->fuse != nullptr ? r->fuse(specs, i, labels) : FusedOp{nullptr, 0};
    if (fused.first != nullptr) {
      out.push_back(std::move(fused.first));
      i += fused.second;
    } else {
      out.push_back(std::move(unfused[i]));
      ++i;
    }
  }
  return out;
}

}  // namespace sluice::data_worker
