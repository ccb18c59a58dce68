#include "common/service/retry_policy.h"

#include "absl/strings/str_cat.h"
#include "common/service/grpc_status.h"

namespace sluice::service {

bool IsRetryable(absl::StatusCode code, CallKind kind) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return true;
    case absl::StatusCode::kNotFound:
      return kind == CallKind::kBatchStream;
    default:
      return false;
  }
}

bool IsUnreachable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

std::vector<absl::StatusCode> UnreachableCodes() {
  return {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded};
}

absl::Status PeerCallError(const absl::Status& status, absl::string_view peer,
                           absl::string_view address, absl::string_view rpc) {
  if (status.ok()) return absl::OkStatus();
  if (IsUnreachable(status.code())) {
    return absl::UnavailableError(absl::StrCat("cannot reach the ", peer, " at ", address, ": ",
                                               rpc, ": ", status.message()));
  }
  if (absl::IsUnimplemented(status)) {
    return absl::FailedPreconditionError(absl::StrCat("the gRPC server at ", address, " is not a ",
                                                      peer, " (", rpc, " is unimplemented)"));
  }
  return absl::Status(status.code(),
                      absl::StrCat(peer, " at ", address, ": ", rpc, ": ", status.message()));
}

absl::Status PeerCallError(const grpc::Status& status, absl::string_view peer,
                           absl::string_view address, absl::string_view rpc) {
  return PeerCallError(FromGrpcStatus(status), peer, address, rpc);
}

}  // namespace sluice::service
