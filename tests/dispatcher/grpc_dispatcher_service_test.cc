#include "dispatcher/grpc_dispatcher_service.h"

#include <chrono>
#include <memory>

#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/dispatcher.grpc.pb.h"

namespace sluice::dispatcher {
namespace {

using ::testing::HasSubstr;

class GrpcDispatcherServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DispatcherOptions options;
    options.clock = &clock_;
    auto impl = DispatcherImpl::Create(options);
    ASSERT_TRUE(impl.ok());
    impl_ = std::move(*impl);
    service_ = std::make_unique<GrpcDispatcherService>(impl_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
    stub_ = proto::DispatcherService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  static void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  FakeClock clock_;
  std::unique_ptr<DispatcherImpl> impl_;
  std::unique_ptr<GrpcDispatcherService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<proto::DispatcherService::Stub> stub_;
};

TEST_F(GrpcDispatcherServiceTest, RegistersDatasetJobAndWorkerThroughARealChannel) {
  proto::RegisterDatasetRequest dataset;
  dataset.set_protocol_version(kProtocolVersion);
  dataset.set_pipeline("pipeline-bytes");
  dataset.add_shard_record_counts(100);
  dataset.set_batch_size(10);
  proto::RegisterDatasetResponse dataset_response;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Status s = stub_->RegisterDataset(&context, dataset, &dataset_response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_GT(dataset_response.dataset_id(), 0u);

  proto::GetOrCreateJobRequest job;
  job.set_protocol_version(kProtocolVersion);
  job.set_job_name("train");
  job.set_dataset_id(dataset_response.dataset_id());
  job.mutable_config()->set_num_consumers(2);
  job.mutable_config()->set_split_size(25);
  proto::GetOrCreateJobResponse job_response;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    ASSERT_TRUE(stub_->GetOrCreateJob(&context, job, &job_response).ok());
  }
  EXPECT_TRUE(job_response.created());
  EXPECT_EQ(job_response.config().split_size(), 30u);

  proto::WorkerRegisterRequest worker;
  worker.set_protocol_version(kProtocolVersion);
  worker.set_address("127.0.0.1:9");
  worker.set_capacity(2);
  proto::WorkerRegisterResponse worker_response;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    ASSERT_TRUE(stub_->WorkerRegister(&context, worker, &worker_response).ok());
  }
  EXPECT_GT(worker_response.worker_id(), 0u);

  proto::WorkerHeartbeatRequest beat;
  beat.set_protocol_version(kProtocolVersion);
  beat.set_worker_id(worker_response.worker_id());
  proto::WorkerHeartbeatResponse beat_response;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    ASSERT_TRUE(stub_->WorkerHeartbeat(&context, beat, &beat_response).ok());
  }
  EXPECT_EQ(beat_response.start_size(), 2);
}

TEST_F(GrpcDispatcherServiceTest, ErrorsKeepTheirCodeAndMessage) {
  proto::GetOrCreateJobRequest job;
  job.set_protocol_version(kProtocolVersion + 1);
  proto::GetOrCreateJobResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status s = stub_->GetOrCreateJob(&context, job, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("upgrade"));

  proto::GetJobStateRequest state;
  state.set_protocol_version(kProtocolVersion);
  state.set_job_id(77);
  proto::GetJobStateResponse state_response;
  grpc::ClientContext context2;
  SetDeadline(&context2);
  EXPECT_EQ(stub_->GetJobState(&context2, state, &state_response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace sluice::dispatcher
