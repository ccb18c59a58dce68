// Which failed calls a sluice process retries, and how it words the ones it gives up on: the
// one table every client of a sluice server (trainer client, worker, CLI) reads.
//
//   code               unary RPC                       GetBatches stream
//   UNAVAILABLE        retry: the peer is unreachable  retry
//   DEADLINE_EXCEEDED  retry: the peer is unreachable  retry
//   ABORTED            retry                           retry (a newer stream superseded it)
//   CANCELLED          retry                           retry
//   NOT_FOUND          fail                            retry (the worker does not know the job
//                                                      yet: its next heartbeat brings it)
//   anything else      fail: a verdict on the request or the data, surfaced to the user
//
// Loops that retry on their own (heartbeats, streams) ask IsRetryable; calls retried with
// RetryWithBackoff (common/base/retry.h) retry only while the peer is unreachable
// (UnreachableCodes), so a dispatcher that answers ABORTED is heard at once.
#ifndef SLUICE_COMMON_SERVICE_RETRY_POLICY_H_
#define SLUICE_COMMON_SERVICE_RETRY_POLICY_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace sluice::service {

enum class CallKind { kUnary, kBatchStream };

// The table above.
bool IsRetryable(absl::StatusCode code, CallKind kind = CallKind::kUnary);

// UNAVAILABLE or DEADLINE_EXCEEDED: no answer came from the peer.
bool IsUnreachable(absl::StatusCode code);
// The same codes, for RetryOptions::retry_on.
std::vector<absl::StatusCode> UnreachableCodes();

// The status of call `rpc` to the `peer` ("sluice dispatcher") at `address` that ended with
// `status`, worded for the user:
//   unreachable    Unavailable "cannot reach the sluice dispatcher at 10.0.0.5:7070:
//                  GetStatus: <message>"
//   UNIMPLEMENTED  FailedPrecondition "the gRPC server at 10.0.0.5:7070 is not a sluice
//                  dispatcher (GetStatus is unimplemented)"
//   other codes    kept, the message prefixed "sluice dispatcher at ADDR: RPC: "
absl::Status PeerCallError(const absl::Status& status, absl::string_view peer,
                           absl::string_view address, absl::string_view rpc);
absl::Status PeerCallError(const grpc::Status& status, absl::string_view peer,
                           absl::string_view address, absl::string_view rpc);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_RETRY_POLICY_H_
