// Executor: runs a validated, optimized pipeline (plan.h), one epoch at a time
// or as a long-lived stream of runs.
//
// Where the pieces live: validation spec.h, optimizer plan.h, the stage
// threads and queues of a stream of runs run_stream.h, batching batch_assembler.h, the queues
// ordered_queue.h, thread counts autotune.h; docs/engine.md tells the story.
//
// Each stage of the plan has its own worker threads; stages are connected by
// bounded OrderedQueues, so elements leave in the order of the input sequence
// whatever the parallelism, and a consumer that stops reading stops the
// pipeline with bounded memory. The input sequence of an epoch is the dataset's
// records in record::Permutation(n, shuffle seed, epoch) order if the pipeline
// shuffles, else in natural order, or an explicit list of global indices (a
// split given by the distributed service). Every random op draws from
// ElementContext{job seed, epoch, global index}.RngFor(op position), so an
// element gets the same augmentation at any parallelism, in any mode, with or
// without the optimizer's rewrites.
//
//   ASSIGN_OR_RETURN(auto ex, Executor::Create(spec, options));
//   RETURN_IF_ERROR(ex->Start(/*epoch=*/0));
//   while (true) {
//     ASSIGN_OR_RETURN(std::optional<Element> e, ex->GetNext());
//     if (!e) break;  // end of epoch
//     // e->columns[0]: the [64,3,224,224] float32 images; e->global_indices:
//     // their record ids.
//   }
//
// Bad records: with on_error=fail the element's error (DataLoss naming the
// shard or image file, the record's global index, the node and op) is returned
// by GetNext in its place in the sequence, and the epoch ends; with skip the
// element is dropped and counted.
//
// Streams of runs: a worker serves many splits of a job, one after the other.
// Open() starts the stage threads once; each Submit() appends a run (a split's
// record indices and epoch) to the feed, which the running pipeline takes up
// as soon as the previous run's records are in: the threads, their autotuned
// counts and the full queues carry over from split to split, instead of a
// start, a ramp-up from one thread and a drain per split. Runs come out in
// submission order; each run's outputs are exactly what an epoch over its
// indices gives (its own batches, cut at its end; the same RNG, order,
// filters and errors), followed by the end of the run:
//
//   RETURN_IF_ERROR(ex->Open());
//   ASSIGN_OR_RETURN(uint64_t a, ex->Submit(split_a, /*epoch=*/0));
//   ASSIGN_OR_RETURN(uint64_t b, ex->Submit(split_b, /*epoch=*/0));
//   // Next(): split_a's batches, nullopt, split_b's batches, nullopt.
//
// A run's error is returned by Next in its place; the rest of that run is
// dropped (the feed stops giving its records) and its end follows, while the
// next runs go on. Start(epoch) is Open, Submit of the epoch's order and a
// closed feed: the threads end with the epoch.
//
// Threads: Start()/Open() start the stage workers and the autotuner (an
// RunStream owns them); Stop() (or the next Start/Open, or the destructor)
// cancels and joins them. GetNext/Next/Start/Open/Stop must be called from one
// thread at a time; Submit, CancelRun and FeedIdle from any thread.
#ifndef SLUICE_DATA_WORKER_PIPELINE_EXECUTOR_H_
#define SLUICE_DATA_WORKER_PIPELINE_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "data_worker/pipeline/element.h"
#include "data_worker/pipeline/element_cache.h"
#include "data_worker/pipeline/plan.h"
#include "data_worker/pipeline/spec.h"
#include "prometheus/registry.h"

namespace sluice::data_worker::pipeline {

class RunStream;  // run_stream.h
struct ExecutorMetrics;

// A pipeline's CPU budget in threads: `threads`, or every core at 0
// (ExecutorOptions::cpu_budget, the --threads flags).
int CpuBudgetOrAllCores(int threads);

struct ExecutorOptions {
  OptimizerOptions optimizer;
  // Threads of all stages together; 0 = std::thread::hardware_concurrency().
  int cpu_budget = 0;
  // Bytes of elements waiting in queues, all queues together.
  int64_t memory_budget_bytes = int64_t{1} << 30;
  // Grow AUTOTUNE stages from 1 thread while the budget allows. Off: AUTOTUNE
  // stages share the budget evenly from the start.
  bool autotune = true;
  absl::Duration autotune_interval = absl::Milliseconds(50);
  prometheus::Registry* registry = nullptr;  // null: no metrics
  Clock* clock = nullptr;                    // null: RealClock
  // The worker's budget (memory_budget.h), shared with its other executors and
  // its consumer queues: the executor's live bytes are charged to it, and its
  // feed waits for room while an output waits for the reader. Not owned; null:
  // none.
  MemoryBudget* worker_budget = nullptr;
  // The storage of the pipeline's cache node (element_cache.h, docs/cache.md); null: the node
  // caches nothing and every element is computed.
  std::shared_ptr<ElementCache> cache;
  // The service job's seed: random ops draw from JobPipelineSeed(the spec's
  // seed, job_seed) (common/base/random.h); 0 (in-process runs): the spec's.
  uint64_t job_seed = 0;
};

struct StageStats {
  std::string name;
  int threads = 0;
  // Elements (for a batch stage: input elements) processed.
  uint64_t elements = 0;
  uint64_t dropped = 0;  // filtered out or skipped
  double busy_seconds = 0;
  int64_t queue_capacity = 0;
  int64_t peak_queue_items = 0;
  int64_t peak_queue_bytes = 0;
};

struct PipelineStats {
  std::vector<StageStats> stages;
  uint64_t elements_out = 0;  // elements delivered (inside batches)
  uint64_t batches_out = 0;
  uint64_t skipped = 0;  // bad records dropped with on_error=skip
  uint64_t filtered = 0;
  int peak_threads = 0;
  // Sum over queues of each queue's peak bytes: an upper bound of the peak
  // total.
  int64_t peak_queued_bytes = 0;
  double wall_seconds = 0;
  std::string plan;
  std::vector<std::string> rewrites;
};

class Executor {
 public:
  // Validates and optimizes `spec`. Errors as Validate() (spec.h).
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const proto::Pipeline& spec,
                                                          ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Starts epoch `epoch` over the whole source (shuffled if the pipeline
  // shuffles).
  absl::Status Start(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  // The record order of epoch `epoch` over the whole source: the seeded
  // permutation if the pipeline shuffles, else 0..size()-1.
  std::vector<uint64_t> EpochOrder(uint64_t epoch) const;
  // The next element or batch; nullopt at the end of the epoch.
  // FailedPrecondition before Start.
  absl::StatusOr<std::optional<Element>> GetNext() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the stage threads with an open feed and no run (stops a running
  // epoch or stream first).
  absl::Status Open() ABSL_LOCKS_EXCLUDED(mu_);
  // Appends a run over `global_indices` (in this order) of epoch `epoch` to
  // the open feed; returns its id. InvalidArgument for an index >= size();
  // FailedPrecondition unless Open.
  absl::StatusOr<uint64_t> Submit(std::vector<uint64_t> global_indices, uint64_t epoch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The feed gives run `run` no more records; what is in flight still comes
  // out of Next, then its end.
  void CancelRun(uint64_t run) ABSL_LOCKS_EXCLUDED(mu_);
  // Every submitted run's records have entered the pipeline: the time to
  // Submit the next one so that the stages never run dry.
  bool FeedIdle() const ABSL_LOCKS_EXCLUDED(mu_);
  // The next output of the oldest unfinished run; nullopt at its end; its
  // error (then its end). FailedPrecondition without an open stream or an
  // unfinished run; Cancelled after Stop.
  absl::StatusOr<std::optional<Element>> Next() ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the running epoch and joins its threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Changes the thread budget of all stages together, also for the running
  // epoch: autotune gives threads back (at element boundaries) until the total
  // fits, or may add up to the new budget. REQUIRES: threads > 0.
  void SetCpuBudget(int threads) { cpu_budget_.store(threads); }

  PipelineStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const PhysicalPlan& plan() const { return plan_; }
  const LogicalPipeline& logical() const { return logical_; }
  uint64_t source_size() const { return logical_.source->size(); }
  // Live element bytes anywhere in the pipeline (queues and workers): for
  // back-pressure tests.
  int64_t live_bytes() const { return live_.live(); }
  int64_t peak_live_bytes() const { return live_.peak(); }
  // Stage worker threads started since creation: flat while a stream serves
  // split after split (tests).
  uint64_t thread_starts() const { return thread_starts_.load(); }

 private:
  Executor(LogicalPipeline logical, PhysicalPlan plan, ExecutorOptions options);
  // Start(epoch) over `global_indices` in this order. InvalidArgument for an
  // index >= size().
  absl::Status Start(std::vector<uint64_t> global_indices, uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  const LogicalPipeline logical_;
  const PhysicalPlan plan_;
  const ExecutorOptions options_;
  // Pushed-down filters: true = keep (empty = keep all).
  std::vector<bool> index_mask_;

  // Declared before run_: the run's items count into live_ until destroyed.
  LiveBytes live_{options_.worker_budget};
  // Declared before run_ as well: the run's elements are recycled here.
  ElementPool pool_;
  std::unique_ptr<ExecutorMetrics> metrics_;  // null without a registry

  mutable absl::Mutex mu_;
  std::unique_ptr<RunStream> run_ ABSL_GUARDED_BY(mu_);
  // Submitted runs whose end Next has not returned yet, oldest first.
  std::deque<uint64_t> unfinished_runs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_run_id_ ABSL_GUARDED_BY(mu_) = 1;
  PipelineStats last_stats_ ABSL_GUARDED_BY(mu_);
  // Thread counts autotune reached in the previous epoch; the next epoch starts
  // from them.
  std::vector<int> tuned_threads_ ABSL_GUARDED_BY(mu_);

  Clock* clock_ = nullptr;
  std::atomic<int> cpu_budget_{1};
  std::atomic<uint64_t> thread_starts_{0};

  PipelineStats CollectStats(const RunStream& run) const;
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_EXECUTOR_H_
