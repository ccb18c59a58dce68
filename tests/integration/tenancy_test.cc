// The attacks of a trainer on other teams, replayed against real processes: a dispatcher and a
// worker with --tokens-file listing two trainers (alice, bob), a worker identity, a second worker
// identity (rogue) and an operator. Each attack is refused with PERMISSION_DENIED (or
// INVALID_ARGUMENT) naming the role or the owner, and alice's job still reads every record
// exactly once.
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "common/service/channel_factory.h"
#include "common/service/protocol.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/dispatcher.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/certificates.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::LabelPipeline;
using ::sluice::testing::SecuredCluster;
using ::sluice::testing::TempDir;
using ::sluice::testing::WriteLabelDataset;
using ::testing::HasSubstr;

constexpr int kRecords = 64;

class TenancyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    WriteLabelDataset(dir_->Join("root/ds"), kRecords);
    auto certs = tools::MakeCertificates(dir_->Join("tls"));
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new tools::Certificates(*certs);
    for (const char* name : {"alice", "bob", "worker", "rogue", "ops", "mallory", "trudy", "carol"})
      std::ofstream(Token(name)) << "token-of-" << name << "\n";
    std::ofstream(dir_->Join("tokens.csv"))
        << "token-of-alice,alice,1001,sluice:trainers\n"
           "token-of-bob,bob,1002,sluice:trainers\n"
           "token-of-worker,worker,2001,sluice:workers\n"
           "token-of-rogue,rogue,2002,sluice:workers\n"
           "token-of-ops,ops,3001,\"sluice:operators,sluice:trainers\"\n"
           "token-of-mallory,mallory,1003,sluice:trainers\n"
           "token-of-trudy,trudy,1004,sluice:trainers\n"
           "token-of-carol,carol,1005,sluice:trainers\n";
    const std::vector<std::string> tokens = {"--tokens-file", dir_->Join("tokens.csv")};
    std::vector<std::string> worker_flags = tokens;
    worker_flags.insert(worker_flags.end(), {"--max-streams-per-identity", "2"});
    std::vector<std::string> dispatcher_flags = tokens;
    dispatcher_flags.insert(dispatcher_flags.end(),
                            {"--max-datasets-per-identity", "4", "--max-jobs-per-identity", "3"});
    auto cluster = tools::LocalCluster::Start(
        SecuredCluster(dir_->Join("root"), dir_->Join("cluster"), *certs_, Token("worker"),
                       worker_flags, dispatcher_flags));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete certs_;
    delete dir_;
  }

  static std::string Token(const std::string& name) { return dir_->Join("token-" + name); }
  static service::ChannelOptions As(const std::string& name) {
    return {.tls_ca = certs_->ca,
            .tls_cert = certs_->client_cert,
            .tls_key = certs_->client_key,
            .auth_token_file = Token(name)};
  }
  static ClientOptions Client(const std::string& name) {
    return {.dispatcher_address = cluster_->dispatcher_address(),
            .connect_timeout = absl::Seconds(20),
            .tls_ca = certs_->ca,
            .tls_cert = certs_->client_cert,
            .tls_key = certs_->client_key,
            .auth_token_file = Token(name)};
  }
  static std::unique_ptr<proto::DispatcherService::Stub> Dispatcher(const std::string& name) {
    auto channel = service::CreateChannel(cluster_->dispatcher_address(), As(name));
    EXPECT_TRUE(channel.ok()) << channel.status();
    return proto::DispatcherService::NewStub(*channel);
  }
  static proto::Pipeline Pipeline() { return LabelPipeline(dir_->Join("root/ds")); }
  // The id of the job stored as `name`, as the operator sees it (0: none).
  static uint64_t JobId(const std::string& name) {
    grpc::ClientContext context;
    proto::GetStatusRequest request;
    request.set_protocol_version(service::kProtocolVersion);
    request.set_starting_workers(-1);
    proto::GetStatusResponse response;
    EXPECT_TRUE(Dispatcher("ops")->GetStatus(&context, request, &response).ok());
    for (const proto::JobStatus& job : response.jobs())
      if (job.job_name() == name) return job.job_id();
    return 0;
  }

  static TempDir* dir_;
  static tools::Certificates* certs_;
  static tools::LocalCluster* cluster_;
};

TempDir* TenancyTest::dir_ = nullptr;
tools::Certificates* TenancyTest::certs_ = nullptr;
tools::LocalCluster* TenancyTest::cluster_ = nullptr;

// A synthetic source of `records` records.
std::string Synthetic(int64_t records) {
  proto::Pipeline pipeline;
  pipeline.mutable_source()->mutable_synthetic()->set_num_records(records);
  return pipeline.SerializeAsString();
}

// RegisterDataset through the raw API (the client library asks a worker for the counts).
grpc::Status RegisterAs(proto::DispatcherService::Stub& stub, std::vector<uint64_t> counts,
                        uint64_t batch_size, uint64_t* dataset_id,
                        const std::string& pipeline = Synthetic(100)) {
  grpc::ClientContext context;
  proto::RegisterDatasetRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_pipeline(pipeline);
  for (uint64_t c : counts) request.add_shard_record_counts(c);
  request.set_batch_size(batch_size);
  proto::RegisterDatasetResponse response;
  grpc::Status s = stub.RegisterDataset(&context, request, &response);
  *dataset_id = response.dataset_id();
  return s;
}

grpc::Status CreateJobAs(proto::DispatcherService::Stub& stub, uint64_t dataset_id,
                         const std::string& name) {
  grpc::ClientContext context;
  proto::GetOrCreateJobRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_dataset_id(dataset_id);
  request.set_job_name(name);
  proto::GetOrCreateJobResponse response;
  return stub.GetOrCreateJob(&context, request, &response);
}

// Bob marks alice's slots complete (and reads her state, and streams her batches from the
// worker): each refused; alice then reads every record exactly once.
TEST_F(TenancyTest, AnotherTrainerCannotTruncateReadOrStreamAJob) {
  auto alice = DataServiceClient::Create(Client("alice"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto it = (*alice)->Open({.job_name = "train", .pipeline = Pipeline()});
  ASSERT_TRUE(it.ok()) << it.status();
  std::multiset<uint64_t> ids;
  auto first = (*it)->GetNext();
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
  ids.insert((*first)->global_indices.begin(), (*first)->global_indices.end());

  const uint64_t job = JobId("alice/train");
  ASSERT_NE(job, 0u);
  {
    grpc::ClientContext context;
    proto::GetJobStateRequest request;
    request.set_protocol_version(service::kProtocolVersion);
    request.set_job_id(job);
    proto::GetJobStateResponse response;
    const grpc::Status s = Dispatcher("bob")->GetJobState(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(),
                HasSubstr(absl::StrCat("bob (groups: sluice:trainers) may not call "
                                       "GetJobState for job ",
                                       job, ": the job belongs to alice")));
  }
  {
    grpc::ClientContext context;
    proto::ClientHeartbeatRequest request;
    request.set_protocol_version(service::kProtocolVersion);
    request.set_job_id(job);
    for (uint64_t position = 0; position < 8; ++position) {
      proto::ClientSplitProgress* p = request.add_progress();
      p->set_position(position);
      p->set_delivered_batches(1);
      p->set_complete(true);
    }
    proto::ClientHeartbeatResponse response;
    const grpc::Status s = Dispatcher("bob")->ClientHeartbeat(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("the job belongs to alice"));
  }
  {
    auto channel = service::CreateChannel(cluster_->worker(0).address, As("bob"));
    ASSERT_TRUE(channel.ok());
    grpc::ClientContext context;
    proto::GetBatchesRequest request;
    request.set_protocol_version(service::kProtocolVersion);
    request.set_job_id(job);
    auto reader = proto::WorkerService::NewStub(*channel)->GetBatches(&context, request);
    proto::Batch batch;
    while (reader->Read(&batch)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("may not call GetBatches for job ", job,
                                                          ": the job belongs to alice")));
  }
  while (true) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    ids.insert((*batch)->global_indices.begin(), (*batch)->global_indices.end());
  }
  ASSERT_EQ(ids.size(), static_cast<size_t>(kRecords));
  for (int i = 0; i < kRecords; ++i) EXPECT_EQ(ids.count(i), 1u) << i;
}

TEST_F(TenancyTest, TrainerCannotDrainOrRegisterWorkers) {
  grpc::ClientContext drain_context;
  proto::DrainWorkerRequest drain;
  drain.set_protocol_version(service::kProtocolVersion);
  drain.set_worker_id(1);
  proto::DrainWorkerResponse drained;
  grpc::Status s = Dispatcher("bob")->DrainWorker(&drain_context, drain, &drained);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("needs the role sluice:operators"));

  grpc::ClientContext register_context;
  proto::WorkerRegisterRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_address("127.0.0.1:1");
  proto::WorkerRegisterResponse response;
  s = Dispatcher("bob")->WorkerRegister(&register_context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("needs the role sluice:workers"));
}

TEST_F(TenancyTest, HugeCapacityAndAddressTakeoverAreRefused) {
  grpc::ClientContext context;
  proto::WorkerRegisterRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_address("127.0.0.1:2");
  request.set_capacity(2147483647);
  proto::WorkerRegisterResponse response;
  grpc::Status s = Dispatcher("rogue")->WorkerRegister(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("capacity 2147483647 is more than --max-worker-capacity 64"));

  grpc::ClientContext takeover;
  request.set_address(cluster_->worker(0).address);
  request.set_capacity(2);
  s = Dispatcher("rogue")->WorkerRegister(&takeover, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("may not register at ", cluster_->worker(0).address,
                                     ": live worker")));
}

TEST_F(TenancyTest, GetStatusShowsATrainerOnlyItsOwnJobs) {
  auto bob = DataServiceClient::Create(Client("bob"));
  ASSERT_TRUE(bob.ok()) << bob.status();
  auto it = (*bob)->Open({.job_name = "train", .pipeline = Pipeline()});
  ASSERT_TRUE(it.ok()) << it.status();
  ASSERT_NE(JobId("bob/train"), 0u);  // the same name as alice's: another job

  grpc::ClientContext context;
  proto::GetStatusRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_starting_workers(-1);
  proto::GetStatusResponse response;
  ASSERT_TRUE(Dispatcher("bob")->GetStatus(&context, request, &response).ok());
  ASSERT_GE(response.jobs_size(), 1);
  for (const proto::JobStatus& job : response.jobs())
    EXPECT_EQ(job.job_name().rfind("bob/", 0), 0u) << job.job_name();
  // Read to the end: an abandoned consumer's full queue would hold the worker's one producer
  // until the consumer timeout, and delay the jobs of the tests after this one.
  while (true) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
  }
}

// Bob's spec resizes 1 x 16384 images by their shorter side to 16384: 16384 x 268435456 pixels,
// 12 TiB per element. The worker refuses it before allocating; bob's consumer gets
// INVALID_ARGUMENT naming the op, the failed split is not handed to another worker, no process
// dies, and alice's job beside it reads every record exactly once.
TEST_F(TenancyTest, AHostileSpecFailsAloneAndItsSplitIsNotHandedOn) {
  auto hostile = pipeline_spec::ParsePipelineSpec(R"(
source: {synthetic: {num_records: 16, height: 1, width: 16384}, columns: [image]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 16384}}]}
  - batch: {size: 2}
)");
  ASSERT_TRUE(hostile.ok()) << hostile.status();
  auto bob = DataServiceClient::Create(Client("bob"));
  ASSERT_TRUE(bob.ok()) << bob.status();
  auto bad = (*bob)->Open({.job_name = "hostile", .pipeline = *hostile});
  ASSERT_TRUE(bad.ok()) << bad.status();
  auto alice = DataServiceClient::Create(Client("alice"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  auto it = (*alice)->Open({.job_name = "beside", .pipeline = Pipeline()});
  ASSERT_TRUE(it.ok()) << it.status();

  auto failed = (*bad)->GetNext();
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  EXPECT_THAT(failed.status().message(),
              HasSubstr("(Resize): an output of 16384x268435456 (HxW) is too "
                        "large"));

  std::multiset<uint64_t> ids;
  while (true) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    ids.insert((*batch)->global_indices.begin(), (*batch)->global_indices.end());
  }
  ASSERT_EQ(ids.size(), static_cast<size_t>(kRecords));
  for (int i = 0; i < kRecords; ++i) EXPECT_EQ(ids.count(i), 1u) << i;

  const uint64_t job = JobId("bob/hostile");
  ASSERT_NE(job, 0u);
  grpc::ClientContext context;
  proto::GetJobStateRequest request;
  request.set_protocol_version(service::kProtocolVersion);
  request.set_job_id(job);
  proto::GetJobStateResponse state;
  ASSERT_TRUE(Dispatcher("ops")->GetJobState(&context, request, &state).ok());
  int assigned = 0;
  for (const proto::ConsumerState& consumer : state.consumers()) {
    for (const proto::SplitState& split : consumer.splits()) {
      EXPECT_LE(split.assignments(), 1u) << split.position();
      assigned += split.assignments();
    }
  }
  EXPECT_GE(assigned, 1);
  EXPECT_EQ(cluster_->FindExitedChild(), "");
}

// shard_record_counts=[10^12] (the client sends the counts): the job that would enumerate a
// billion splits is refused before anything is built, a sum past 2^48 already at registration;
// the dispatcher stays up.
TEST_F(TenancyTest, ForgedShardRecordCountsAreRefused) {
  auto mallory = Dispatcher("mallory");
  uint64_t dataset = 0;
  grpc::Status s = RegisterAs(*mallory, {uint64_t{1} << 62, uint64_t{1} << 62}, 8, &dataset);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("shard_record_counts add up to more than "
                                           "281474976710656 records"));
  // Counts the dataset's manifest does not have: the dispatcher has a worker read it and
  // refuses the request before anything is journaled or allocated.
  s = RegisterAs(*mallory, {1000000000000ull}, 8, &dataset, Pipeline().SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("RegisterDataset: shard 0 of dataset '", dir_->Join("root/ds"),
                                     "' has 64 records (read by data worker ")));
  EXPECT_THAT(s.error_message(), HasSubstr("the request says 1000000000000"));
  s = RegisterAs(*mallory, {1000000000000ull}, 8, &dataset, Synthetic(100));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A dataset that really is that large is refused when it would be cut into splits.
  s = RegisterAs(*mallory, {1000000000000ull}, 8, &dataset, Synthetic(1000000000000));
  ASSERT_TRUE(s.ok()) << s.error_message();
  s = CreateJobAs(*mallory, dataset, "huge");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            "the job would have 976562500 splits of 1024 records, more than "
            "--max-splits-per-job 1048576: set a larger split_size, or raise "
            "--max-splits-per-job");
  EXPECT_EQ(cluster_->FindExitedChild(), "");
}

// One trainer registering dataset after dataset and job after job (each a journal record
// that survives restarts) is stopped at its own quota, naming the flag.
TEST_F(TenancyTest, OneTrainerCannotHoardDatasetsOrJobs) {
  auto trudy = Dispatcher("trudy");
  uint64_t dataset = 0;
  // Jobs whose consumers never come hold worker capacity until their lease runs out (60 s);
  // a spec the worker refuses keeps them off the one worker the next test reads from.
  proto::Pipeline refused;
  refused.mutable_source()->mutable_synthetic()->set_num_records(100);
  refused.mutable_source()->mutable_synthetic()->set_height(-1);
  const std::string spec = refused.SerializeAsString();
  for (uint64_t batch = 1; batch <= 4; ++batch) {
    grpc::Status s = RegisterAs(*trudy, {100}, batch, &dataset, spec);
    ASSERT_TRUE(s.ok()) << batch << ": " << s.error_message();
  }
  uint64_t fifth = 0;
  grpc::Status s = RegisterAs(*trudy, {100}, 5, &fifth, spec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("trudy already holds 4 datasets "
                                           "(--max-datasets-per-identity 4)"));
  ASSERT_TRUE(RegisterAs(*trudy, {100}, 4, &dataset, spec).ok());  // again: the same one

  for (const char* name : {"h0", "h1", "h2"}) {
    s = CreateJobAs(*trudy, dataset, name);
    ASSERT_TRUE(s.ok()) << name << ": " << s.error_message();
  }
  s = CreateJobAs(*trudy, dataset, "h3");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(),
              HasSubstr("trudy already holds 3 jobs (--max-jobs-per-identity 3)"));
}

// Mallory holds two streams without reading them and asks for a third: refused naming
// --max-streams-per-identity; carol's job on the same worker reads every record exactly once.
TEST_F(TenancyTest, OneTrainerHoldingStreamsCannotStarveOthers) {
  auto mallory = DataServiceClient::Create(Client("mallory"));
  ASSERT_TRUE(mallory.ok()) << mallory.status();
  std::vector<std::unique_ptr<BatchIterator>> held;
  for (uint32_t consumer = 0; consumer < 3; ++consumer) {
    auto it = (*mallory)->Open({.job_name = "hoard",
                                .pipeline = Pipeline(),
                                .num_consumers = 3,
                                .consumer_index = consumer});
    ASSERT_TRUE(it.ok()) << it.status();
    auto batch = (*it)->GetNext();
    if (consumer < 2) {
      ASSERT_TRUE(batch.ok() && batch->has_value()) << batch.status();
    } else {
      EXPECT_EQ(batch.status().code(), absl::StatusCode::kResourceExhausted) << batch.status();
      EXPECT_THAT(batch.status().message(),
                  HasSubstr("mallory already holds 2 streams on this worker "
                            "(--max-streams-per-identity 2)"));
    }
    held.push_back(std::move(*it));
  }

  auto carol = DataServiceClient::Create(Client("carol"));
  ASSERT_TRUE(carol.ok()) << carol.status();
  auto it = (*carol)->Open({.job_name = "train", .pipeline = Pipeline()});
  ASSERT_TRUE(it.ok()) << it.status();
  std::multiset<uint64_t> ids;
  while (true) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    ids.insert((*batch)->global_indices.begin(), (*batch)->global_indices.end());
  }
  ASSERT_EQ(ids.size(), static_cast<size_t>(kRecords));
  for (int i = 0; i < kRecords; ++i) EXPECT_EQ(ids.count(i), 1u) << i;
}

}  // namespace
}  // namespace sluice
