// `cache: auto`'s decision (dispatcher/cache_auto.h) with exact inputs: an expensive prefix with a
// small output is cached at its end; a cheap prefix, or one over the free budget, is not (with
// the reason); nothing is cached at or after an op that draws new randomness each epoch. Then
// through DispatcherImpl: the decision waits for an epoch's records from all workers, is
// journaled (a restart keeps it), creates the cache, and reaches workers in a new JobInfo.
#include "dispatcher/cache_auto.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/pipeline_spec/cache_key.h"
#include "dispatcher/dispatcher_impl.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {
namespace {

enum class Op { kDecode, kResize, kCenterCrop, kFlip, kNormalize };

proto::PipelineNode Map(std::vector<Op> ops) {
  proto::PipelineNode n;
  proto::MapNode* m = n.mutable_map();
  m->add_input_columns("image");
  for (Op op : ops) {
    proto::OpSpec* s = m->add_ops();
    switch (op) {
      case Op::kDecode:
        s->mutable_decode();
        break;
      case Op::kResize:
        s->mutable_resize()->set_size(256);
        break;
      case Op::kCenterCrop:
        s->mutable_center_crop()->set_size(224);
        break;
      case Op::kFlip:
        s->mutable_random_horizontal_flip();
        break;
      case Op::kNormalize:
        s->mutable_normalize();
        break;
    }
  }
  return n;
}

proto::Pipeline EvalPipeline(std::vector<proto::PipelineNode> maps) {
  proto::Pipeline p;
  p.mutable_source()->mutable_dataset()->set_path("/data/val");
  p.mutable_source()->add_columns("image");
  for (proto::PipelineNode& n : maps) *p.add_nodes() = std::move(n);
  p.add_nodes()->mutable_batch()->set_size(10);
  return p;
}

proto::NodeCost Cost(int node, uint64_t records, double busy, uint64_t out_bytes) {
  proto::NodeCost c;
  c.set_job_id(7);
  c.set_node_index(node);
  c.set_records(records);
  c.set_busy_seconds(busy);
  c.set_out_bytes(out_bytes);
  c.set_out_elements(records);
  return c;
}

// The header's worked example: decode+resize 2 ms and 150 KB per record, center_crop 0.1 ms and
// 50 KB, then a random flip; 1000 records per epoch, reading 1 ns per byte.
AutoCacheInput Example(const proto::Pipeline* p) {
  AutoCacheInput in;
  in.pipeline = p;
  in.split_size = 100;
  in.records_per_epoch = 1000;
  in.min_records = 1000;
  in.read_seconds_per_byte = 1e-9;
  in.costs = {Cost(0, 1000, 2.0, 150'000'000), Cost(1, 1000, 0.1, 50'000'000),
              Cost(2, 1000, 0.05, 50'000'000)};
  return in;
}

std::string FingerprintWithCacheAfter(const proto::Pipeline& p, int after, uint64_t split_size) {
  proto::Pipeline q;
  *q.mutable_source() = p.source();
  for (int i = 0; i < p.nodes_size(); ++i) {
    *q.add_nodes() = p.nodes(i);
    if (i == after) q.add_nodes()->mutable_cache()->set_name("anything");
  }
  return pipeline_spec::CacheKeyOf(q, split_size)->fingerprint;
}

TEST(CacheAuto, AnExpensivePrefixWithASmallOutputIsCachedAtItsEnd) {
  const proto::Pipeline p = EvalPipeline(
      {Map({Op::kDecode, Op::kResize}), Map({Op::kCenterCrop}), Map({Op::kFlip, Op::kNormalize})});
  const proto::CacheDecision d = DecideAutoCache(Example(&p));
  EXPECT_TRUE(d.decided());
  ASSERT_TRUE(d.cache()) << d.reason();
  EXPECT_EQ(d.after_node(), 1);  // after center_crop: 50 MB, not 150 MB after resize
  EXPECT_EQ(d.estimated_bytes(), 50'000'000u);
  EXPECT_NEAR(d.cpu_seconds_saved_per_epoch(), 2.05, 1e-9);  // 2.1 s computed - 0.05 s read
  EXPECT_EQ(d.records_measured(), 1000u);
  const std::string fp = FingerprintWithCacheAfter(p, 1, 100);
  EXPECT_EQ(d.fingerprint(), fp);
  EXPECT_EQ(d.name(), "auto-" + fp);
  EXPECT_EQ(d.reason(),
            "cache after nodes[1]: recomputing costs 2.10 CPU s per epoch, reading 47.7 MiB back "
            "saves 2.05");
}

TEST(CacheAuto, CostsFromSeveralWorkersAreSummed) {
  const proto::Pipeline p = EvalPipeline({Map({Op::kDecode, Op::kResize}), Map({Op::kCenterCrop})});
  AutoCacheInput in = Example(&p);
  // Two workers, 600 + 400 records: the same totals as one worker's 1000.
  in.costs = {Cost(0, 600, 1.2, 90'000'000), Cost(1, 600, 0.06, 30'000'000),
              Cost(0, 400, 0.8, 60'000'000), Cost(1, 400, 0.04, 20'000'000)};
  const proto::CacheDecision d = DecideAutoCache(in);
  ASSERT_TRUE(d.cache()) << d.reason();
  EXPECT_EQ(d.after_node(), 1);
  EXPECT_EQ(d.estimated_bytes(), 50'000'000u);
  EXPECT_EQ(d.records_measured(), 1000u);
}

TEST(CacheAuto, NothingIsDecidedBeforeAnEpochIsMeasured) {
  const proto::Pipeline p = EvalPipeline({Map({Op::kDecode})});
  AutoCacheInput in = Example(&p);
  in.costs = {Cost(0, 999, 2.0, 150'000'000)};
  const proto::CacheDecision d = DecideAutoCache(in);
  EXPECT_FALSE(d.decided());
  EXPECT_FALSE(d.cache());
  EXPECT_EQ(d.reason(), "measuring: 999 of 1000 records");
}

TEST(CacheAuto, ACheapPrefixIsNotCached) {
  const proto::Pipeline p = EvalPipeline({Map({Op::kDecode, Op::kResize}), Map({Op::kCenterCrop})});
  AutoCacheInput in = Example(&p);
  // 0.01 s + 0.001 s of CPU per epoch; reading back 0.15 s or 0.05 s.
  in.costs = {Cost(0, 1000, 0.01, 150'000'000), Cost(1, 1000, 0.001, 50'000'000)};
  const proto::CacheDecision d = DecideAutoCache(in);
  EXPECT_TRUE(d.decided());
  EXPECT_FALSE(d.cache());
  EXPECT_EQ(d.reason(),
            "no cut pays: the best saves 0.00 of 0.01 CPU seconds per epoch (reading back costs "
            "about as much as computing)");
}

TEST(CacheAuto, ACutOverTheFreeBudgetIsNotTaken) {
  const proto::Pipeline p = EvalPipeline({Map({Op::kDecode, Op::kResize}), Map({Op::kCenterCrop})});
  AutoCacheInput in = Example(&p);
  in.free_bytes = 40'000'000;  // below both cuts' 150 MB and 50 MB
  proto::CacheDecision d = DecideAutoCache(in);
  EXPECT_TRUE(d.decided());
  EXPECT_FALSE(d.cache());
  EXPECT_EQ(d.reason(), "every cut's output is over the free cache budget (38.1 MiB)");

  in.free_bytes = 100'000'000;  // the 50 MB cut fits
  d = DecideAutoCache(in);
  ASSERT_TRUE(d.cache()) << d.reason();
  EXPECT_EQ(d.after_node(), 1);
}

TEST(CacheAuto, TheCutComesBeforeTheFirstRandomOp) {
  // The flip's map is the expensive one, with a tiny output: it still cannot be cached.
  const proto::Pipeline p =
      EvalPipeline({Map({Op::kDecode}), Map({Op::kFlip, Op::kResize}), Map({Op::kCenterCrop})});
  AutoCacheInput in = Example(&p);
  in.costs = {Cost(0, 1000, 1.0, 150'000'000), Cost(1, 1000, 9.0, 1'000),
              Cost(2, 1000, 0.1, 1'000)};
  const proto::CacheDecision d = DecideAutoCache(in);
  ASSERT_TRUE(d.cache()) << d.reason();
  EXPECT_EQ(d.after_node(), 0);
  EXPECT_EQ(d.estimated_bytes(), 150'000'000u);
  EXPECT_NEAR(d.cpu_seconds_saved_per_epoch(), 0.85, 1e-9);  // 1.0 - 0.15
}

TEST(CacheAuto, ARandomFirstOpLeavesNoPrefix) {
  const proto::Pipeline p = EvalPipeline({Map({Op::kFlip, Op::kDecode})});
  AutoCacheInput in = Example(&p);
  in.costs = {Cost(0, 1000, 5.0, 1'000)};
  const proto::CacheDecision d = DecideAutoCache(in);
  EXPECT_TRUE(d.decided());
  EXPECT_FALSE(d.cache());
  EXPECT_EQ(d.reason(), "no deterministic prefix: nodes[0].ops[0] draws new randomness each epoch");
}

TEST(CacheAuto, AMapWithoutMeasurementsIsNoCandidate) {
  // The worker measured only the source (the map's tail runs in the client: not reported).
  const proto::Pipeline p = EvalPipeline({Map({Op::kDecode, Op::kNormalize})});
  AutoCacheInput in = Example(&p);
  in.costs = {Cost(1, 1000, 0.2, 0)};  // the batch node: no candidate either
  const proto::CacheDecision d = DecideAutoCache(in);
  EXPECT_TRUE(d.decided());
  EXPECT_FALSE(d.cache());
  EXPECT_EQ(d.reason(),
            "no candidate node's cost was measured (a map whose tail the client runs, or a "
            "pipeline run as one stage, is not measured)");
}

TEST(CacheAuto, WithCacheAfterInsertsTheNodeAndRefusesASecond) {
  const proto::Pipeline p = EvalPipeline({Map({Op::kDecode}), Map({Op::kCenterCrop})});
  absl::StatusOr<proto::Pipeline> q = WithCacheAfter(p, 0, "auto-x");
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->nodes_size(), 4);
  EXPECT_TRUE(q->nodes(0).has_map());
  EXPECT_EQ(q->nodes(1).cache().name(), "auto-x");
  EXPECT_EQ(q->nodes(2).map().ops(0).center_crop().size(), 224);
  EXPECT_TRUE(q->nodes(3).has_batch());
  EXPECT_EQ(q->source().dataset().path(), "/data/val");
  EXPECT_EQ(WithCacheAfter(*q, 0, "again").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WithCacheAfter(p, 3, "x").status().message(),
            "cache: after_node 3 is not a node of the pipeline (3 nodes)");
}

using ::sluice::testonly::Sync;

class DispatcherAutoCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 100 synthetic records in 2 splits of 50: decode (node 0), then a random flip (node 1).
    pipeline_.mutable_source()->mutable_synthetic()->set_num_records(100);
    *pipeline_.add_nodes() = Map({Op::kDecode});
    *pipeline_.add_nodes() = Map({Op::kFlip});
    pipeline_.add_nodes()->mutable_batch()->set_size(10);
    fp_ = FingerprintWithCacheAfter(pipeline_, 0, 50);
    journal_ = std::make_shared<InMemoryJournal>();
    Restart();
  }
  void Restart() {
    impl_.reset();
    DispatcherOptions options;
    options.clock = &clock_;
    options.registry = &registry_;
    options.journal = journal_;
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }
  // A job `name` over pipeline_ (100 records, splits of 50) with `cache` and `epochs` (0: unset).
  proto::GetOrCreateJobResponse Job(const std::string& name, proto::CacheMode cache,
                                    uint64_t epochs) {
    proto::RegisterDatasetRequest d;
    d.set_protocol_version(kProtocolVersion);
    d.set_pipeline(pipeline_.SerializeAsString());
    d.add_shard_record_counts(100);
    d.set_batch_size(10);
    proto::RegisterDatasetResponse dr;
    EXPECT_TRUE(Sync(impl_).RegisterDataset(d, &dr).ok());
    proto::GetOrCreateJobRequest j;
    j.set_protocol_version(kProtocolVersion);
    j.set_job_name(name);
    j.set_dataset_id(dr.dataset_id());
    j.mutable_config()->set_num_consumers(1);
    j.mutable_config()->set_num_epochs(epochs);
    j.mutable_config()->set_split_size(50);
    j.mutable_config()->set_cache(cache);
    proto::GetOrCreateJobResponse jr;
    EXPECT_TRUE(Sync(impl_).GetOrCreateJob(j, &jr).ok());
    return jr;
  }
  uint64_t Worker() {
    proto::WorkerRegisterRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_address("w:" + std::to_string(++workers_));  // another address: another worker
    proto::WorkerRegisterResponse rr;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(r, &rr).ok());
    return rr.worker_id();
  }
  proto::WorkerHeartbeatResponse Beat(uint64_t worker, uint64_t job,
                                      std::vector<proto::NodeCost> costs, bool decided = false) {
    proto::WorkerHeartbeatRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_worker_id(worker);
    r.add_known_job_ids(job);
    if (decided) r.add_cache_decided_job_ids(job);
    for (proto::NodeCost& c : costs) {
      c.set_job_id(job);
      *r.add_node_costs() = c;
    }
    proto::WorkerHeartbeatResponse rr;
    absl::Status s = Sync(impl_).WorkerHeartbeat(r, &rr);
    EXPECT_TRUE(s.ok()) << s;
    return rr;
  }
  proto::GetStatusResponse Status() {
    proto::GetStatusRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_starting_workers(-1);
    proto::GetStatusResponse rr;
    EXPECT_TRUE(Sync(impl_).GetStatus(r, &rr).ok());
    return rr;
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  std::shared_ptr<Journal> journal_;
  std::unique_ptr<DispatcherImpl> impl_;
  proto::Pipeline pipeline_;
  std::string fp_;
  int workers_ = 0;
};

TEST_F(DispatcherAutoCacheTest, DecidesOnceAnEpochIsMeasuredKeepsItAcrossARestartAndTellsWorkers) {
  const proto::GetOrCreateJobResponse created = Job("eval", proto::CACHE_MODE_AUTO, /*epochs=*/3);
  const uint64_t job = created.job_id();
  EXPECT_TRUE(created.config().slots_follow_splits());  // splits can be written from epoch 1
  const uint64_t w1 = Worker();
  const uint64_t w2 = Worker();

  // 60 of 100 records measured: no decision, no cache, the JobInfo is not sent again.
  proto::WorkerHeartbeatResponse r = Beat(w1, job, {Cost(0, 60, 1.2, 60'000)});
  EXPECT_EQ(r.jobs_size(), 0);
  proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_FALSE(status.jobs(0).cache_decision().decided());
  EXPECT_EQ(status.jobs(0).cache_decision().reason(), "measuring: 60 of 100 records");
  EXPECT_EQ(status.caches_size(), 0);
  // The same worker again (cumulative: its report replaces the last one).
  Beat(w1, job, {Cost(0, 60, 1.2, 60'000), Cost(1, 60, 0.1, 60'000)});
  EXPECT_EQ(Status().jobs(0).cache_decision().reason(), "measuring: 60 of 100 records");

  // Another worker's 40 records: 100 of 100. Decode costs 2 s per epoch, its 100 KB read back
  // 0.1 ms: cache after nodes[0], before the flip.
  r = Beat(w2, job, {Cost(0, 40, 0.8, 40'000), Cost(1, 40, 0.1, 40'000)});
  ASSERT_EQ(r.jobs_size(), 1);  // w2 holds the undecided JobInfo: it gets the decided one
  const proto::JobInfo& info = r.jobs(0);
  EXPECT_TRUE(info.cache_decision().cache());
  proto::Pipeline sent;
  ASSERT_TRUE(sent.ParseFromString(info.pipeline()));
  ASSERT_EQ(sent.nodes_size(), 4);
  EXPECT_EQ(sent.nodes(1).cache().name(), "auto-" + fp_);
  EXPECT_EQ(pipeline_spec::CacheKeyOf(sent, 50)->fingerprint, fp_);

  auto expect_decided = [&](const proto::GetStatusResponse& s) {
    ASSERT_EQ(s.jobs_size(), 1);
    const proto::CacheDecision& d = s.jobs(0).cache_decision();
    EXPECT_TRUE(d.decided());
    EXPECT_TRUE(d.cache());
    EXPECT_EQ(d.after_node(), 0);
    EXPECT_EQ(d.name(), "auto-" + fp_);
    EXPECT_EQ(d.fingerprint(), fp_);
    EXPECT_EQ(d.estimated_bytes(), 100'000u);
    EXPECT_NEAR(d.cpu_seconds_saved_per_epoch(), 2.0 - 0.0001, 1e-9);
    EXPECT_EQ(d.records_measured(), 100u);
    EXPECT_EQ(d.from_epoch(), 0u);  // no consumer has read anything here
    ASSERT_EQ(s.caches_size(), 1);
    EXPECT_EQ(s.caches(0).name(), "auto-" + fp_);
    EXPECT_EQ(s.caches(0).splits_total(), 2u);
    EXPECT_EQ(s.jobs(0).cache(),
              "cache 'auto-" + fp_ + "' (" + fp_ + "): 0/2 splits committed, 0 B");
  };
  expect_decided(Status());
  // A worker that has the decided JobInfo is not sent it again; later reports change nothing.
  EXPECT_EQ(Beat(w2, job, {Cost(0, 500, 0.1, 9'000'000)}, /*decided=*/true).jobs_size(), 0);
  EXPECT_EQ(Beat(w1, job, {}, /*decided=*/false).jobs_size(), 1);

  Restart();  // the decision is in the journal
  expect_decided(Status());
}

TEST_F(DispatcherAutoCacheTest, AJobWithoutCacheAutoHasNoDecision) {
  const proto::GetOrCreateJobResponse jr =
      Job("plain", proto::CACHE_MODE_UNSPECIFIED, /*epochs=*/0);
  EXPECT_FALSE(jr.config().slots_follow_splits());
  Beat(Worker(), jr.job_id(), {Cost(0, 100, 5.0, 100)});
  const proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_FALSE(status.jobs(0).has_cache_decision());
  EXPECT_EQ(status.caches_size(), 0);
}

}  // namespace
}  // namespace sluice::dispatcher
