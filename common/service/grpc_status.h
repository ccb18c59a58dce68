// Conversion between absl::Status (what every sluice API returns) and grpc::Status (what
// crosses the wire). absl::StatusCode and grpc::StatusCode share their numbering (both follow
// google.rpc.Code), so codes map one to one and messages pass unchanged. Only gRPC adapters
// and clients call these.
#ifndef SLUICE_COMMON_SERVICE_GRPC_STATUS_H_
#define SLUICE_COMMON_SERVICE_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace sluice::service {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// FromGrpcStatus with the message prefixed: "<what>: <message>".
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_GRPC_STATUS_H_
