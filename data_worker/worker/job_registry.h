// JobRegistry: the jobs a worker knows, built from the JobInfo the dispatcher sends (parsed
// pipeline, data-root check, column names, batch size) with a pool of idle Executors each.
//
// A job whose pipeline is over a limit, does not parse, reads outside every --data-root (or
// its dataset names a shard outside the dataset's folder), or fails validation is kept as
// *refused*: its status is what the consumer's stream ends with
//   INVALID_ARGUMENT  "pipeline spec has 300 nodes, more than --max-pipeline-nodes 256"
//                     (or bytes, --max-pipeline-bytes: service/limits.h)
//   PERMISSION_DENIED "pipeline source '/x' is outside the worker's --data-root (/a, /b)"
//                     "source: dataset '/r/d': '/r/d/s.urec' resolves to '/o/s.urec', outside
//                      its dataset folder '/r/d' ..."
//   INVALID_ARGUMENT  the validator's message naming node and field
//   FAILED_PRECONDITION a missing source path (NOT_FOUND means "job unknown yet, retry")
//
// Thread-safe. Add() does I/O (opens the source) without holding the lock.
#ifndef SLUICE_DATA_WORKER_WORKER_JOB_REGISTRY_H_
#define SLUICE_DATA_WORKER_WORKER_JOB_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/pipeline_spec/cache_key.h"
#include "common/service/limits.h"
#include "common/tensor_kernels/finish.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/worker/split_cache.h"
#include "proto/pipeline.pb.h"
#include "proto/worker.pb.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker {

struct Job {
  proto::JobInfo info;
  absl::Status status;  // not OK: refused
  proto::Pipeline spec;
  std::vector<std::string> column_names;
  uint64_t batch_size = 1;
  bool shuffle = false;
  bool batched = false;  // the pipeline has a batch node

  // Trainer-side finishing (common/tensor_kernels/finish.h). With finish auto or client and a
  // pipeline whose last map before the batch ends in a tail the client can run, the executor
  // runs the pipeline without that tail; TaskRunner then ships each batch with the tail named
  // in its header (finish client; auto when the column is uint8, so the wire carries 4x fewer
  // bytes) or runs `ops` itself (finish auto on a float32 column).
  // A RandomHorizontalFlip right before that tail goes with it: the worker only draws it
  // (`mirror`, with its pipeline-wide position and the pipeline's seed) and sends the draws.
  struct Tail {
    int column = 0;                              // index into column_names
    std::vector<proto::OpSpec> specs;            // what the header names
    std::shared_ptr<const Op> mirror;            // the flip that specs begin with (null: none)
    uint64_t seed = 0;                           // the pipeline's, for the flip's draws
    std::vector<std::shared_ptr<const Op>> ops;  // the ops after it, built (fused), for the worker
  };
  kernels::FinishMode finish = kernels::FinishMode::kAuto;
  std::optional<Tail> tail;

  // The pipeline's cache node (docs/cache.md) and, with a --cache-root, its files: the job's
  // executors read and offer elements through it, its producers capture whole splits.
  std::optional<pipeline_spec::CacheKey> cache_key;
  std::shared_ptr<SplitCache> cache;

  // `cache: auto` still undecided (docs/cache.md): the executors run every map and filter node
  // as a stage of its own (no map fusion, map+batch fusion or vectorization), so that each
  // node's cost and output size is measured (TaskRunner::stage_costs) and reported. Once the
  // dispatcher decides, it sends the JobInfo again (with the cache node, if any) and Add()
  // builds the job anew.
  bool measuring = false;

  // Idle executors of this job (running none); guarded by the registry.
  std::vector<std::unique_ptr<pipeline::Executor>> idle;
};

class JobRegistry {
 public:
  // `data_roots`: canonical paths (CanonicalDataRoots). `limits`: the pipeline limits jobs
  // are refused over, and the batch limit producers check (limits()).
  JobRegistry(std::vector<std::string> data_roots, pipeline::ExecutorOptions executor_options,
              std::shared_ptr<spdlog::logger> logger, service::ServiceLimits limits = {},
              CacheStore* caches = nullptr);

  // Canonicalizes each root. InvalidArgument: none, or an empty one.
  static absl::StatusOr<std::vector<std::string>> CanonicalDataRoots(
      std::vector<std::string> roots);

  // Builds `info`'s job unless known, or known from an earlier JobInfo without the `cache: auto`
  // decision `info` carries (the job is then built again: runs in flight keep the old Job and
  // its executors, which are dropped when released). Never fails: a bad job is kept refused.
  void Add(const proto::JobInfo& info) ABSL_LOCKS_EXCLUDED(mu_);
  // Null when unknown.
  std::shared_ptr<const Job> Get(uint64_t job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint64_t> ids() const ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(uint64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // An idle executor of `job` or a new one (its creation error); `built_for` (optional) gets the
  // Job it runs the pipeline of.
  absl::StatusOr<std::unique_ptr<pipeline::Executor>> AcquireExecutor(
      uint64_t job_id, std::shared_ptr<const Job>* built_for = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Back to the pool; dropped if the job was removed meanwhile, or built again since the
  // executor's `built_for` (when given).
  void ReleaseExecutor(uint64_t job_id, std::unique_ptr<pipeline::Executor> executor,
                       const Job* built_for = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // PermissionDenied unless the pipeline's source lies under a data root (exposed for tests).
  absl::Status CheckDataRoot(const proto::Pipeline& spec) const;

  // The shard record counts of the dataset `pipeline` (serialized) reads, from its manifest
  // (proto/worker_service.proto: DescribeDataset has the errors).
  absl::StatusOr<std::vector<uint64_t>> ShardRecordCounts(const std::string& pipeline) const;

  const service::ServiceLimits& limits() const { return limits_; }
  // The worker's cache files (null: none).
  CacheStore* caches() const { return caches_; }

 private:
  std::shared_ptr<Job> Build(const proto::JobInfo& info) const;
  // Trainer-side finishing: cuts the client's tail off job->spec (if it has one), records it in
  // job->tail and replaces `executor` by one of the cut pipeline.
  absl::Status CutTail(Job* job, std::unique_ptr<pipeline::Executor>* executor) const;
  // The executor options of `job`'s pipelines: the worker's, with the job's cache.
  pipeline::ExecutorOptions OptionsFor(const Job& job) const;

  const std::vector<std::string> data_roots_;
  const pipeline::ExecutorOptions executor_options_;
  const std::shared_ptr<spdlog::logger> logger_;
  const service::ServiceLimits limits_;
  CacheStore* const caches_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_JOB_REGISTRY_H_
