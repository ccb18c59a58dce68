// Every gRPC channel and server port sluice opens is made here, so transport security is
// decided in one place (docs/security.md).
//
//   server                                    client (ChannelOptions)
//   --tls-cert/--tls-key        TLS           tls_ca: the CA that signed the server's cert
//   + --tls-ca                  mutual TLS    + tls_cert/tls_key: a cert signed by that CA
//   --auth-token-file (TLS)     bearer token  auth_token_file: the same token
//   --tokens-file (TLS)         identities    auth_token_file: a token listed there
//
// The bearer token travels as "authorization: Bearer <token>" on every call; the server
// compares it in constant time and both sides re-read their token file when it changes, so
// a token rotates without a restart (write the new file on both sides). A token needs TLS:
// over plaintext anyone on the path could read it (gRPC itself refuses to send call
// credentials over an insecure channel).
//
// Misconfiguration fails fast with a message that says which side is wrong: WaitForConnected
// probes the server with a TLS handshake of its own when the channel fails, and the server
// answers UNAUTHENTICATED "missing bearer token" / "wrong bearer token".
//
// Files: the PEM checks are in certificate_checks.h, the token file and its call credentials
// in token_file.h, the probe behind WaitForConnected's messages in tls_probe.cc.
#ifndef SLUICE_COMMON_SERVICE_CHANNEL_FACTORY_H_
#define SLUICE_COMMON_SERVICE_CHANNEL_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/service/token_file.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace sluice::service {

struct ChannelOptions {
  // 0: gRPC's default (4 MiB) for received messages; -1: unlimited.
  int max_receive_message_bytes = -1;

  // Transport security. TLS when tls_ca is set: the server's certificate must be signed by
  // this CA (PEM file) and name the address's host (or tls_server_name).
  std::string tls_ca;
  // This side's certificate and key (PEM files), for servers that require mutual TLS. Both
  // or neither; they need tls_ca.
  std::string tls_cert;
  std::string tls_key;
  // The name the server's certificate must carry instead of the address's host (for servers
  // reached by IP whose certificate names a service).
  std::string tls_server_name;
  // File holding the bearer token presented on every call (re-read when it changes). Needs
  // tls_ca.
  std::string auth_token_file;

  bool tls() const { return !tls_ca.empty(); }
};

// What a server's listening port requires. Flag names match the programs' flags.
struct ServerSecurityOptions {
  std::string tls_cert;         // --tls-cert: TLS when set (with tls_key)
  std::string tls_key;          // --tls-key
  std::string tls_ca;           // --tls-ca: mutual TLS, client certs signed by this CA
  std::string auth_token_file;  // --auth-token-file: bearer token on every call
  // --tokens-file: the callers accepted, each with its identity (tokens_file.h). Replaces
  // --auth-token-file's check on this server; --auth-token-file is then only the token this
  // process presents when it calls another.
  std::string tokens_file;

  bool tls() const { return !tls_cert.empty(); }
};

// A channel to `address` (host:port). InvalidArgument for an empty address, an incomplete or
// inconsistent TLS configuration, unreadable/expired/mismatched certificate files or an
// empty token file (each message names the option). Does not connect.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const std::string& address,
                                                             const ChannelOptions& options = {});

// Credentials for a server's listening port, checked the same way as CreateChannel: a
// certificate that expired, a key that does not match it, --tls-ca or --auth-token-file
// without --tls-cert are InvalidArgument naming the flag.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CreateServerCredentials(
    const ServerSecurityOptions& options);

// Waits until `channel` (made by CreateChannel(address, options)) is connected, at most
// until `deadline`: DeadlineExceeded "no gRPC connection to ADDR" then. A TLS mismatch is
// Unavailable, reported as soon as a connection attempt fails (it will not heal by waiting):
//   "TLS handshake with 127.0.0.1:7070 failed: the server's certificate is not signed by
//    --tls-ca ca.pem (unable to get local issuer certificate) (is the server using TLS? is
//    --tls-ca the CA that signed its certificate?)"
// while "nothing listens" is retried until the deadline.
absl::Status WaitForConnected(grpc::Channel& channel, const std::string& address,
                              const ChannelOptions& options, absl::Time deadline);

// Connects to `address` and makes a TLS handshake of its own (OpenSSL, tls_probe.cc) to tell
// why a channel with `options` cannot connect. Unavailable with the reason when it finds a TLS
// mismatch (plaintext vs TLS, wrong CA, expired certificate, name mismatch, client
// certificate missing or refused); OK when it finds none (including "nothing listens").
// Blocks up to `timeout`.
absl::Status DiagnoseTls(const std::string& address, const ChannelOptions& options,
                         absl::Duration timeout);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_CHANNEL_FACTORY_H_
