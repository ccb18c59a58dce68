#include "common/service/channel_factory.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace sluice::service {

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(
    const std::string& address, const ChannelOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("empty address (want host:port)");
  grpc::ChannelArguments args;
  if (options.max_receive_message_bytes != 0)
    args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  return grpc::InsecureServerCredentials();
}

}  // namespace sluice::service
