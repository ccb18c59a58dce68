// The shared flag plumbing of the server main()s and the service limits.
#include "common/service/server_main.h"

#include <cstdlib>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/version.h"
#include "common/service/channel_factory.h"
#include "common/service/limits.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "proto/dispatcher.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace sluice::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(EnvName, IsUpperSnakeCaseWithThePrefix) {
  EXPECT_EQ(EnvName("--advertise-address"), "SLUICE_ADVERTISE_ADDRESS");
  EXPECT_EQ(EnvName("--dispatcher"), "SLUICE_DISPATCHER");
  EXPECT_EQ(EnvName("--tls-ca"), "SLUICE_TLS_CA");
}

TEST(SetEnvNames, EveryFlagReadsItsVariableAndTheCommandLineWins) {
  ServerFlags flags;
  CLI::App app;
  AddServerFlags(app, &flags);
  SetEnvNames(app);
  setenv("SLUICE_METRICS_ADDRESS", "0.0.0.0:9100", 1);
  setenv("SLUICE_LOG_FORMAT", "json", 1);
  setenv("SLUICE_PORT", "7001", 1);
  const char* argv[] = {"prog", "--port", "7002"};
  app.parse(3, const_cast<char**>(argv));
  unsetenv("SLUICE_METRICS_ADDRESS");
  unsetenv("SLUICE_LOG_FORMAT");
  unsetenv("SLUICE_PORT");
  EXPECT_EQ(flags.metrics_address, "0.0.0.0:9100");
  EXPECT_EQ(flags.log_format, "json");
  EXPECT_EQ(flags.port, 7002);
}

TEST(ParseHostPort, AcceptsHostHostPortAndIpv6) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(
      ParseHostPort("10.1.2.3", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "10.1.2.3");
  EXPECT_EQ(port, -1);
  ASSERT_TRUE(
      ParseHostPort("10.1.2.3:7071", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "10.1.2.3");
  EXPECT_EQ(port, 7071);
  ASSERT_TRUE(
      ParseHostPort("[fd00::1]:80", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "fd00::1");
  EXPECT_EQ(port, 80);
  ASSERT_TRUE(
      ParseHostPort("fd00::1", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "fd00::1");
  EXPECT_EQ(port, -1);
  const absl::Status bad =
      ParseHostPort("pod:http", "--metrics-address", &host, &port);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--metrics-address 'pod:http'"));
}

TEST(Limits, EachRefusalNamesItsFlag) {
  ServiceLimits limits{.max_pipeline_bytes = 64,
                       .max_pipeline_nodes = 2,
                       .max_batch_bytes = 10,
                       .max_jobs = 3,
                       .max_consumers_per_job = 4,
                       .max_streams = 5};
  proto::Pipeline pipeline;
  for (int i = 0; i < 2; ++i) pipeline.add_nodes()->mutable_map()->add_ops();
  absl::Status s = CheckPipelineLimits(pipeline, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "pipeline spec has 4 nodes, more than --max-pipeline-nodes 2");
  pipeline.Clear();
  pipeline.mutable_source()->mutable_dataset()->set_path(std::string(100, 'x'));
  s = CheckPipelineLimits(pipeline, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than --max-pipeline-bytes 64"));

  EXPECT_THAT(
      CheckSerializedPipelineLimits(pipeline.SerializeAsString(), limits)
          .message(),
      HasSubstr("more than --max-pipeline-bytes 64"));
  EXPECT_EQ(CheckSerializedPipelineLimits("\xff\xff", limits).code(),
            absl::StatusCode::kInvalidArgument);
  pipeline.Clear();
  EXPECT_TRUE(
      CheckSerializedPipelineLimits(pipeline.SerializeAsString(), limits).ok());

  EXPECT_TRUE(CheckJobLimit(2, limits).ok());
  EXPECT_EQ(CheckJobLimit(3, limits).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(CheckJobLimit(3, limits).message(), HasSubstr("(--max-jobs 3)"));
  EXPECT_TRUE(CheckConsumerLimit(4, limits).ok());
  EXPECT_EQ(CheckConsumerLimit(5, limits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckBatchLimit(10, limits).ok());
  EXPECT_EQ(CheckBatchLimit(11, limits).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckStreamLimit(4, limits).ok());
  EXPECT_THAT(CheckStreamLimit(5, limits).message(),
              HasSubstr("(--max-streams 5)"));
  EXPECT_EQ(MaxMessageBytes(limits), 64 + kMessageOverheadBytes);
}

// grpc.health.v1 Check for the whole server: the status byte, or -1 on error.
int HealthStatus(const std::string& address) {
  auto channel = CreateChannel(address);
  if (!channel.ok()) return -1;
  grpc::GenericStub stub(*channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice no_bytes("", 0);
  grpc::ByteBuffer request(&no_bytes, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  std::vector<grpc::Slice> slices;
  if (!status.ok() || !response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& slice : slices)
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

TEST(ServerMain, ServesHealthWritesTheAddressFileAndTurnsNotServing) {
  testing::TempDir dir;
  auto main = ServerMain::Create(
      "test", {.host = "0.0.0.0", .port = 0, .address_file = dir.Join("addr")});
  ASSERT_TRUE(main.ok()) << main.status();
  grpc::ServerBuilder builder;
  proto::DispatcherService::Service
      unimplemented;  // a server needs one service
  builder.RegisterService(&unimplemented);
  const absl::Status started = (*main)->Start(builder);
  ASSERT_TRUE(started.ok()) << started;
  const std::string address =
      "127.0.0.1:" + std::to_string((*main)->bound_port());
  EXPECT_EQ((*main)->address(), address);  // the wildcard shown as loopback
  EXPECT_EQ(testing::ReadFile(dir.Join("addr")), address + "\n");
  EXPECT_EQ(HealthStatus(address), 1);  // SERVING
  (*main)->SetServing(false);
  EXPECT_EQ(HealthStatus(address), 2);  // NOT_SERVING
  (*main)->Shutdown(absl::ZeroDuration());
}

TEST(ServerMain, ExportsBuildInfoRequestsByMethodAndCodeAndErrorsByCode) {
  auto main = ServerMain::Create("test", {.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(main.ok()) << main.status();
  grpc::ServerBuilder builder;
  proto::DispatcherService::Service unimplemented;
  builder.RegisterService(&unimplemented);
  ASSERT_TRUE((*main)->Start(builder).ok());
  const std::string address = (*main)->address();
  EXPECT_EQ(HealthStatus(address), 1);
  EXPECT_EQ(HealthStatus(address), 1);
  {
    auto channel = CreateChannel(address);
    ASSERT_TRUE(channel.ok());
    auto stub = proto::DispatcherService::NewStub(*channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::GetStatusResponse response;
    EXPECT_EQ(stub->GetStatus(&context, {}, &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  const std::string text =
      prometheus::TextSerializer().Serialize((*main)->registry().Collect());
  (*main)->Shutdown(absl::ZeroDuration());
  EXPECT_THAT(text, HasSubstr(std::string("sluice_build_info{revision=\"") + Revision() +
                              "\",version=\"" + Version() + "\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sluice_grpc_server_started_total{grpc_method=\"Check\","
                              "grpc_service=\"grpc.health.v1.Health\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_grpc_server_handled_total{grpc_code=\"OK\","
                              "grpc_method=\"Check\",grpc_service=\"grpc.health.v1.Health\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_grpc_server_handled_total{grpc_code=\"UNIMPLEMENTED\","
                              "grpc_method=\"GetStatus\","
                              "grpc_service=\"sluice.proto.DispatcherService\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sluice_grpc_server_handling_seconds_count{grpc_method=\"Check\","
                              "grpc_service=\"grpc.health.v1.Health\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_test_errors_total{code=\"UNIMPLEMENTED\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("sluice_test_errors_total{code=\"OK\"}")));
}

TEST(ServerMain, BadFlagsAreInvalidArgumentNamingThem) {
  EXPECT_THAT(
      ServerMain::Create("test", {.log_format = "xml"}).status().message(),
      HasSubstr("--log-format: 'xml'"));
  EXPECT_THAT(ServerMain::Create("test", {.metrics_address = "host:port"})
                  .status()
                  .message(),
              HasSubstr("--metrics-address 'host:port'"));
  ServerFlags token_only;
  token_only.security.auth_token_file = "/nonexistent";
  EXPECT_EQ(ServerMain::Create("test", token_only).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::service
