#include "data_worker/worker/grpc_worker_service.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/base/clock.h"
#include "common/record/dataset.h"
#include "common/service/batch_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/worker_service.grpc.pb.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/data_worker/worker/worker_test_util.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker {
namespace {

using ::testing::ElementsAre;
using testing::Eventually;
using testing::FakeDispatcher;
using testing::MakeJob;
using testing::MakeSplit;

class GrpcWorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pipeline::testing::MakeDataset(dir_.Join("ds"), 48, /*classes=*/1000, {},
                                   /*fixed=*/48);
  }

  void StartWorker(size_t queue_batches) {
    WorkerOptions options;
    options.data_roots = {dir_.path()};
    options.threads = 2;
    options.capacity = 1;
    options.queue_batches = queue_batches;
    options.heartbeat_thread = false;
    options.clock = &clock_;
    auto w = WorkerImpl::Create(options, std::make_unique<FakeDispatcher>(&fake_));
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(*w);
    service_ = std::make_unique<GrpcWorkerService>(worker_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    ASSERT_TRUE(worker_->Start(absl::StrCat("127.0.0.1:", port)).ok());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), args);
  }

  void TearDown() override {
    if (worker_ != nullptr) worker_->Stop();
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      server_->Wait();
    }
  }

  void Assign(const std::string& yaml, const proto::SplitAssignment& split) {
    proto::WorkerHeartbeatResponse r;
    *r.add_jobs() = MakeJob(1, absl::StrReplaceAll(yaml, {{"DIR", dir_.Join("ds")}}), 4);
    *r.add_start() = split;
    {
      absl::MutexLock lock(&fake_.mu);
      fake_.script.push_back(r);
    }
    ASSERT_TRUE(worker_->Heartbeat().ok());
  }

  // Reads GetBatches frames as a client does (service::DecodeBatch) and hands
  // the test each checked header.
  class FrameReader {
   public:
    explicit FrameReader(std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream)
        : stream_(std::move(stream)) {}
    bool Read(proto::Batch* header) {
      grpc::ByteBuffer frame;
      if (!stream_->Read(&frame)) return false;
      absl::StatusOr<service::ReceivedBatch> batch = service::DecodeBatch(&frame);
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok()) return false;
      *header = batch->header;
      last_ = *std::move(batch);
      return true;
    }
    // The last batch read.
    const service::ReceivedBatch& last() const { return last_; }
    grpc::Status Finish() { return stream_->Finish(); }

   private:
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream_;
    service::ReceivedBatch last_;
  };

  // `held_batches` > 0: the consumer holds that many batches of epoch 0 position 0.
  std::unique_ptr<FrameReader> Open(grpc::ClientContext* context,
                                    uint32_t version = kProtocolVersion,
                                    uint64_t held_batches = 0) {
    proto::GetBatchesRequest request;
    request.set_protocol_version(version);
    request.set_job_id(1);
    request.set_consumer_index(0);
    if (held_batches > 0) {
      proto::HeldSplit* h = request.add_held();
      h->mutable_key()->set_job_id(1);
      h->mutable_key()->set_consumer_index(0);
      h->set_batches(held_batches);
    }
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return std::make_unique<FrameReader>(
        service::OpenBatchStream(channel_.get(), context, request));
  }

  sluice::testing::TempDir dir_;
  FakeClock clock_;
  FakeDispatcher::Shared fake_;
  std::unique_ptr<WorkerImpl> worker_;
  std::unique_ptr<GrpcWorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcWorkerServiceTest, ClientReadsTheExactBatchesOfASplitThenOkOnStop) {
  StartWorker(/*queue_batches=*/8);
  Assign(R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes:
  - batch: {size: 4}
)",
         MakeSplit(1, 0, 0, /*split_id=*/1, 12, 24, 12, /*skip=*/1));
  grpc::ClientContext context;
  auto reader = Open(&context, kProtocolVersion, /*held_batches=*/1);
  proto::Batch b;
  ASSERT_TRUE(reader->Read(&b));
  EXPECT_EQ(b.batch_index(), 1u);
  EXPECT_THAT(b.global_indices(), ElementsAre(16, 17, 18, 19));
  EXPECT_FALSE(b.end_of_split());
  ASSERT_TRUE(reader->Read(&b));
  EXPECT_EQ(b.batch_index(), 2u);
  EXPECT_THAT(b.global_indices(), ElementsAre(20, 21, 22, 23));
  EXPECT_FALSE(b.end_of_split());
  EXPECT_EQ(b.columns(0).data_length(), 32u);
  // The column bytes after the header are the labels of records 20..23
  // (label = the record index in the test dataset).
  const service::ColumnBytes labels = service::Gather(reader->last(), 0, /*alignment=*/8);
  ASSERT_EQ(labels.size, 32u);
  std::vector<int64_t> values(4);
  std::memcpy(values.data(), labels.data, 32);
  EXPECT_THAT(values, ElementsAre(20, 21, 22, 23));
  ASSERT_TRUE(reader->Read(&b));
  EXPECT_TRUE(b.end_of_split());
  EXPECT_EQ(b.batch_index(), 3u);

  worker_->Stop();  // the worker exits: the stream ends OK, nothing is queued
  EXPECT_FALSE(reader->Read(&b));
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(GrpcWorkerServiceTest, ErrorsReachTheClientWithTheirCodes) {
  StartWorker(/*queue_batches=*/8);
  {
    grpc::ClientContext context;
    auto reader = Open(&context);
    proto::Batch b;
    EXPECT_FALSE(reader->Read(&b));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  Assign(R"(
source: {dataset: {path: /etc}, columns: [label]}
nodes:
  - batch: {size: 4}
)",
         MakeSplit(1, 0, 0, 0, 0, 8, 0, 0));
  {
    grpc::ClientContext context;
    auto reader = Open(&context);
    proto::Batch b;
    EXPECT_FALSE(reader->Read(&b));
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("outside the worker's --data-root"));
  }
  {
    grpc::ClientContext context;
    auto reader = Open(&context, kProtocolVersion + 1);
    proto::Batch b;
    EXPECT_FALSE(reader->Read(&b));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
}

// DescribeDataset: the shard sizes of a dataset under the worker's --data-root, from its
// manifest, for a client that does not mount the data.
TEST_F(GrpcWorkerServiceTest, DescribeDatasetReadsTheManifestUnderTheDataRoot) {
  pipeline::testing::MakeDataset(dir_.Join("sharded"), 40, /*classes=*/4, {},
                                 /*fixed=*/48, /*shard_size=*/4096);
  std::filesystem::create_directories(dir_.Join("empty"));
  StartWorker(/*queue_batches=*/8);
  std::unique_ptr<proto::WorkerService::Stub> stub = proto::WorkerService::NewStub(channel_);
  auto describe = [&](const std::string& path, uint32_t version,
                      proto::DescribeDatasetResponse* response) {
    proto::Pipeline spec;
    spec.mutable_source()->mutable_dataset()->set_path(path);
    proto::DescribeDatasetRequest request;
    request.set_protocol_version(version);
    request.set_pipeline(spec.SerializeAsString());
    grpc::ClientContext context;
    return stub->DescribeDataset(&context, request, response);
  };

  absl::StatusOr<record::Manifest> manifest =
      record::Manifest::ReadFile(dir_.Join("sharded") + "/" + record::kManifestName);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::vector<uint64_t> expected;
  uint64_t total = 0;
  for (const record::ShardInfo& shard : manifest->shards) {
    expected.push_back(shard.records);
    total += shard.records;
  }
  ASSERT_GT(expected.size(), 2u);
  ASSERT_EQ(total, 40u);
  proto::DescribeDatasetResponse response;
  grpc::Status status = describe(dir_.Join("sharded"), kProtocolVersion, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(response.shard_record_counts(), ::testing::ElementsAreArray(expected));

  status = describe(dir_.Join("empty"), kProtocolVersion, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(),
              ::testing::HasSubstr(absl::StrCat("pipeline source '", dir_.Join("empty"),
                                                "' is not a readable Unirecord "
                                                "dataset folder")));
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("sluice record convert"));

  status = describe("/etc", kProtocolVersion, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("pipeline source '/etc' is outside the "
                                                           "worker's --data-root"));

  status = describe(dir_.Join("sharded"), kProtocolVersion + 1, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  proto::DescribeDatasetRequest garbage;
  garbage.set_protocol_version(kProtocolVersion);
  garbage.set_pipeline("\xff\xff\xff");
  grpc::ClientContext context;
  status = stub->DescribeDataset(&context, garbage, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("not a serialized Pipeline"));
}

TEST_F(GrpcWorkerServiceTest, SlowReaderKeepsWorkerMemoryBounded) {
  StartWorker(/*queue_batches=*/2);
  // 1 x 3 x 448 x 448 float32 = 2.4 MB per batch, 48 batches in the split: 116 MB, well over
  // what gRPC's flow-control window and the loopback sockets can hold (up to ~23 MiB seen),
  // so the producer meets a full queue however the run is timed (with 12 such batches the
  // buffers once took the whole split).
  Assign(R"(
source: {dataset: {path: DIR}, columns: [image]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 448, width: 448}}, {cast: {dtype: float32}}]}
  - batch: {size: 1}
)",
         MakeSplit(1, 0, 0, 0, 0, 48, 0, 0));
  const int64_t batch_bytes = 1 * 448 * 448 * 3 * 4;
  grpc::ClientContext context;
  auto reader = Open(&context);
  proto::Batch b;
  ASSERT_TRUE(reader->Read(&b));
  ASSERT_EQ(b.columns(0).data_length(), static_cast<size_t>(batch_bytes));
  // The reader pauses: the producer stops on the full queue before the split is
  // done.
  // (gRPC may still drain a few batches into its flow-control window first.)
  ASSERT_TRUE(Eventually(
      [&] { return worker_->blocked_producers() == 1 && worker_->queued_batches() == 2; }));
  ASSERT_TRUE(worker_->Heartbeat().ok());
  EXPECT_LT(worker_->last_heartbeat().splits(0).produced_batches(), 48u);
  // Queue (2) + the write in flight + look-ahead + the executor's bounded
  // queues.
  EXPECT_LE(worker_->peak_bytes(), 8 * batch_bytes);

  uint64_t next = 1;
  bool marker = false;
  while (reader->Read(&b)) {
    EXPECT_EQ(b.batch_index(), next);
    if (b.end_of_split()) {
      marker = true;
      break;
    }
    ASSERT_EQ(b.global_indices_size(), 1);
    EXPECT_EQ(b.global_indices(0), next);
    ++next;
  }
  EXPECT_TRUE(marker);
  EXPECT_EQ(next, 48u);
  context.TryCancel();
}

}  // namespace
}  // namespace sluice::data_worker
