#include "common/service/protocol.h"

#include "absl/strings/str_cat.h"

namespace sluice::service {

absl::Status CheckProtocolVersion(uint32_t peer_version, absl::string_view peer,
                                  absl::string_view server) {
  if (peer_version == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(peer, " protocol version ", peer_version, ", ",
                                                    server, " ", kProtocolVersion, ": upgrade the ",
                                                    peer_version < kProtocolVersion ? peer : server,
                                                    " so both speak the same version"));
}

}  // namespace sluice::service
