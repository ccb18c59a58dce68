// Resource limits of the sluice servers, each a flag (listed with the field) with a default
// sized for one training cluster. A request over a limit is refused with the flag's name, so
// the operator knows which knob to turn:
//   ResourceExhausted  the server is full (jobs, streams), or a batch is larger than it serves
//                      (batch bytes): retry later, make batches smaller, or raise it;
//   InvalidArgument    this request is too big whatever the load (spec bytes and nodes,
//                      consumers).
// Where each is checked, and what the caller sees: docs/security.md ("Limits"). Worker memory
// (--memory-mb) is a budget the pipelines adapt to, not a refusal.
// The checks are plain functions so that each handler calls one at its top.
#ifndef SLUICE_COMMON_SERVICE_LIMITS_H_
#define SLUICE_COMMON_SERVICE_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/pipeline.pb.h"

namespace sluice::service {

struct ServiceLimits {
  int64_t max_pipeline_bytes = 1 << 20;    // --max-pipeline-bytes: serialized spec
  int64_t max_pipeline_nodes = 256;        // --max-pipeline-nodes: nodes + map ops
  int64_t max_batch_bytes = 512ll << 20;   // --max-batch-bytes: one batch's column bytes
  int64_t max_jobs = 1024;                 // --max-jobs: jobs a dispatcher holds
  int64_t max_consumers_per_job = 4096;    // --max-consumers-per-job
  int64_t max_streams = 1024;              // --max-streams: open GetBatches per worker
  int64_t max_splits_per_job = 1 << 20;    // --max-splits-per-job
  int64_t max_jobs_per_identity = 256;     // --max-jobs-per-identity
  int64_t max_streams_per_identity = 256;  // --max-streams-per-identity
};

// Slack for a message's non-payload fields (keys, shapes, indices) over max_batch_bytes.
inline constexpr int64_t kMessageOverheadBytes = 4 << 20;

// The gRPC message size limit that lets every allowed batch (or spec) through: the largest
// of them plus kMessageOverheadBytes, capped at INT32_MAX.
int MaxMessageBytes(const ServiceLimits& limits);

// InvalidArgument when a serialized spec of `bytes` is over --max-pipeline-bytes (checked
// before parsing: the dispatcher, which keeps specs opaque, checks only this):
//   "pipeline spec is 2000000 bytes, more than --max-pipeline-bytes 1048576"
absl::Status CheckPipelineBytes(int64_t bytes, const ServiceLimits& limits);

// InvalidArgument when the serialized spec or its node count (nodes plus the ops of map
// nodes) is over the limit:
//   "pipeline spec has 300 nodes, more than --max-pipeline-nodes 256"
absl::Status CheckPipelineLimits(const proto::Pipeline& pipeline, const ServiceLimits& limits);

// The same for a pipeline as it travels (RegisterDataset, JobInfo): the size is checked before
// parsing; InvalidArgument also when it does not parse.
absl::Status CheckSerializedPipelineLimits(absl::string_view serialized,
                                           const ServiceLimits& limits);

// ResourceExhausted when a dispatcher holding `jobs` jobs may not create another.
absl::Status CheckJobLimit(int64_t jobs, const ServiceLimits& limits);

// ResourceExhausted when a job would have more splits (per epoch) than allowed: the dispatcher
// keeps a few words per split and per slot, so the split count bounds a job's memory.
//   "the job would have 976562500 splits of 1024 records, more than --max-splits-per-job ..."
absl::Status CheckSplitLimit(uint64_t splits, uint64_t split_size, const ServiceLimits& limits);

// ResourceExhausted when `user`, holding `held` of what `flag` counts, may not take another:
//   "alice already holds 256 jobs (--max-jobs-per-identity 256): wait for one to finish ..."
absl::Status CheckPerIdentityLimit(absl::string_view user, int64_t held, int64_t limit,
                                   absl::string_view what, absl::string_view flag);

// InvalidArgument when a job asks for more consumers than allowed.
absl::Status CheckConsumerLimit(int64_t num_consumers, const ServiceLimits& limits);

// ResourceExhausted when a batch is larger than allowed (the pipeline's batch size or its
// images are too large for this service). The worker checks every batch before encoding it;
// the consumer's stream ends with:
//   "a batch of 805306368 bytes is more than --max-batch-bytes 536870912: use a smaller
//    batch size or smaller images"
absl::Status CheckBatchLimit(int64_t batch_bytes, const ServiceLimits& limits);

// ResourceExhausted when a worker with `open_streams` streams may not open another.
absl::Status CheckStreamLimit(int64_t open_streams, const ServiceLimits& limits);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_LIMITS_H_
