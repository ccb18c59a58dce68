// TaskRunner: the worker's producers. `threads` producer threads take tasks from a FIFO, run
// each on one of its job's Executors (JobRegistry's pool), encode every output element as a
// wire batch and Push() it into ConsumerQueues; a split ends with its end-of-split marker.
//
// Progress counts output batches. A task with skip_batches = k runs its split from the first
// record (the output is a pure function of seed, epoch and records) and discards batches
// 0..k-1 instead of sending them: filters and skipped records cannot shift what a replacement
// worker sends. Example: split of 10 records, batch 4, skip 1 -> batches 1 ([4..7]) and 2
// ([8, 9]), then the marker with batch_index 3.
//
// A task stops when ConsumerQueues says it is gone (dropped, restarted, stopped); a pipeline
// error goes to the consumer's stream (ConsumerQueues::Fail). Start()/Stop() own the threads.
#ifndef SLUICE_DATA_WORKER_WORKER_TASK_RUNNER_H_
#define SLUICE_DATA_WORKER_WORKER_TASK_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/service/batch_codec.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/worker/consumer_queues.h"
#include "data_worker/worker/job_registry.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker {

// Turns an executor output into a wire batch without copying: each column's Tensor moves into
// a shared owner that the queue and gRPC's slices reference (service/batch_codec.h). An
// unbatched pipeline's element gets a leading dimension of 1, so shape[0] is always the element
// count. InvalidArgument if the column counts differ.
absl::StatusOr<service::WireBatch> ToWireBatch(pipeline::Element element,
                                               const Job& job);

// Trainer-side finishing of one executor output (job.tail, job_registry.h): either runs the tail
// on the batch here, or leaves the column as it is and returns the ColumnFinish the header must
// carry (finish client; auto when the column is uint8, which the tail would make 4x larger).
// Errors: the tail op's own (e.g. InvalidArgument naming the op).
absl::StatusOr<std::optional<proto::ColumnFinish>> FinishOrShip(
    const Job& job, pipeline::Element* element);

class TaskRunner {
 public:
  TaskRunner(ConsumerQueues* queues, JobRegistry* jobs,
             prometheus::Registry& registry,
             std::shared_ptr<spdlog::logger> logger);
  ~TaskRunner();  // Stop()s

  void Start(int threads) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues task `task_id` (from ConsumerQueues::AddTask) for production.
  void Enqueue(uint64_t task_id, proto::SplitAssignment assignment,
               bool parallel) ABSL_LOCKS_EXCLUDED(mu_);

  // Peak over time of queued bytes plus the live bytes of every running Executor.
  int64_t peak_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // Busy time, for the autoscaler's capacity measurement (cumulative: the runs that ended plus
  // the running ones so far, so that a worker's first report does not wait for its first
  // split to end). A pipeline run is busy for the thread-seconds of its bottleneck stage (the
  // stage with the most busy time per thread) divided by that stage's threads: the time that
  // stage would need alone. Time blocked on a full queue or idle without a split is not busy.
  // The worker's busy seconds are the runs' busy seconds divided by the producer count, so
  // that they never exceed wall time: elements_run / busy_seconds is what the worker produces
  // per second when it never waits for its consumers.
  double busy_seconds() const ABSL_LOCKS_EXCLUDED(mu_);
  // Elements (inside batches) of the runs busy_seconds() counts.
  uint64_t elements_run() const ABSL_LOCKS_EXCLUDED(mu_);
  // The same two counters per job (busy seconds divided by the producer count like the total),
  // so that jobs of different cost sharing this worker each get their own capacity.
  struct JobBusy {
    uint64_t elements = 0;
    double busy_seconds = 0;
  };
  std::map<uint64_t, JobBusy> busy_by_job() const ABSL_LOCKS_EXCLUDED(mu_);
  // Stops reporting a job that is over, so the per-job counters stay bounded.
  void ForgetJob(uint64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Work {
    uint64_t task_id = 0;
    proto::SplitAssignment assignment;
    bool parallel = false;
  };

  void ProducerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Run(const Work& work, const Job& job, pipeline::Executor& ex)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One pass over the split (or one epoch of a parallel walk). False: stop the task.
  bool RunEpoch(const Work& work, const Job& job, pipeline::Executor& ex,
                uint64_t epoch, uint64_t* batch_index) ABSL_LOCKS_EXCLUDED(mu_);
  void UpdatePeak() ABSL_LOCKS_EXCLUDED(mu_);

  ConsumerQueues* const queues_;
  JobRegistry* const jobs_;
  const std::shared_ptr<spdlog::logger> logger_;
  prometheus::Counter& splits_started_;

  mutable absl::Mutex mu_;
  absl::CondVar work_available_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Work> pending_ ABSL_GUARDED_BY(mu_);
  struct Running {
    pipeline::Executor* ex;
    uint64_t job_id;
  };
  std::vector<Running> running_ ABSL_GUARDED_BY(mu_);
  int64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int producers_ ABSL_GUARDED_BY(mu_) = 0;
  double run_busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // summed over runs
  uint64_t elements_run_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, JobBusy> run_busy_by_job_
      ABSL_GUARDED_BY(mu_);           // busy summed over runs
  std::vector<std::thread> threads_;  // started by Start, joined by Stop
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_TASK_RUNNER_H_
