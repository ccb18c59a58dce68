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
  EXPECT_EQ(in.stages[0].threads + in.stages[1].threads + in.stages[2].threads,
            6);
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

}  // namespace
}  // namespace sluice::data_worker::pipeline
