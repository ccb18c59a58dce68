// A dataset's life in the dispatcher (dispatcher_impl.h, "Datasets"): its shard record counts
// are checked against the dataset (a worker reads the manifest) before they are journaled;
// a dataset no job uses is forgotten after dataset_ttl; the journal stays bounded and a restart
// after compaction restores the same state. DispatcherImpl on a FakeClock, without gRPC.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "dispatcher/sqlite_journal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/pipeline.pb.h"
#include "tests/testing/sync_dispatcher.h"
#include "tests/testing/temp_dir.h"

namespace sluice::dispatcher {
namespace {

using ::sluice::testonly::Sync;

// One RegisterDataset call: its answer, once given (from the caller's thread, or the
// DurableAcks thread once what it registered is durable).
struct Call {
  proto::RegisterDatasetResponse response;
  absl::Status status;
  absl::Notification answered;

  bool has_answer() const { return answered.HasBeenNotified(); }
  // Waits for the answer (a test failure after 10 s).
  absl::Status Answer() {
    EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
    return status;
  }
};

std::string DatasetPipeline(const std::string& path) {
  proto::Pipeline pipeline;
  pipeline.mutable_source()->mutable_dataset()->set_path(path);
  pipeline.add_nodes()->mutable_batch()->set_size(8);
  return pipeline.SerializeAsString();
}

proto::RegisterDatasetRequest Request(const std::string& pipeline, std::vector<uint64_t> counts,
                                      uint64_t batch = 8) {
  proto::RegisterDatasetRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_pipeline(pipeline);
  for (uint64_t c : counts) request.add_shard_record_counts(c);
  request.set_batch_size(batch);
  return request;
}

class DatasetLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(std::make_shared<InMemoryJournal>()); }

  void Restart(std::shared_ptr<Journal> journal) {
    impl_.reset();
    DispatcherOptions options;
    options.clock = &clock_;
    options.journal = std::move(journal);
    options.verify_shard_counts = verify_;
    options.dataset_ttl = absl::Minutes(1);
    options.snapshot_bytes = uint64_t{1} << 20;
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }

  // Starts RegisterDataset; the answer lands in the returned Call when it is given.
  std::shared_ptr<Call> Register(const proto::RegisterDatasetRequest& request) {
    auto call = std::make_shared<Call>();
    impl_->RegisterDataset(request, &call->response, [call](absl::Status s) {
      call->status = std::move(s);
      call->answered.Notify();
    });
    return call;
  }

  uint64_t Worker(const std::string& address) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address(address);
    request.set_capacity(2);
    proto::WorkerRegisterResponse response;
    EXPECT_TRUE(Sync(impl_).WorkerRegister(request, &response).ok());
    return response.worker_id();
  }

  proto::WorkerHeartbeatResponse WorkerBeat(uint64_t worker,
                                            std::vector<proto::DatasetDescription> described = {}) {
    proto::WorkerHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker);
    for (proto::DatasetDescription& d : described) *request.add_described() = d;
    proto::WorkerHeartbeatResponse response;
    absl::Status s = Sync(impl_).WorkerHeartbeat(request, &response);
    EXPECT_TRUE(s.ok()) << s;
    return response;
  }

  static proto::DatasetDescription Read(uint64_t ticket, std::vector<uint64_t> counts) {
    proto::DatasetDescription d;
    d.set_ticket(ticket);
    for (uint64_t c : counts) d.add_shard_record_counts(c);
    return d;
  }

  absl::Status CreateJob(const std::string& name, uint64_t dataset,
                         proto::GetOrCreateJobResponse* response) {
    proto::GetOrCreateJobRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_name(name);
    request.set_dataset_id(dataset);
    request.mutable_config()->set_num_epochs(1);
    request.mutable_config()->set_split_size(16);
    return Sync(impl_).GetOrCreateJob(request, response);
  }

  // The consumer closes its iterator: the job is collected at once.
  void Leave(uint64_t job) {
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_job_id(job);
    request.set_leaving(true);
    proto::ClientHeartbeatResponse response;
    ASSERT_TRUE(Sync(impl_).ClientHeartbeat(request, &response).ok());
  }

  FakeClock clock_;
  bool verify_ = true;
  std::unique_ptr<DispatcherImpl> impl_;
};

// The attack: counts of 10^12 records for a dataset whose manifest says 64. The call is held
// until a worker read the manifest, then refused naming the shard and both counts; nothing
// was journaled, so no job can be made of it.
TEST_F(DatasetLifecycleTest, AForgedShardCountIsRefusedNamingTheShardAndBothCounts) {
  const uint64_t worker = Worker("w1:1");
  const std::string pipeline = DatasetPipeline("/data/ds");
  std::shared_ptr<Call> call = Register(Request(pipeline, {64, 1000000000000}));
  EXPECT_FALSE(call->has_answer());

  proto::WorkerHeartbeatResponse beat = WorkerBeat(worker);
  ASSERT_EQ(beat.describe_size(), 1);
  EXPECT_EQ(beat.describe(0).ticket(), 1u);
  EXPECT_EQ(beat.describe(0).pipeline(), pipeline);
  EXPECT_FALSE(call->has_answer());

  beat = WorkerBeat(worker, {Read(1, {64, 64})});
  EXPECT_EQ(beat.describe_size(), 0);
  EXPECT_EQ(call->Answer().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call->Answer().message(),
            "RegisterDataset: shard 1 of dataset '/data/ds' has 64 records "
            "(read by data "
            "worker 1 at w1:1), the request says 1000000000000");
  EXPECT_EQ(call->response.dataset_id(), 0u);
  // A shard too many is refused the same way.
  call = Register(Request(pipeline, {64, 64, 64}));
  beat = WorkerBeat(worker);
  ASSERT_EQ(beat.describe_size(), 1);
  WorkerBeat(worker, {Read(beat.describe(0).ticket(), {64, 64})});
  EXPECT_EQ(call->Answer().message(),
            "RegisterDataset: dataset '/data/ds' has 2 shards (read by data "
            "worker 1 at w1:1), "
            "the request's shard_record_counts list 3");
}

// The true counts are registered once a worker confirmed them; the same request again is
// answered at once, without asking a worker.
TEST_F(DatasetLifecycleTest, TrueCountsAreRegisteredOnceAWorkerConfirmedThem) {
  const uint64_t worker = Worker("w1:1");
  const proto::RegisterDatasetRequest request = Request(DatasetPipeline("/data/ds"), {64, 36});
  std::shared_ptr<Call> call = Register(request);
  proto::WorkerHeartbeatResponse beat = WorkerBeat(worker);
  ASSERT_EQ(beat.describe_size(), 1);
  WorkerBeat(worker, {Read(beat.describe(0).ticket(), {64, 36})});
  ASSERT_TRUE(call->Answer().ok()) << call->status;
  const uint64_t dataset = call->response.dataset_id();
  EXPECT_NE(dataset, 0u);

  std::shared_ptr<Call> again = Register(request);
  EXPECT_TRUE(again->Answer().ok());
  EXPECT_EQ(again->response.dataset_id(), dataset);
  EXPECT_EQ(WorkerBeat(worker).describe_size(), 0);
  proto::GetOrCreateJobResponse job;
  EXPECT_TRUE(CreateJob("train", dataset, &job).ok());
  EXPECT_EQ(job.splits_per_epoch(), 4u + 3u);  // 64 = 4 x 16, 36 = 16 + 16 + 4
}

// What the worker could not read (outside its --data-root, no manifest) is the answer.
TEST_F(DatasetLifecycleTest, TheWorkersErrorIsTheAnswer) {
  const uint64_t worker = Worker("w1:1");
  std::shared_ptr<Call> call = Register(Request(DatasetPipeline("/etc"), {1}));
  WorkerBeat(worker);
  proto::DatasetDescription refused;
  refused.set_ticket(1);
  refused.set_error_code(static_cast<int32_t>(absl::StatusCode::kPermissionDenied));
  refused.set_error_message("pipeline source '/etc' is outside the worker's --data-root (/data)");
  WorkerBeat(worker, {refused});
  EXPECT_EQ(call->Answer().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(call->Answer().message(),
            "RegisterDataset: data worker 1 at w1:1 could not read the "
            "manifest of dataset "
            "'/etc': pipeline source '/etc' is outside the worker's "
            "--data-root (/data)");
}

// No worker registered: the call waits for one; a worker registering in time is handed the
// task; without one, UNAVAILABLE after verify_timeout (8 s).
TEST_F(DatasetLifecycleTest, WithoutAWorkerTheCallWaitsThenAnswersUnavailable) {
  std::shared_ptr<Call> late = Register(Request(DatasetPipeline("/data/a"), {10}));
  clock_.Advance(absl::Seconds(7));
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_FALSE(late->has_answer());
  const uint64_t worker = Worker("w1:1");
  proto::WorkerHeartbeatResponse beat = WorkerBeat(worker);
  ASSERT_EQ(beat.describe_size(), 1);
  WorkerBeat(worker, {Read(1, {10})});
  EXPECT_TRUE(late->Answer().ok()) << late->status;

  std::shared_ptr<Call> unanswered = Register(Request(DatasetPipeline("/data/b"), {10}));
  WorkerBeat(worker);  // takes ticket 2 and never answers
  clock_.Advance(absl::Seconds(8));
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_EQ(unanswered->Answer().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(unanswered->Answer().message(),
            "RegisterDataset: no data worker read the manifest of dataset "
            "'/data/b' within "
            "8s to check its shard record counts (none answered): start a "
            "worker whose "
            "--data-root holds the dataset, then retry");
}

// A worker that took the task and does not answer within two heartbeat intervals: the next
// worker to heartbeat gets it; a late answer of the first is ignored once decided.
TEST_F(DatasetLifecycleTest, ATaskAWorkerDoesNotAnswerGoesToAnother) {
  const uint64_t first = Worker("w1:1");
  const uint64_t second = Worker("w2:1");
  std::shared_ptr<Call> call = Register(Request(DatasetPipeline("/data/ds"), {5}));
  ASSERT_EQ(WorkerBeat(first).describe_size(), 1);
  EXPECT_EQ(WorkerBeat(second).describe_size(), 0);  // the first holds it
  clock_.Advance(absl::Seconds(2));
  ASSERT_EQ(WorkerBeat(second).describe_size(), 1);
  WorkerBeat(second, {Read(1, {5})});
  EXPECT_TRUE(call->Answer().ok());
  WorkerBeat(first, {Read(1, {6})});  // too late, and for a decided ticket
  EXPECT_TRUE(call->Answer().ok());
}

// Held calls are bounded (each holds its spec): past 64, RESOURCE_EXHAUSTED to retry; a
// dataset registered already is still answered at once.
TEST_F(DatasetLifecycleTest, HeldRegistrationsAreBounded) {
  const uint64_t worker = Worker("w1:1");
  std::shared_ptr<Call> first = Register(Request(DatasetPipeline("/data/ds"), {5}));
  WorkerBeat(worker);
  WorkerBeat(worker, {Read(1, {5})});
  ASSERT_TRUE(first->Answer().ok()) << first->status;
  std::vector<std::shared_ptr<Call>> held;
  for (int i = 0; i < 64; ++i)
    held.push_back(Register(Request(DatasetPipeline(absl::StrCat("/data/d", i)), {5})));
  std::shared_ptr<Call> over = Register(Request(DatasetPipeline("/data/over"), {5}));
  EXPECT_EQ(over->Answer().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over->Answer().message(),
            "RegisterDataset: 64 registrations already wait for a worker to "
            "check their shard "
            "record counts: retry in a few seconds");
  std::shared_ptr<Call> again = Register(Request(DatasetPipeline("/data/ds"), {5}));
  EXPECT_TRUE(again->Answer().ok()) << again->status;
  EXPECT_EQ(again->response.dataset_id(), first->response.dataset_id());
  for (const std::shared_ptr<Call>& call : held) EXPECT_FALSE(call->has_answer());
}

// A synthetic source states its size: checked at once, no worker needed.
TEST_F(DatasetLifecycleTest, SyntheticCountsAreCheckedWithoutAWorker) {
  proto::Pipeline pipeline;
  pipeline.mutable_source()->mutable_synthetic()->set_num_records(100);
  std::shared_ptr<Call> lie = Register(Request(pipeline.SerializeAsString(), {1000000000000}));
  EXPECT_EQ(lie->Answer().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lie->Answer().message(),
            "RegisterDataset: the synthetic source has 100 records in one shard, the "
            "request's shard_record_counts are [1000000000000]");
  std::shared_ptr<Call> truth = Register(Request(pipeline.SerializeAsString(), {100}));
  EXPECT_TRUE(truth->Answer().ok()) << truth->status;

  std::shared_ptr<Call> opaque = Register(Request("spec of an attacker", {100}));
  EXPECT_EQ(opaque->Answer().code(), absl::StatusCode::kInvalidArgument);
}

// A worker holding a WatchAssignment call is woken by a dataset to check.
TEST_F(DatasetLifecycleTest, AWatchingWorkerIsWokenByADatasetToCheck) {
  const uint64_t worker = Worker("w1:1");
  proto::WatchAssignmentRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_worker_id(worker);
  proto::WatchAssignmentResponse response;
  std::optional<absl::Status> answered;
  impl_->WatchAssignment(request, &response,
                         [&answered](absl::Status s) { answered = std::move(s); });
  EXPECT_FALSE(answered.has_value());
  std::shared_ptr<Call> call = Register(Request(DatasetPipeline("/data/ds"), {5}));
  ASSERT_TRUE(answered.has_value());
  EXPECT_TRUE(answered->ok());
  EXPECT_TRUE(response.work_available());
}

// A dataset no job uses is forgotten dataset_ttl (1 min) after its last use; registering it
// again counts as a use.
TEST_F(DatasetLifecycleTest, ADatasetNoJobUsesIsForgottenAfterItsTtl) {
  verify_ = false;
  Restart(std::make_shared<InMemoryJournal>());
  const proto::RegisterDatasetRequest request = Request("pipe", {100});
  proto::RegisterDatasetResponse registered;
  ASSERT_TRUE(Sync(impl_).RegisterDataset(request, &registered).ok());
  proto::GetOrCreateJobResponse job;
  ASSERT_TRUE(CreateJob("train", registered.dataset_id(), &job).ok());
  clock_.Advance(absl::Minutes(5));
  ASSERT_TRUE(impl_->Tick().ok());  // its job uses it
  Leave(job.job_id());
  clock_.Advance(absl::Seconds(59));
  ASSERT_TRUE(impl_->Tick().ok());
  proto::RegisterDatasetResponse again;
  ASSERT_TRUE(Sync(impl_).RegisterDataset(request, &again).ok());
  EXPECT_EQ(again.dataset_id(), registered.dataset_id());
  clock_.Advance(absl::Seconds(59));
  ASSERT_TRUE(impl_->Tick().ok());
  EXPECT_TRUE(CreateJob("kept", registered.dataset_id(), &job).ok());
  Leave(job.job_id());
  clock_.Advance(absl::Seconds(60));
  ASSERT_TRUE(impl_->Tick().ok());
  const absl::Status gone = CreateJob("late", registered.dataset_id(), &job);
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.message(), absl::StrCat("dataset ", registered.dataset_id(),
                                         " is not registered: call RegisterDataset first"));
}

uint64_t JournalBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (const char* name : {"journal.sqlite3", "journal.sqlite3-wal"}) {
    std::error_code error;
    const uint64_t size = std::filesystem::file_size(std::filesystem::path(dir) / name, error);
    if (!error) bytes += size;
  }
  return bytes;
}

// The attack: 150 RegisterDataset calls with distinct large specs (128 KiB here, 19 MiB
// in all), each used by a job that ends. Each dataset is forgotten a minute after its job; the
// journal is compacted whenever 1 MiB of updates accumulated (snapshot_bytes), so it stays at
// one snapshot and the updates after it. Per call: register, create job, remove job, forget
// dataset = 4 records. 8 registrations make 1 MiB: the snapshot is written after register 8,
// 16, ..., 144, so 3 (job 144, its removal, dataset 144 forgotten) + 6 x 4 (calls 145-150) = 27
// records follow it. A restart then restores the same jobs and state.
TEST_F(DatasetLifecycleTest, ManyLargeDatasetsLeaveTheJournalBoundedAndRestartRestoresIt) {
  verify_ = false;
  ::sluice::testing::TempDir dir;
  auto open = [&]() {
    SqliteJournal::Options options;
    options.sync = SqliteJournal::SyncMode::kNormal;
    auto journal = SqliteJournal::Open(dir.path(), options);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return std::shared_ptr<Journal>(std::move(*journal));
  };
  std::shared_ptr<Journal> journal = open();
  Restart(journal);
  for (int i = 1; i <= 150; ++i) {
    std::string spec(128 << 10, static_cast<char>('a' + i % 26));
    absl::StrAppend(&spec, i);
    proto::RegisterDatasetResponse registered;
    ASSERT_TRUE(Sync(impl_).RegisterDataset(Request(spec, {64}), &registered).ok());
    proto::GetOrCreateJobResponse job;
    ASSERT_TRUE(CreateJob(absl::StrCat("job-", i), registered.dataset_id(), &job).ok());
    Leave(job.job_id());
    clock_.Advance(absl::Minutes(1));
    ASSERT_TRUE(impl_->Tick().ok());
  }
  EXPECT_EQ(journal->updates_since_snapshot(), 27u);
  absl::StatusOr<Journal::Contents> contents = journal->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->updates.size(), 27u);
  proto::DispatcherSnapshot snapshot;
  ASSERT_TRUE(snapshot.ParseFromString(contents->snapshot));
  ASSERT_EQ(snapshot.updates_size(), 2);  // the id floor, dataset 144
  EXPECT_TRUE(snapshot.updates(1).has_register_dataset());
  // One snapshot (128 KiB) and at most 1 MiB of updates, plus SQLite's pages and WAL.
  EXPECT_LT(JournalBytes(dir.path()), uint64_t{4} << 20);

  // A live job with progress, then a restart: the same state comes back.
  proto::RegisterDatasetResponse registered;
  ASSERT_TRUE(Sync(impl_).RegisterDataset(Request("live", {64}), &registered).ok());
  proto::GetOrCreateJobResponse job;
  ASSERT_TRUE(CreateJob("live", registered.dataset_id(), &job).ok());
  const uint64_t worker = Worker("w1:1");
  ASSERT_EQ(WorkerBeat(worker).start_size(), 2);
  auto state = [&](proto::GetStatusResponse* status, proto::GetJobStateResponse* job_state) {
    proto::GetStatusRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_starting_workers(-1);
    ASSERT_TRUE(Sync(impl_).GetStatus(request, status).ok());
    proto::GetJobStateRequest get;
    get.set_protocol_version(kProtocolVersion);
    get.set_job_id(job.job_id());
    ASSERT_TRUE(Sync(impl_).GetJobState(get, job_state).ok());
  };
  proto::GetStatusResponse status_before;
  proto::GetJobStateResponse job_before;
  state(&status_before, &job_before);
  ASSERT_EQ(job_before.consumers_size(), 1);
  ASSERT_EQ(job_before.consumers(0).splits_size(), 4);
  EXPECT_EQ(job_before.consumers(0).splits(0).status(), proto::SPLIT_STATUS_ASSIGNED);

  impl_.reset();
  journal.reset();
  Restart(open());
  proto::GetStatusResponse status_after;
  proto::GetJobStateResponse job_after;
  state(&status_after, &job_after);
  EXPECT_EQ(job_after.SerializeAsString(), job_before.SerializeAsString());
  ASSERT_EQ(status_after.jobs_size(), 1);
  EXPECT_EQ(status_after.jobs(0).job_name(), "live");
  EXPECT_EQ(status_after.jobs(0).SerializeAsString(), status_before.jobs(0).SerializeAsString());
  ASSERT_EQ(status_after.workers_size(), 1);
  EXPECT_EQ(status_after.workers(0).address(), "w1:1");
  proto::RegisterDatasetResponse same;
  ASSERT_TRUE(Sync(impl_).RegisterDataset(Request("live", {64}), &same).ok());
  EXPECT_EQ(same.dataset_id(), registered.dataset_id());
}

}  // namespace
}  // namespace sluice::dispatcher
