// Cache nodes on the dispatcher (dispatcher/cache_catalog.h, dispatcher_impl_cache.cc): the
// commit policy and the budget's eviction on the catalog alone, then through DispatcherImpl:
// a job creates its cache, the first report of a split is committed once and survives a
// restart, workers get only news, and `rm` is refused while a job uses the cache.
#include "dispatcher/cache_catalog.h"

#include <memory>
#include <set>
#include <string>

#include "common/base/clock.h"
#include "common/pipeline_spec/cache_key.h"
#include "dispatcher/dispatcher_impl.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {
namespace {

using ::sluice::testonly::Sync;

proto::Update Create(const std::string& fp, uint64_t splits, uint64_t seq) {
  proto::Update u;
  u.mutable_cache_create()->set_fingerprint(fp);
  u.mutable_cache_create()->set_name("c-" + fp);
  u.mutable_cache_create()->set_total_splits(splits);
  u.mutable_cache_create()->set_seq(seq);
  return u;
}

proto::CacheSplitFile File(const std::string& fp, uint64_t split, uint64_t bytes) {
  proto::CacheSplitFile f;
  f.set_fingerprint(fp);
  f.set_split_id(split);
  f.set_path(fp + "/split-" + std::to_string(split) + ".0123456789abcdef.urec");
  f.set_bytes(bytes);
  return f;
}

proto::Update Commit(proto::CacheSplitFile f, uint64_t seq) {
  proto::Update u;
  f.set_seq(seq);
  *u.mutable_cache_commit()->mutable_file() = f;
  return u;
}

void ApplyOk(CacheCatalog& c, const proto::Update& u) {
  ASSERT_TRUE(c.Validate(u).ok()) << c.Validate(u);
  c.Apply(u);
}

TEST(CacheCatalog, ASplitIsCommittedOnceAndWorkersGetOnlyNews) {
  CacheCatalog c;
  ApplyOk(c, Create("a", 3, 1));
  ApplyOk(c, Commit(File("a", 0, 10), 2));
  EXPECT_EQ(c.Validate(Commit(File("a", 0, 10), 3)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Validate(Commit(File("a", 3, 10), 3)).code(),
            absl::StatusCode::kFailedPrecondition);  // out of range
  const CacheCatalog::CommitPlan again = c.PlanCommit(File("a", 0, 10), 0, {});
  EXPECT_FALSE(again.commit);
  EXPECT_EQ(again.why, "split 0 is committed already");
  ApplyOk(c, Commit(File("a", 2, 5), 3));

  proto::WorkerHeartbeatResponse all, news, none;
  c.EventsSince(0, &all);
  c.EventsSince(2, &news);
  c.EventsSince(3, &none);
  EXPECT_EQ(all.cache_seq(), 3u);
  ASSERT_EQ(all.cache_commits_size(), 2);
  ASSERT_EQ(news.cache_commits_size(), 1);
  EXPECT_EQ(news.cache_commits(0).split_id(), 2u);
  EXPECT_EQ(none.cache_commits_size(), 0);
  EXPECT_EQ(c.total_bytes(), 15u);
}

TEST(CacheCatalog, OverTheBudgetTheOldestUnusedCacheIsEvictedWhole) {
  CacheCatalog c;
  ApplyOk(c, Create("old", 4, 1));
  ApplyOk(c, Create("used", 4, 2));
  ApplyOk(c, Create("newer", 4, 3));
  ApplyOk(c, Create("mine", 4, 4));
  ApplyOk(c, Commit(File("old", 0, 40), 5));
  ApplyOk(c, Commit(File("old", 1, 20), 6));
  ApplyOk(c, Commit(File("used", 0, 30), 7));
  ApplyOk(c, Commit(File("newer", 0, 5), 8));
  // 95 committed; budget 100; "used" is in use. A 20-byte file: evict "old" (oldest) only.
  CacheCatalog::CommitPlan plan = c.PlanCommit(File("mine", 0, 20), 100, {"used"});
  EXPECT_TRUE(plan.commit);
  EXPECT_EQ(plan.evict, std::vector<std::string>({"old"}));
  // A file that only fits by evicting "used" is refused instead; nothing is evicted.
  plan = c.PlanCommit(File("mine", 0, 80), 100, {"used"});
  EXPECT_FALSE(plan.commit);
  EXPECT_TRUE(plan.evict.empty());
  EXPECT_EQ(plan.why,
            "over --cache-budget-bytes 100: 95 bytes committed, the file has 80 and the other "
            "caches are in use");
  // Within the budget nothing is evicted; budget 0 is unlimited.
  EXPECT_TRUE(c.PlanCommit(File("mine", 0, 5), 100, {}).evict.empty());
  EXPECT_TRUE(c.PlanCommit(File("mine", 0, 1000), 0, {}).commit);

  proto::Update remove;
  remove.mutable_cache_remove()->set_fingerprint("old");
  remove.mutable_cache_remove()->set_seq(9);
  ApplyOk(c, remove);
  EXPECT_EQ(c.total_bytes(), 35u);
  proto::WorkerHeartbeatResponse news;
  c.EventsSince(8, &news);
  EXPECT_EQ(news.cache_removed_size(), 1);
  EXPECT_EQ(news.cache_removed(0), "old");
  EXPECT_EQ(news.cache_commits_size(), 0);
}

TEST(CacheCatalog, TheSnapshotRebuildsCommitsAndRemovals) {
  CacheCatalog c;
  ApplyOk(c, Create("a", 2, 1));
  ApplyOk(c, Create("b", 2, 2));
  ApplyOk(c, Commit(File("a", 1, 7), 3));
  proto::Update remove;
  remove.mutable_cache_remove()->set_fingerprint("b");
  remove.mutable_cache_remove()->set_seq(4);
  ApplyOk(c, remove);
  proto::DispatcherSnapshot snapshot;
  c.AppendSnapshot(&snapshot);
  CacheCatalog replayed;
  for (const proto::Update& u : snapshot.updates()) ApplyOk(replayed, u);
  EXPECT_EQ(replayed.seq(), 4u);
  EXPECT_EQ(replayed.total_bytes(), 7u);
  ASSERT_NE(replayed.Find("a"), nullptr);
  EXPECT_EQ(replayed.Find("a")->files.at(1).path(), File("a", 1, 7).path());
  EXPECT_EQ(replayed.Find("b"), nullptr);
  proto::WorkerHeartbeatResponse news;
  replayed.EventsSince(3, &news);
  ASSERT_EQ(news.cache_removed_size(), 1);
  EXPECT_EQ(news.cache_removed(0), "b");
}

// Through DispatcherImpl, with the journal replayed by a restart.
class DispatcherCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pipeline_.mutable_source()->mutable_synthetic()->set_num_records(100);
    auto* map = pipeline_.add_nodes()->mutable_map();
    map->add_input_columns("image");
    map->add_ops()->mutable_decode();
    pipeline_.add_nodes()->mutable_cache()->set_name("eval");
    pipeline_.add_nodes()->mutable_batch()->set_size(10);
    key_ = *pipeline_spec::CacheKeyOf(pipeline_, 50);
    journal_ = std::make_shared<InMemoryJournal>();
    Restart();
  }
  void Restart() {
    impl_.reset();
    DispatcherOptions options;
    options.clock = &clock_;
    options.registry = &registry_;
    options.journal = journal_;
    options.cache_budget_bytes = 1000;
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }
  uint64_t Job(const std::string& name) { return Job(name, pipeline_); }
  uint64_t Job(const std::string& name, const proto::Pipeline& pipeline) {
    proto::RegisterDatasetRequest d;
    d.set_protocol_version(kProtocolVersion);
    d.set_pipeline(pipeline.SerializeAsString());
    d.add_shard_record_counts(100);
    d.set_batch_size(10);
    proto::RegisterDatasetResponse dr;
    EXPECT_TRUE(Sync(impl_).RegisterDataset(d, &dr).ok());
    proto::GetOrCreateJobRequest j;
    j.set_protocol_version(kProtocolVersion);
    j.set_job_name(name);
    j.set_dataset_id(dr.dataset_id());
    j.mutable_config()->set_num_consumers(1);
    j.mutable_config()->set_num_epochs(1);
    j.mutable_config()->set_split_size(50);
    proto::GetOrCreateJobResponse jr;
    EXPECT_TRUE(Sync(impl_).GetOrCreateJob(j, &jr).ok());
    return jr.job_id();
  }
  uint64_t Worker() {
    proto::WorkerRegisterRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_address("w:1");
    proto::WorkerRegisterResponse rr;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(r, &rr).ok());
    return rr.worker_id();
  }
  proto::WorkerHeartbeatResponse Beat(uint64_t worker, uint64_t seq,
                                      std::vector<proto::CacheSplitFile> files) {
    proto::WorkerHeartbeatRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_worker_id(worker);
    r.set_cache_seq(seq);
    for (auto& f : files) *r.add_cache_files() = f;
    proto::WorkerHeartbeatResponse rr;
    absl::Status s = Sync(impl_).WorkerHeartbeat(r, &rr);
    EXPECT_TRUE(s.ok()) << s;
    return rr;
  }
  proto::GetStatusResponse Status() {
    proto::GetStatusRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_starting_workers(-1);
    r.set_cache_files(true);
    proto::GetStatusResponse rr;
    EXPECT_TRUE(Sync(impl_).GetStatus(r, &rr).ok());
    return rr;
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  std::shared_ptr<Journal> journal_;
  std::unique_ptr<DispatcherImpl> impl_;
  proto::Pipeline pipeline_;
  pipeline_spec::CacheKey key_;
};

TEST_F(DispatcherCacheTest, FirstReportOfASplitIsCommittedAndSurvivesARestart) {
  const uint64_t job = Job("eval");
  const uint64_t w = Worker();
  proto::CacheSplitFile first = File(key_.fingerprint, 1, 300);
  proto::CacheSplitFile second = File(key_.fingerprint, 1, 300);
  second.set_path(key_.fingerprint + "/split-1.fedcba9876543210.urec");

  proto::WorkerHeartbeatResponse a = Beat(w, 0, {first});
  ASSERT_EQ(a.cache_acked_size(), 1);
  EXPECT_EQ(a.cache_acked(0), first.path());
  ASSERT_EQ(a.cache_commits_size(), 1);
  EXPECT_EQ(a.cache_commits(0).path(), first.path());
  // A second worker's file for the same split: acknowledged, not committed.
  proto::WorkerHeartbeatResponse b = Beat(w, a.cache_seq(), {second});
  EXPECT_EQ(b.cache_acked_size(), 1);
  EXPECT_EQ(b.cache_commits_size(), 0);

  proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.caches_size(), 1);
  EXPECT_EQ(status.caches(0).name(), "eval");
  EXPECT_EQ(status.caches(0).splits_committed(), 1u);
  EXPECT_EQ(status.caches(0).splits_total(), 2u);
  EXPECT_EQ(status.caches(0).bytes(), 300u);
  EXPECT_EQ(status.jobs(0).cache(),
            "cache 'eval' (" + key_.fingerprint + "): 1/2 splits committed, 300 B");

  Restart();
  status = Status();
  ASSERT_EQ(status.caches_size(), 1);
  ASSERT_EQ(status.caches(0).files_size(), 1);
  EXPECT_EQ(status.caches(0).files(0).path(), first.path());
  EXPECT_EQ(job, status.jobs(0).job_id());
}

TEST_F(DispatcherCacheTest, RemoveIsRefusedWhileAJobUsesTheCache) {
  const uint64_t job = Job("eval");
  proto::RemoveCacheRequest rm;
  rm.set_protocol_version(kProtocolVersion);
  rm.set_name("eval");
  proto::RemoveCacheResponse rr;
  absl::Status s = Sync(impl_).RemoveCache(rm, &rr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "cache 'eval' (" + key_.fingerprint + ") is used by job " +
                             std::to_string(job) +
                             " ('eval'): remove it once that job is over (its consumers "
                             "finished or left)");
  rm.set_name("nope");
  EXPECT_EQ(Sync(impl_).RemoveCache(rm, &rr).code(), absl::StatusCode::kNotFound);
}

TEST_F(DispatcherCacheTest, AFileOverTheBudgetIsAcknowledgedButNotCommitted) {
  Job("eval");
  const uint64_t w = Worker();
  proto::WorkerHeartbeatResponse a = Beat(w, 0, {File(key_.fingerprint, 0, 1001)});
  EXPECT_EQ(a.cache_acked_size(), 1);
  EXPECT_EQ(a.cache_commits_size(), 0);
  EXPECT_EQ(Status().caches(0).splits_committed(), 0u);
}

TEST_F(DispatcherCacheTest, OverTheBudgetTheCacheOfAJobThatIsOverIsEvictedAndWorkersAreTold) {
  Job("old");
  const uint64_t w = Worker();
  proto::WorkerHeartbeatResponse a = Beat(w, 0, {File(key_.fingerprint, 0, 600)});
  ASSERT_EQ(a.cache_commits_size(), 1);
  // The job's consumers never come: collected after the consumer timeout.
  clock_.Advance(absl::Seconds(61));
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(61));
  ASSERT_TRUE(impl_->Tick().ok());
  ASSERT_EQ(Status().jobs_size(), 0);

  proto::Pipeline other = pipeline_;
  other.set_seed(5);  // another prefix: another cache
  const std::string fp = pipeline_spec::CacheKeyOf(other, 50)->fingerprint;
  Job("new", other);
  // 600 + 600 > 1000: the old cache, unused now, goes whole; the new file is committed. (The
  // first worker timed out meanwhile; another reports, having seen the first commit.)
  const uint64_t w2 = Worker();
  proto::WorkerHeartbeatResponse b = Beat(w2, a.cache_seq(), {File(fp, 0, 600)});
  ASSERT_EQ(b.cache_removed_size(), 1);
  EXPECT_EQ(b.cache_removed(0), key_.fingerprint);
  ASSERT_EQ(b.cache_commits_size(), 1);
  EXPECT_EQ(b.cache_commits(0).fingerprint(), fp);
  const proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.caches_size(), 1);
  EXPECT_EQ(status.caches(0).fingerprint(), fp);
  EXPECT_EQ(status.caches(0).bytes(), 600u);
}

}  // namespace
}  // namespace sluice::dispatcher
