#include "data_worker/worker/grpc_dispatcher_client.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::data_worker {
namespace {

using ::testing::HasSubstr;

TEST(GrpcDispatcherClient, UnreachableDispatcherFailsUnavailableNamingTheAddress) {
  GrpcDispatcherClientOptions options;
  options.address = "127.0.0.1:1";  // nothing listens on port 1
  options.connect_timeout = absl::Milliseconds(500);
  auto client = GrpcDispatcherClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  proto::WorkerRegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_address("127.0.0.1:2");
  proto::WorkerRegisterResponse response;
  absl::Status status = (*client)->WorkerRegister(request, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("cannot reach the sluice dispatcher at 127.0.0.1:1: WorkerRegister"));
  EXPECT_THAT(status.message(), HasSubstr("--dispatcher"));
}

TEST(GrpcDispatcherClient, EmptyAddressIsRejected) {
  EXPECT_EQ(GrpcDispatcherClient::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::data_worker
