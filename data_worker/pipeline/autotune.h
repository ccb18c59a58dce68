// Autotune: per-stage thread counts and queue sizes within a CPU and a memory
// budget, from measured stage rates (docs/autotune.md explains the algorithm
// with an example).
//
// A pure function of one measurement interval, so it is tested without threads
// or clocks; the executor calls it every Options::autotune_interval and applies
// the decision.
#ifndef SLUICE_DATA_WORKER_PIPELINE_AUTOTUNE_H_
#define SLUICE_DATA_WORKER_PIPELINE_AUTOTUNE_H_

#include <cstdint>
#include <vector>

namespace sluice::data_worker::pipeline {

struct StageSample {
  int threads = 1;
  bool tunable = true;      // false: the spec fixed num_parallel_workers
  bool finished = false;    // the stage has seen the end of its input
  uint64_t elements = 0;    // elements finished during the interval
  double busy_seconds = 0;  // thread-seconds spent on them
  // Largest element seen in the stage's output queue.
  int64_t max_element_bytes = 0;
};

struct AutotuneInput {
  std::vector<StageSample> stages;  // in pipeline order; stage i feeds queue i
  // Fraction of the interval the consumer waited for the pipeline (0 = never
  // starved).
  double consumer_wait_fraction = 1;
  int cpu_budget = 1;               // threads, all stages together
  int64_t memory_budget_bytes = 0;  // bytes queued, all queues together
  int prefetch = -1;                // final queue size, -1 = AUTOTUNE
  // Length of the interval the samples cover; 0 = unknown (then no thread is
  // given back for being idle).
  double interval_seconds = 0;
};

struct AutotuneDecision {
  // Per stage. Lower than before only for a stage that gave a thread back
  // (idle, or the budget shrank); never below 1.
  std::vector<int> threads;
  std::vector<int64_t> queue_capacity;  // per stage output queue, items
  std::vector<int64_t> queue_bytes;     // per stage output queue, byte limit
  int bottleneck = -1;                  // stage that got a thread, or -1
  int released = -1;                    // a stage that gave a thread back, or -1
};

AutotuneDecision DecideAutotune(const AutotuneInput& in);

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_AUTOTUNE_H_
