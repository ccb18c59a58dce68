// Synthetic-load ops for tests and scaling experiments: Spin burns thread CPU
// time, Sleep adds latency without CPU. Both pass their input through
// unchanged.
#ifndef SLUICE_DATA_WORKER_OPS_SYNTHETIC_LOAD_H_
#define SLUICE_DATA_WORKER_OPS_SYNTHETIC_LOAD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"

namespace sluice::data_worker {

absl::StatusOr<std::unique_ptr<Op>> MakeSpin(const proto::SpinOp& spec, OpLabel label);
absl::StatusOr<std::unique_ptr<Op>> MakeSleep(const proto::SleepOp& spec, OpLabel label);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_SYNTHETIC_LOAD_H_
