// A secured cluster end to end: a dispatcher and a worker as real processes with mutual TLS
// and a bearer token (certificates made by openssl in the test), a secured consumer reading
// every record, and unsecured or wrongly secured consumers and processes refused at once with
// the code and message that say what is wrong.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/process.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "common/service/channel_factory.h"
#include "data_worker/pipeline/spec.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/certificates.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::BinDir;
using ::sluice::testing::LabelPipeline;
using ::sluice::testing::SecuredCluster;
using ::sluice::testing::TempDir;
using ::sluice::testing::WriteLabelDataset;
using ::testing::HasSubstr;

constexpr int kRecords = 64;

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    WriteLabelDataset(dir_->Join("root/ds"), kRecords);
    auto certs = tools::MakeCertificates(dir_->Join("tls"));
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new tools::Certificates(*certs);
    auto other = tools::MakeCertificates(dir_->Join("other-tls"));
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = new tools::Certificates(*other);
    auto cluster = tools::LocalCluster::Start(
        SecuredCluster(dir_->Join("root"), dir_->Join("cluster"), *certs_, certs_->token));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete certs_;
    delete other_;
    delete dir_;
  }

  static ClientOptions Secured() {
    return {.dispatcher_address = cluster_->dispatcher_address(),
            .connect_timeout = absl::Seconds(20),
            .tls_ca = certs_->ca,
            .tls_cert = certs_->client_cert,
            .tls_key = certs_->client_key,
            .auth_token_file = certs_->token};
  }

  // Runs `argv` (a server that should refuse to start) and returns its exit code and log.
  static std::pair<int, std::string> RunToExit(std::vector<std::string> argv,
                                               const std::string& name) {
    const std::string log = dir_->Join(name + ".log");
    auto process = Subprocess::Start(argv, {.log_file = log});
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return {-1, ""};
    absl::StatusOr<int> code = (*process)->Wait(absl::Seconds(20));
    if (!code.ok()) (*process)->Stop(absl::Seconds(1));
    return {code.value_or(-1), testing::ReadFile(log)};
  }

  static TempDir* dir_;
  static tools::Certificates* certs_;
  static tools::Certificates* other_;
  static tools::LocalCluster* cluster_;
};

TempDir* SecurityTest::dir_ = nullptr;
tools::Certificates* SecurityTest::certs_ = nullptr;
tools::Certificates* SecurityTest::other_ = nullptr;
tools::LocalCluster* SecurityTest::cluster_ = nullptr;

TEST_F(SecurityTest, SecuredConsumerReadsEveryRecord) {
  auto client = DataServiceClient::Create(Secured());
  ASSERT_TRUE(client.ok()) << client.status();
  auto it =
      (*client)->Open({.job_name = "secured", .pipeline = LabelPipeline(dir_->Join("root/ds"))});
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

// The first error of reading a job over `dataset`, OK if it read to the end.
absl::Status ReadJob(DataServiceClient& client, const std::string& name,
                     const std::string& dataset) {
  auto it = client.Open({.job_name = name, .pipeline = LabelPipeline(dataset)});
  if (!it.ok()) return it.status();
  while (true) {
    auto batch = (*it)->GetNext();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) return absl::OkStatus();
  }
}

TEST_F(SecurityTest, DataRootHoldsAgainstSymlinksAndDotDot) {
  const std::string outside = dir_->Join("outside");
  WriteLabelDataset(outside, kRecords);
  std::filesystem::create_symlink(outside, dir_->Join("root/link-out"));
  auto client = DataServiceClient::Create(Secured());
  ASSERT_TRUE(client.ok()) << client.status();

  absl::Status s = ReadJob(**client, "link-out", dir_->Join("root/link-out"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("pipeline source '", dir_->Join("root/link-out"),
                                     "' (resolved: '", std::filesystem::canonical(outside).string(),
                                     "') is outside the worker's --data-root")));

  s = ReadJob(**client, "dot-dot", dir_->Join("root/ds/../../outside"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("is outside the worker's --data-root"));
}

TEST_F(SecurityTest, ShardOutsideItsDatasetFolderFailsTheConsumerFast) {
  // A dataset under the root whose manifest names a shard that is a symlink
  // out of the dataset's folder (and out of the root).
  const std::string escape = dir_->Join("root/escape");
  WriteLabelDataset(escape, kRecords);
  std::filesystem::create_directories(dir_->Join("outside-shards"));
  std::string shard;
  for (const auto& entry : std::filesystem::directory_iterator(escape)) {
    if (entry.path().filename() != record::kManifestName) shard = entry.path().string();
  }
  ASSERT_FALSE(shard.empty());
  const std::string moved =
      dir_->Join("outside-shards/" + std::filesystem::path(shard).filename().string());
  std::filesystem::rename(shard, moved);
  std::filesystem::create_symlink(moved, shard);

  auto client = DataServiceClient::Create(Secured());
  ASSERT_TRUE(client.ok()) << client.status();
  // The worker refuses the job when it builds it; the consumer's GetNext must
  // say so, not wait for batches that never come.
  absl::Status s;
  absl::Notification done;
  std::thread reader([&] {
    s = ReadJob(**client, "escape", escape);
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    // The reader cannot be stopped from here: end the test binary, saying why.
    std::fprintf(stderr,
                 "FAILED: GetNext did not return within 30 s for a dataset "
                 "whose shard is outside its folder (the consumer hangs)\n");
    std::abort();
  }
  reader.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", shard, "' resolves to '",
                                                  std::filesystem::canonical(moved).string(),
                                                  "', outside its dataset folder")));
}

TEST_F(SecurityTest, PlaintextConsumerIsToldToUseTls) {
  const absl::Time start = absl::Now();
  auto client = DataServiceClient::Create(
      {.dispatcher_address = cluster_->dispatcher_address(), .connect_timeout = absl::Seconds(60)});
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(),
              HasSubstr("the server uses TLS and this client connects in plaintext"));
  // Told at the first failed attempt, not after the 60 s connect timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST_F(SecurityTest, WrongCaIsNamed) {
  ClientOptions options = Secured();
  options.tls_ca = other_->ca;
  auto client = DataServiceClient::Create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(),
              HasSubstr(absl::StrCat("TLS handshake with ", cluster_->dispatcher_address(),
                                     " failed: the server's certificate is not signed by "
                                     "--tls-ca ",
                                     other_->ca)));
}

TEST_F(SecurityTest, ConsumerWithoutClientCertificateIsToldMutualTls) {
  ClientOptions options = Secured();
  options.tls_cert.clear();
  options.tls_key.clear();
  auto client = DataServiceClient::Create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(),
              HasSubstr("the server requires a client certificate (mutual TLS)"));
}

TEST_F(SecurityTest, ConsumerWithAnExpiredCertificateIsRefusedBeforeConnecting) {
  ClientOptions options = Secured();
  options.tls_cert = certs_->expired_cert;
  options.tls_key = certs_->expired_key;
  auto client = DataServiceClient::Create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(),
              HasSubstr(absl::StrCat("--tls-cert ", certs_->expired_cert,
                                     ": the certificate expired on Jan  2 00:00:00 2020 GMT")));
}

TEST_F(SecurityTest, MissingAndWrongBearerTokensAreUnauthenticated) {
  ClientOptions options = Secured();
  options.auth_token_file.clear();
  auto client = DataServiceClient::Create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(client.status().message(), HasSubstr("missing bearer token"));

  testing::WriteFile(dir_->Join("wrong-token"), "not-the-token\n");
  options.auth_token_file = dir_->Join("wrong-token");
  client = DataServiceClient::Create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(client.status().message(), HasSubstr("wrong bearer token"));
}

TEST_F(SecurityTest, HealthServiceAnswersServingOverTheSecuredPort) {
  auto channel =
      service::CreateChannel(cluster_->worker(0).address, {.tls_ca = certs_->ca,
                                                           .tls_cert = certs_->client_cert,
                                                           .tls_key = certs_->client_key,
                                                           .auth_token_file = certs_->token});
  ASSERT_TRUE(channel.ok()) << channel.status();
  grpc::GenericStub stub(*channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice no_bytes("", 0);  // HealthCheckRequest{service: ""} serializes to nothing
  grpc::ByteBuffer request(&no_bytes, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

TEST_F(SecurityTest, DispatcherWithAnExpiredCertificateRefusesToStart) {
  auto [code, log] = RunToExit({BinDir() + "/sluice-dispatcher", "--port", "0", "--tls-cert",
                                certs_->expired_cert, "--tls-key", certs_->expired_key},
                               "expired-dispatcher");
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, HasSubstr("the certificate expired on Jan  2 00:00:00 2020 GMT"));
}

TEST_F(SecurityTest, PlaintextWorkerIsRefusedAtOnceNamingTls) {
  auto [code, log] =
      RunToExit({BinDir() + "/sluice-worker", "--dispatcher", cluster_->dispatcher_address(),
                 "--data-root", dir_->path(), "--connect-timeout", "60s"},
                "plaintext-worker");
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, HasSubstr("the server uses TLS and this client connects in plaintext"));
}

TEST_F(SecurityTest, TokenWithoutTlsIsRefusedNamingTheFlag) {
  auto [code, log] = RunToExit(
      {BinDir() + "/sluice-dispatcher", "--port", "0", "--auth-token-file", certs_->token},
      "plaintext-token-dispatcher");
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, HasSubstr("--auth-token-file needs --tls-cert and --tls-key"));
}

}  // namespace
}  // namespace sluice
