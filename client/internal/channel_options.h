// The transport security fields of ClientOptions as the channel factory takes them
// (common/service/channel_factory.h): one mapping for the dispatcher's and the workers'
// channels.
#ifndef SLUICE_CLIENT_INTERNAL_CHANNEL_OPTIONS_H_
#define SLUICE_CLIENT_INTERNAL_CHANNEL_OPTIONS_H_

#include "common/service/channel_factory.h"
#include "sluice/client.h"

namespace sluice::client {

inline service::ChannelOptions ToChannelOptions(const ClientOptions& options,
                                                int max_receive_message_bytes) {
  service::ChannelOptions channel;
  channel.max_receive_message_bytes = max_receive_message_bytes;
  channel.tls_ca = options.tls_ca;
  channel.tls_cert = options.tls_cert;
  channel.tls_key = options.tls_key;
  channel.auth_token_file = options.auth_token_file;
  channel.tls_server_name = options.tls_server_name;
  return channel;
}

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_CHANNEL_OPTIONS_H_
