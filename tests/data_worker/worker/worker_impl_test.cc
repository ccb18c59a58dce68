// WorkerImpl with a scripted fake dispatcher and in-process stream readers: splits, skips,
// drops, refused jobs, limits, finishing, the heartbeat's counters, long-lived executors and the
// memory budget. One file (~800 lines) because every case drives the same fixture (worker,
// fake dispatcher, reader); splitting it would copy the fixture.
#include "data_worker/worker/worker_impl.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/base/random.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/sharding.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/data_worker/worker/worker_test_util.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker {
namespace {

using ::testing::ElementsAre;
using testing::Eventually;
using testing::FakeDispatcher;
using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeSplit;

constexpr char kLabels[] = R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes:
  - batch: {size: 4}
)";
constexpr char kShuffledLabels[] = R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes:
  - shuffle: {seed: 3}
  - batch: {size: 4}
)";
constexpr char kImages[] = R"(
on_error: fail
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 32, width: 32}}]}
  - batch: {size: 4}
)";

class WorkerImplTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pipeline::testing::MakeDataset(dir_.Join("ds"), 40, /*classes=*/1000, {},
                                   /*fixed=*/40);
    pipeline::testing::MakeDataset(dir_.Join("bad"), 12, /*classes=*/4,
                                   /*corrupt=*/{6},
                                   /*fixed=*/40);
  }

  std::string Yaml(const char* yaml, const std::string& ds = "ds") const {
    return absl::StrReplaceAll(yaml, {{"DIR", dir_.Join(ds)}});
  }

  std::unique_ptr<WorkerImpl> MakeWorker(size_t queue_batches = 8,
                                         std::vector<std::string> roots = {},
                                         int64_t queue_bytes = 0,
                                         service::ServiceLimits limits = {}) {
    WorkerOptions options;
    options.address = "127.0.0.1:1";
    options.data_roots = roots.empty() ? std::vector<std::string>{dir_.path()} : roots;
    options.threads = 2;
    options.capacity = 2;
    options.queue_batches = queue_batches;
    options.queue_bytes = queue_bytes;
    options.heartbeat_thread = false;
    options.clock = &clock_;
    options.limits = limits;
    auto w = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->Start().ok());
    return std::move(*w);
  }

  void Script(proto::WorkerHeartbeatResponse response) {
    absl::MutexLock lock(&fake_.mu);
    fake_.script.push_back(std::move(response));
  }

  // A worker with its own heartbeat thread on manual_clock_ (not started): no heartbeat period
  // passes unless the test advances it. Capacity 1, whose first heartbeat brings job 1 and its
  // split 0 of `records` records.
  std::unique_ptr<WorkerImpl> MakeThreadedWorker(absl::Duration interval, uint64_t records) {
    WorkerOptions options;
    options.address = "127.0.0.1:1";
    options.data_roots = {dir_.path()};
    options.threads = 1;
    options.capacity = 1;
    options.heartbeat_interval = interval;
    options.clock = &manual_clock_;
    proto::WorkerHeartbeatResponse first;
    *first.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
    *first.add_start() = MakeSplit(1, 0, 0, 0, 0, records, 0, 0);
    Script(first);
    auto w = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  // Scripts `response`, heartbeats once.
  void Deliver(WorkerImpl& w, proto::WorkerHeartbeatResponse response) {
    Script(std::move(response));
    ASSERT_TRUE(w.Heartbeat().ok());
  }

  // A reader of one consumer's stream: waits (on the notify callback) for each
  // event. WorkerImpl may call notify even after CloseStream (a producer that
  // read the callback just before): the callback holds the wakeup counter, not
  // the Reader.
  struct Wakeups {
    absl::Mutex mu;
    int count ABSL_GUARDED_BY(mu) = 0;
  };
  struct Reader {
    std::shared_ptr<Wakeups> wakeups = std::make_shared<Wakeups>();
    uint64_t id = 0;
    WorkerImpl* w = nullptr;
    ~Reader() {
      if (w != nullptr && id != 0) w->CloseStream(id);
    }

    StreamEvent Next() {
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      Wakeups& wk = *wakeups;
      while (true) {
        int seen;
        {
          absl::MutexLock lock(&wk.mu);
          seen = wk.count;
        }
        StreamEvent e = w->PollStream(id);
        if (e.kind != StreamEvent::kPending) return e;
        absl::MutexLock lock(&wk.mu);
        auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wk.mu) { return wk.count != seen; };
        if (!wk.mu.AwaitWithDeadline(absl::Condition(&changed), deadline)) return e;
      }
    }
  };

  // `held`: the consumer holds that many batches of the split at (epoch, position); a split
  // whose task skips batches is one it holds them of.
  struct Holds {
    uint64_t epoch = 0;
    uint64_t position = 0;
    uint64_t batches = 0;
  };
  std::unique_ptr<Reader> Open(WorkerImpl& w, uint64_t job, uint32_t consumer,
                               absl::Status* status = nullptr,
                               std::optional<Holds> held = std::nullopt) {
    auto r = std::make_unique<Reader>();
    r->w = &w;
    proto::GetBatchesRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_consumer_index(consumer);
    if (held.has_value()) {
      proto::HeldSplit* h = request.add_held();
      h->mutable_key()->set_job_id(job);
      h->mutable_key()->set_consumer_index(consumer);
      h->mutable_key()->set_epoch(held->epoch);
      h->mutable_key()->set_position(held->position);
      h->set_batches(held->batches);
    }
    auto id = w.OpenStream(request, service::Identity::Development(), [wakeups = r->wakeups] {
      absl::MutexLock lock(&wakeups->mu);
      ++wakeups->count;
    });
    if (status != nullptr) *status = id.status();
    if (!id.ok()) return nullptr;
    r->id = *id;
    return r;
  }

  // Job `job` of `yaml` (batches of `batch_size`) on a new worker: the first event of consumer
  // 0's stream over records [0, records).
  StreamEvent FirstBatch(uint64_t job, const std::string& yaml, uint64_t batch_size,
                         uint64_t records) {
    auto w = MakeWorker();
    proto::WorkerHeartbeatResponse r;
    *r.add_jobs() = MakeJob(job, Yaml(yaml.c_str()), batch_size);
    *r.add_start() = MakeSplit(job, 0, 0, 0, 0, records, 0, 0);
    Deliver(*w, r);
    auto reader = Open(*w, job, 0);
    EXPECT_NE(reader, nullptr);
    StreamEvent event;
    if (reader != nullptr) event = reader->Next();
    reader.reset();
    w->Stop();
    return event;  // its column bytes are owned by the event
  }

  static std::vector<uint64_t> Ids(const proto::Batch& b) {
    return {b.global_indices().begin(), b.global_indices().end()};
  }

  sluice::testing::TempDir dir_;
  FakeClock clock_;
  testing::ManualClock manual_clock_;
  FakeDispatcher::Shared fake_;
};

// The finish tail (normalize + hwc2chw) leaves the worker as uint8 with the
// ops in the header under finish auto/client, as float32 under worker.
TEST_F(WorkerImplTest, FinishDecidesWhetherTheTailShipsAsUint8OrRunsHere) {
  const std::string tail = R"(
source: {dataset: {path: DIR}, columns: [label, image]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 6}}, {normalize: {mean: [0.5], std: [0.25]}}, {hwc2chw: {}}]}
  - batch: {size: 4}
finish: )";
  uint64_t job = 0;
  for (const std::string finish : {"client", "auto", "worker"}) {
    SCOPED_TRACE(finish);
    const StreamEvent b = FirstBatch(++job, tail + finish + "\n", 4, 8);
    ASSERT_EQ(b.kind, StreamEvent::kBatch) << b.status;
    const proto::Batch& h = b.batch.header;
    ASSERT_EQ(h.columns_size(), 2);
    if (finish == "worker") {
      EXPECT_EQ(h.finish_size(), 0);
      EXPECT_EQ(h.columns(1).dtype(), proto::TENSOR_DTYPE_FLOAT32);
      EXPECT_THAT(h.columns(1).shape(), ElementsAre(4, 3, 8, 6));
    } else {
      ASSERT_EQ(h.finish_size(), 1);
      EXPECT_EQ(h.finish(0).column(), 1u);
      ASSERT_EQ(h.finish(0).ops_size(), 2);
      EXPECT_TRUE(h.finish(0).ops(0).has_normalize());
      EXPECT_TRUE(h.finish(0).ops(1).has_hwc2chw());
      EXPECT_EQ(h.columns(1).dtype(), proto::TENSOR_DTYPE_UINT8);
      EXPECT_THAT(h.columns(1).shape(), ElementsAre(4, 8, 6, 3));
      EXPECT_EQ(h.columns(1).data_length(), 4u * 8 * 6 * 3);
    }
    EXPECT_EQ(h.columns(0).dtype(), proto::TENSOR_DTYPE_INT64);
  }
}

// On a float32 column the tail does not shrink the wire: auto runs it on the
// worker; client still ships it (float32, the ops in the header).
TEST_F(WorkerImplTest, FinishAutoRunsTheTailHereWhenItWouldNotShrinkTheWire) {
  const std::string tail = R"(
source: {dataset: {path: DIR}, columns: [image]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 6}}, {cast: {dtype: float32}}, {normalize: {mean: [0.5], std: [0.25]}}, {hwc2chw: {}}]}
  - batch: {size: 4}
finish: )";
  uint64_t job = 0;
  for (const std::string finish : {"auto", "client"}) {
    SCOPED_TRACE(finish);
    const StreamEvent b = FirstBatch(++job, tail + finish + "\n", 4, 4);
    ASSERT_EQ(b.kind, StreamEvent::kBatch) << b.status;
    const proto::Batch& h = b.batch.header;
    ASSERT_EQ(h.columns_size(), 1);
    EXPECT_EQ(h.columns(0).dtype(), proto::TENSOR_DTYPE_FLOAT32);
    if (finish == "auto") {
      EXPECT_EQ(h.finish_size(), 0);
      EXPECT_THAT(h.columns(0).shape(), ElementsAre(4, 3, 8, 6));
    } else {
      ASSERT_EQ(h.finish_size(), 1);
      EXPECT_THAT(h.columns(0).shape(), ElementsAre(4, 8, 6, 3));
    }
  }
}

// A RandomHorizontalFlip right before the tail goes to the client with it: the worker ships the
// uint8 pixels unmirrored, names the flip first and sends its draws (p: 1 mirrors every element;
// the bits against in-process: ServiceTest.BatchesFinishedByClientOrWorkerAreByteIdenticalToInProcess).
TEST_F(WorkerImplTest, AFlipBeforeTheTailShipsAsOneDrawPerElement) {
  const std::string spec = R"(
source: {dataset: {path: DIR}, columns: [image]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 6}}, {random_horizontal_flip: {p: P}}, {normalize: {mean: [0.5], std: [0.25]}}, {hwc2chw: {}}]}
  - batch: {size: 4}
)";
  std::string pixels[2];  // the shipped uint8 column under p: 1 and p: 0
  uint64_t job = 0;
  for (const std::string p : {"1", "0"}) {
    SCOPED_TRACE(p);
    const StreamEvent b = FirstBatch(++job, absl::StrReplaceAll(spec, {{"P", p}}), 4, 4);
    ASSERT_EQ(b.kind, StreamEvent::kBatch) << b.status;
    const proto::Batch& h = b.batch.header;
    ASSERT_EQ(h.finish_size(), 1);
    ASSERT_EQ(h.finish(0).ops_size(), 3);
    EXPECT_TRUE(h.finish(0).ops(0).has_random_horizontal_flip());
    EXPECT_TRUE(h.finish(0).ops(1).has_normalize());
    EXPECT_TRUE(h.finish(0).ops(2).has_hwc2chw());
    if (p == "1") {
      EXPECT_THAT(h.finish(0).mirrored(), ElementsAre(true, true, true, true));
    } else {
      EXPECT_THAT(h.finish(0).mirrored(), ElementsAre(false, false, false, false));
    }
    ASSERT_EQ(h.columns(0).dtype(), proto::TENSOR_DTYPE_UINT8);
    ASSERT_EQ(b.batch.columns.size(), 1u);
    pixels[job - 1].assign(reinterpret_cast<const char*>(b.batch.columns[0].data),
                           b.batch.columns[0].size);
  }
  EXPECT_EQ(pixels[0].size(), 4u * 8 * 6 * 3);
  EXPECT_EQ(pixels[0], pixels[1]);  // not mirrored on the worker
}

// On a float32 column under finish auto the worker runs the cut flip itself, element by
// element with the op's own draws: the same bits as the uncut pipeline (finish worker).
TEST_F(WorkerImplTest, ACutFlipTheWorkerRunsItselfGivesTheUncutPipelinesBits) {
  const std::string spec = R"(
seed: 9
source: {dataset: {path: DIR}, columns: [image]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 6}}, {cast: {dtype: float32}}, {random_horizontal_flip: {}}, {normalize: {mean: [0.5], std: [0.25]}}, {hwc2chw: {}}]}
  - batch: {size: 8}
finish: )";
  std::string images[2];
  uint64_t job = 0;
  for (const std::string finish : {"auto", "worker"}) {
    SCOPED_TRACE(finish);
    const StreamEvent b = FirstBatch(++job, spec + finish + "\n", 8, 8);
    ASSERT_EQ(b.kind, StreamEvent::kBatch) << b.status;
    EXPECT_EQ(b.batch.header.finish_size(), 0);
    EXPECT_THAT(b.batch.header.columns(0).shape(), ElementsAre(8, 3, 8, 6));
    images[job - 1].assign(reinterpret_cast<const char*>(b.batch.columns[0].data),
                           b.batch.columns[0].size);
  }
  EXPECT_EQ(images[0].size(), 8u * 3 * 8 * 6 * 4);
  EXPECT_EQ(images[0], images[1]);
}

TEST_F(WorkerImplTest, SplitYieldsItsGlobalIndicesInOrderAfterSkippedBatches) {
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  // Split 3: records [10, 20) of shard 0; the consumer already holds batch 0.
  *r.add_start() = MakeSplit(1, 0, /*position=*/5, /*split_id=*/3, 10, 20, 10, /*skip=*/1);
  Deliver(*w, r);
  auto reader = Open(*w, 1, 0, nullptr, Holds{.position = 5, .batches = 1});
  ASSERT_NE(reader, nullptr);

  StreamEvent b1 = reader->Next();
  ASSERT_EQ(b1.kind, StreamEvent::kBatch) << b1.status;
  EXPECT_EQ(b1.batch.header.batch_index(), 1u);
  EXPECT_FALSE(b1.batch.header.end_of_split());
  EXPECT_EQ(b1.batch.header.split_id(), 3u);
  EXPECT_EQ(b1.batch.header.key().position(), 5u);
  EXPECT_THAT(Ids(b1.batch.header), ElementsAre(14, 15, 16, 17));
  ASSERT_EQ(b1.batch.header.columns_size(), 1);
  EXPECT_EQ(b1.batch.header.columns(0).name(), "label");
  EXPECT_EQ(b1.batch.header.columns(0).dtype(), proto::TENSOR_DTYPE_INT64);
  EXPECT_THAT(b1.batch.header.columns(0).shape(), ElementsAre(4));
  std::vector<int64_t> labels(4);
  std::memcpy(labels.data(), b1.batch.columns[0].data, 32);
  EXPECT_THAT(labels, ElementsAre(14, 15, 16, 17));  // label = index % 1000

  StreamEvent b2 = reader->Next();
  ASSERT_EQ(b2.kind, StreamEvent::kBatch) << b2.status;
  EXPECT_EQ(b2.batch.header.batch_index(), 2u);
  EXPECT_FALSE(b2.batch.header.end_of_split());
  EXPECT_THAT(Ids(b2.batch.header), ElementsAre(18, 19));
  // Then the end-of-split marker: no columns, batch_index = the split's batch count.
  StreamEvent marker = reader->Next();
  ASSERT_EQ(marker.kind, StreamEvent::kBatch) << marker.status;
  EXPECT_TRUE(marker.batch.header.end_of_split());
  EXPECT_EQ(marker.batch.header.batch_index(), 3u);
  EXPECT_EQ(marker.batch.header.columns_size(), 0);
  EXPECT_EQ(marker.batch.header.global_indices_size(), 0);

  // The next heartbeat reports the split finished, counted from batch 0, and
  // the rate.
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(w->Heartbeat().ok());
  const proto::WorkerHeartbeatRequest hb = w->last_heartbeat();
  ASSERT_EQ(hb.splits_size(), 1);
  EXPECT_EQ(hb.splits(0).produced_batches(), 3u);
  EXPECT_TRUE(hb.splits(0).finished_producing());
  EXPECT_THAT(hb.known_job_ids(), ElementsAre(1));
  EXPECT_DOUBLE_EQ(hb.elements_per_second(), 3.0);  // 6 elements in 2 s
  // A heartbeat 10 ms later (sent early: a split ended) repeats the rate
  // instead of dividing nothing by 10 ms.
  clock_.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_DOUBLE_EQ(w->last_heartbeat().elements_per_second(), 3.0);
  EXPECT_EQ(hb.worker_id(), 101u);
  // The autoscaler's counters: with one job, its entry is the totals.
  ASSERT_EQ(hb.job_busy_size(), 1);
  EXPECT_EQ(hb.job_busy(0).job_id(), 1u);
  EXPECT_GT(hb.elements_total(), 0u);
  EXPECT_EQ(hb.job_busy(0).elements_total(), hb.elements_total());
  EXPECT_DOUBLE_EQ(hb.job_busy(0).busy_seconds_total(), hb.busy_seconds_total());
  // A job that is over is no longer reported; the totals keep it.
  proto::WorkerHeartbeatResponse over;
  over.add_finished_job_ids(1);
  Deliver(*w, over);
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->last_heartbeat().job_busy_size(), 0);
  EXPECT_EQ(w->last_heartbeat().elements_total(), hb.elements_total());
}

TEST_F(WorkerImplTest, ASlotOfAResumedEpochDeliversItsBatchRangeNumberedFromZero) {
  // Split 3 = records [10, 20), batch 4: batches [10..13] [14..17] [18, 19]. Position 5 is
  // batches [1, 2) of it, position 6 batches [1, end) with the first of them held already.
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  proto::SplitAssignment middle = MakeSplit(1, 0, /*position=*/5, /*split_id=*/3, 10, 20, 10, 0);
  middle.set_first_batch(1);
  middle.set_end_batch(2);
  *r.add_start() = middle;
  proto::SplitAssignment tail = MakeSplit(1, 0, /*position=*/6, /*split_id=*/3, 10, 20, 10, 1);
  tail.set_first_batch(1);
  *r.add_start() = tail;
  Deliver(*w, r);
  auto reader = Open(*w, 1, 0, nullptr, Holds{.position = 6, .batches = 1});
  ASSERT_NE(reader, nullptr);
  std::map<uint64_t, std::vector<std::pair<uint64_t, std::vector<uint64_t>>>> got;
  for (int i = 0; i < 4; ++i) {
    StreamEvent e = reader->Next();
    ASSERT_EQ(e.kind, StreamEvent::kBatch) << e.status;
    const proto::Batch& h = e.batch.header;
    std::vector<uint64_t> ids;
    if (!h.end_of_split()) ids = Ids(h);
    got[h.key().position()].push_back({h.batch_index(), ids});
  }
  using Sent = std::vector<std::pair<uint64_t, std::vector<uint64_t>>>;
  EXPECT_EQ(got[5], (Sent{{0, {14, 15, 16, 17}}, {1, {}}}));  // then its marker: 1 batch
  EXPECT_EQ(got[6], (Sent{{1, {18, 19}}, {2, {}}}));          // batch 0 of it was held
}

TEST_F(WorkerImplTest, ShuffledSplitFollowsTheSeededPermutationOfItsRange) {
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kShuffledLabels), 4, /*seed=*/11);
  *r.add_start() = MakeSplit(1, 0, 0, /*split_id=*/2, 16, 28, 16, /*skip=*/1, /*epoch=*/3);
  Deliver(*w, r);
  // The split's 12 records (16..27) in the order of
  // Permutation(12, MixSeed({job seed 11, split 2}), epoch 3) =
  // [3, 1, 10, 6, 8, 0, 11, 5, 9, 4, 7, 2] (pinned here: a change reorders
  // existing jobs); batch 0 (its first 4) is skipped.
  ASSERT_EQ(record::Permutation(12, MixSeed({11, 2}), 3),
            (std::vector<uint64_t>{3, 1, 10, 6, 8, 0, 11, 5, 9, 4, 7, 2}));
  const std::vector<uint64_t> want = {24, 16, 27, 21, 25, 20, 23, 18};
  auto reader = Open(*w, 1, 0, nullptr, Holds{.epoch = 3, .batches = 1});
  std::vector<uint64_t> got;
  for (int i = 0; i < 2; ++i) {
    StreamEvent e = reader->Next();
    ASSERT_EQ(e.kind, StreamEvent::kBatch) << e.status;
    EXPECT_EQ(e.batch.header.batch_index(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ(e.batch.header.key().epoch(), 3u);
    for (uint64_t id : Ids(e.batch.header)) got.push_back(id);
  }
  EXPECT_EQ(got, want);
  EXPECT_NE(got[0], 20u);  // really shuffled (this seed)
}

// One byte bound for all consumers of all jobs: with room for 3 batches, two
// consumers (of two jobs) hold 3 batches together (4 if the second consumer's
// first batch came when the others had filled the bound), not 2 x 8; each gets
// its batches.
TEST_F(WorkerImplTest, QueueBytesBoundAllConsumersTogether) {
  const int64_t batch_bytes = 4 * 32 * 32 * 3 + 4 * 8;
  auto w = MakeWorker(/*queue_batches=*/8, /*roots=*/{},
                      /*queue_bytes=*/3 * batch_bytes);
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kImages), 4);
  *r.add_jobs() = MakeJob(2, Yaml(kImages), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);  // 10 batches each
  *r.add_start() = MakeSplit(2, 0, 0, 0, 0, 40, 0, 0);
  Deliver(*w, r);
  ASSERT_TRUE(Eventually([&] { return w->blocked_producers() == 2; }));
  EXPECT_GE(w->queued_batches(), 3u);
  EXPECT_LE(w->queued_batches(), 4u);
  EXPECT_EQ(w->queued_bytes(), static_cast<int64_t>(w->queued_batches()) * batch_bytes);
  for (uint64_t job : {1, 2}) {  // both consumers progress
    auto reader = Open(*w, job, 0);
    ASSERT_NE(reader, nullptr);
    StreamEvent e = reader->Next();
    ASSERT_EQ(e.kind, StreamEvent::kBatch) << e.status;
    EXPECT_EQ(e.batch.header.key().job_id(), job);
  }
  w->Stop();
}

TEST_F(WorkerImplTest, FullQueueBlocksTheProducerWithBoundedMemoryUntilRead) {
  auto w = MakeWorker(/*queue_batches=*/2);
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kImages), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);  // 10 batches
  Deliver(*w, r);
  ASSERT_TRUE(Eventually([&] { return w->blocked_producers() == 1; }));
  EXPECT_EQ(w->queued_batches(), 2u);
  const int64_t batch_bytes = 4 * 32 * 32 * 3 + 4 * 8;
  EXPECT_EQ(w->queued_bytes(), 2 * batch_bytes);
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->last_heartbeat().splits(0).produced_batches(), 2u);
  EXPECT_FALSE(w->last_heartbeat().splits(0).finished_producing());
  EXPECT_EQ(w->last_heartbeat().queue_depth(), 2u);
  EXPECT_EQ(w->last_heartbeat().queue_capacity(), 2u);
  // Queue + look-ahead + the executor's bounded queues: far below the split's
  // 10 batches.
  EXPECT_LT(w->peak_bytes(), 8 * batch_bytes);

  auto reader = Open(*w, 1, 0);
  for (uint64_t i = 0; i < 10; ++i) {
    StreamEvent e = reader->Next();
    ASSERT_EQ(e.kind, StreamEvent::kBatch) << e.status;
    EXPECT_EQ(e.batch.header.batch_index(), i);
    EXPECT_FALSE(e.batch.header.end_of_split());
    EXPECT_EQ(e.batch.header.global_indices(0), 4 * i);
  }
  StreamEvent marker = reader->Next();
  ASSERT_EQ(marker.kind, StreamEvent::kBatch) << marker.status;
  EXPECT_TRUE(marker.batch.header.end_of_split());
  EXPECT_EQ(marker.batch.header.batch_index(), 10u);
}

TEST_F(WorkerImplTest, DropStopsProductionAndDiscardsQueuedBatches) {
  auto w = MakeWorker(/*queue_batches=*/2);
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kImages), 4);
  const proto::SplitAssignment split = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);
  *r.add_start() = split;
  Deliver(*w, r);
  ASSERT_TRUE(Eventually([&] { return w->blocked_producers() == 1; }));
  proto::WorkerHeartbeatResponse drop;
  *drop.add_drop() = split.key();
  Deliver(*w, drop);
  EXPECT_EQ(w->queued_batches(), 0u);
  EXPECT_EQ(w->queued_bytes(), 0);
  ASSERT_TRUE(Eventually([&] { return w->blocked_producers() == 0; }));
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->last_heartbeat().splits_size(), 0);
  EXPECT_EQ(w->queued_batches(), 0u);  // nothing produced after the drop
}

TEST_F(WorkerImplTest, JobOutsideTheDataRootsIsRefusedNamingTheRoots) {
  sluice::testing::TempDir other;
  auto w = MakeWorker(8, {other.Join("a"), other.Join("b")});
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 8, 0, 0);
  Deliver(*w, r);
  absl::Status status;
  EXPECT_EQ(Open(*w, 1, 0, &status), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(), absl::StrCat("pipeline source '", dir_.Join("ds"),
                                           "' is outside the worker's --data-root (",
                                           other.Join("a"), ", ", other.Join("b"), ")"));
  EXPECT_EQ(w->queued_batches(), 0u);
  // The refused job's split is reported finished producing: it does not hold
  // one of the worker's --capacity slots while its consumer is told the error.
  ASSERT_TRUE(Eventually([&] {
    EXPECT_TRUE(w->Heartbeat().ok());
    const proto::WorkerHeartbeatRequest& beat = w->last_heartbeat();
    return beat.splits_size() == 1 && beat.splits(0).finished_producing();
  }));
  EXPECT_EQ(w->last_heartbeat().splits(0).produced_batches(), 0u);
}

TEST_F(WorkerImplTest, InvalidPipelineIsRefusedWithTheValidatorsMessage) {
  auto w = MakeWorker();
  const std::string yaml = absl::StrReplaceAll(R"(
source: {dataset: {path: DIR}, columns: [image]}
nodes:
  - map: {input_columns: [image], ops: [{resize: {height: 0, width: 8}}]}
  - batch: {size: 4}
)",
                                               {{"DIR", dir_.Join("ds")}});
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto expected = pipeline::Validate(*spec);
  ASSERT_FALSE(expected.ok());
  ASSERT_EQ(expected.status().code(), absl::StatusCode::kInvalidArgument);

  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, yaml, 4);
  Deliver(*w, r);
  absl::Status status;
  EXPECT_EQ(Open(*w, 1, 0, &status), nullptr);
  EXPECT_EQ(status, expected.status());
}

TEST_F(WorkerImplTest, JobOverThePipelineLimitsIsRefusedNamingTheFlag) {
  // kImages has 2 nodes (map, batch) and 2 map ops: 4 against the limit.
  auto w = MakeWorker(8, {}, 0, {.max_pipeline_nodes = 3});
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kImages), 4);
  *r.add_jobs() = MakeJob(2, Yaml(kLabels), 4);
  Deliver(*w, r);
  absl::Status status;
  EXPECT_EQ(Open(*w, 1, 0, &status), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "pipeline spec has 4 nodes, more than --max-pipeline-nodes 3");
  EXPECT_NE(Open(*w, 2, 0), nullptr);  // 1 node

  const proto::JobInfo job = MakeJob(1, Yaml(kLabels), 4);
  const int64_t bytes = static_cast<int64_t>(job.pipeline().size());
  auto small = MakeWorker(8, {}, 0, {.max_pipeline_bytes = bytes - 1});
  proto::WorkerHeartbeatResponse r2;
  *r2.add_jobs() = job;
  Deliver(*small, r2);
  EXPECT_EQ(Open(*small, 1, 0, &status), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), absl::StrCat("pipeline spec is ", bytes,
                                           " bytes, more than --max-pipeline-bytes ", bytes - 1));
}

TEST_F(WorkerImplTest, BatchOverMaxBatchBytesEndsTheStreamNamingTheFlag) {
  // A batch of 4 int64 labels is 32 bytes.
  auto w = MakeWorker(8, {}, 0, {.max_batch_bytes = 31});
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  *r.add_start() = MakeSplit(1, 0, 0, /*split_id=*/0, 0, 8, 0, 0);
  Deliver(*w, r);
  auto reader = Open(*w, 1, 0);
  ASSERT_NE(reader, nullptr);
  StreamEvent end = reader->Next();
  ASSERT_EQ(end.kind, StreamEvent::kEnd);
  EXPECT_EQ(end.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(end.status.message(),
              HasSubstr("job 1 slot 0 (split 0 positions 0..8) batch 0: a batch "
                        "of 32 bytes is more than --max-batch-bytes 31"));
}

TEST_F(WorkerImplTest, CorruptRecordEndsTheStreamWithDataLossAfterEarlierBatches) {
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kImages, "bad"), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 12, 0, 0);
  Deliver(*w, r);
  auto reader = Open(*w, 1, 0);
  StreamEvent first = reader->Next();
  ASSERT_EQ(first.kind, StreamEvent::kBatch) << first.status;
  StreamEvent end = reader->Next();
  ASSERT_EQ(end.kind, StreamEvent::kEnd);
  EXPECT_EQ(end.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(end.status.message(), HasSubstr("record 6"));
}

TEST_F(WorkerImplTest, UnknownJobAndWrongVersionAndConsumerAreRejected) {
  auto w = MakeWorker();
  absl::Status status;
  EXPECT_EQ(Open(*w, 9, 0, &status), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);

  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  Deliver(*w, r);
  EXPECT_EQ(Open(*w, 1, 1, &status), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  proto::GetBatchesRequest request;
  request.set_protocol_version(kProtocolVersion + 1);
  request.set_job_id(1);
  EXPECT_EQ(w->OpenStream(request, service::Identity::Development(), [] {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerImplTest, StreamsPerIdentityAreCappedAndFreedWhenClosed) {
  service::ServiceLimits limits;
  limits.max_streams_per_identity = 2;
  auto w = MakeWorker(/*queue_batches=*/8, /*roots=*/{}, /*queue_bytes=*/0, limits);
  proto::WorkerHeartbeatResponse r;
  proto::JobInfo alices = MakeJob(1, Yaml(kLabels), 4, /*seed=*/7,
                                  /*consumers=*/3);
  alices.set_job_name("alice/train");
  proto::JobInfo bobs = MakeJob(2, Yaml(kLabels), 4);
  bobs.set_job_name("bob/train");
  *r.add_jobs() = alices;
  *r.add_jobs() = bobs;
  Deliver(*w, r);
  const service::Identity alice{.user = "alice", .groups = {"sluice:trainers"}};
  const service::Identity bob{.user = "bob", .groups = {"sluice:trainers"}};
  auto open = [&](const service::Identity& who, uint64_t job, uint32_t consumer) {
    proto::GetBatchesRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_consumer_index(consumer);
    return w->OpenStream(request, who, [] {});
  };
  absl::StatusOr<uint64_t> first = open(alice, 1, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<uint64_t> second = open(alice, 1, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<uint64_t> third = open(alice, 1, 2);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.status().message(),
            "alice already holds 2 streams on this worker "
            "(--max-streams-per-identity 2): wait for one to finish, or ask an "
            "operator to raise --max-streams-per-identity");
  absl::StatusOr<uint64_t> bobs_stream = open(bob, 2, 0);
  ASSERT_TRUE(bobs_stream.ok()) << bobs_stream.status();
  w->CloseStream(*first);
  third = open(alice, 1, 2);
  ASSERT_TRUE(third.ok()) << third.status();
  w->CloseStream(*second);
  w->CloseStream(*third);
  w->CloseStream(*bobs_stream);
}

TEST_F(WorkerImplTest, LostWorkerDropsEverythingAndRegistersAgain) {
  auto w = MakeWorker(/*queue_batches=*/2);
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kImages), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);
  Deliver(*w, r);
  ASSERT_TRUE(Eventually([&] { return w->blocked_producers() == 1; }));
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.script.push_back(absl::NotFoundError("worker 101 is not registered"));
  }
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->worker_id(), 102u);
  EXPECT_EQ(w->queued_batches(), 0u);
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->last_heartbeat().worker_id(), 102u);
  EXPECT_EQ(w->last_heartbeat().splits_size(), 0);
}

TEST_F(WorkerImplTest, DrainingEndsAStreamOkOnceItsSplitsAreSent) {
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 8, 0, 0);
  Deliver(*w, r);
  auto reader = Open(*w, 1, 0);
  ASSERT_EQ(reader->Next().kind, StreamEvent::kBatch);
  ASSERT_EQ(reader->Next().kind, StreamEvent::kBatch);
  StreamEvent marker = reader->Next();
  ASSERT_EQ(marker.kind, StreamEvent::kBatch);
  ASSERT_TRUE(marker.batch.header.end_of_split());
  ASSERT_TRUE(w->Drain().ok());
  StreamEvent end = reader->Next();
  EXPECT_EQ(end.kind, StreamEvent::kEnd);
  EXPECT_TRUE(end.status.ok()) << end.status;
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_EQ(fake_.drains, 1);
  }
  proto::WorkerHeartbeatResponse exit;
  exit.set_draining(true);
  exit.set_may_exit(true);
  Deliver(*w, exit);
  EXPECT_TRUE(w->may_exit());
}

// Reads `consumer`'s stream until `splits` end-of-split markers came; returns
// each split's record ids by position, checking that batches come in order,
// never mix two splits and hold `batch` records but the split's last.
std::map<uint64_t, std::vector<uint64_t>> ReadSplits(std::function<StreamEvent()> next, int splits,
                                                     uint64_t batch) {
  std::map<uint64_t, std::vector<uint64_t>> got;
  std::map<uint64_t, uint64_t> batches;
  for (int ended = 0; ended < splits;) {
    StreamEvent e = next();
    EXPECT_EQ(e.kind, StreamEvent::kBatch) << e.status;
    if (e.kind != StreamEvent::kBatch) break;
    const proto::Batch& h = e.batch.header;
    const uint64_t pos = h.key().position();
    EXPECT_EQ(h.batch_index(), batches[pos]) << "position " << pos;
    if (h.end_of_split()) {
      ++ended;
      continue;
    }
    EXPECT_EQ(got[pos].size(), batches[pos] * batch) << "a short batch inside";
    ++batches[pos];
    got[pos].insert(got[pos].end(), h.global_indices().begin(), h.global_indices().end());
  }
  return got;
}

// A split that ends is reported at once, not at the next heartbeat period, so
// that the dispatcher hands the freed capacity its next split now (with splits
// that last about one period, producers stood idle for up to half the time).
// The worker's clock never moves here, so its hour-long period never passes:
// only the early report can carry the finished split.
TEST_F(WorkerImplTest, ASplitThatEndsIsReportedBeforeTheHeartbeatPeriod) {
  std::unique_ptr<WorkerImpl> w = MakeThreadedWorker(absl::Hours(1), 10);
  ASSERT_NE(w, nullptr);
  const absl::Time start = manual_clock_.Now();
  ASSERT_TRUE(w->Start().ok());  // registers, heartbeats, gets the split
  auto finished_reported = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake_.mu) {
    for (const proto::WorkerHeartbeatRequest& h : fake_.heartbeats) {
      for (const proto::WorkerSplitProgress& p : h.splits()) {
        if (p.finished_producing()) return true;
      }
    }
    return false;
  };
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_TRUE(fake_.mu.AwaitWithTimeout(absl::Condition(&finished_reported), absl::Seconds(20)));
    // The first heartbeat brought the split; a later one reports it finished.
    ASSERT_GE(fake_.heartbeats.size(), 2u);
    EXPECT_EQ(fake_.heartbeats[0].splits_size(), 0);
  }
  EXPECT_EQ(manual_clock_.Now(), start);  // no period passed
  w->Stop();
}

// A worker that could produce more and has a consumer attached asks for its
// next split soon instead of at its interval (8 s here): at an epoch boundary
// the consumer reports the epoch done after the worker's split ended, and the
// next epoch's split is handed out then. The extra heartbeats back off (1 s,
// 2 s, 4 s, then the interval), so a long idle episode costs three. The
// worker's clock moves only when the test advances it.
TEST_F(WorkerImplTest, AnIdleWorkerWithAConsumerAsksForItsNextSplitSoon) {
  std::unique_ptr<WorkerImpl> created = MakeThreadedWorker(absl::Seconds(8), 6);
  ASSERT_NE(created, nullptr);
  WorkerImpl& w = *created;
  ASSERT_TRUE(w.Start().ok());  // registers; its thread heartbeats
  std::unique_ptr<Reader> reader;
  absl::Status open;
  ASSERT_TRUE(Eventually([&] {  // the job arrives
    reader = Open(w, 1, 0, &open);
    return reader != nullptr;
  })) << open;
  // The ids of the next split, to its end-of-split marker.
  auto read_split = [&](std::vector<uint64_t>* ids) {
    while (true) {
      StreamEvent e = reader->Next();
      ASSERT_EQ(e.kind, StreamEvent::kBatch) << e.status;
      if (e.batch.header.end_of_split()) return;
      for (uint64_t id : Ids(e.batch.header)) ids->push_back(id);
    }
  };
  std::vector<uint64_t> ids;
  read_split(&ids);  // split 0: the worker is idle from its end
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_THAT(ids, ElementsAre(0, 1, 2, 3, 4, 5));
  // The early heartbeat reports split 0 finished and starts the idle episode;
  // once the thread sleeps again, its next heartbeat is due 1 s later.
  auto finished_reported = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake_.mu) {
    return !fake_.heartbeats.empty() && fake_.heartbeats.back().splits_size() == 1 &&
           fake_.heartbeats.back().splits(0).finished_producing();
  };
  {
    absl::MutexLock lock(&fake_.mu);
    ASSERT_TRUE(fake_.mu.AwaitWithTimeout(absl::Condition(&finished_reported), absl::Seconds(20)));
  }
  ASSERT_TRUE(manual_clock_.AwaitSleepsAbove(manual_clock_.sleeps()));
  // The consumer finishing its epoch.
  manual_clock_.Advance(absl::Milliseconds(400));
  Script([] {
    proto::WorkerHeartbeatResponse next;
    *next.add_start() = MakeSplit(1, 0, 0, 1, 6, 10, 6, 0, /*epoch=*/1);
    return next;
  }());
  // 1 s into the idle episode: the backed-off heartbeat takes the split (the
  // periodic one would come at 8 s).
  manual_clock_.Advance(absl::Milliseconds(600));
  ids.clear();
  read_split(&ids);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_THAT(ids, ElementsAre(6, 7, 8, 9));
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_LE(fake_.heartbeats.size(), 8u);
  }
  reader.reset();
  w.Stop();
}

// Twelve splits of two jobs (one shuffled), two consumers each, of sizes that
// are not multiples of the batch, come in one heartbeat and run one after the
// other on the producers' long-lived executors: each consumer gets exactly its
// splits' records in each split's order, nothing lost, repeated or moved to
// another split.
TEST_F(WorkerImplTest, SplitsOfTwoJobsInterleaveOnLongLivedExecutors) {
  auto w = MakeWorker(/*queue_batches=*/64);
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4, /*seed=*/7, /*consumers=*/2);
  *r.add_jobs() = MakeJob(2, Yaml(kShuffledLabels), 4, /*seed=*/11, /*consumers=*/2);
  std::map<std::pair<uint64_t, uint32_t>, std::map<uint64_t, std::vector<uint64_t>>> want;
  uint64_t split_id = 0;
  for (uint64_t pos = 0; pos < 3; ++pos) {
    for (uint64_t job : {1, 2}) {
      for (uint32_t consumer : {0, 1}) {
        const uint64_t begin = (split_id * 7) % 30;
        const uint64_t n = 3 + (split_id % 3) * 4;  // 3, 7 or 11 records
        *r.add_start() = MakeSplit(job, consumer, pos, split_id, begin, begin + n, begin, 0);
        want[{job, consumer}][pos] = record::SplitRecordOrder(begin, n, /*shuffle=*/job == 2,
                                                              job == 1 ? 7 : 11, split_id, 0);
        ++split_id;
      }
    }
  }
  Deliver(*w, r);
  for (uint64_t job : {1, 2}) {
    for (uint32_t consumer : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "job " << job << " consumer " << consumer);
      auto reader = Open(*w, job, consumer);
      ASSERT_NE(reader, nullptr);
      EXPECT_EQ(ReadSplits([&] { return reader->Next(); }, 3, 4), (want[{job, consumer}]));
    }
  }
}

// A job's pipeline threads start once per producer, not once per split: with
// one producer, twelve more splits start no thread.
TEST_F(WorkerImplTest, AJobsPipelineThreadsAreNotRestartedPerSplit) {
  WorkerOptions options;
  options.address = "127.0.0.1:1";
  options.data_roots = {dir_.path()};
  options.threads = 1;  // no room for autotune to add one
  options.capacity = 1;
  options.heartbeat_thread = false;
  options.clock = &clock_;
  auto created = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
  ASSERT_TRUE(created.ok()) << created.status();
  WorkerImpl& w = **created;
  ASSERT_TRUE(w.Start().ok());
  proto::WorkerHeartbeatResponse first;
  *first.add_jobs() = MakeJob(1, Yaml(kImages), 4);
  *first.add_start() = MakeSplit(1, 0, 0, 0, 0, 10, 0, 0);
  Deliver(w, first);
  auto reader = Open(w, 1, 0);
  ASSERT_NE(reader, nullptr);
  std::map<uint64_t, std::vector<uint64_t>> want = {
      {0, record::SplitRecordOrder(0, 10, false, 7, 0, 0)}};
  EXPECT_EQ(ReadSplits([&] { return reader->Next(); }, 1, 4), want);
  const uint64_t started = w.pipeline_thread_starts();
  EXPECT_GT(started, 0u);

  proto::WorkerHeartbeatResponse more;
  want.clear();
  for (uint64_t pos = 1; pos <= 12; ++pos) {
    const uint64_t begin = (pos * 3) % 30;
    *more.add_start() = MakeSplit(1, 0, pos, pos, begin, begin + 10, begin, 0);
    want[pos] = record::SplitRecordOrder(begin, 10, false, 7, pos, 0);
  }
  Deliver(w, more);
  EXPECT_EQ(ReadSplits([&] { return reader->Next(); }, 12, 4), want);
  EXPECT_EQ(w.pipeline_thread_starts(), started);
  reader.reset();
  w.Stop();
}

// One budget for the whole worker, pipelines included: sixteen consumers with
// eight-batch queues and 98 KB batches would hold 16 x 8 batches (12.6 MB)
// under per-consumer bounds. With a budget of two batches, the queues hold
// the budget plus one batch per consumer whose queue was empty (so that every
// consumer progresses; before anyone reads, only the two whose splits the two
// producers run), and each producer's pipeline stops feeding once an output
// waits for its reader, keeping what was already in flight behind it. For
// this pipeline (2 threads, batch 8) that is at most, in batches: 2 in the
// output queue, 2 held by batch threads waiting to push, 2 being filled, 3 of
// records in the batch window (2 x 8 + 4 x 2 threads), and under 1 of
// elements in the stage queue and threads: 10 per producer (measured: 1.1).
// Every consumer then gets all its records.
TEST_F(WorkerImplTest, OneMemoryBudgetBoundsQueuesAndPipelinesOfAllConsumers) {
  constexpr char kBig[] = R"(
on_error: fail
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 64, width: 64}}]}
  - batch: {size: 8}
)";
  const int64_t batch_bytes = 8 * 64 * 64 * 3 + 8 * 8;
  const int64_t budget = 2 * batch_bytes;
  constexpr int kConsumers = 16;
  constexpr int kProducers = 2;  // MakeWorker's capacity
  auto w = MakeWorker(/*queue_batches=*/8, /*roots=*/{}, budget);
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kBig), 8, /*seed=*/7, /*consumers=*/kConsumers);
  std::map<uint32_t, std::map<uint64_t, std::vector<uint64_t>>> want;
  for (uint64_t pos = 0; pos < 2; ++pos) {  // 2 splits of 3 batches each
    for (uint32_t c = 0; c < kConsumers; ++c) {
      const uint64_t id = pos * kConsumers + c;
      const uint64_t begin = (id * 5) % 16;
      *r.add_start() = MakeSplit(1, c, pos, id, begin, begin + 24, begin, 0);
      want[c][pos] = record::SplitRecordOrder(begin, 24, false, 7, id, 0);
    }
  }
  Deliver(*w, r);
  ASSERT_TRUE(Eventually([&] { return w->blocked_producers() == kProducers; }));
  const int64_t bound = budget + kProducers * batch_bytes  // empty queues
                        + kProducers * 10 * batch_bytes;   // in flight
  EXPECT_LE(w->queued_bytes(), budget + kProducers * batch_bytes);
  EXPECT_LE(w->budget_peak_bytes(), bound);
  // The trainers read all at once (a producer waits for the consumer it
  // serves).
  std::vector<std::map<uint64_t, std::vector<uint64_t>>> got(kConsumers);
  std::vector<std::thread> trainers;
  for (uint32_t c = 0; c < kConsumers; ++c) {
    trainers.emplace_back([&, c] {
      auto reader = Open(*w, 1, c);
      if (reader != nullptr) {
        got[c] = ReadSplits([&] { return reader->Next(); }, 2, 8);
      }
    });
  }
  for (std::thread& t : trainers) t.join();
  for (uint32_t c = 0; c < kConsumers; ++c) EXPECT_EQ(got[c], want[c]) << c;
  // While they read, a producer moves on from a consumer whose last batches
  // are still queued, so every consumer may hold one batch the budget let in.
  const int64_t reading = bound + (kConsumers - kProducers) * batch_bytes;
  EXPECT_LE(w->budget_peak_bytes(), reading);
  EXPECT_LE(w->peak_bytes(), reading);
}

TEST_F(WorkerImplTest, NewerStreamSupersedesTheOlderOne) {
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  Deliver(*w, r);
  auto old_reader = Open(*w, 1, 0);
  auto new_reader = Open(*w, 1, 0);
  StreamEvent e = old_reader->Next();
  EXPECT_EQ(e.kind, StreamEvent::kEnd);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w->PollStream(new_reader->id).kind, StreamEvent::kPending);
}

// The assignment channel: the dispatcher says work waits, and the worker heartbeats at once,
// though its interval (an hour) never passes on its clock.
TEST_F(WorkerImplTest, AWatchAnsweredWithWorkBringsAHeartbeatAtOnce) {
  {
    absl::MutexLock lock(&fake_.mu);
    fake_.watch = true;
    fake_.watch_script.push_back(true);
  }
  WorkerOptions options;
  options.address = "127.0.0.1:1";
  options.data_roots = {dir_.path()};
  options.heartbeat_interval = absl::Hours(1);
  options.clock = &manual_clock_;
  auto w = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Time start = manual_clock_.Now();
  ASSERT_TRUE((*w)->Start().ok());
  auto second_heartbeat = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake_.mu) {
    return fake_.heartbeats.size() >= 2;
  };
  {
    absl::MutexLock lock(&fake_.mu);
    EXPECT_TRUE(fake_.mu.AwaitWithTimeout(absl::Condition(&second_heartbeat), absl::Seconds(20)));
    ASSERT_GE(fake_.watches.size(), 1u);
    EXPECT_EQ(fake_.watches[0].worker_id(), 101u);
    EXPECT_EQ(fake_.watches[0].max_wait_seconds(), 3600);
  }
  EXPECT_EQ(manual_clock_.Now(), start);  // no interval passed
  (*w)->Stop();                           // ends the watch call in progress (CancelWatch)
  absl::MutexLock lock(&fake_.mu);
  EXPECT_TRUE(fake_.watch_cancelled);
}

// The dispatcher checks a registered dataset's shard record counts through a worker: each
// DescribeTask of a heartbeat's answer is read (the manifest under --data-root) and answered in
// the next heartbeat, once; what the worker may not read is answered with its error.
TEST_F(WorkerImplTest, DescribeTasksAreAnsweredInTheNextHeartbeat) {
  auto w = MakeWorker();
  proto::WorkerHeartbeatResponse response;
  proto::Pipeline inside;
  inside.mutable_source()->mutable_dataset()->set_path(dir_.Join("ds"));
  proto::DescribeTask* task = response.add_describe();
  task->set_ticket(7);
  task->set_pipeline(inside.SerializeAsString());
  proto::Pipeline outside;
  outside.mutable_source()->mutable_dataset()->set_path("/etc");
  task = response.add_describe();
  task->set_ticket(8);
  task->set_pipeline(outside.SerializeAsString());
  Deliver(*w, response);
  ASSERT_TRUE(w->Heartbeat().ok());
  const proto::WorkerHeartbeatRequest hb = w->last_heartbeat();
  ASSERT_EQ(hb.described_size(), 2);
  EXPECT_EQ(hb.described(0).ticket(), 7u);
  EXPECT_EQ(hb.described(0).error_code(), 0);
  ASSERT_EQ(hb.described(0).shard_record_counts_size(), 1);
  EXPECT_EQ(hb.described(0).shard_record_counts(0), 40u);
  EXPECT_EQ(hb.described(1).ticket(), 8u);
  EXPECT_EQ(hb.described(1).error_code(),
            static_cast<int32_t>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(hb.described(1).error_message(),
              HasSubstr("pipeline source '/etc' is outside the worker's --data-root"));
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->last_heartbeat().described_size(), 0);
}

// ---- Production groups (docs/sharing.md) ----

double EventCount(prometheus::Registry& registry, const std::string& name,
                  const std::string& event) {
  double total = 0;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "event" && l.value == event) total += m.counter.value;
      }
    }
  }
  return total;
}

class SharedProductionTest : public WorkerImplTest {
 protected:
  std::unique_ptr<WorkerImpl> MakeSharingWorker(size_t queue_batches) {
    WorkerOptions options;
    options.address = "127.0.0.1:1";
    options.data_roots = {dir_.path()};
    options.threads = 2;
    options.capacity = 2;
    options.queue_batches = queue_batches;
    options.queue_bytes = 0;
    options.heartbeat_thread = false;
    options.clock = &clock_;
    options.share_detach_after = absl::Milliseconds(50);
    options.registry = &registry_;
    auto w = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->Start().ok());
    return std::move(*w);
  }

  // Slot 0 of consumer 0 of `job`: records [0, 40) of shard 0, 10 batches of 4.
  static proto::SplitAssignment Slot(uint64_t job, uint64_t skip, uint64_t group) {
    proto::SplitAssignment a = MakeSplit(job, 0, 0, 0, 0, 40, 0, skip);
    a.set_share_group(group);
    return a;
  }

  // Reads the stream to its marker: batch index -> (ids, label bytes).
  static std::map<uint64_t, std::pair<std::vector<uint64_t>, std::string>> ReadAll(
      Reader& reader, uint64_t* marker_index) {
    std::map<uint64_t, std::pair<std::vector<uint64_t>, std::string>> out;
    while (true) {
      StreamEvent e = reader.Next();
      EXPECT_EQ(e.kind, StreamEvent::kBatch) << e.status;
      if (e.kind != StreamEvent::kBatch) return out;
      if (e.batch.header.end_of_split()) {
        *marker_index = e.batch.header.batch_index();
        return out;
      }
      const service::ColumnBytes& col = e.batch.columns[0];
      EXPECT_FALSE(out.contains(e.batch.header.batch_index()));
      out[e.batch.header.batch_index()] = {
          Ids(e.batch.header), std::string(reinterpret_cast<const char*>(col.data), col.size)};
    }
  }

  prometheus::Registry registry_;
};

TEST_F(SharedProductionTest, AGroupsSlotIsProducedOnceForEveryMember) {
  auto w = MakeSharingWorker(/*queue_batches=*/16);
  proto::WorkerHeartbeatResponse r;
  for (uint64_t job : {1, 2, 3}) *r.add_jobs() = MakeJob(job, Yaml(kShuffledLabels), 4);
  *r.add_start() = Slot(1, /*skip=*/0, /*group=*/77);
  *r.add_start() = Slot(2, /*skip=*/0, /*group=*/77);
  *r.add_start() = Slot(3, /*skip=*/3, /*group=*/77);  // its consumer holds 3 batches
  Deliver(*w, r);
  auto r1 = Open(*w, 1, 0);
  auto r2 = Open(*w, 2, 0);
  auto r3 = Open(*w, 3, 0, nullptr, Holds{.batches = 3});
  uint64_t m1 = 0, m2 = 0, m3 = 0;
  const auto b1 = ReadAll(*r1, &m1);
  const auto b2 = ReadAll(*r2, &m2);
  const auto b3 = ReadAll(*r3, &m3);
  EXPECT_EQ(m1, 10u);
  EXPECT_EQ(m2, 10u);
  EXPECT_EQ(m3, 10u);
  ASSERT_EQ(b1.size(), 10u);
  EXPECT_EQ(b1, b2);  // the same bytes, each job under its own key
  ASSERT_EQ(b3.size(), 7u);
  EXPECT_EQ(b3.begin()->first, 3u);
  for (const auto& [index, batch] : b3) EXPECT_EQ(batch, b1.at(index));
  std::vector<uint64_t> ids;
  for (const auto& [index, batch] : b1)
    ids.insert(ids.end(), batch.first.begin(), batch.first.end());
  std::sort(ids.begin(), ids.end());
  std::vector<uint64_t> expected(40);
  for (uint64_t i = 0; i < 40; ++i) expected[i] = i;
  EXPECT_EQ(ids, expected);
  // One production served three tasks.
  EXPECT_EQ(EventCount(registry_, "sluice_worker_splits_total", "started"), 1);
  EXPECT_EQ(EventCount(registry_, "sluice_worker_shared_splits_total", "joined"), 2);
  EXPECT_EQ(EventCount(registry_, "sluice_worker_shared_splits_total", "detached"), 0);
  // The heartbeat counts the group's slot as one production.
  ASSERT_TRUE(w->Heartbeat().ok());
  EXPECT_EQ(w->last_heartbeat().splits_size(), 3);
}

TEST_F(SharedProductionTest, AMemberThatStopsReadingIsDetachedAndGetsItsRestAlone) {
  auto w = MakeSharingWorker(/*queue_batches=*/1);
  proto::WorkerHeartbeatResponse r;
  for (uint64_t job : {1, 2}) *r.add_jobs() = MakeJob(job, Yaml(kShuffledLabels), 4);
  *r.add_start() = Slot(1, 0, 77);
  *r.add_start() = Slot(2, 0, 77);
  Deliver(*w, r);
  // Job 2's consumer reads nothing: job 1 gets its whole slot all the same.
  auto r1 = Open(*w, 1, 0);
  uint64_t m1 = 0;
  const auto b1 = ReadAll(*r1, &m1);
  EXPECT_EQ(m1, 10u);
  ASSERT_EQ(b1.size(), 10u);
  EXPECT_EQ(EventCount(registry_, "sluice_worker_shared_splits_total", "detached"), 1);
  // Job 2 then reads: every batch once, in order, the same bytes, from its own production.
  auto r2 = Open(*w, 2, 0);
  uint64_t m2 = 0;
  const auto b2 = ReadAll(*r2, &m2);
  EXPECT_EQ(m2, 10u);
  EXPECT_EQ(b2, b1);
  EXPECT_EQ(EventCount(registry_, "sluice_worker_splits_total", "started"), 2);
}

TEST_F(SharedProductionTest, SlotsOfAnotherGroupOrPositionAreNotShared) {
  auto w = MakeSharingWorker(/*queue_batches=*/16);
  proto::WorkerHeartbeatResponse r;
  for (uint64_t job : {1, 2, 3}) *r.add_jobs() = MakeJob(job, Yaml(kShuffledLabels), 4);
  *r.add_start() = Slot(1, 0, 77);
  *r.add_start() = Slot(2, 0, 78);  // another group
  proto::SplitAssignment other = MakeSplit(3, 0, /*position=*/1, 0, 0, 40, 0, 0);
  other.set_share_group(77);  // another slot
  *r.add_start() = other;
  Deliver(*w, r);
  for (uint64_t job : {1, 2, 3}) {
    auto reader = Open(*w, job, 0);
    uint64_t marker = 0;
    EXPECT_EQ(ReadAll(*reader, &marker).size(), 10u);
  }
  EXPECT_EQ(EventCount(registry_, "sluice_worker_splits_total", "started"), 3);
  EXPECT_EQ(EventCount(registry_, "sluice_worker_shared_splits_total", "joined"), 0);
}

// ---- Paused consumers (task_runner.h) ----

class PausedConsumerTest : public WorkerImplTest {
 protected:
  // One producer, queues of 2 batches, splits that pause after 500 ms unread (long enough that a
  // test thread about to read is not taken for a trainer that stopped, even under ASan).
  std::unique_ptr<WorkerImpl> MakePausingWorker(
      absl::Duration pause_unread_after = absl::Milliseconds(500)) {
    WorkerOptions options;
    options.address = "127.0.0.1:1";
    options.data_roots = {dir_.path()};
    options.threads = 1;
    options.capacity = 1;
    options.queue_batches = 2;
    options.queue_bytes = 0;
    options.heartbeat_thread = false;
    options.clock = &clock_;
    options.pause_unread_after = pause_unread_after;
    options.registry = &registry_;
    auto w = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->Start().ok());
    return std::move(*w);
  }

  // Reads batches [from, 10) and the marker of slot 0 (records 0..39 in order, 4 per batch).
  static void ExpectRest(Reader& reader, uint64_t from) {
    for (uint64_t i = from; i < 10; ++i) {
      StreamEvent e = reader.Next();
      ASSERT_EQ(e.kind, StreamEvent::kBatch) << "batch " << i << ": " << e.status;
      ASSERT_FALSE(e.batch.header.end_of_split()) << "batch " << i;
      EXPECT_EQ(e.batch.header.batch_index(), i);
      EXPECT_EQ(Ids(e.batch.header),
                (std::vector<uint64_t>{4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3}));
    }
    StreamEvent marker = reader.Next();
    ASSERT_EQ(marker.kind, StreamEvent::kBatch) << marker.status;
    EXPECT_TRUE(marker.batch.header.end_of_split());
    EXPECT_EQ(marker.batch.header.batch_index(), 10u);
  }

  prometheus::Registry registry_;
};

TEST_F(PausedConsumerTest, AConsumerThatStopsReadingFreesTheProducerAndResumesExactlyOnce) {
  auto w = MakePausingWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  *r.add_jobs() = MakeJob(2, Yaml(kLabels), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);  // 10 batches
  Deliver(*w, r);
  // Job 1's trainer reads batches 0-2, then stops: 3 and 4 fill its queue, 5 finds no room.
  auto r1 = Open(*w, 1, 0);
  for (uint64_t i = 0; i < 3; ++i) {
    StreamEvent e = r1->Next();
    ASSERT_EQ(e.kind, StreamEvent::kBatch) << e.status;
    ASSERT_EQ(e.batch.header.batch_index(), i);
  }
  ASSERT_TRUE(Eventually(
      [&] { return EventCount(registry_, "sluice_worker_paused_splits_total", "paused") >= 1; }));
  EXPECT_EQ(w->blocked_producers(), 0);
  EXPECT_EQ(w->queued_batches(), 2u);  // batches 3 and 4 stay queued
  // The split is reported detached: it holds none of the worker's capacity.
  ASSERT_TRUE(w->Heartbeat().ok());
  ASSERT_EQ(w->last_heartbeat().splits_size(), 1);
  EXPECT_TRUE(w->last_heartbeat().splits(0).detached());
  EXPECT_FALSE(w->last_heartbeat().splits(0).finished_producing());
  EXPECT_EQ(w->last_heartbeat().splits(0).produced_batches(), 5u);

  // The worker's only producer serves job 2's whole slot meanwhile (held, Next() would give up
  // after 20 s and fail).
  proto::WorkerHeartbeatResponse second;
  *second.add_start() = MakeSplit(2, 0, 0, 0, 0, 40, 0, 0);
  Deliver(*w, second);
  auto r2 = Open(*w, 2, 0);
  ExpectRest(*r2, 0);

  // Job 1 reads again: batches 3-9 and the marker, each once, in order.
  ExpectRest(*r1, 3);
  // Every pause resumed (job 2's too, had its reader been slow to start).
  EXPECT_EQ(EventCount(registry_, "sluice_worker_paused_splits_total", "resumed"),
            EventCount(registry_, "sluice_worker_paused_splits_total", "paused"));
  ASSERT_TRUE(w->Heartbeat().ok());
  const proto::WorkerHeartbeatRequest last = w->last_heartbeat();
  ASSERT_EQ(last.splits_size(), 2);
  for (const proto::WorkerSplitProgress& p : last.splits()) {
    EXPECT_FALSE(p.detached()) << p.key().job_id();
    EXPECT_TRUE(p.finished_producing()) << p.key().job_id();
  }
}

TEST_F(PausedConsumerTest, APausedSplitResumesWhenItsConsumerAttachesAgain) {
  auto w = MakePausingWorker();
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);
  Deliver(*w, r);
  // No trainer attaches at all: batches 0 and 1 fill the queue, then the split pauses.
  ASSERT_TRUE(Eventually(
      [&] { return EventCount(registry_, "sluice_worker_paused_splits_total", "paused") == 1; }));
  // A trainer that restored a state holding batch 0 attaches: the held batch is discarded,
  // and the rest comes once.
  auto reader = Open(*w, 1, 0, nullptr, Holds{.batches = 1});
  ExpectRest(*reader, 1);
  EXPECT_GE(EventCount(registry_, "sluice_worker_paused_splits_total", "resumed"), 1);
  EXPECT_EQ(EventCount(registry_, "sluice_worker_paused_splits_total", "resumed"),
            EventCount(registry_, "sluice_worker_paused_splits_total", "paused"));
}

TEST_F(PausedConsumerTest, ATrainerWithALongerStepPausesOnceNotAtEveryBatch) {
  // The trainer takes a batch every 300 ms, longer than the 200 ms after which a full, unread
  // queue pauses: the first wait pauses the split, and each pause doubles the next one's wait
  // (400 ms), so it is not paused (and its prefix recomputed) again at every batch. Without the
  // doubling it pauses at about every one of its 10 batches.
  auto w = MakePausingWorker(absl::Milliseconds(200));
  proto::WorkerHeartbeatResponse r;
  *r.add_jobs() = MakeJob(1, Yaml(kLabels), 4);
  *r.add_start() = MakeSplit(1, 0, 0, 0, 0, 40, 0, 0);
  Deliver(*w, r);
  auto reader = Open(*w, 1, 0);
  for (uint64_t i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(300));  // the trainer's step, not a synchronisation
    StreamEvent e = reader->Next();
    ASSERT_EQ(e.kind, StreamEvent::kBatch) << "batch " << i << ": " << e.status;
    EXPECT_EQ(e.batch.header.batch_index(), i);
    EXPECT_EQ(Ids(e.batch.header), (std::vector<uint64_t>{4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3}));
  }
  StreamEvent marker = reader->Next();
  ASSERT_EQ(marker.kind, StreamEvent::kBatch) << marker.status;
  EXPECT_TRUE(marker.batch.header.end_of_split());
  const double paused = EventCount(registry_, "sluice_worker_paused_splits_total", "paused");
  EXPECT_GE(paused, 1);
  EXPECT_LE(paused, 3);  // 1 on time; a thread descheduled for over 100 ms may add one or two
}

}  // namespace
}  // namespace sluice::data_worker
