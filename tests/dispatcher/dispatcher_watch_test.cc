// The assignment channel (DispatcherImpl::WatchAssignment, dispatcher_impl.h) and leaving
// consumers (ClientHeartbeatRequest.leaving) on a FakeClock, without gRPC: a held watch is
// answered when work for its worker appears, not before, and after the heartbeat interval.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {
namespace {

using ::sluice::testonly::Sync;

// One WatchAssignment call: its answer, once given.
struct HeldWatch {
  proto::WatchAssignmentResponse response;
  std::optional<absl::Status> status;
};

class DispatcherWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DispatcherOptions options;
    options.clock = &clock_;
    options.registry = &registry_;
    options.heartbeat_interval = absl::Seconds(30);
    options.worker_timeout = absl::Seconds(300);
    options.first_split_alone = true;  // as sluice-dispatcher runs
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
    proto::RegisterDatasetRequest dataset;
    dataset.set_protocol_version(kProtocolVersion);
    dataset.set_pipeline("pipe");
    dataset.add_shard_record_counts(240);
    dataset.set_batch_size(8);
    proto::RegisterDatasetResponse registered;
    ASSERT_TRUE(Sync(impl_).RegisterDataset(dataset, &registered).ok());
    dataset_ = registered.dataset_id();
  }

  // 240 records in slots of 40: 6 slots for its one consumer.
  uint64_t Job(const std::string& name) {
    proto::GetOrCreateJobRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_name(name);
    request.set_dataset_id(dataset_);
    request.mutable_config()->set_num_epochs(1);
    request.mutable_config()->set_split_size(40);
    proto::GetOrCreateJobResponse response;
    EXPECT_TRUE(Sync(impl_).GetOrCreateJob(request, &response).ok());
    return response.job_id();
  }

  uint64_t Worker(uint32_t capacity) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address("w:1");
    request.set_capacity(capacity);
    proto::WorkerRegisterResponse response;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(request, &response).ok());
    return response.worker_id();
  }

  // A heartbeat reporting `held` (producing) and the jobs it knows.
  proto::WorkerHeartbeatResponse Beat(uint64_t worker,
                                      const std::vector<proto::SplitAssignment>& held = {},
                                      const std::vector<uint64_t>& known_jobs = {}) {
    proto::WorkerHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    for (const proto::SplitAssignment& a : held) *request.add_splits()->mutable_key() = a.key();
    for (uint64_t job : known_jobs) request.add_known_job_ids(job);
    proto::WorkerHeartbeatResponse response;
    EXPECT_TRUE(Sync(impl_).WorkerHeartbeat(request, &response).ok());
    return response;
  }

  void Watch(uint64_t worker, HeldWatch* watch, const std::vector<uint64_t>& known_jobs = {}) {
    proto::WatchAssignmentRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    for (uint64_t job : known_jobs) request.add_known_job_ids(job);
    impl_->WatchAssignment(request, &watch->response,
                           [watch](absl::Status s) { watch->status = s; });
  }

  // A heartbeat of the job's consumer that has returned `batches` batches.
  void Returned(uint64_t job, uint64_t batches) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_batches_returned_total(batches);
    proto::ClientHeartbeatResponse response;
    EXPECT_TRUE(Sync(impl_).ClientHeartbeat(request, &response).ok());
  }

  void Leave(uint64_t job) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_leaving(true);
    proto::ClientHeartbeatResponse response;
    EXPECT_TRUE(Sync(impl_).ClientHeartbeat(request, &response).ok());
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  std::unique_ptr<DispatcherImpl> impl_;
  uint64_t dataset_ = 0;
};

TEST_F(DispatcherWatchTest, AHeldWatchIsAnsweredWhenANewJobMakesWork) {
  const uint64_t worker = Worker(/*capacity=*/2);
  EXPECT_EQ(Beat(worker).start_size(), 0);
  HeldWatch watch;
  Watch(worker, &watch);
  EXPECT_FALSE(watch.status.has_value());  // nothing to do: held
  const uint64_t job = Job("j");
  ASSERT_TRUE(watch.status.has_value());
  EXPECT_TRUE(watch.status->ok()) << *watch.status;
  EXPECT_TRUE(watch.response.work_available());
  // Until the consumer returned a batch, one split at a time: it gets all the CPU.
  const proto::WorkerHeartbeatResponse beat = Beat(worker);
  ASSERT_EQ(beat.start_size(), 1);
  EXPECT_EQ(beat.start(0).key().job_id(), job);
  EXPECT_EQ(beat.start(0).key().position(), 0u);
  HeldWatch second;
  Watch(worker, &second);
  EXPECT_FALSE(second.status.has_value());
  Returned(job, /*batches=*/1);  // the consumer started: the rest may go out
  ASSERT_TRUE(second.status.has_value());
  EXPECT_TRUE(second.response.work_available());
  const proto::WorkerHeartbeatResponse next = Beat(worker, {beat.start(0)});
  ASSERT_EQ(next.start_size(), 1);
  EXPECT_EQ(next.start(0).key().position(), 1u);
}

TEST_F(DispatcherWatchTest, AFullWorkerIsNotWokenAndHearsFalseAfterTheInterval) {
  const uint64_t worker = Worker(/*capacity=*/1);
  Job("a");
  const proto::WorkerHeartbeatResponse beat = Beat(worker);
  ASSERT_EQ(beat.start_size(), 1);
  HeldWatch watch;
  Watch(worker, &watch);
  Job("b");  // pending work, but no free capacity on this worker
  EXPECT_FALSE(watch.status.has_value());
  clock_.Advance(absl::Seconds(29));
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_FALSE(watch.status.has_value());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(impl_->Tick().ok());
  ASSERT_TRUE(watch.status.has_value());
  EXPECT_TRUE(watch.status->ok()) << *watch.status;
  EXPECT_FALSE(watch.response.work_available());
}

TEST_F(DispatcherWatchTest, AJobWhoseConsumerLeavesFreesItsWorkerAtOnce) {
  const uint64_t worker = Worker(/*capacity=*/1);
  const uint64_t left = Job("left");
  const proto::WorkerHeartbeatResponse first = Beat(worker);
  ASSERT_EQ(first.start_size(), 1);
  const std::vector<proto::SplitAssignment> held(first.start().begin(), first.start().end());
  HeldWatch watch;
  Watch(worker, &watch);
  const uint64_t next = Job("next");
  EXPECT_FALSE(watch.status.has_value());
  // The only consumer closed its iterator: "left" is collected now.
  Leave(left);
  ASSERT_TRUE(watch.status.has_value());
  EXPECT_TRUE(watch.response.work_available());
  const proto::WorkerHeartbeatResponse beat = Beat(worker, held, {left});
  EXPECT_EQ(beat.drop_size(), 1);
  ASSERT_EQ(beat.finished_job_ids_size(), 1);
  EXPECT_EQ(beat.finished_job_ids(0), left);
  ASSERT_EQ(beat.start_size(), 1);
  EXPECT_EQ(beat.start(0).key().job_id(), next);
}

TEST_F(DispatcherWatchTest, AWatchIsAnsweredJobsOverWhenAJobItsWorkerRunsIsCollected) {
  const uint64_t worker = Worker(/*capacity=*/2);
  const uint64_t left = Job("left");
  const proto::WorkerHeartbeatResponse first = Beat(worker);
  ASSERT_EQ(first.start_size(), 1);  // one split until the consumer's first batch
  const std::vector<proto::SplitAssignment> held(first.start().begin(), first.start().end());
  HeldWatch watch;
  Watch(worker, &watch, /*known_jobs=*/{left});
  EXPECT_FALSE(watch.status.has_value());  // the job is live and nothing waits: held
  // The consumer saved its state and left after its first batch: "left" is collected, and the
  // worker that produces its split hears so now, not at its next heartbeat.
  Leave(left);
  ASSERT_TRUE(watch.status.has_value());
  EXPECT_TRUE(watch.status->ok()) << *watch.status;
  EXPECT_TRUE(watch.response.jobs_over());
  EXPECT_FALSE(watch.response.work_available());
  const proto::WorkerHeartbeatResponse beat = Beat(worker, held, {left});
  ASSERT_EQ(beat.finished_job_ids_size(), 1);
  EXPECT_EQ(beat.finished_job_ids(0), left);
  ASSERT_EQ(beat.drop_size(), 1);
  EXPECT_EQ(beat.drop(0).job_id(), left);
  // Once the worker no longer runs it, its watch is held again.
  HeldWatch again;
  Watch(worker, &again);
  EXPECT_FALSE(again.status.has_value());
  impl_->Stop();  // answers the held watch while `again` lives
}

TEST_F(DispatcherWatchTest, AWatchListingAJobTheDispatcherDoesNotHaveIsAnsweredAtOnce) {
  const uint64_t worker = Worker(/*capacity=*/1);
  const uint64_t live = Job("live");
  const proto::WorkerHeartbeatResponse first = Beat(worker);
  ASSERT_EQ(first.start_size(), 1);
  HeldWatch held;
  Watch(worker, &held, /*known_jobs=*/{live});
  EXPECT_FALSE(held.status.has_value());
  HeldWatch gone;
  Watch(worker, &gone, /*known_jobs=*/{live, /*never created=*/live + 1000});
  ASSERT_TRUE(gone.status.has_value());
  EXPECT_TRUE(gone.status->ok()) << *gone.status;
  EXPECT_TRUE(gone.response.jobs_over());
  EXPECT_FALSE(gone.response.work_available());
  impl_->Stop();  // answers the held watch while `held` lives
}

TEST_F(DispatcherWatchTest, UnknownWorkersAndAStoppingDispatcherAnswerAtOnce) {
  HeldWatch unknown;
  Watch(/*worker=*/99, &unknown);
  ASSERT_TRUE(unknown.status.has_value());
  EXPECT_EQ(unknown.status->code(), absl::StatusCode::kNotFound);
  const uint64_t worker = Worker(/*capacity=*/1);
  HeldWatch held;
  Watch(worker, &held);
  EXPECT_FALSE(held.status.has_value());
  impl_->Stop();
  ASSERT_TRUE(held.status.has_value());
  EXPECT_EQ(held.status->code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sluice::dispatcher
