// SplitCache and CacheStore (data_worker/worker/split_cache.h) with real executors: a split
// captured by one "worker" is read back by another from the committed file, byte-identical to
// computing it, and uncommitted files are never read and get deleted.
#include "data_worker/worker/split_cache.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/cache_key.h"
#include "common/pipeline_spec/parse.h"
#include "data_worker/pipeline/executor.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/executor_testing.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker {
namespace {

namespace fs = std::filesystem;
using pipeline::Element;
using pipeline::Executor;
using pipeline::ExecutorOptions;

// Decode + resize before the cache, normalize after it (so the cached column is uint8 and the
// output float32); a filter before the cache drops labels 0 and 3.
constexpr char kSpec[] = R"(
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 24, width: 20}}]}
  - filter: {predicate: "label in [1, 2]"}
  - cache: {name: eval}
  - map: {input_columns: [image], ops: [{normalize: {mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}}]}
  - batch: {size: 4}
)";

// Every output's columns as bytes, in order.
std::vector<std::string> Bytes(const std::vector<Element>& outputs) {
  std::vector<std::string> out;
  for (const Element& e : outputs) {
    std::string b;
    for (const Tensor& t : e.columns)
      b.append(reinterpret_cast<const char*>(t.data()), t.num_bytes());
    for (uint64_t g : e.global_indices) absl::StrAppend(&b, "#", g);
    out.push_back(std::move(b));
  }
  return out;
}

double Value(prometheus::Registry& r, const std::string& name) {
  for (const auto& family : r.Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
  }
  return -1;
}

class SplitCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pipeline::testing::MakeDataset(dir_.Join("ds"), 24, /*classes=*/4);
    auto p =
        pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(kSpec, {{"DIR", dir_.Join("ds")}}));
    ASSERT_TRUE(p.ok()) << p.status();
    spec_ = *p;
    key_ = *pipeline_spec::CacheKeyOf(spec_, /*split_size=*/12);
    root_ = dir_.Join("cache");
  }

  // An executor of the spec whose cache node uses `cache` (null: computes everything).
  std::unique_ptr<Executor> Make(std::shared_ptr<SplitCache> cache) {
    ExecutorOptions o;
    o.cpu_budget = 2;
    o.cache = std::move(cache);
    auto ex = Executor::Create(spec_, o);
    EXPECT_TRUE(ex.ok()) << ex.status();
    return ex.ok() ? *std::move(ex) : nullptr;
  }
  std::vector<ColumnType> Types() {
    auto ex = Make(nullptr);
    return ex->logical().cache->column_types;
  }

  sluice::testing::TempDir dir_;
  proto::Pipeline spec_;
  pipeline_spec::CacheKey key_;
  std::string root_;
  // Split 1 of the dataset at split size 12: records 12..23, in a shuffled order.
  const std::vector<uint64_t> order_ = {17, 12, 23, 14, 20, 13, 22, 15, 19, 16, 21, 18};
};

TEST_F(SplitCacheTest, ACommittedSplitIsReadBackByAnotherWorkerByteIdenticalToComputing) {
  prometheus::Registry r1, r2;
  CacheStore writer_store(root_, r1, spdlog::default_logger());
  CacheStore reader_store(root_, r2, spdlog::default_logger());
  std::shared_ptr<SplitCache> writer = writer_store.Get(key_.fingerprint, key_.name, Types());

  ASSERT_TRUE(writer->BeginCapture(/*split_id=*/1, /*first_global=*/12, /*num_records=*/12));
  auto computing = Make(writer);
  auto first = testonly::RunSplit(*computing, order_, /*epoch=*/0);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<proto::CacheSplitFile> file = writer->FinishCapture(1);
  ASSERT_TRUE(file.ok()) << file.status();
  // Labels 1 and 2 of records 12..23 (label = index % 4): 13, 14, 17, 18, 21, 22.
  EXPECT_EQ(file->records(), 6u);
  EXPECT_EQ(file->split_id(), 1u);
  EXPECT_EQ(file->first_global(), 12u);
  EXPECT_EQ(file->num_records(), 12u);
  EXPECT_TRUE(fs::exists(fs::path(root_) / file->path()));
  EXPECT_EQ(Value(r1, "sluice_worker_cache_written_files_total"), 1);

  // Another worker learns the commit and reads the split from the file in a later epoch.
  std::shared_ptr<SplitCache> reader = reader_store.Get(key_.fingerprint, key_.name, Types());
  EXPECT_FALSE(reader->IsCommitted(1));
  proto::CacheSplitFile committed = *file;
  committed.set_seq(2);
  reader->AddCommitted(committed);
  EXPECT_TRUE(reader->IsCommitted(1));
  EXPECT_FALSE(reader->BeginCapture(1, 12, 12));
  auto cached = testonly::RunSplit(*Make(reader), order_, /*epoch=*/1);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(Value(r2, "sluice_worker_cache_read_elements_total"), 6);

  auto recomputed = testonly::RunSplit(*Make(nullptr), order_, /*epoch=*/1);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  ASSERT_EQ(Bytes(*recomputed).size(), 2u);  // 6 elements, batches of 4
  EXPECT_EQ(Bytes(*cached), Bytes(*recomputed));
  EXPECT_EQ(Bytes(*first), Bytes(*recomputed));
}

TEST_F(SplitCacheTest, TheCommitDeletesTheSplitsOtherFilesAndKeepsTheCommittedOne) {
  prometheus::Registry r1, r2;
  CacheStore writer_store(root_, r1, spdlog::default_logger());
  std::shared_ptr<SplitCache> writer = writer_store.Get(key_.fingerprint, key_.name, Types());
  ASSERT_TRUE(writer->BeginCapture(1, 12, 12));
  ASSERT_TRUE(testonly::RunSplit(*Make(writer), order_, 0).ok());
  absl::StatusOr<proto::CacheSplitFile> file = writer->FinishCapture(1);
  ASSERT_TRUE(file.ok()) << file.status();
  // A killed writer's partial file, and a complete one whose report never arrived.
  const fs::path dir = fs::path(root_) / key_.fingerprint;
  const fs::path partial = dir / "split-1.00000000deadbeef.partial";
  const fs::path orphan = dir / "split-1.00000000feedface.urec";
  const fs::path other_split = dir / "split-10.00000000deadbeef.partial";
  for (const fs::path& p : {partial, orphan, other_split}) std::ofstream(p) << "garbage";

  CacheStore reader_store(root_, r2, spdlog::default_logger());
  std::shared_ptr<SplitCache> reader = reader_store.Get(key_.fingerprint, key_.name, Types());
  reader->AddCommitted(*file);
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_TRUE(fs::exists(other_split));  // another split's: not this commit's business
  EXPECT_TRUE(fs::exists(fs::path(root_) / file->path()));
  EXPECT_EQ(Value(r2, "sluice_worker_cache_discarded_files_total"), 2);
}

TEST_F(SplitCacheTest, ACaptureOfASplitCommittedMeanwhileIsNotWritten) {
  prometheus::Registry r1, r2;
  CacheStore a(root_, r1, spdlog::default_logger());
  CacheStore b(root_, r2, spdlog::default_logger());
  std::shared_ptr<SplitCache> ca = a.Get(key_.fingerprint, key_.name, Types());
  std::shared_ptr<SplitCache> cb = b.Get(key_.fingerprint, key_.name, Types());
  ASSERT_TRUE(ca->BeginCapture(1, 12, 12));
  ASSERT_TRUE(cb->BeginCapture(1, 12, 12));
  ASSERT_TRUE(testonly::RunSplit(*Make(ca), order_, 0).ok());
  absl::StatusOr<proto::CacheSplitFile> fa = ca->FinishCapture(1);
  ASSERT_TRUE(fa.ok()) << fa.status();
  cb->AddCommitted(*fa);  // a's file committed while b's run was going
  absl::StatusOr<proto::CacheSplitFile> fb = cb->FinishCapture(1);
  EXPECT_EQ(fb.status().code(), absl::StatusCode::kAlreadyExists) << fb.status();
}

TEST_F(SplitCacheTest, StoreReportsUntilAckedAndDeletesARefusedFile) {
  prometheus::Registry r;
  CacheStore store(root_, r, spdlog::default_logger());
  std::shared_ptr<SplitCache> c = store.Get(key_.fingerprint, key_.name, Types());
  ASSERT_TRUE(c->BeginCapture(1, 12, 12));
  ASSERT_TRUE(testonly::RunSplit(*Make(c), order_, 0).ok());
  absl::StatusOr<proto::CacheSplitFile> file = c->FinishCapture(1);
  ASSERT_TRUE(file.ok());
  store.Report(*file);

  proto::WorkerHeartbeatRequest hb;
  store.Fill(&hb);
  ASSERT_EQ(hb.cache_files_size(), 1);
  EXPECT_EQ(hb.cache_files(0).path(), file->path());
  EXPECT_EQ(hb.cache_seq(), 0u);

  // Not acknowledged: reported again.
  proto::WorkerHeartbeatResponse no_ack;
  no_ack.set_cache_seq(1);
  store.Apply(no_ack);
  proto::WorkerHeartbeatRequest again;
  store.Fill(&again);
  EXPECT_EQ(again.cache_files_size(), 1);
  EXPECT_EQ(again.cache_seq(), 1u);

  // Acknowledged without a commit (refused, e.g. over the budget): the file goes.
  proto::WorkerHeartbeatResponse refused;
  refused.set_cache_seq(1);
  refused.add_cache_acked(file->path());
  store.Apply(refused);
  proto::WorkerHeartbeatRequest after;
  store.Fill(&after);
  EXPECT_EQ(after.cache_files_size(), 0);
  EXPECT_FALSE(fs::exists(fs::path(root_) / file->path()));
  EXPECT_FALSE(c->IsCommitted(1));
}

TEST_F(SplitCacheTest, ARemovedCacheIsForgottenAndItsFolderDeleted) {
  prometheus::Registry r;
  CacheStore store(root_, r, spdlog::default_logger());
  std::shared_ptr<SplitCache> c = store.Get(key_.fingerprint, key_.name, Types());
  ASSERT_TRUE(c->BeginCapture(1, 12, 12));
  ASSERT_TRUE(testonly::RunSplit(*Make(c), order_, 0).ok());
  absl::StatusOr<proto::CacheSplitFile> file = c->FinishCapture(1);
  ASSERT_TRUE(file.ok());
  proto::WorkerHeartbeatResponse commit;
  commit.set_cache_seq(2);
  *commit.add_cache_commits() = *file;
  store.Apply(commit);
  EXPECT_TRUE(c->IsCommitted(1));

  proto::WorkerHeartbeatResponse removed;
  removed.set_cache_seq(3);
  removed.add_cache_removed(key_.fingerprint);
  store.Apply(removed);
  EXPECT_FALSE(c->IsCommitted(1));
  EXPECT_FALSE(fs::exists(fs::path(root_) / key_.fingerprint));
  std::vector<Tensor> cols;
  absl::StatusOr<pipeline::ElementCache::Found> found = c->Lookup(13, &cols);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, pipeline::ElementCache::Found::kMiss);
}

}  // namespace
}  // namespace sluice::data_worker
