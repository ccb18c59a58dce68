// Conversion between absl::Status (what every sluice API returns) and grpc::Status (what
// crosses the wire). absl::StatusCode and grpc::StatusCode share their numbering (both follow
// google.rpc.Code), so codes map one to one and messages pass unchanged, unless too long for
// the wire (WireMessage). Only gRPC adapters and clients call these.
#ifndef SLUICE_COMMON_SERVICE_GRPC_STATUS_H_
#define SLUICE_COMMON_SERVICE_GRPC_STATUS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace sluice::service {

// A status message travels in a response header, which gRPC peers refuse
// above 8 KiB (the whole call then fails with RESOURCE_EXHAUSTED and the
// error is lost): a message longer than this on the wire (percent-encoded
// as gRPC sends it) keeps its first kWireHeadBytes and last kWireTailBytes,
// with "... (N bytes cut) ..." between.
inline constexpr size_t kMaxWireMessageBytes = 6000;
inline constexpr size_t kWireHeadBytes = 1500;
inline constexpr size_t kWireTailBytes = 4000;
std::string WireMessage(absl::string_view message);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// FromGrpcStatus with the message prefixed: "<what>: <message>".
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_GRPC_STATUS_H_
