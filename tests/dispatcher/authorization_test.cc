// Who may call which DispatcherService method (dispatcher/authorization.h).
#include "dispatcher/authorization.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::dispatcher {
namespace {

using service::Identity;
using service::Role;
using ::testing::HasSubstr;

const Identity kAlice{.user = "alice", .groups = {"sluice:trainers"}};
const Identity kBob{.user = "bob", .groups = {"sluice:trainers"}};
const Identity kWorker{.user = "worker", .groups = {"sluice:workers"}};
const Identity kOtherWorker{.user = "rogue", .groups = {"sluice:workers"}};
const Identity kOps{.user = "ops", .groups = {"sluice:operators"}};

TEST(Authorization, JobsAreCreatedOnlyOverRegisteredDatasetsWithScopedNames) {
  Authorization auth({});
  const proto::RegisterDatasetRequest dataset;
  EXPECT_EQ(auth.CheckRegisterDataset(kWorker, dataset).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(auth.CheckRegisterDataset(kAlice, dataset).ok());
  auth.DatasetRegistered(kAlice, dataset, 5);

  proto::GetOrCreateJobRequest request;
  request.set_dataset_id(5);
  request.set_job_name("train");
  ASSERT_TRUE(auth.CheckGetOrCreateJob(kAlice, "1-0", &request).ok());
  EXPECT_EQ(request.job_name(), "alice/train");

  request.set_job_name("train");
  const absl::Status s = auth.CheckGetOrCreateJob(kBob, "1-1", &request);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("did not register that dataset"));

  auth.DatasetRegistered(kBob, dataset, 5);  // the same spec: bob owns it too
  request.set_job_name("");
  ASSERT_TRUE(auth.CheckGetOrCreateJob(kBob, "1-2", &request).ok());
  EXPECT_EQ(request.job_name(), "bob/~1-2");

  request.set_job_name("train");
  ASSERT_TRUE(auth.CheckGetOrCreateJob(Identity::Development(), "1-3", &request).ok());
  EXPECT_EQ(request.job_name(), "train");
}

TEST(Authorization, DatasetsPerIdentityAreCappedButRegisteringAgainPasses) {
  Authorization auth({.max_datasets_per_identity = 2});
  proto::RegisterDatasetRequest request;
  request.set_batch_size(8);
  request.add_shard_record_counts(100);
  for (const char* spec : {"a", "b"}) {
    request.set_pipeline(spec);
    ASSERT_TRUE(auth.CheckRegisterDataset(kAlice, request).ok()) << spec;
    auth.DatasetRegistered(kAlice, request, spec[0]);
  }
  request.set_pipeline("c");
  absl::Status s = auth.CheckRegisterDataset(kAlice, request);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "alice already holds 2 datasets (--max-datasets-per-identity 2): "
            "wait for one to finish, or ask an operator to raise "
            "--max-datasets-per-identity");
  // Another batch size is another dataset; the same one again passes.
  request.set_pipeline("a");
  request.set_batch_size(16);
  EXPECT_EQ(auth.CheckRegisterDataset(kAlice, request).code(),
            absl::StatusCode::kResourceExhausted);
  request.set_batch_size(8);
  EXPECT_TRUE(auth.CheckRegisterDataset(kAlice, request).ok());
  // Bob's quota is his own; the development identity has none.
  request.set_pipeline("c");
  EXPECT_TRUE(auth.CheckRegisterDataset(kBob, request).ok());
  EXPECT_TRUE(auth.CheckRegisterDataset(Identity::Development(), request).ok());
}

// A dataset the dispatcher forgot (--dataset-ttl) no longer counts against its registrant.
TEST(Authorization, ForgottenDatasetsNoLongerCountAgainstTheQuota) {
  Authorization auth({.max_datasets_per_identity = 2});
  proto::RegisterDatasetRequest request;
  request.set_batch_size(8);
  request.add_shard_record_counts(100);
  for (const char* spec : {"a", "b"}) {
    request.set_pipeline(spec);
    auth.DatasetRegistered(kAlice, request, spec[0]);
  }
  request.set_pipeline("c");
  EXPECT_EQ(auth.CheckRegisterDataset(kAlice, request).code(),
            absl::StatusCode::kResourceExhausted);
  auth.ForgetDatasets("bob", [](uint64_t) { return false; });  // not alice's
  EXPECT_EQ(auth.CheckRegisterDataset(kAlice, request).code(),
            absl::StatusCode::kResourceExhausted);
  auth.ForgetDatasets("alice", [](uint64_t id) { return id != 'a'; });
  EXPECT_TRUE(auth.CheckRegisterDataset(kAlice, request).ok());
  // Alice no longer owns the forgotten dataset: a job over its old id is refused.
  proto::GetOrCreateJobRequest job;
  job.set_dataset_id('a');
  EXPECT_EQ(auth.CheckGetOrCreateJob(kAlice, "1-1", &job).code(),
            absl::StatusCode::kPermissionDenied);
  job.set_dataset_id('b');
  EXPECT_TRUE(auth.CheckGetOrCreateJob(kAlice, "1-2", &job).ok());
}

TEST(Authorization, OnlyTheOwnerOrAnOperatorReachesAJob) {
  Authorization auth({});
  EXPECT_FALSE(auth.JobOwner(9).has_value());
  proto::GetStatusResponse status;
  proto::JobStatus* job = status.add_jobs();
  job->set_job_id(9);
  job->set_job_name("alice/train");
  auth.LearnJobs(status);
  ASSERT_EQ(auth.JobOwner(9), "alice");

  EXPECT_TRUE(auth.CheckJobAccess(kAlice, Role::kTrainer, "ClientHeartbeat", 9, "alice").ok());
  const absl::Status s = auth.CheckJobAccess(kBob, Role::kTrainer, "ClientHeartbeat", 9, "alice");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "bob (groups: sluice:trainers) may not call ClientHeartbeat for "
            "job 9: the job belongs to alice (only its owner or an operator, "
            "sluice:operators, may)");
  EXPECT_TRUE(auth.CheckJobAccess(kOps, Role::kTrainer, "GetJobState", 9, "alice").ok());
  EXPECT_EQ(auth.CheckJobAccess(kWorker, Role::kTrainer, "GetJobState", 9, "worker").code(),
            absl::StatusCode::kPermissionDenied);  // no trainer role

  auth.JobCreated(kBob, 10);
  EXPECT_EQ(auth.JobOwner(10), "bob");
}

TEST(Authorization, WorkerIdsAndAddressesStayWithTheirIdentity) {
  Authorization auth({.max_worker_capacity = 8});
  proto::WorkerRegisterRequest request;
  request.set_address("10.0.0.1:5000");
  request.set_capacity(2);
  uint64_t holder = 1;
  EXPECT_EQ(auth.CheckWorkerRegister(kAlice, request, &holder).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(auth.CheckWorkerRegister(kWorker, request, &holder).ok());
  EXPECT_EQ(holder, 0u);
  auth.WorkerRegistered(kWorker, 3, request.address());

  ASSERT_TRUE(auth.CheckWorkerRegister(kOtherWorker, request, &holder).ok());
  EXPECT_EQ(holder, 3u);  // the adapter refuses while worker 3 lives
  ASSERT_TRUE(auth.CheckWorkerRegister(kWorker, request, &holder).ok());
  EXPECT_EQ(holder, 0u);

  request.set_capacity(2147483647);
  const absl::Status s = auth.CheckWorkerRegister(kWorker, request, &holder);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("capacity 2147483647 is more than "
                                     "--max-worker-capacity 8"));

  EXPECT_TRUE(auth.CheckWorker(kWorker, 3, "WorkerHeartbeat").ok());
  const absl::Status taken = auth.CheckWorker(kOtherWorker, 3, "WorkerHeartbeat");
  EXPECT_EQ(taken.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(taken.message(), HasSubstr("worker 3: that worker was registered by worker"));
  // An id not seen since the start is bound to its first caller.
  EXPECT_TRUE(auth.CheckWorker(kOtherWorker, 4, "WorkerHeartbeat").ok());
  EXPECT_EQ(auth.CheckWorker(kWorker, 4, "WorkerHeartbeat").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.CheckWorker(kAlice, 5, "WorkerHeartbeat").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Authorization, DrainIsForOperatorsAndTrainersSeeTheirOwnJobs) {
  Authorization auth({});
  const absl::Status s = auth.CheckDrainWorker(kAlice);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("needs the role sluice:operators"));
  EXPECT_TRUE(auth.CheckDrainWorker(kOps).ok());

  proto::GetStatusRequest request;
  request.set_starting_workers(3);
  ASSERT_TRUE(auth.CheckGetStatus(kAlice, &request).ok());
  EXPECT_EQ(request.starting_workers(), -1);
  EXPECT_EQ(auth.CheckGetStatus(kWorker, &request).code(), absl::StatusCode::kPermissionDenied);

  proto::GetStatusResponse status;
  status.add_jobs()->set_job_name("alice/a");
  status.add_jobs()->set_job_name("bob/b");
  status.add_jobs()->set_job_name("dev");
  status.add_drain(4);
  proto::GetStatusResponse seen = status;
  auth.FilterStatus(kAlice, &seen);
  ASSERT_EQ(seen.jobs_size(), 1);
  EXPECT_EQ(seen.jobs(0).job_name(), "alice/a");
  EXPECT_EQ(seen.drain_size(), 0);
  seen = status;
  auth.FilterStatus(kOps, &seen);
  EXPECT_EQ(seen.jobs_size(), 3);
}

}  // namespace
}  // namespace sluice::dispatcher
