// Label ops: OneHot (int32/int64 scalar class id → float32 [num_classes]).
#ifndef SLUICE_DATA_WORKER_OPS_LABEL_H_
#define SLUICE_DATA_WORKER_OPS_LABEL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"

namespace sluice::data_worker {

// Apply:      scalar (or [1]) label → [num_classes]
// ApplyBatch: [N] → [N, num_classes]
// A label outside [0, num_classes) is InvalidArgument naming the label.
absl::StatusOr<std::unique_ptr<Op>> MakeOneHot(const proto::OneHotOp& spec, OpLabel label);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_LABEL_H_
