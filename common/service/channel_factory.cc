// The channel factory (channel_factory.h): every channel and server credential sluice makes,
// after checking the options together. The parts live beside it: the PEM file checks in
// certificate_checks.cc, the bearer token in token_file.cc, the TLS probe behind
// WaitForConnected's messages in tls_probe.cc.
#include "common/service/channel_factory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/service/certificate_checks.h"
#include "common/service/tokens_file.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace sluice::service {
namespace {

absl::Status CheckChannelOptions(const ChannelOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (!o.tls_cert.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert/--tls-key need --tls-ca (the CA that signed the server's "
        "certificate)");
  }
  if (!o.auth_token_file.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--auth-token-file needs TLS (--tls-ca): a bearer token over plaintext "
        "can be read by "
        "anyone on the network");
  }
  if (!o.tls_server_name.empty() && o.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls-server-name needs --tls-ca");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const std::string& address,
                                                             const ChannelOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("empty address (want host:port)");
  if (absl::Status s = CheckChannelOptions(options); !s.ok()) return s;
  grpc::ChannelArguments args;
  // A peer that comes back at another address under the same DNS name (a restarted pod behind a
  // headless Service) is looked up again on the next reconnect; gRPC's default waits 30 s
  // between two lookups, longer than a restarted dispatcher takes to come back.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  if (options.max_receive_message_bytes != 0)
    args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  if (!options.tls()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  if (absl::Status s = CheckCaFile(options.tls_ca); !s.ok()) return s;
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadFileForFlag(options.tls_ca, "--tls-ca");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (!options.tls_cert.empty()) {
    if (absl::Status s = CheckCertificateFiles(options.tls_cert, options.tls_key, "--tls-cert");
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> cert = ReadFileForFlag(options.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFileForFlag(options.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokenFile>> token = TokenFile::Create(options.auth_token_file);
    if (!token.ok()) return token.status();
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    MakeBearerTokenCredentials(std::move(*token)));
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CreateServerCredentials(
    const ServerSecurityOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (!options.tls()) {
    if (!options.tls_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls-ca (mutual TLS) needs --tls-cert and --tls-key (this server's "
          "certificate)");
    }
    if (!options.auth_token_file.empty()) {
      return absl::InvalidArgumentError(
          "--auth-token-file needs --tls-cert and --tls-key: a bearer token "
          "over plaintext can "
          "be read by anyone on the network");
    }
    if (!options.tokens_file.empty()) {
      return absl::InvalidArgumentError(
          "--tokens-file needs --tls-cert and --tls-key: a bearer token over "
          "plaintext can be read by anyone on the network");
    }
    return grpc::InsecureServerCredentials();
  }
  if (absl::Status s = CheckCertificateFiles(options.tls_cert, options.tls_key, "--tls-cert");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> cert = ReadFileForFlag(options.tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFileForFlag(options.tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_ca.empty()) {
    if (absl::Status s = CheckCaFile(options.tls_ca); !s.ok()) return s;
    absl::StatusOr<std::string> ca = ReadFileForFlag(options.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
  if (!options.tokens_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokensFile>> tokens = TokensFile::Create(options.tokens_file);
    if (!tokens.ok()) return tokens.status();
    credentials->SetAuthMetadataProcessor(MakeTokensProcessor(std::move(*tokens)));
  } else if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::shared_ptr<TokenFile>> token = TokenFile::Create(options.auth_token_file);
    if (!token.ok()) return token.status();
    credentials->SetAuthMetadataProcessor(MakeBearerTokenProcessor(std::move(*token)));
  }
  return credentials;
}

absl::Status WaitForConnected(grpc::Channel& channel, const std::string& address,
                              const ChannelOptions& options, absl::Time deadline) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  absl::Time last_probe = absl::InfinitePast();
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && absl::Now() - last_probe >= absl::Seconds(1)) {
      // At most one probe a second: a server that is still starting is probed again later.
      last_probe = absl::Now();
      const absl::Duration left = deadline - absl::Now();
      if (left > absl::ZeroDuration()) {
        if (absl::Status why = DiagnoseTls(address, options, std::min(left, absl::Seconds(3)));
            !why.ok()) {
          return why;
        }
      }
    }
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return absl::DeadlineExceededError(absl::StrCat("no gRPC connection to ", address));
    }
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return absl::OkStatus();
}

}  // namespace sluice::service
