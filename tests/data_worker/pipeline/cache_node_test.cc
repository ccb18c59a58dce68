// The cache node in validation, planning and fingerprinting (docs/cache.md).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/cache_key.h"
#include "common/pipeline_spec/parse.h"
#include "data_worker/pipeline/plan.h"
#include "data_worker/pipeline/spec.h"
#include "gtest/gtest.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker::pipeline {
namespace {

class CacheNodeTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::MakeDataset(dir_.Join("ds"), 8); }
  proto::Pipeline Spec(const std::string& nodes) const {
    auto p = pipeline_spec::ParsePipelineSpec(
        absl::StrCat("source: {dataset: {path: ", dir_.Join("ds"),
                     "}, columns: [image, label]}\nnodes:\n", nodes));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : proto::Pipeline();
  }
  absl::Status Check(const std::string& nodes) const { return Validate(Spec(nodes)).status(); }

  sluice::testing::TempDir dir_;
};

TEST_F(CacheNodeTest, ARandomOpBeforeTheCacheIsRefusedSayingWhy) {
  const absl::Status s = Check(R"(
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 32}}]}
  - map: {input_columns: [image], ops: [{random_resized_crop: {size: 24}}]}
  - cache: {name: train}
  - batch: {size: 2}
)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "cache: cache 'train' comes after map[1].ops[0] (RandomResizedCrop), which draws new "
            "randomness each epoch, so a cached copy would repeat epoch 1's augmentation; move "
            "the cache before that op");
}

TEST_F(CacheNodeTest, RandomOpsAfterTheCacheAreFine) {
  EXPECT_TRUE(Check(R"(
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 32}}]}
  - cache: {name: train}
  - map: {input_columns: [image], ops: [{random_resized_crop: {size: 24}}, {random_horizontal_flip: {}}]}
  - batch: {size: 2}
)")
                  .ok());
}

TEST_F(CacheNodeTest, PlacementAndNameAreChecked) {
  EXPECT_EQ(
      Check("  - map: {input_columns: [image], ops: [{decode: {}}, {center_crop: {size: 8}}]}\n"
            "  - batch: {size: 2}\n  - cache: {name: x}\n")
          .message(),
      "cache: cache after batch is not supported: place it before the batch node");
  EXPECT_EQ(Check("  - cache: {name: x}\n  - cache: {name: y}\n").message(),
            "cache: only one cache node is supported");
  EXPECT_EQ(Check("  - cache: {name: ''}\n").message(), "cache.name: must not be empty");
  EXPECT_EQ(Check("  - cache: {name: 'a/b'}\n").message(),
            "cache.name: 'a/b' may hold only letters, digits, '_', '-' and '.'");
}

TEST_F(CacheNodeTest, NothingIsFusedOrVectorizedAcrossTheCache) {
  auto lp = Validate(Spec(R"(
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 8}}, {normalize: {mean: [0, 0, 0], std: [1, 1, 1]}}]}
  - cache: {name: eval}
  - filter: {predicate: "label == 1"}
  - batch: {size: 2}
)"));
  ASSERT_TRUE(lp.ok()) << lp.status();
  auto plan = Optimize(*lp, OptimizerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Normalize stays before the cache (not vectorized after the batch), and the filter after
  // the cache is not pushed down onto the dataset index.
  EXPECT_EQ(plan->Describe(),
            "source+map[0][Read map[0]{Decode+Resize,Normalize} cache(eval)] -> "
            "filter[0][filter[0]] -> batch[Batch(2)]");
  EXPECT_TRUE(plan->source_filters.empty());
}

TEST_F(CacheNodeTest, TheFingerprintCoversThePrefixSeedAndSplitSizeOnly) {
  const std::string prefix =
      "  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 16}}]}\n"
      "  - cache: {name: eval}\n";
  const auto a = pipeline_spec::CacheKeyOf(Spec(prefix + "  - batch: {size: 2}\n"), 64);
  const auto b = pipeline_spec::CacheKeyOf(
      Spec(prefix + "  - map: {input_columns: [image], ops: [{random_horizontal_flip: {}}]}\n"
                    "  - batch: {size: 4}\n"),
      64);
  const auto other_split = pipeline_spec::CacheKeyOf(Spec(prefix), 128);
  proto::Pipeline seeded = Spec(prefix);
  seeded.set_seed(9);
  const auto other_seed = pipeline_spec::CacheKeyOf(seeded, 64);
  const auto other_prefix = pipeline_spec::CacheKeyOf(
      Spec("  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 17}}]}\n"
           "  - cache: {name: eval}\n"),
      64);
  ASSERT_TRUE(a && b && other_split && other_seed && other_prefix);
  EXPECT_EQ(a->name, "eval");
  EXPECT_EQ(a->node_index, 1);
  EXPECT_EQ(a->fingerprint.size(), 16u);
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_NE(a->fingerprint, other_split->fingerprint);
  EXPECT_NE(a->fingerprint, other_seed->fingerprint);
  EXPECT_NE(a->fingerprint, other_prefix->fingerprint);
  EXPECT_FALSE(pipeline_spec::CacheKeyOf(Spec("  - batch: {size: 2}\n"), 64).has_value());
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
