// The shared flag plumbing of the server main()s and the service limits.
#include "common/service/server_main.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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
  ASSERT_TRUE(ParseHostPort("10.1.2.3", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "10.1.2.3");
  EXPECT_EQ(port, -1);
  ASSERT_TRUE(ParseHostPort("10.1.2.3:7071", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "10.1.2.3");
  EXPECT_EQ(port, 7071);
  ASSERT_TRUE(ParseHostPort("[fd00::1]:80", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "fd00::1");
  EXPECT_EQ(port, 80);
  ASSERT_TRUE(ParseHostPort("fd00::1", "--advertise-address", &host, &port).ok());
  EXPECT_EQ(host, "fd00::1");
  EXPECT_EQ(port, -1);
  const absl::Status bad = ParseHostPort("pod:http", "--metrics-address", &host, &port);
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
  EXPECT_EQ(s.message(), "pipeline spec has 4 nodes, more than --max-pipeline-nodes 2");
  pipeline.Clear();
  pipeline.mutable_source()->mutable_dataset()->set_path(std::string(100, 'x'));
  s = CheckPipelineLimits(pipeline, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than --max-pipeline-bytes 64"));

  EXPECT_THAT(CheckSerializedPipelineLimits(pipeline.SerializeAsString(), limits).message(),
              HasSubstr("more than --max-pipeline-bytes 64"));
  EXPECT_EQ(CheckSerializedPipelineLimits("\xff\xff", limits).code(),
            absl::StatusCode::kInvalidArgument);
  pipeline.Clear();
  EXPECT_TRUE(CheckSerializedPipelineLimits(pipeline.SerializeAsString(), limits).ok());

  EXPECT_TRUE(CheckJobLimit(2, limits).ok());
  EXPECT_EQ(CheckJobLimit(3, limits).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(CheckJobLimit(3, limits).message(), HasSubstr("(--max-jobs 3)"));
  EXPECT_TRUE(CheckConsumerLimit(4, limits).ok());
  EXPECT_EQ(CheckConsumerLimit(5, limits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckBatchLimit(10, limits).ok());
  EXPECT_EQ(CheckBatchLimit(11, limits).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckStreamLimit(4, limits).ok());
  EXPECT_THAT(CheckStreamLimit(5, limits).message(), HasSubstr("(--max-streams 5)"));
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
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
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
      "test",
      {.host = "0.0.0.0", .port = 0, .address_file = dir.Join("addr"), .allow_insecure = true});
  ASSERT_TRUE(main.ok()) << main.status();
  grpc::ServerBuilder builder;
  proto::DispatcherService::Service unimplemented;  // a server needs one service
  builder.RegisterService(&unimplemented);
  const absl::Status started = (*main)->Start(builder);
  ASSERT_TRUE(started.ok()) << started;
  const std::string address = "127.0.0.1:" + std::to_string((*main)->bound_port());
  EXPECT_EQ((*main)->address(), address);  // the wildcard shown as loopback
  EXPECT_EQ((*main)->bind_address(), "0.0.0.0:" + std::to_string((*main)->bound_port()));
  EXPECT_EQ(testing::ReadFile(dir.Join("addr")), address + "\n");
  EXPECT_EQ(HealthStatus(address), 1);  // SERVING
  (*main)->SetServing(false);
  EXPECT_EQ(HealthStatus(address), 2);  // NOT_SERVING
  (*main)->Shutdown(absl::ZeroDuration());
}

TEST(ServerMain, NonLoopbackWithoutTlsAndTokensNeedsAllowInsecure) {
  const absl::Status s = ServerMain::Create("test", {.host = "0.0.0.0"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--host 0.0.0.0 is reachable from other machines and "
                                     "this port is plaintext and unauthenticated"));
  EXPECT_THAT(s.message(), HasSubstr("--allow-insecure (SLUICE_ALLOW_INSECURE=1)"));
  std::string warning;
  EXPECT_TRUE(CheckListenSecurity({.host = "127.0.0.1"}, &warning).ok());
  EXPECT_TRUE(warning.empty());
  EXPECT_TRUE(CheckListenSecurity({.host = "::1"}, &warning).ok());
  ServerFlags tls_only{.host = "10.1.2.3"};
  tls_only.security.tls_cert = "c.pem";
  tls_only.security.tls_key = "k.pem";
  EXPECT_THAT(CheckListenSecurity(tls_only, &warning).message(),
              HasSubstr("this port authenticates no caller"));
  tls_only.allow_insecure = true;
  ASSERT_TRUE(CheckListenSecurity(tls_only, &warning).ok());
  EXPECT_THAT(warning, HasSubstr("(--allow-insecure)"));
  ServerFlags secured = tls_only;
  secured.allow_insecure = false;
  secured.security.tokens_file = "tokens.csv";
  ASSERT_TRUE(CheckListenSecurity(secured, &warning).ok());
  EXPECT_TRUE(warning.empty());
}

// A TCP connection to 127.0.0.1:`port` that sent `text`; -1 if it cannot connect.
int ConnectAndSend(int port, const std::string& text) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  // Under the server's 5 s request timeout, which would otherwise free a blocked thread and
  // hide the failure; a failure, not a hang.
  timeval timeout{.tv_sec = 4, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  if (send(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(ServerMain, MetricsAnswerWhileHalfOpenClientsHoldConnections) {
  auto main = ServerMain::Create("test", {.metrics_port = 0});
  ASSERT_TRUE(main.ok()) << main.status();
  const int port = (*main)->metrics_port();
  std::vector<int> half_open;
  for (int i = 0; i < 4; ++i) {  // more than prometheus-cpp's 2 default threads
    const int fd = ConnectAndSend(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
    ASSERT_GE(fd, 0);
    half_open.push_back(fd);
  }
  const int fd =
      ConnectAndSend(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_GE(fd, 0);
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while (answer.find("\r\n\r\n") == std::string::npos &&
         (n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
    answer.append(buffer, n);
  }
  close(fd);
  for (int h : half_open) close(h);
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200 OK"));
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
  const std::string text = prometheus::TextSerializer().Serialize((*main)->registry().Collect());
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
  EXPECT_THAT(ServerMain::Create("test", {.log_format = "xml"}).status().message(),
              HasSubstr("--log-format: 'xml'"));
  EXPECT_THAT(ServerMain::Create("test", {.metrics_address = "host:port"}).status().message(),
              HasSubstr("--metrics-address 'host:port'"));
  ServerFlags token_only;
  token_only.security.auth_token_file = "/nonexistent";
  EXPECT_EQ(ServerMain::Create("test", token_only).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::service
