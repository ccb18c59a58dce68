#include "common/service/limits.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace sluice::service {

int MaxMessageBytes(const ServiceLimits& limits) {
  const int64_t largest = std::max(limits.max_batch_bytes, limits.max_pipeline_bytes);
  return static_cast<int>(
      std::min<int64_t>(largest + kMessageOverheadBytes, std::numeric_limits<int32_t>::max()));
}

absl::Status CheckPipelineBytes(int64_t bytes, const ServiceLimits& limits) {
  if (bytes <= limits.max_pipeline_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("pipeline spec is ", bytes,
                                                 " bytes, more than --max-pipeline-bytes ",
                                                 limits.max_pipeline_bytes));
}

absl::Status CheckPipelineLimits(const proto::Pipeline& pipeline, const ServiceLimits& limits) {
  if (absl::Status s = CheckPipelineBytes(static_cast<int64_t>(pipeline.ByteSizeLong()), limits);
      !s.ok()) {
    return s;
  }
  int64_t nodes = pipeline.nodes_size();
  for (const proto::PipelineNode& node : pipeline.nodes()) {
    if (node.has_map()) nodes += node.map().ops_size();
  }
  if (nodes > limits.max_pipeline_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline spec has ", nodes,
                                                   " nodes, more than --max-pipeline-nodes ",
                                                   limits.max_pipeline_nodes));
  }
  return absl::OkStatus();
}

absl::Status CheckSerializedPipelineLimits(absl::string_view serialized,
                                           const ServiceLimits& limits) {
  if (absl::Status s = CheckPipelineBytes(static_cast<int64_t>(serialized.size()), limits);
      !s.ok()) {
    return s;
  }
  proto::Pipeline pipeline;
  if (!pipeline.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    return absl::InvalidArgumentError("pipeline spec does not parse as sluice.proto.Pipeline");
  }
  return CheckPipelineLimits(pipeline, limits);
}

absl::Status CheckJobLimit(int64_t jobs, const ServiceLimits& limits) {
  if (jobs < limits.max_jobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the dispatcher already holds ", jobs, " jobs (--max-jobs ", limits.max_jobs,
                   "): wait for one to finish or raise --max-jobs"));
}

absl::Status CheckSplitLimit(uint64_t splits, uint64_t split_size, const ServiceLimits& limits) {
  if (splits <= static_cast<uint64_t>(limits.max_splits_per_job)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the job would have ", splits, " splits of ", split_size,
                   " records, more than --max-splits-per-job ", limits.max_splits_per_job,
                   ": set a larger split_size, or raise --max-splits-per-job"));
}

absl::Status CheckPerIdentityLimit(absl::string_view user, int64_t held, int64_t limit,
                                   absl::string_view what, absl::string_view flag) {
  if (held < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(user, " already holds ", held, " ", what, " (", flag, " ", limit,
                   "): wait for one to finish, or ask an operator to raise ", flag));
}

absl::Status CheckConsumerLimit(int64_t num_consumers, const ServiceLimits& limits) {
  if (num_consumers <= limits.max_consumers_per_job) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("num_consumers ", num_consumers,
                                                 " is more than --max-consumers-per-job ",
                                                 limits.max_consumers_per_job));
}

absl::Status CheckBatchLimit(int64_t batch_bytes, const ServiceLimits& limits) {
  if (batch_bytes <= limits.max_batch_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("a batch of ", batch_bytes, " bytes is more than --max-batch-bytes ",
                   limits.max_batch_bytes, ": use a smaller batch size or smaller images"));
}

absl::Status CheckStreamLimit(int64_t open_streams, const ServiceLimits& limits) {
  if (open_streams < limits.max_streams) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("this worker already serves ", open_streams,
                                                   " streams (--max-streams ", limits.max_streams,
                                                   ")"));
}

}  // namespace sluice::service
