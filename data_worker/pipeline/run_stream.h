// RunStream: the running pipeline of an Executor (executor.h): the stage
// workers, the queues between them, the batch assembler and the autotune
// thread. Internal to the executor; exposed in a header for the executor and
// tests.
//
// Its input is a feed of runs (Submit: a list of global indices and an
// epoch), fed one after the other as one sequence; each run's records are
// followed by its end-of-run marker (Element::end_of_run), which every stage
// passes on untouched and the batch stage uses to cut the run's last batch.
// The threads outlive the runs: while the feed is open (until CloseFeed) and
// has nothing to give, stage 0 waits for the next Submit, and the later
// stages wait for it, with their thread counts as autotune left them.
//
// Stage i's workers pop from queue i-1 (stage 0: from the feed), run the
// stage's steps (Process) and push to queue i at the same sequence number; a
// batch stage hands its items to its BatchAssembler, which pushes batch k at
// sequence k:
//
//   feed ─▶ [stage 0: Read, Map…] ─▶ queue 0 ─▶ … ─▶ [batch stage] ─▶ queue n-1 ─▶ GetNext
//            N threads each                         BatchAssembler
//
// Threads: workers are started by AddWorker (Start, then the autotune thread
// when it decides a stage needs one more); Cancel wakes everything, Join joins
// them, Clear frees what is left. All owned by the RunStream.
#ifndef SLUICE_DATA_WORKER_PIPELINE_RUN_STREAM_H_
#define SLUICE_DATA_WORKER_PIPELINE_RUN_STREAM_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "data_worker/pipeline/batch_assembler.h"
#include "data_worker/pipeline/element.h"
#include "data_worker/pipeline/element_cache.h"
#include "data_worker/pipeline/ordered_queue.h"
#include "data_worker/pipeline/plan.h"
#include "data_worker/pipeline/spec.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace sluice::data_worker::pipeline {

using ItemQueue = OrderedQueue<Item>;
// The items a stage worker takes at once (at most its group size) and pointers to them, held
// inline: an ungrouped stage, or a python op's default group of 8, allocates nothing per group.
using ItemGroup = absl::InlinedVector<Item, 8>;
using ItemRefs = absl::InlinedVector<Item*, 8>;
using GroupSeqs = absl::InlinedVector<uint64_t, 8>;

// Metric references, built once per executor.
struct ExecutorMetrics {
  struct Stage {
    prometheus::Counter* elements;
    prometheus::Counter* busy;
    prometheus::Gauge* depth;
    prometheus::Histogram* latency;
  };
  std::vector<Stage> stages;
  std::map<std::string, prometheus::Histogram*, std::less<>> ops;
  prometheus::Counter* skipped;
};

// What an epoch needs from its executor. Pointers are not owned and outlive
// the run.
struct EpochContext {
  const LogicalPipeline* logical = nullptr;
  const PhysicalPlan* plan = nullptr;
  ExecutorMetrics* metrics = nullptr;  // null: no metrics
  Clock* clock = nullptr;
  LiveBytes* live = nullptr;
  int cpu_budget = 1;
  // The budget now, if it may change during the epoch (Executor::
  // SetCpuBudget); null: cpu_budget.
  const std::atomic<int>* live_cpu_budget = nullptr;
  int64_t memory_budget_bytes = 0;
  bool autotune = true;
  absl::Duration autotune_interval;
  // Counts every worker thread started (Executor::thread_starts); not owned.
  std::atomic<uint64_t>* thread_starts = nullptr;
  // The worker's budget the feed waits on (memory_budget.h); null: none.
  MemoryBudget* budget = nullptr;
  // Where the feed takes its elements and the batch stage gives them back
  // (element.h); null: elements are allocated and freed. Not owned.
  ElementPool* pool = nullptr;
  // The cache node's storage (element_cache.h); null: the cache step does nothing.
  ElementCache* cache = nullptr;
};

class RunStream {
 public:
  // Counters of one stage; read by the autotuner and the executor's stats.
  struct Stage {
    const StagePlan* plan = nullptr;
    int index = 0;
    std::atomic<int> threads{0};  // running workers
    // Workers the stage should have; a worker above it leaves at its next
    // element boundary (autotune gave the thread back).
    std::atomic<int> target{0};
    std::atomic<uint64_t> elements{0};
    std::atomic<uint64_t> dropped{0};
    std::atomic<uint64_t> skipped{0};
    std::atomic<int64_t> busy_ns{0};
    std::atomic<bool> finished{false};
    std::unique_ptr<BatchAssembler> assembler;  // batch stages only
    // Elements a worker takes at once: the largest Op::group_size() of the
    // stage's ops (1: one at a time).
    int group = 1;
  };

  // Builds the queues; starts nothing. The feed is open and empty.
  explicit RunStream(const EpochContext& ctx);
  ~RunStream();
  RunStream(const RunStream&) = delete;
  RunStream& operator=(const RunStream&) = delete;

  // Starts threads[i] workers for stage i, and the autotune thread if
  // `autotuner`.
  void Start(const std::vector<int>& threads, bool autotuner) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends run `id`: `indices` (valid global indices) of epoch `epoch`.
  void Submit(uint64_t id, std::vector<uint64_t> indices, uint64_t epoch)
      ABSL_LOCKS_EXCLUDED(feed_mu_);
  // No more runs: the input ends after the submitted ones.
  void CloseFeed() ABSL_LOCKS_EXCLUDED(feed_mu_);
  // The feed gives run `id` no more records (its marker comes next).
  void CancelRun(uint64_t id) ABSL_LOCKS_EXCLUDED(feed_mu_);
  // Every submitted run has been fed, marker included.
  bool FeedIdle() const ABSL_LOCKS_EXCLUDED(feed_mu_);
  // The queue GetNext pops.
  ItemQueue& output() { return *queues_.back(); }
  // The reader popped an output (the feed may admit again under a full
  // budget).
  void Popped();
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  void Join() ABSL_LOCKS_EXCLUDED(mu_);
  // Frees queued items and partial batches. REQUIRES: Join() returned.
  void Clear();

  absl::Time start_time() const { return start_; }
  const std::vector<std::unique_ptr<Stage>>& stages() const { return stages_; }
  const std::vector<std::unique_ptr<ItemQueue>>& queues() const { return queues_; }
  int peak_threads() const ABSL_LOCKS_EXCLUDED(mu_);

  // Consumer-side state, used by the executor's consumer thread only.
  bool stopped = false;  // guarded by the executor's mutex
  bool done = false;     // GetNext saw the end or an error
  // The oldest unfinished run failed: its outputs up to its marker are
  // dropped.
  bool skipping = false;
  std::atomic<uint64_t> elements_out{0};
  std::atomic<uint64_t> batches_out{0};

 private:
  // The next input item of `stage`; with wait=false, kNotReady instead of
  // waiting for one.
  ItemQueue::PopResult PopInput(int stage, Item* item, uint64_t* seq, bool wait = true)
      ABSL_LOCKS_EXCLUDED(feed_mu_);
  // Waits for one input item of stage si, then takes the ones already
  // waiting behind it, up to the stage's group (reserving each in the batch
  // stage's assembler): items[i] at sequence seqs[i], in order. kEnd (the
  // input's end in *end) or kCancelled when the first one is.
  ItemQueue::PopResult PopGroup(int si, ItemGroup* items, GroupSeqs* seqs, uint64_t* end);
  // "<shard or file>: record <global>: <node> (<op>): <message>".
  absl::Status Wrap(const absl::Status& s, uint64_t global, std::string_view node,
                    std::string_view op) const;
  // Runs the per-element steps of `stage` on `items` (elements, not markers),
  // step by step over the group, turning each into a hole or an error on
  // failure. Each element's result is what it would be alone: ops draw from
  // the element's context, never from its group.
  void Process(Stage& stage, const ItemRefs& items);
  // Process with timing and counters; the time counts `weight` times in the
  // stage's busy time (busy_sampler.h); returns the time taken.
  absl::Duration TimedProcess(int si, const ItemRefs& items, int64_t weight);
  void ElementWorker(int si);
  void BatchWorker(int si);
  // A finished batch of stage `si`: vectorized ops, then the output queue.
  void EmitBatch(int si, uint64_t k, absl::StatusOr<Element> batch);
  // One more worker for stage si (or one fewer leaving, if one is about to).
  void AddWorker(int si) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True if this worker of stage si should leave now (and it is counted out).
  bool LeaveIfAboveTarget(int si);
  void Autotune() ABSL_LOCKS_EXCLUDED(mu_);

  struct Run {
    uint64_t id = 0;
    std::vector<uint64_t> indices;
    uint64_t epoch = 0;
    size_t next = 0;  // the next index to feed
    bool cancelled = false;
  };

  const EpochContext ctx_;
  const absl::Time start_;

  mutable absl::Mutex feed_mu_;
  std::deque<Run> runs_ ABSL_GUARDED_BY(feed_mu_);    // not yet fully fed
  uint64_t next_feed_ ABSL_GUARDED_BY(feed_mu_) = 0;  // sequence number
  bool feed_closed_ ABSL_GUARDED_BY(feed_mu_) = false;
  bool feed_cancelled_ ABSL_GUARDED_BY(feed_mu_) = false;

  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<std::unique_ptr<ItemQueue>> queues_;  // queue i = stage i's out
  // Items pushed to the output queue and not yet popped; and Cancel() was
  // called: what the feed's budget wait checks besides the budget.
  std::atomic<int64_t> outputs_waiting_{0};
  std::atomic<bool> budget_cancelled_{false};

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  int peak_threads_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread autotuner_;
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_RUN_STREAM_H_
