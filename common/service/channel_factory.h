// Every gRPC channel and server port sluice opens is made here, so transport security is
// decided in one place.
//
// Today channels are plaintext; ChannelOptions/ServerOptions are where TLS, mutual TLS and the
// bearer token go (docs/security.md once they exist).
#ifndef SLUICE_COMMON_SERVICE_CHANNEL_FACTORY_H_
#define SLUICE_COMMON_SERVICE_CHANNEL_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace sluice::service {

struct ChannelOptions {
  // 0: gRPC's default (4 MiB) for received messages; -1: unlimited.
  int max_receive_message_bytes = -1;
};

// A channel to `address` (host:port). InvalidArgument for an empty address.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& address, const ChannelOptions& options = {});

// Credentials for a server's listening port.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials();

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_CHANNEL_FACTORY_H_
