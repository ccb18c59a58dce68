// The credentials factory with real certificates (made by openssl for this test) and real
// gRPC servers on loopback: TLS, mutual TLS, the bearer token, and the message each
// misconfiguration gets.
#include "common/service/channel_factory.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/service/certificate_checks.h"
#include "common/service/token_file.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/dispatcher.grpc.pb.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/certificates.h"

namespace sluice::service {
namespace {

using ::testing::HasSubstr;

// Answers GetJobState with OK: enough to see a call get through.
class FakeDispatcher final : public proto::DispatcherService::Service {
  grpc::Status GetJobState(grpc::ServerContext*, const proto::GetJobStateRequest*,
                           proto::GetJobStateResponse*) override {
    return grpc::Status::OK;
  }
};

class Server {
 public:
  explicit Server(std::shared_ptr<grpc::ServerCredentials> credentials) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", std::move(credentials), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Server() {
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  bool ok() const { return server_ != nullptr && port_ != 0; }

 private:
  FakeDispatcher service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class ChannelFactoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto certs = tools::MakeCertificates(dir_->Join("good"));
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new tools::Certificates(*certs);
    auto other = tools::MakeCertificates(dir_->Join("other"));
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = new tools::Certificates(*other);
  }
  static void TearDownTestSuite() {
    delete certs_;
    delete other_;
    delete dir_;
  }

  static ServerSecurityOptions Tls() {
    return {.tls_cert = certs_->server_cert, .tls_key = certs_->server_key};
  }
  static ServerSecurityOptions MutualTls() {
    ServerSecurityOptions o = Tls();
    o.tls_ca = certs_->ca;
    return o;
  }
  static ChannelOptions Client() {
    return {.tls_ca = certs_->ca, .tls_cert = certs_->client_cert, .tls_key = certs_->client_key};
  }

  // Connects (5 s at most) and calls GetJobState.
  static absl::Status Call(const std::string& address, const ChannelOptions& options) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateChannel(address, options);
    if (!channel.ok()) return channel.status();
    if (absl::Status s =
            WaitForConnected(**channel, address, options, absl::Now() + absl::Seconds(5));
        !s.ok()) {
      return s;
    }
    auto stub = proto::DispatcherService::NewStub(*channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    proto::GetJobStateResponse response;
    const grpc::Status s = stub->GetJobState(&context, {}, &response);
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }

  static Server Start(const ServerSecurityOptions& options) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        CreateServerCredentials(options);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return Server(credentials.ok() ? *credentials : grpc::InsecureServerCredentials());
  }

  static testing::TempDir* dir_;
  static tools::Certificates* certs_;
  static tools::Certificates* other_;  // another CA's
};

testing::TempDir* ChannelFactoryTest::dir_ = nullptr;
tools::Certificates* ChannelFactoryTest::certs_ = nullptr;
tools::Certificates* ChannelFactoryTest::other_ = nullptr;

TEST(TokensEqual, ComparesWholeStrings) {
  EXPECT_TRUE(TokensEqual("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(TokensEqual("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(TokensEqual("Bearer abc", "Bearer abcd"));
  EXPECT_FALSE(TokensEqual("", "x"));
}

TEST(TokenFile, StripsWhitespaceAndRereadsARotatedFile) {
  testing::TempDir dir;
  const std::string path = dir.Join("token");
  testing::WriteFile(path, "first-token\n");
  absl::StatusOr<std::shared_ptr<TokenFile>> token = TokenFile::Create(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*(*token)->Get(), "first-token");
  testing::WriteFile(path, "  the-second-token \n");
  EXPECT_EQ(*(*token)->Get(), "the-second-token");
  testing::WriteFile(path, "\n");
  EXPECT_EQ((*token)->Get().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenFile, RefusesMissingAndEmptyFiles) {
  testing::TempDir dir;
  EXPECT_EQ(TokenFile::Create(dir.Join("missing")).status().code(), absl::StatusCode::kNotFound);
  testing::WriteFile(dir.Join("empty"), " \n");
  absl::Status empty = TokenFile::Create(dir.Join("empty")).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("is empty"));
}

TEST_F(ChannelFactoryTest, RefusesIncompleteConfigurations) {
  absl::Status s = CreateServerCredentials({.auth_token_file = certs_->token}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--auth-token-file needs --tls-cert"));
  s = CreateServerCredentials({.tls_ca = certs_->ca}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = CreateServerCredentials({.tls_cert = certs_->server_cert}).status();
  EXPECT_THAT(s.message(), HasSubstr("--tls-cert and --tls-key go together"));
  s = CreateChannel("127.0.0.1:1", {.auth_token_file = certs_->token}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--auth-token-file needs TLS"));
}

TEST_F(ChannelFactoryTest, RefusesAnExpiredCertificateAndAForeignKey) {
  absl::Status s =
      CreateServerCredentials({.tls_cert = certs_->expired_cert, .tls_key = certs_->expired_key})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("expired on Jan  2 00:00:00 2020 GMT"));
  s = CheckCertificateFiles(certs_->server_cert, certs_->client_key, "--tls-cert");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not the key of --tls-cert"));
}

TEST_F(ChannelFactoryTest, TlsClientReachesTlsServer) {
  Server server = Start(Tls());
  ASSERT_TRUE(server.ok());
  EXPECT_TRUE(Call(server.address(), {.tls_ca = certs_->ca}).ok());
  // The certificate names localhost too.
  EXPECT_TRUE(
      Call(absl::StrCat("localhost:", server.address().substr(10)), {.tls_ca = certs_->ca}).ok());
}

TEST_F(ChannelFactoryTest, PlaintextClientToTlsServerIsToldToUseTls) {
  Server server = Start(Tls());
  ASSERT_TRUE(server.ok());
  const absl::Status s = Call(server.address(), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("the server uses TLS and this client connects in plaintext"));
}

TEST_F(ChannelFactoryTest, TlsClientToPlaintextServerIsToldTheServerHasNoTls) {
  Server server(grpc::InsecureServerCredentials());
  ASSERT_TRUE(server.ok());
  const absl::Status s = Call(server.address(), {.tls_ca = certs_->ca});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("TLS handshake with ", server.address(),
                                                  " failed: the server does not speak TLS")));
}

TEST_F(ChannelFactoryTest, WrongCaIsNamed) {
  Server server = Start(Tls());
  ASSERT_TRUE(server.ok());
  const absl::Status s = Call(server.address(), {.tls_ca = other_->ca});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("the server's certificate is not signed by "
                                                  "--tls-ca ",
                                                  other_->ca)));
  EXPECT_THAT(s.message(), HasSubstr("is --tls-ca the CA that signed its certificate?"));
}

TEST_F(ChannelFactoryTest, ExpiredServerCertificateIsNamed) {
  // CreateServerCredentials refuses an expired certificate, so build the server by hand.
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back(
      {testing::ReadFile(certs_->expired_key), testing::ReadFile(certs_->expired_cert)});
  Server server(grpc::SslServerCredentials(ssl));
  ASSERT_TRUE(server.ok());
  const absl::Status s = Call(server.address(), {.tls_ca = certs_->ca});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("the server's certificate expired (not after Jan  2"));
}

TEST_F(ChannelFactoryTest, ServerNameMismatchIsNamed) {
  Server server = Start(Tls());
  ASSERT_TRUE(server.ok());
  const absl::Status s =
      Call(server.address(), {.tls_ca = certs_->ca, .tls_server_name = "sluice.example"});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("the server's certificate does not name sluice.example"));
}

TEST_F(ChannelFactoryTest, MutualTlsNeedsAClientCertificateSignedByItsCa) {
  Server server = Start(MutualTls());
  ASSERT_TRUE(server.ok());
  EXPECT_TRUE(Call(server.address(), Client()).ok());

  absl::Status s = Call(server.address(), {.tls_ca = certs_->ca});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("the server requires a client certificate (mutual TLS)"));

  s = Call(server.address(),
           {.tls_ca = certs_->ca, .tls_cert = other_->client_cert, .tls_key = other_->client_key});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("the server refused this client's certificate"));
}

TEST_F(ChannelFactoryTest, BearerTokenIsRequiredComparedAndRotated) {
  testing::TempDir dir;
  const std::string server_token = dir.Join("server-token");
  const std::string client_token = dir.Join("client-token");
  testing::WriteFile(server_token, "s3cret-1\n");
  testing::WriteFile(client_token, "s3cret-1\n");
  ServerSecurityOptions secured = Tls();
  secured.auth_token_file = server_token;
  Server server = Start(secured);
  ASSERT_TRUE(server.ok());

  EXPECT_TRUE(Call(server.address(), {.tls_ca = certs_->ca, .auth_token_file = client_token}).ok());

  absl::Status s = Call(server.address(), {.tls_ca = certs_->ca});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("missing bearer token"));

  testing::WriteFile(dir.Join("wrong"), "s3cret-2\n");
  s = Call(server.address(), {.tls_ca = certs_->ca, .auth_token_file = dir.Join("wrong")});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("wrong bearer token"));

  // Rotation: the server's new token holds at once, the old one is refused.
  testing::WriteFile(server_token, "s3cret-2-rotated\n");
  s = Call(server.address(), {.tls_ca = certs_->ca, .auth_token_file = client_token});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  testing::WriteFile(client_token, "s3cret-2-rotated\n");
  EXPECT_TRUE(Call(server.address(), {.tls_ca = certs_->ca, .auth_token_file = client_token}).ok());
}

TEST_F(ChannelFactoryTest, NothingListeningIsNotATlsProblem) {
  EXPECT_TRUE(DiagnoseTls("127.0.0.1:1", {.tls_ca = certs_->ca}, absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace sluice::service
