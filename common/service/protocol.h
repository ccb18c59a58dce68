// The version of sluice's wire protocol, and the one check every service applies.
//
// Every request to the dispatcher and every GetBatches call carries `protocol_version`
// (proto/worker.proto: ProtocolVersion). A peer speaking another version is refused with
// FAILED_PRECONDITION naming both versions and which side to upgrade. Bump
// proto::PROTOCOL_VERSION_CURRENT whenever a message changes incompatibly. A field whose zero
// value keeps the old meaning on both sides does not bump it: e.g. ClientHeartbeat's list
// versions (proto/dispatcher.proto, "Versioned lists"), where 0 means "send / these are the
// whole lists", so old clients and old dispatchers interoperate with new ones.
#ifndef SLUICE_COMMON_SERVICE_PROTOCOL_H_
#define SLUICE_COMMON_SERVICE_PROTOCOL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/worker.pb.h"

namespace sluice::service {

inline constexpr uint32_t kProtocolVersion = proto::PROTOCOL_VERSION_CURRENT;

// OK if `peer_version` is ours. Otherwise FailedPrecondition naming both versions and the side
// that is behind:
//   "client protocol version 3, dispatcher 2: upgrade the dispatcher so both speak the same
//   version"
// `peer` names the caller ("client", "client/worker"), `server` the side that checks.
absl::Status CheckProtocolVersion(uint32_t peer_version, absl::string_view peer,
                                  absl::string_view server);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_PROTOCOL_H_
