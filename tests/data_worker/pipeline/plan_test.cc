#include "data_worker/pipeline/plan.h"

#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker::pipeline {
namespace {

using ::testing::ElementsAre;

constexpr char kSpec[] = R"(
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - filter: {predicate: "label != 2"}
  - filter: {predicate: "label in [0, 1, 3]"}
  - map: {input_columns: [image], ops: [decode]}
  - map:
      input_columns: [image]
      ops: [{random_resized_crop: {size: 16}}, random_horizontal_flip,
            {normalize: {mean: [0.5], std: [0.5]}}, hwc2chw]
  - map: {input_columns: [label], ops: [{one_hot: {num_classes: 4}}]}
  - batch: {size: 4}
)";

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::MakeDataset(dir_.Join("ds"), 8); }
  LogicalPipeline Logical(const std::string& yaml) {
    auto p = sluice::pipeline_spec::ParsePipelineSpec(
        absl::StrReplaceAll(yaml, {{"DIR", dir_.Join("ds")}}));
    EXPECT_TRUE(p.ok()) << p.status();
    auto lp = Validate(*p);
    EXPECT_TRUE(lp.ok()) << lp.status();
    return *lp;
  }
  sluice::testing::TempDir dir_;
};

TEST_F(PlanTest, EveryRewriteOn) {
  auto plan = Optimize(Logical(kSpec), OptimizerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Only the map fused with the batch is vectorized: map[0]+map[1] runs in
  // the first stage, before batching.
  EXPECT_EQ(plan->Describe(),
            "index-filter x2 -> source+map[0]+map[1][Read "
            "map[0]+map[1]{Decode+RandomResizedCrop,RandomHorizontalFlip,"
            "Normalize+HWC2CHW}] -> map[2]+batch[Batch(4) "
            "vectorized[1]{OneHot}]");
  EXPECT_THAT(plan->rewrites,
              ElementsAre("filter pushdown: filter[0]", "filter pushdown: filter[1]",
                          "map fusion: map[0]+map[1]", "map+batch fusion: map[2]+batch",
                          "source fusion: source+map[0]+map[1]",
                          "vectorization: map[2] OneHot after batch"));
  EXPECT_EQ(plan->source_filters.size(), 2u);
}

TEST_F(PlanTest, TrailingBatchedOpsOfTheLastMapRunAfterBatching) {
  OptimizerOptions no_write;
  no_write.batch_write_fusion = false;
  auto plan = Optimize(Logical(R"(
source: {dataset: {path: DIR}, columns: [image]}
nodes:
  - map:
      input_columns: [image]
      ops: [decode, {center_crop: {size: 16}}, {normalize: {mean: [0.5], std: [0.5]}},
            hwc2chw, {cast: {dtype: float16}}]
  - batch: {size: 4}
)"),
                       no_write);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(),
            "source+map[0]+batch[Read map[0]{Decode+CenterCrop} Batch(4) "
            "vectorized[0]{Normalize+HWC2CHW+Cast}]");
}

constexpr char kTrainTail[] = R"(
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - map:
      input_columns: [image]
      ops: [decode, {random_resized_crop: {size: 16}}, random_horizontal_flip,
            {normalize: {mean: [0.5], std: [0.5]}}, hwc2chw]
  - batch: {size: 4}
)";

TEST_F(PlanTest, BatchWriteFusionWritesTheFlipAndNormalizeIntoTheBatch) {
  auto plan = Optimize(Logical(kTrainTail), OptimizerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(),
            "source+map[0]+batch[Read map[0]{Decode+RandomResizedCrop} Batch(4) "
            "write[0]{RandomHorizontalFlip,Normalize+HWC2CHW}]");
  EXPECT_EQ(plan->rewrites.back(),
            "batch write fusion: map[0] RandomHorizontalFlip,Normalize+HWC2CHW into the batch "
            "slots");
  ASSERT_EQ(plan->stages.back().writes.size(), 1u);
  EXPECT_TRUE(plan->stages.back().vectorized.empty());

  // A cast to float16 is fused in too; an op between the flip and Normalize
  // keeps the flip per element.
  plan = Optimize(Logical(absl::StrReplaceAll(
                      kTrainTail, {{"hwc2chw]", "hwc2chw, {cast: {dtype: float16}}]"},
                                   {"random_horizontal_flip,",
                                    "random_horizontal_flip, {resize: {height: 8, width: 8}},"}})),
                  OptimizerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(),
            "source+map[0]+batch[Read map[0]{Decode+RandomResizedCrop,RandomHorizontalFlip,"
            "Resize} Batch(4) write[0]{Normalize+HWC2CHW+Cast}]");
}

TEST_F(PlanTest, BatchWriteFusionCanBeTurnedOffAndNeedsOpFusionAndVectorization) {
  const std::string vectorized =
      "source+map[0]+batch[Read map[0]{Decode+RandomResizedCrop,RandomHorizontalFlip} Batch(4) "
      "vectorized[0]{Normalize+HWC2CHW}]";
  OptimizerOptions o;
  o.batch_write_fusion = false;
  auto plan = Optimize(Logical(kTrainTail), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(), vectorized);
  o = OptimizerOptions();
  o.vectorization = false;
  plan = Optimize(Logical(kTrainTail), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(),
            "source+map[0]+batch[Read map[0]{Decode+RandomResizedCrop,RandomHorizontalFlip,"
            "Normalize+HWC2CHW} Batch(4)]");
  o = OptimizerOptions();
  o.op_fusion = false;
  plan = Optimize(Logical(kTrainTail), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(),
            "source+map[0]+batch[Read map[0]{Decode,RandomResizedCrop,RandomHorizontalFlip} "
            "Batch(4) vectorized[0]{Normalize,HWC2CHW}]");
}

TEST_F(PlanTest, NoRewritesIsOneStagePerNode) {
  auto plan = Optimize(Logical(kSpec), OptimizerOptions::None());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Describe(),
            "source[Read] -> filter[0][filter[0]] -> filter[1][filter[1]] -> "
            "map[0][map[0]{Decode}] -> "
            "map[1][map[1]{RandomResizedCrop,RandomHorizontalFlip,Normalize,"
            "HWC2CHW}] -> map[2][map[2]{OneHot}] -> batch[Batch(4)]");
  EXPECT_TRUE(plan->rewrites.empty());
  ASSERT_EQ(plan->stages.size(), 7u);
  EXPECT_TRUE(plan->stages.back().batch);
  EXPECT_EQ(plan->stages.back().batch_size, 4);
}

TEST_F(PlanTest, PipelineParallelismIsOneStage) {
  OptimizerOptions o = OptimizerOptions::None();
  o.pipeline_parallel = true;
  auto plan = Optimize(Logical(kSpec), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 1u);
  EXPECT_EQ(plan->stages[0].steps.size(), 6u);  // read, 2 filters, 3 maps
  EXPECT_TRUE(plan->stages[0].batch);
  EXPECT_THAT(plan->rewrites, ElementsAre("pipeline parallelism: one stage"));
}

TEST_F(PlanTest, FilterAfterAMapOnItsColumnIsNotPushedDown) {
  auto plan = Optimize(Logical(R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes:
  - map: {input_columns: [label], ops: [{spin: {cpu_micros: 0}}]}
  - filter: {predicate: "label != 2"}
)"),
                       OptimizerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->source_filters.empty());
  EXPECT_EQ(plan->Describe(), "source+map[0][Read map[0]{Spin}] -> filter[0][filter[0]]");
}

TEST_F(PlanTest, FixedParallelismSurvivesFusion) {
  auto plan = Optimize(Logical(R"(
source: {dataset: {path: DIR}, columns: [image], num_parallel_workers: 2}
nodes:
  - map: {input_columns: [image], ops: [decode], num_parallel_workers: 3}
  - map: {input_columns: [image], ops: [{resize: {size: 8}}],
          num_parallel_workers: AUTOTUNE}
)"),
                       OptimizerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 1u);
  // Map fusion of a fixed and an AUTOTUNE map is AUTOTUNE.
  EXPECT_EQ(plan->stages[0].parallelism, kAutotune);
  auto fixed = Optimize(Logical(R"(
source: {dataset: {path: DIR}, columns: [image], num_parallel_workers: 2}
nodes:
  - map: {input_columns: [image], ops: [decode], num_parallel_workers: 3}
)"),
                        OptimizerOptions());
  ASSERT_TRUE(fixed.ok());
  // Source fusion takes the larger fixed count.
  EXPECT_EQ(fixed->stages[0].parallelism, 3);
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
