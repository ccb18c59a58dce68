// DispatcherImpl's autoscaling on the fake clock: heartbeats in, Autoscaler's
// decision out (sluice_desired_workers, GetStatus) and, with Scaler::kLocal,
// the victims drained.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "dispatcher/journal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {

using ::sluice::testonly::Sync;
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class DispatcherAutoscaleTest : public ::testing::Test {
 protected:
  void Start(DispatcherOptions::Scaler scaler, uint32_t max_workers = 16,
             std::shared_ptr<Journal> journal = nullptr,
             absl::Duration heartbeat_interval = absl::Seconds(1)) {
    impl_.reset();
    DispatcherOptions options;
    options.heartbeat_interval = heartbeat_interval;
    options.journal = std::move(journal);
    options.clock = &clock_;
    options.registry = &registry_;
    options.worker_timeout = absl::Seconds(60);
    options.scaler = scaler;
    options.min_workers = 1;
    options.max_workers = max_workers;
    options.scale_period = absl::Seconds(2);
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }

  // A job of one consumer over 1000 records, batches of 10.
  uint64_t Job(const std::string& name = "j", int priority = 0, uint32_t min_workers = 0,
               uint32_t consumers = 1) {
    proto::RegisterDatasetRequest dataset;
    dataset.set_protocol_version(kProtocolVersion);
    dataset.set_pipeline("pipe");
    dataset.add_shard_record_counts(1000);
    dataset.set_batch_size(10);
    proto::RegisterDatasetResponse registered;
    EXPECT_TRUE(Sync(impl_).RegisterDataset(dataset, &registered).ok());
    proto::GetOrCreateJobRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_name(name);
    request.set_dataset_id(registered.dataset_id());
    request.mutable_config()->set_num_epochs(1);
    request.mutable_config()->set_split_size(100);
    request.mutable_config()->set_priority(priority);
    request.mutable_config()->set_min_workers(min_workers);
    request.mutable_config()->set_num_consumers(consumers);
    proto::GetOrCreateJobResponse response;
    EXPECT_TRUE(Sync(impl_).GetOrCreateJob(request, &response).ok());
    return response.job_id();
  }

  uint64_t Worker(const std::string& address) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address(address);
    request.set_capacity(1);
    proto::WorkerRegisterResponse response;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(request, &response).ok());
    return response.worker_id();
  }

  struct JobBusy {
    uint64_t job_id;
    uint64_t elements;
    double busy;
  };

  // A heartbeat with the worker's cumulative elements and busy seconds (in
  // total and, if `jobs` is not empty, per job); it reports the splits the
  // dispatcher handed it so far, unfinished (`finished`: every one of them
  // finished producing, so its slot is free for a new split).
  proto::WorkerHeartbeatResponse WorkerBeat(uint64_t worker, uint64_t elements, double busy,
                                            const std::vector<JobBusy>& jobs = {},
                                            bool finished = false) {
    proto::WorkerHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    request.set_elements_total(elements);
    request.set_busy_seconds_total(busy);
    for (const JobBusy& j : jobs) {
      proto::JobBusy* b = request.add_job_busy();
      b->set_job_id(j.job_id);
      b->set_elements_total(j.elements);
      b->set_busy_seconds_total(j.busy);
    }
    for (const proto::SplitKey& key : held_[worker]) {
      proto::WorkerSplitProgress* p = request.add_splits();
      *p->mutable_key() = key;
      p->set_finished_producing(finished);
    }
    proto::WorkerHeartbeatResponse response;
    absl::Status s = Sync(impl_).WorkerHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    for (const proto::SplitAssignment& a : response.start()) held_[worker].push_back(a.key());
    return response;
  }

  void ClientBeat(uint64_t job, uint64_t batches, double wait_seconds, uint32_t consumer = 0,
                  bool leaving = false) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_consumer_index(consumer);
    request.set_leaving(leaving);
    request.set_batches_returned_total(batches);
    request.set_wait_seconds_total(wait_seconds);
    proto::ClientHeartbeatResponse response;
    absl::Status s = Sync(impl_).ClientHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
  }

  proto::GetStatusResponse Status(int starting = -1) {
    proto::GetStatusRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_starting_workers(starting);
    proto::GetStatusResponse response;
    EXPECT_TRUE(Sync(impl_).GetStatus(request, &response).ok());
    return response;
  }

  // Two workers past their warm-up, each measuring 100 elements per busy
  // second; one consumer returning 20 batches/s of 10 and waiting half the
  // time: demand 400 el/s, need 4 workers, x 1.05 headroom -> 5.
  void TwoWarmWorkersAndAWaitingConsumer() {
    job_ = Job();
    a_ = Worker("a:1");
    b_ = Worker("b:1");
    ASSERT_TRUE(impl_->Tick().ok());  // the first decision: nothing measured
    clock_.Advance(absl::Seconds(6));
    WorkerBeat(a_, 0, 0);
    WorkerBeat(b_, 0, 0);
    ClientBeat(job_, 0, 0);
    ASSERT_TRUE(impl_->Tick().ok());
    clock_.Advance(absl::Seconds(2));
    WorkerBeat(a_, 200, 2.0);
    WorkerBeat(b_, 100, 1.0);  // busy half the time: still 100 el/busy-s
    ClientBeat(job_, 40, 1.0);
    ASSERT_TRUE(impl_->Tick().ok());
  }

  // A pool bounded at 2, jobs "low" and "high" (priority 1), workers a_ and b_ past their
  // warm-up, every counter at 0: the next reports measure.
  void LowAndHighOnTwoWarmWorkers(uint64_t& low, uint64_t& high,
                                  absl::Duration heartbeat_interval = absl::Seconds(1)) {
    Start(DispatcherOptions::Scaler::kNone, /*max_workers=*/2, /*journal=*/nullptr,
          heartbeat_interval);
    low = Job("low");
    high = Job("high", /*priority=*/1);
    a_ = Worker("a:1");
    b_ = Worker("b:1");
    ASSERT_TRUE(impl_->Tick().ok());
    clock_.Advance(absl::Seconds(6));
    for (uint64_t w : {a_, b_}) WorkerBeat(w, 0, 0, {{low, 0, 0}, {high, 0, 0}});
    ClientBeat(low, 0, 0);
    ClientBeat(high, 0, 0);
    ASSERT_TRUE(impl_->Tick().ok());
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  prometheus::Registry registry_;
  std::unique_ptr<DispatcherImpl> impl_;
  std::map<uint64_t, std::vector<proto::SplitKey>> held_;
  uint64_t job_ = 0, a_ = 0, b_ = 0;
};

// Three workers, one job whose consumer reads 100 el/s, 100 el per busy second: need 1.00,
// x 1.05 -> 2. A fresh dispatcher scales down to 2 at once; one restarted from its journal
// (the job and workers recovered) was sized on demand it never saw and holds 3 for a window.
class FirstWindowTest : public DispatcherAutoscaleTest,
                        public ::testing::WithParamInterface<bool> {};

TEST_P(FirstWindowTest, OnlyARestartedDispatcherHoldsItsWorkersForAWindow) {
  const bool restart = GetParam();
  auto journal = std::make_shared<InMemoryJournal>();
  Start(DispatcherOptions::Scaler::kNone, 16, journal);
  job_ = Job();
  const std::vector<uint64_t> workers = {Worker("a:1"), Worker("b:1"), Worker("c:1")};
  if (restart) Start(DispatcherOptions::Scaler::kNone, 16, journal);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));  // past the workers' warm-up
  for (uint64_t w : workers) WorkerBeat(w, 0, 0);
  ClientBeat(job_, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  WorkerBeat(workers[0], 100, 1.0);
  WorkerBeat(workers[1], 100, 1.0);
  WorkerBeat(workers[2], 0, 0);
  ClientBeat(job_, 20, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  const proto::GetStatusResponse status = Status();
  if (restart) {
    EXPECT_EQ(impl_->desired_workers(), 3);
    EXPECT_THAT(status.reason(), HasSubstr("no scale-down before 30s of measurements"));
  } else {
    EXPECT_EQ(impl_->desired_workers(), 2);
    EXPECT_THAT(status.reason(), StartsWith("down 3 -> 2: largest need over the last 30s 1.00"));
  }
}

INSTANTIATE_TEST_SUITE_P(FreshAndRestarted, FirstWindowTest, ::testing::Bool());

TEST_F(DispatcherAutoscaleTest, SizesFromDemandAndBusyTimeCapacity) {
  Start(DispatcherOptions::Scaler::kNone);
  TwoWarmWorkersAndAWaitingConsumer();
  EXPECT_EQ(impl_->desired_workers(), 5);
  const proto::GetStatusResponse status = Status();
  EXPECT_EQ(status.desired_workers(), 5);
  EXPECT_EQ(status.current_workers(), 2);
  EXPECT_EQ(status.scaler(), "none");
  EXPECT_THAT(status.reason(), StartsWith("up 2 -> 5: need 4.00 workers"));
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_DOUBLE_EQ(status.jobs(0).demand_elements_per_second(), 400);
  EXPECT_DOUBLE_EQ(status.jobs(0).capacity_elements_per_second(), 100);
  ASSERT_EQ(status.jobs(0).consumers_size(), 1);
  EXPECT_DOUBLE_EQ(status.jobs(0).consumers(0).batches_per_second(), 20);
  EXPECT_DOUBLE_EQ(status.jobs(0).consumers(0).wait_fraction(), 0.5);
  ASSERT_EQ(status.workers_size(), 2);
  EXPECT_EQ(status.workers(0).address(), "a:1");
  EXPECT_EQ(status.workers(0).state(), "active");
  EXPECT_DOUBLE_EQ(status.workers(0).elements_per_busy_second(), 100);
  bool found = false;
  for (const auto& family : registry_.Collect()) {
    if (family.name != "sluice_desired_workers") continue;
    found = true;
    EXPECT_EQ(family.metric.at(0).gauge.value, 5);
  }
  EXPECT_TRUE(found);
}

// Two jobs share two workers. "cheap" (batch 10) wants 200 el/s and each
// worker makes 200 of its elements per busy second; "dear" gets 20 el/s while
// its trainer waits half the time (demand 40 el/s), at 20 el per busy second.
// Per job: 1 + 2 = 3 workers, x 1.05 -> 4. The totals (160 elements per 1.25
// busy seconds = 128 el/s) would give 240 / 128 = 1.88 -> 2: the mix the
// workers produced in the window is not the mix the trainers demand.
TEST_F(DispatcherAutoscaleTest, HeartbeatPerJobCapacitySizesEachJob) {
  Start(DispatcherOptions::Scaler::kNone);
  const uint64_t cheap = Job("cheap");
  const uint64_t dear = Job("dear");
  a_ = Worker("a:1");
  b_ = Worker("b:1");
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));
  for (uint64_t w : {a_, b_}) WorkerBeat(w, 0, 0, {{cheap, 0, 0}, {dear, 0, 0}});
  ClientBeat(cheap, 0, 0);
  ClientBeat(dear, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  for (uint64_t w : {a_, b_}) {
    WorkerBeat(w, 160, 1.25, {{cheap, 150, 0.75}, {dear, 10, 0.5}});
  }
  ClientBeat(cheap, 40, 0);
  ClientBeat(dear, 4, 1.0);
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_EQ(impl_->desired_workers(), 4);
  const proto::GetStatusResponse status = Status();
  EXPECT_THAT(status.reason(), StartsWith(absl::StrCat("up 2 -> 4: need 3.00 workers (job ", cheap,
                                                       ": 200 el/s / 200 el/s per worker; job ",
                                                       dear, ": 40 el/s / 20 el/s per worker)")));
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_DOUBLE_EQ(status.jobs(0).capacity_elements_per_second(), 200);
  EXPECT_DOUBLE_EQ(status.jobs(1).capacity_elements_per_second(), 20);
  EXPECT_DOUBLE_EQ(status.jobs(1).demand_elements_per_second(), 40);
  // The worker's own figure stays the total: 160 elements / 1.25 busy s.
  EXPECT_DOUBLE_EQ(status.workers(0).elements_per_busy_second(), 128);
}

// A worker that reports only totals (no job_busy: an older worker, the same
// protocol version) is measured for every job by its totals.
TEST_F(DispatcherAutoscaleTest, TotalsAloneServeEveryJob) {
  Start(DispatcherOptions::Scaler::kNone);
  const uint64_t one = Job("one");
  const uint64_t two = Job("two");
  a_ = Worker("a:1");
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));
  WorkerBeat(a_, 0, 0);
  ClientBeat(one, 0, 0);
  ClientBeat(two, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  WorkerBeat(a_, 200, 2.0);
  ClientBeat(one, 20, 0);  // 100 el/s
  ClientBeat(two, 40, 0);  // 200 el/s
  ASSERT_TRUE(impl_->Tick().ok());
  // 300 el/s at 100 el/s per worker: 3, x 1.05 -> 4.
  EXPECT_EQ(impl_->desired_workers(), 4);
  const proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_DOUBLE_EQ(status.jobs(0).capacity_elements_per_second(), 100);
  EXPECT_DOUBLE_EQ(status.jobs(1).capacity_elements_per_second(), 100);
}

TEST_F(DispatcherAutoscaleTest, StartingWorkersCountAsCurrent) {
  // (kNone: with kLocal the first decision, before the consumer reported,
  // would already have drained b for lack of demand.)
  Start(DispatcherOptions::Scaler::kNone);
  TwoWarmWorkersAndAWaitingConsumer();
  EXPECT_EQ(impl_->desired_workers(), 5);
  Status(/*starting=*/3);  // the actuator started the missing three
  clock_.Advance(absl::Seconds(2));
  WorkerBeat(a_, 400, 4.0);
  WorkerBeat(b_, 200, 2.0);
  ClientBeat(job_, 80, 2.0);
  ASSERT_TRUE(impl_->Tick().ok());
  const proto::GetStatusResponse status = Status();
  EXPECT_EQ(status.current_workers(), 5);
  EXPECT_EQ(status.desired_workers(), 5);
  EXPECT_THAT(status.reason(), StartsWith("hold 5"));
  EXPECT_EQ(status.drain_size(), 0);
}

TEST_F(DispatcherAutoscaleTest, LocalScalerDrainsTheVictimsWhenDemandLeaves) {
  Start(DispatcherOptions::Scaler::kLocal);
  const uint64_t a = Worker("a:1");
  const uint64_t b = Worker("b:1");
  const uint64_t c = Worker("c:1");
  clock_.Advance(absl::Seconds(6));
  for (uint64_t w : {a, b, c}) WorkerBeat(w, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());  // no job: down to min_workers = 1
  EXPECT_EQ(impl_->desired_workers(), 1);
  const proto::GetStatusResponse status = Status();
  EXPECT_THAT(status.reason(), HasSubstr("down 3 -> 1: no live consumer"));
  ASSERT_EQ(status.drain_size(), 2);
  int draining = 0;
  for (const proto::WorkerStatus& w : status.workers()) {
    if (w.state() == "draining") ++draining;
  }
  EXPECT_EQ(draining, 2);
  // A drained worker holding nothing may exit; the one that stays may not.
  for (uint64_t w : {a, b, c}) {
    const proto::WorkerHeartbeatResponse r = WorkerBeat(w, 0, 0);
    const bool victim = w == status.drain(0) || w == status.drain(1);
    EXPECT_EQ(r.draining(), victim) << "worker " << w;
    EXPECT_EQ(r.may_exit(), victim) << "worker " << w;
  }
}

TEST_F(DispatcherAutoscaleTest, AdvisoryScalerDrainsNobody) {
  Start(DispatcherOptions::Scaler::kNone);
  const uint64_t a = Worker("a:1");
  const uint64_t b = Worker("b:1");
  clock_.Advance(absl::Seconds(6));
  for (uint64_t w : {a, b}) WorkerBeat(w, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_EQ(impl_->desired_workers(), 1);
  for (uint64_t w : {a, b}) {
    const proto::WorkerHeartbeatResponse r = WorkerBeat(w, 0, 0);
    EXPECT_FALSE(r.draining());
  }
}

// A consumer registers at t = 6 s and gets its first batch 0.5 s later, all
// of it waiting (the job's workers starting): a window of one batch in
// 0.5 s with no time busy would say 2 batches/s at a busy fraction of at most
// 0.02, a demand of 1,000 el/s. It is extended to the next report instead:
// 41 batches in 2.5 s, 1.0 s of it waiting -> 16.4 batches/s at a busy
// fraction of 0.6, 273.3 el/s (40 batches per 1.5 s busy after the first).
TEST_F(DispatcherAutoscaleTest, AWindowOfOneBatchIsExtendedToTheNextReport) {
  Start(DispatcherOptions::Scaler::kNone);
  job_ = Job();
  a_ = Worker("a:1");
  ASSERT_TRUE(impl_->Tick().ok());  // a decision at t = 0: the next one at 6.5 s
  clock_.Advance(absl::Seconds(6));
  ClientBeat(job_, 0, 0);
  clock_.Advance(absl::Milliseconds(500));
  ClientBeat(job_, 1, 0.5);
  ASSERT_TRUE(impl_->Tick().ok());
  proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.jobs_size(), 1);
  ASSERT_EQ(status.jobs(0).consumers_size(), 1);
  EXPECT_EQ(status.jobs(0).consumers(0).batches_per_second(), 0);
  EXPECT_EQ(status.jobs(0).demand_elements_per_second(), 0);
  clock_.Advance(absl::Seconds(2));
  ClientBeat(job_, 41, 1.0);
  ASSERT_TRUE(impl_->Tick().ok());
  status = Status();
  ASSERT_EQ(status.jobs_size(), 1);
  ASSERT_EQ(status.jobs(0).consumers_size(), 1);
  EXPECT_DOUBLE_EQ(status.jobs(0).consumers(0).batches_per_second(), 16.4);
  EXPECT_DOUBLE_EQ(status.jobs(0).consumers(0).wait_fraction(), 0.4);
  EXPECT_NEAR(status.jobs(0).demand_elements_per_second(), 273.33, 0.01);
}

// A job whose epochs last a second (one split of one batch each): every window holds an epoch
// start. Its trainer returns a batch of 10 a second, waiting half the time (20 el/s), then three
// quarters of it (40 el/s) from its 9th second: the second demand is read at the next decision,
// where the epoch grace used to keep the first for as long as the job ran.
TEST_F(DispatcherAutoscaleTest, ADemandIsReadThroughEpochsShorterThanTheGrace) {
  Start(DispatcherOptions::Scaler::kNone);
  proto::RegisterDatasetRequest dataset;
  dataset.set_protocol_version(kProtocolVersion);
  dataset.set_pipeline("pipe");
  dataset.add_shard_record_counts(10);
  dataset.set_batch_size(10);
  proto::RegisterDatasetResponse registered;
  ASSERT_TRUE(Sync(impl_).RegisterDataset(dataset, &registered).ok());
  proto::GetOrCreateJobRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_job_name("short-epochs");
  request.set_dataset_id(registered.dataset_id());
  request.mutable_config()->set_num_epochs(1000);
  request.mutable_config()->set_split_size(10);
  request.mutable_config()->set_num_consumers(1);
  proto::GetOrCreateJobResponse job;
  ASSERT_TRUE(Sync(impl_).GetOrCreateJob(request, &job).ok());
  a_ = Worker("a:1");
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));  // past the worker's warm-up
  double wait = 0;
  std::vector<double> demands;
  for (uint64_t epoch = 0; epoch < 16; ++epoch) {
    WorkerBeat(a_, 10 * epoch, 0.1 * static_cast<double>(epoch), {}, /*finished=*/true);
    proto::ClientHeartbeatRequest beat;
    beat.set_protocol_version(kProtocolVersion);
    beat.set_job_id(job.job_id());
    beat.set_batches_returned_total(epoch);
    beat.set_wait_seconds_total(wait);
    if (epoch > 0) {
      proto::ClientSplitProgress* p = beat.add_progress();
      p->set_epoch(epoch - 1);
      p->set_position(0);
      p->set_delivered_batches(1);
      p->set_complete(true);
    }
    proto::ClientHeartbeatResponse response;
    ASSERT_TRUE(Sync(impl_).ClientHeartbeat(beat, &response).ok());
    ASSERT_EQ(response.epoch(), epoch);
    if (epoch % 2 == 0) {
      ASSERT_TRUE(impl_->Tick().ok());
      const proto::GetStatusResponse status = Status();
      ASSERT_EQ(status.jobs_size(), 1);
      demands.push_back(status.jobs(0).demand_elements_per_second());
    }
    clock_.Advance(absl::Seconds(1));
    wait += epoch < 8 ? 0.5 : 0.75;
  }
  // Decisions at epochs 0, 2, ..., 14: nothing read yet, then 20 el/s; the window from epoch 8's
  // report to epoch 10's holds 1.5 s of wait in 2 s: 40 el/s.
  EXPECT_THAT(demands, ::testing::ElementsAre(0, 20, 20, 20, 20, 40, 40, 40));
}

TEST_F(DispatcherAutoscaleTest, DecidesOncePerScalePeriod) {
  Start(DispatcherOptions::Scaler::kNone);
  TwoWarmWorkersAndAWaitingConsumer();
  ASSERT_EQ(impl_->desired_workers(), 5);
  // The consumer leaves (its job is collected later); within the period the
  // decision stands.
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_EQ(impl_->desired_workers(), 5);
}

// The idle stretch the autoscaler tells a pause by comes from the client's
// heartbeats (every 0.5 s here): two warm workers of 100 el per busy second and
// a consumer returning 16 batches/s of 10 (160 el/s: need 1.6 x 1.05 -> 2)
// for 32 s, then two periods whose readings fall, 8 then 4 batches/s. Spread
// over every heartbeat, that is a fall: down to 1 at the second. Returned in
// the first second of the first period and the last half second of the
// second (a pause of 2.5 s between), it confirms nothing: hold 2.
TEST_F(DispatcherAutoscaleTest, APauseBetweenHeartbeatsIsNotAFall) {
  for (const bool paused : {false, true}) {
    SCOPED_TRACE(paused ? "paused" : "spread");
    Start(DispatcherOptions::Scaler::kNone);
    job_ = Job();
    a_ = Worker("a:1");
    b_ = Worker("b:1");
    ASSERT_TRUE(impl_->Tick().ok());
    clock_.Advance(absl::Seconds(6));
    uint64_t batches = 0, elements = 0;
    double busy = 0;
    ClientBeat(job_, 0, 0);
    WorkerBeat(a_, 0, 0);
    WorkerBeat(b_, 0, 0);
    ASSERT_TRUE(impl_->Tick().ok());
    // One period: a heartbeat every 0.5 s returning `per_beat[k]` batches.
    auto period = [&](std::vector<uint64_t> per_beat) {
      for (uint64_t n : per_beat) {
        clock_.Advance(absl::Milliseconds(500));
        batches += n;
        ClientBeat(job_, batches, 0);
      }
      elements += 80;
      busy += 0.8;
      WorkerBeat(a_, elements, busy);
      WorkerBeat(b_, elements, busy);
      EXPECT_TRUE(impl_->Tick().ok());
      return Status();
    };
    for (int i = 0; i < 16; ++i) ASSERT_EQ(period({8, 8, 8, 8}).desired_workers(), 2);
    const proto::GetStatusResponse first =
        period(paused ? std::vector<uint64_t>{8, 8, 0, 0} : std::vector<uint64_t>{4, 4, 4, 4});
    EXPECT_EQ(first.desired_workers(), 2);
    EXPECT_DOUBLE_EQ(first.jobs(0).consumers(0).batches_per_second(), 8);
    const proto::GetStatusResponse second =
        period(paused ? std::vector<uint64_t>{0, 0, 0, 8} : std::vector<uint64_t>{2, 2, 2, 2});
    EXPECT_DOUBLE_EQ(second.jobs(0).consumers(0).batches_per_second(), 4);
    if (paused) {
      EXPECT_EQ(second.desired_workers(), 2);
      EXPECT_THAT(second.reason(), StartsWith("hold 2: need 0.40 workers"));
    } else {
      EXPECT_EQ(second.desired_workers(), 1);
      EXPECT_EQ(second.reason(),
                absl::StrCat("down 2 -> 1: demand of job ", job_,
                             " fell in each of the last two readings; need 0.40 workers (job ",
                             job_, ": 40 el/s / 100 el/s per worker) x 1.05 headroom"));
    }
  }
}

// Demand that left is decided at once, not at the end of the period: the
// consumer completes all 10 splits of its single epoch half a second after
// the decision for 5 workers, and the next tick scales down to the minimum.
TEST_F(DispatcherAutoscaleTest, AJobWhoseConsumersLeftIsDecidedAtOnce) {
  Start(DispatcherOptions::Scaler::kNone);
  TwoWarmWorkersAndAWaitingConsumer();
  ASSERT_EQ(impl_->desired_workers(), 5);
  clock_.Advance(absl::Milliseconds(500));
  proto::ClientHeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_job_id(job_);
  request.set_batches_returned_total(100);
  request.set_wait_seconds_total(1.0);
  for (uint64_t position = 0; position < 10; ++position) {
    proto::ClientSplitProgress* p = request.add_progress();
    p->set_epoch(0);
    p->set_position(position);
    p->set_delivered_batches(10);
    p->set_complete(true);
  }
  proto::ClientHeartbeatResponse response;
  ASSERT_TRUE(Sync(impl_).ClientHeartbeat(request, &response).ok());
  ASSERT_TRUE(response.finished());
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_EQ(impl_->desired_workers(), 1);
  EXPECT_THAT(Status().reason(), StartsWith("down 2 -> 1: no live consumer"));
}

// A pool bounded at 2 workers, two jobs that each need 4 (a consumer
// returning 20 batches/s of 10 while waiting half the time: 400 el/s, at 100
// el per busy second): "high" has priority 1 and gets both workers, "low"
// none. The headroom is 1 + 2 x 2.5% x sqrt(4^2 + 4^2) / 8 = 1.035, so high
// wants 4.14 and is short of it. A third worker's split then comes from high,
// where without the allocation the lower job id (low) would have had it.
TEST_F(DispatcherAutoscaleTest, BoundedPoolGoesToTheHigherPriorityJobFirst) {
  uint64_t low = 0, high = 0;
  ASSERT_NO_FATAL_FAILURE(LowAndHighOnTwoWarmWorkers(low, high));
  clock_.Advance(absl::Seconds(2));
  for (uint64_t w : {a_, b_}) {
    WorkerBeat(w, 200, 2.0, {{low, 100, 1.0}, {high, 100, 1.0}});
  }
  ClientBeat(low, 40, 1.0);
  ClientBeat(high, 40, 1.0);
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_EQ(impl_->desired_workers(), 2);
  const proto::GetStatusResponse status = Status();
  EXPECT_TRUE(status.pool_bound());
  EXPECT_THAT(status.reason(), HasSubstr("limited to max_workers 2"));
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_EQ(status.jobs(0).job_id(), low);
  EXPECT_EQ(status.jobs(0).priority(), 0);
  EXPECT_DOUBLE_EQ(status.jobs(0).allocated_workers(), 0);
  EXPECT_EQ(status.jobs(0).allocation_reason(),
            "0.00 of its need 4.00: the pool ran out (priority 0, 0.25 "
            "trainers' wait removed per worker)");
  EXPECT_EQ(status.jobs(1).priority(), 1);
  EXPECT_DOUBLE_EQ(status.jobs(1).allocated_workers(), 2);
  std::map<std::string, double> allocated;
  for (const auto& family : registry_.Collect()) {
    if (family.name != "sluice_job_allocated_workers") continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "sluice_job") allocated[label.value] = metric.gauge.value;
      }
    }
  }
  EXPECT_EQ(allocated, (std::map<std::string, double>{{"high", 2}, {"low", 0}}));
  const uint64_t c = Worker("c:1");
  const proto::WorkerHeartbeatResponse response = WorkerBeat(c, 0, 0);
  ASSERT_EQ(response.start_size(), 1);
  EXPECT_EQ(response.start(0).key().job_id(), high);
}

// A dispatcher restarted from its journal with jobs "low" and "high" (priority 1) on a pool of
// 2: "high"'s trainer reports first one period after "low"'s, so its first reading covers no
// time (no batch, no wait) while "low" needs 4 workers. Dividing the pool then would give "low"
// both workers for a period; it is not divided until "high" is read, then "high" gets both.
TEST_F(DispatcherAutoscaleTest, ARestartedDispatcherDividesThePoolOnceEveryJobIsRead) {
  auto journal = std::make_shared<InMemoryJournal>();
  Start(DispatcherOptions::Scaler::kNone, /*max_workers=*/2, journal);
  const uint64_t low = Job("low");
  const uint64_t high = Job("high", /*priority=*/1);
  a_ = Worker("a:1");
  b_ = Worker("b:1");
  Start(DispatcherOptions::Scaler::kNone, /*max_workers=*/2, journal);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));  // past the workers' warm-up
  for (uint64_t w : {a_, b_}) WorkerBeat(w, 0, 0, {{low, 0, 0}, {high, 0, 0}});
  ClientBeat(low, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  for (uint64_t w : {a_, b_}) WorkerBeat(w, 200, 2.0, {{low, 100, 1.0}, {high, 100, 1.0}});
  ClientBeat(low, 40, 1.0);
  ClientBeat(high, 0, 0);  // its first report since the restart
  ASSERT_TRUE(impl_->Tick().ok());
  proto::GetStatusResponse status = Status();
  EXPECT_FALSE(status.pool_bound());
  EXPECT_THAT(status.reason(),
              HasSubstr(absl::StrCat("the pool is not divided until job ", high,
                                     " is read since the restart: every worker serves every job")));
  clock_.Advance(absl::Seconds(2));
  for (uint64_t w : {a_, b_}) WorkerBeat(w, 400, 4.0, {{low, 200, 2.0}, {high, 200, 2.0}});
  ClientBeat(low, 80, 2.0);
  ClientBeat(high, 40, 1.0);
  ASSERT_TRUE(impl_->Tick().ok());
  status = Status();
  EXPECT_TRUE(status.pool_bound());
  EXPECT_THAT(status.reason(), Not(HasSubstr("not divided")));
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_EQ(status.jobs(0).job_id(), low);
  EXPECT_DOUBLE_EQ(status.jobs(0).allocated_workers(), 0);
  EXPECT_EQ(status.jobs(1).job_id(), high);
  EXPECT_DOUBLE_EQ(status.jobs(1).allocated_workers(), 2);
}

// A trainer killed without closing its iterator sends nothing more. Its lease keeps its job for
// a restart (consumer_timeout, 60 s), but its demand is gone once it has been silent for
// consumer_silence (5 s): the pool bounded at 2 that went to "high" (priority 1) goes to "low"
// in the tick that finds it silent, not a minute later. When its consumer reports again, the
// job gets its share back at the next decision. With a maintenance tick of 3 s (--heartbeat-
// interval) the silence is 11 s: a dispatcher stall of up to 3 ticks + 1 s does not restart the
// leases, and must not read as every consumer falling silent.
struct SilenceCase {
  absl::Duration heartbeat_interval;
  int silent_seconds;  // after which the consumer is no demand
};

class ConsumerSilenceTest : public DispatcherAutoscaleTest,
                            public ::testing::WithParamInterface<SilenceCase> {};

INSTANTIATE_TEST_SUITE_P(Ticks, ConsumerSilenceTest,
                         ::testing::Values(SilenceCase{absl::Seconds(1), 5},
                                           SilenceCase{absl::Seconds(3), 11}));

TEST_P(ConsumerSilenceTest, ATrainerThatStopsReportingGivesUpItsShareWithinSeconds) {
  const int silence = GetParam().silent_seconds;
  uint64_t low = 0, high = 0;
  ASSERT_NO_FATAL_FAILURE(LowAndHighOnTwoWarmWorkers(low, high, GetParam().heartbeat_interval));
  // Each second: both workers make 100 elements per busy second, 50 of each job; low's consumer
  // returns 20 batches of 10 while waiting half the time (demand 400 el/s, need 4), and so does
  // high's while `high_reports`.
  int second = 0;
  uint64_t high_batches = 0;
  double high_wait = 0;
  auto one_second = [&](bool high_reports) {
    clock_.Advance(absl::Seconds(1));
    ++second;
    const uint64_t elements = 100 * static_cast<uint64_t>(second);
    for (uint64_t w : {a_, b_}) {
      WorkerBeat(w, elements, second,
                 {{low, elements / 2, second / 2.0}, {high, elements / 2, second / 2.0}});
    }
    ClientBeat(low, 20 * static_cast<uint64_t>(second), second / 2.0);
    if (high_reports) {
      high_batches += 20;
      high_wait += 0.5;
      ClientBeat(high, high_batches, high_wait);
    }
    ASSERT_TRUE(impl_->Tick().ok());
  };
  auto allocated = [&](uint64_t job) {
    const proto::GetStatusResponse status = Status();
    for (const proto::JobStatus& j : status.jobs()) {
      if (j.job_id() == job) return j.allocated_workers();
    }
    ADD_FAILURE() << "job " << job << " not in the status";
    return -1.0;
  };
  one_second(true);
  one_second(true);  // a decision: high has both workers
  ASSERT_TRUE(Status().pool_bound());
  ASSERT_DOUBLE_EQ(allocated(high), 2);
  ASSERT_DOUBLE_EQ(allocated(low), 0);
  // high's trainer is killed: silence - 1 silent seconds change nothing (decisions included).
  for (int i = 0; i < silence - 1; ++i) {
    one_second(false);
    EXPECT_DOUBLE_EQ(allocated(high), 2) << "after " << i + 1 << " silent seconds";
  }
  one_second(false);  // silent long enough: decided in this tick, whatever the period
  EXPECT_DOUBLE_EQ(allocated(high), 0);
  EXPECT_DOUBLE_EQ(allocated(low), 2);
  const proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.jobs_size(), 2);  // the job is kept for a restart
  EXPECT_EQ(status.jobs(0).allocation_reason(),
            "2.00 of its need 4.00: the pool ran out (priority 0, 0.25 "
            "trainers' wait removed per worker)");
  EXPECT_EQ(status.jobs(1).allocation_reason(),
            "no demand: none of its consumers is reading (finished, left, silent or not started)");
  ASSERT_EQ(status.jobs(1).consumers_size(), 1);
  EXPECT_DOUBLE_EQ(status.jobs(1).consumers(0).silent_seconds(), silence);
  EXPECT_DOUBLE_EQ(status.jobs(0).consumers(0).silent_seconds(), 0);
  // A restarted trainer reports again: high has its share back at the next decision.
  one_second(true);
  one_second(true);
  EXPECT_DOUBLE_EQ(allocated(high), 2);
  EXPECT_DOUBLE_EQ(allocated(low), 0);
}

// A consumer that closes its iterator while the other consumer of its job reads on is no
// demand from the next decision: the job's 800 el/s (two consumers each returning 20 batches/s
// of 10, waiting half the time) reads 400, not 800 until its lease runs out.
TEST_F(DispatcherAutoscaleTest, AConsumerThatLeftIsNoDemandWhileItsJobGoesOn) {
  Start(DispatcherOptions::Scaler::kNone);
  job_ = Job("two", /*priority=*/0, /*min_workers=*/0, /*consumers=*/2);
  a_ = Worker("a:1");
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));
  WorkerBeat(a_, 0, 0);
  for (uint32_t c : {0u, 1u}) ClientBeat(job_, 0, 0, c);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  WorkerBeat(a_, 200, 2.0);
  for (uint32_t c : {0u, 1u}) ClientBeat(job_, 40, 1.0, c);
  ASSERT_TRUE(impl_->Tick().ok());
  ASSERT_EQ(Status().jobs_size(), 1);
  ASSERT_DOUBLE_EQ(Status().jobs(0).demand_elements_per_second(), 800);
  clock_.Advance(absl::Seconds(2));
  WorkerBeat(a_, 400, 4.0);
  ClientBeat(job_, 80, 2.0, 0);
  ClientBeat(job_, 80, 2.0, 1, /*leaving=*/true);
  ASSERT_TRUE(impl_->Tick().ok());
  ASSERT_EQ(Status().jobs_size(), 1);
  EXPECT_DOUBLE_EQ(Status().jobs(0).demand_elements_per_second(), 400);
}

// The largest min_workers a job may ask for (above it the job is refused:
// DispatcherImplTest.MinWorkersAboveInt32IsRefusedNamingIt) is an outsized
// reservation: dropped, and said so, with no overflow in the sums.
TEST_F(DispatcherAutoscaleTest, TheLargestReservationIsOutsizedAndSaysSo) {
  Start(DispatcherOptions::Scaler::kNone, /*max_workers=*/3);
  const uint64_t low = Job("low", /*priority=*/0, /*min_workers=*/2'147'483'647u);
  a_ = Worker("a:1");
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));
  WorkerBeat(a_, 0, 0, {{low, 0, 0}});
  ClientBeat(low, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  WorkerBeat(a_, 200, 2.0, {{low, 100, 1.0}});
  ClientBeat(low, 40, 1.0);
  ASSERT_TRUE(impl_->Tick().ok());
  const proto::GetStatusResponse status = Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).min_workers(), 2'147'483'647u);
  EXPECT_THAT(status.jobs(0).allocation_reason(),
              HasSubstr("; min_workers 2147483647 not reserved: the jobs reserve 2147483647 of a "
                        "pool of at most 3"));
}

// A pool bounded at 3 workers, two jobs that each need 4 (as above): "high"
// has priority 1, "low" min_workers 1. The allocation: low its minimum 1,
// high the other 2 (it wants 4.14). Worker affinity (AssignWorkersToJobs,
// high ranked first): workers a and b serve high, c serves low. Each worker
// finishes its split, and its next one comes from its own job, whatever the
// fewest-splits-in-production rule would have picked. When high finishes,
// a's next split is low's at once, before any decision.
TEST_F(DispatcherAutoscaleTest, BoundedPoolHandsEachWorkerItsAssignedJob) {
  Start(DispatcherOptions::Scaler::kNone, /*max_workers=*/3);
  const uint64_t low = Job("low", /*priority=*/0, /*min_workers=*/1);
  const uint64_t high = Job("high", /*priority=*/1);
  a_ = Worker("a:1");
  b_ = Worker("b:1");
  const uint64_t c = Worker("c:1");
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(6));
  for (uint64_t w : {a_, b_, c}) {
    WorkerBeat(w, 0, 0, {{low, 0, 0}, {high, 0, 0}});
  }
  ClientBeat(low, 0, 0);
  ClientBeat(high, 0, 0);
  ASSERT_TRUE(impl_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  for (uint64_t w : {a_, b_, c}) {
    WorkerBeat(w, 200, 2.0, {{low, 100, 1.0}, {high, 100, 1.0}});
  }
  ClientBeat(low, 40, 1.0);
  ClientBeat(high, 40, 1.0);
  ASSERT_TRUE(impl_->Tick().ok());
  const proto::GetStatusResponse status = Status();
  ASSERT_TRUE(status.pool_bound());
  ASSERT_EQ(status.jobs_size(), 2);
  EXPECT_DOUBLE_EQ(status.jobs(0).allocated_workers(), 1);  // low
  EXPECT_DOUBLE_EQ(status.jobs(1).allocated_workers(), 2);  // high
  std::map<uint64_t, uint64_t> assigned;
  for (uint64_t w : {a_, b_, c}) {
    for (int round = 0; round < 2; ++round) {
      const proto::WorkerHeartbeatResponse response =
          WorkerBeat(w, 200, 2.0, {{low, 100, 1.0}, {high, 100, 1.0}},
                     /*finished=*/true);
      ASSERT_EQ(response.start_size(), 1) << "worker " << w << " round " << round;
      EXPECT_EQ(response.start(0).key().job_id(), w == c ? low : high)
          << "worker " << w << " round " << round;
    }
  }
  // high's consumer reads all 10 splits: the job finishes.
  clock_.Advance(absl::Milliseconds(500));
  proto::ClientHeartbeatRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_job_id(high);
  request.set_batches_returned_total(100);
  request.set_wait_seconds_total(1.0);
  for (uint64_t position = 0; position < 10; ++position) {
    proto::ClientSplitProgress* p = request.add_progress();
    p->set_epoch(0);
    p->set_position(position);
    p->set_delivered_batches(10);
    p->set_complete(true);
  }
  proto::ClientHeartbeatResponse response;
  ASSERT_TRUE(Sync(impl_).ClientHeartbeat(request, &response).ok());
  ASSERT_TRUE(response.finished());
  held_[a_].clear();  // high's splits are done
  const proto::WorkerHeartbeatResponse next =
      WorkerBeat(a_, 200, 2.0, {{low, 100, 1.0}}, /*finished=*/true);
  ASSERT_EQ(next.start_size(), 1);
  EXPECT_EQ(next.start(0).key().job_id(), low);
}

}  // namespace
}  // namespace sluice::dispatcher
