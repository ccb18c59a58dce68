#include "data_worker/pipeline/autotune.h"

#include "gtest/gtest.h"

namespace sluice::data_worker::pipeline {
namespace {

AutotuneInput ThreeStages() {
  AutotuneInput in;
  in.cpu_budget = 6;
  in.memory_budget_bytes = 1 << 20;
  in.consumer_wait_fraction = 0.5;
  // Stage costs: 1 ms, 8 ms, 2 ms per element.
  in.stages = {{1, true, false, 100, 0.1, 1000},
               {1, true, false, 100, 0.8, 4000},
               {1, true, false, 100, 0.2, 4000}};
  return in;
}

TEST(Autotune, GivesAThreadToTheSlowestStage) {
  const AutotuneDecision d = DecideAutotune(ThreeStages());
  EXPECT_EQ(d.bottleneck, 1);
  EXPECT_EQ(d.threads, (std::vector<int>{1, 2, 1}));
}

TEST(Autotune, NeverExceedsTheThreadBudget) {
  AutotuneInput in = ThreeStages();
  for (int round = 0; round < 20; ++round) {
    const AutotuneDecision d = DecideAutotune(in);
    int total = 0;
    for (size_t i = 0; i < d.threads.size(); ++i) {
      total += d.threads[i];
      in.stages[i].threads = d.threads[i];
    }
    EXPECT_LE(total, in.cpu_budget);
  }
  // Converged on the budget, slow stage got most: 8 ms stage ≥ 3 threads.
  EXPECT_EQ(in.stages[0].threads + in.stages[1].threads + in.stages[2].threads, 6);
  EXPECT_GE(in.stages[1].threads, 3);
}

TEST(Autotune, StopsWhenTheConsumerIsTheBottleneck) {
  AutotuneInput in = ThreeStages();
  in.consumer_wait_fraction = 0;
  EXPECT_EQ(DecideAutotune(in).bottleneck, -1);
}

TEST(Autotune, LeavesFixedStagesAlone) {
  AutotuneInput in = ThreeStages();
  in.stages[1].tunable = false;
  const AutotuneDecision d = DecideAutotune(in);
  EXPECT_EQ(d.threads, (std::vector<int>{1, 1, 1}));
}

TEST(Autotune, QueuesFitTheMemoryBudget) {
  AutotuneInput in = ThreeStages();
  in.memory_budget_bytes = 20000;
  for (int64_t budget : {int64_t{1} << 30, int64_t{20000}, int64_t{9000}}) {
    in.memory_budget_bytes = budget;
    const AutotuneDecision d = DecideAutotune(in);
    int64_t bytes = 0, limits = 0;
    for (size_t i = 0; i < d.queue_capacity.size(); ++i) {
      EXPECT_GE(d.queue_capacity[i], 1);
      bytes += d.queue_capacity[i] * in.stages[i].max_element_bytes;
      limits += d.queue_bytes[i];
    }
    EXPECT_LE(bytes, budget);
    EXPECT_LE(limits, budget);
  }
}

TEST(Autotune, GivesBackAThreadThatSatIdle) {
  AutotuneInput in = ThreeStages();
  in.interval_seconds = 0.05;
  in.consumer_wait_fraction = 0;
  // Stage 0 has 4 threads but was busy 0.1 thread-seconds of a 0.05 s
  // interval: 2 threads idle.
  in.stages[0].threads = 4;
  const AutotuneDecision d = DecideAutotune(in);
  EXPECT_EQ(d.released, 0);
  EXPECT_EQ(d.threads, (std::vector<int>{3, 1, 1}));
  // 1.2 threads idle: kept (hysteresis).
  in.stages[0].threads = 3;
  in.stages[0].busy_seconds = 0.09;
  EXPECT_EQ(DecideAutotune(in).released, -1);
}

TEST(Autotune, AShrunkBudgetTakesFromTheStageWithMostCapacity) {
  AutotuneInput in = ThreeStages();
  in.stages[0].threads = 3;  // 3000 elements/s
  in.stages[1].threads = 4;  // 500 elements/s
  in.stages[2].threads = 2;  // 1000 elements/s
  in.cpu_budget = 6;
  const AutotuneDecision d = DecideAutotune(in);
  // 9 → 6: stage 0 (3000/s → 2000 → 1000/s), then stage 2 or 0 at 1000/s...
  int total = 0;
  for (int t : d.threads) total += t;
  EXPECT_EQ(total, 6);
  EXPECT_EQ(d.threads[1], 4);  // the bottleneck keeps its threads
  EXPECT_EQ(d.bottleneck, -1);
  // Fixed stages are never shrunk.
  in.stages[0].tunable = in.stages[2].tunable = false;
  in.stages[1].threads = 2;
  in.cpu_budget = 1;
  EXPECT_EQ(DecideAutotune(in).threads, (std::vector<int>{3, 1, 2}));
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
