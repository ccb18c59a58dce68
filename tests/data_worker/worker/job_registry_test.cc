// JobRegistry and `cache: auto` (docs/cache.md): an undecided job's executors run each map as a
// stage of its own (so its cost is measured); the JobInfo with the decision builds the job again
// with the cache node, an executor of the old build is dropped when released, and an undecided
// JobInfo never replaces a decided one.
#include "data_worker/worker/job_registry.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/parse.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker {
namespace {

constexpr char kSpec[] = R"(
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 24, width: 20}}]}
  - map: {input_columns: [image], ops: [{center_crop: {size: 16}}]}
  - batch: {size: 4}
)";

// The stages of `ex`'s plan (opened: its stages exist from then on).
std::vector<std::string> StageNames(pipeline::Executor& ex) {
  EXPECT_TRUE(ex.Open().ok());
  std::vector<std::string> out;
  for (const pipeline::StageStats& s : ex.stats().stages) out.push_back(s.name);
  return out;
}

class JobRegistryCacheAutoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pipeline::testing::MakeDataset(dir_.Join("ds"), 24, /*classes=*/4);
    auto p =
        pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(kSpec, {{"DIR", dir_.Join("ds")}}));
    ASSERT_TRUE(p.ok()) << p.status();
    spec_ = *p;
    auto roots = JobRegistry::CanonicalDataRoots({dir_.path()});
    ASSERT_TRUE(roots.ok()) << roots.status();
    pipeline::ExecutorOptions options;
    options.cpu_budget = 2;
    registry_ = std::make_unique<JobRegistry>(*roots, options, spdlog::default_logger());
    info_.set_job_id(7);
    info_.set_job_name("eval");
    info_.set_pipeline(spec_.SerializeAsString());
    info_.mutable_config()->set_mode(proto::PROCESSING_MODE_DISTRIBUTED_EPOCH);
    info_.mutable_config()->set_split_size(12);
    info_.mutable_config()->set_cache(proto::CACHE_MODE_AUTO);
  }
  // info_ as the dispatcher sends it once it decided to cache after nodes[0].
  proto::JobInfo Decided() {
    proto::JobInfo info = info_;
    proto::CacheDecision* d = info.mutable_cache_decision();
    d->set_decided(true);
    d->set_cache(true);
    d->set_after_node(0);
    d->set_name("auto-x");
    proto::Pipeline cut = spec_;
    cut.mutable_nodes()->Clear();
    *cut.add_nodes() = spec_.nodes(0);
    cut.add_nodes()->mutable_cache()->set_name("auto-x");
    *cut.add_nodes() = spec_.nodes(1);
    *cut.add_nodes() = spec_.nodes(2);
    info.set_pipeline(cut.SerializeAsString());
    return info;
  }

  sluice::testing::TempDir dir_;
  proto::Pipeline spec_;
  proto::JobInfo info_;
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(JobRegistryCacheAutoTest, AnUndecidedJobRunsEachMapAsAStageOfItsOwn) {
  registry_->Add(info_);
  std::shared_ptr<const Job> job = registry_->Get(7);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(job->status.ok()) << job->status;
  EXPECT_TRUE(job->measuring);
  EXPECT_FALSE(job->cache_key.has_value());
  std::shared_ptr<const Job> built_for;
  auto ex = registry_->AcquireExecutor(7, &built_for);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(built_for, job);
  EXPECT_EQ(StageNames(**ex), (std::vector<std::string>{"source+map[0]", "map[1]", "batch"}));

  // The same job without `cache: auto`: the maps are fused.
  proto::JobInfo plain = info_;
  plain.set_job_id(8);
  plain.mutable_config()->clear_cache();
  registry_->Add(plain);
  EXPECT_FALSE(registry_->Get(8)->measuring);
  auto fused = registry_->AcquireExecutor(8);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(StageNames(**fused), (std::vector<std::string>{"source+map[0]+map[1]+batch"}));
}

TEST_F(JobRegistryCacheAutoTest, TheDecisionBuildsTheJobAgainAndOldExecutorsAreDropped) {
  registry_->Add(info_);
  std::shared_ptr<const Job> old = registry_->Get(7);
  std::shared_ptr<const Job> built_for;
  auto ex = registry_->AcquireExecutor(7, &built_for);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_FALSE((*ex)->logical().cache.has_value());

  registry_->Add(Decided());
  std::shared_ptr<const Job> now = registry_->Get(7);
  ASSERT_NE(now, old);
  ASSERT_TRUE(now->status.ok()) << now->status;
  EXPECT_FALSE(now->measuring);
  ASSERT_TRUE(now->cache_key.has_value());
  EXPECT_EQ(now->cache_key->name, "auto-x");
  EXPECT_EQ(now->cache_key->node_index, 1);

  // The old build's executor comes back: dropped, so the next one has the cache node.
  registry_->ReleaseExecutor(7, *std::move(ex), built_for.get());
  auto next = registry_->AcquireExecutor(7, &built_for);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(built_for, now);
  EXPECT_TRUE((*next)->logical().cache.has_value());

  // A late undecided JobInfo (another heartbeat's) changes nothing.
  registry_->Add(info_);
  EXPECT_EQ(registry_->Get(7), now);
}

}  // namespace
}  // namespace sluice::data_worker
