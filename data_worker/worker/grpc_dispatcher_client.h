// GrpcDispatcherClient: DispatcherClient over a gRPC channel to
// sluice-dispatcher.
//
// Every call has a deadline (rpc_timeout). WorkerRegister, DrainWorker and
// WorkerUnregister retry UNAVAILABLE/DEADLINE_EXCEEDED with backoff
// (common/base/retry.h) for up to connect_timeout, so a dispatcher that
// restarts is waited for, and one that never answers fails within that time.
// WorkerHeartbeat is tried once: the heartbeat loop itself retries at the next
// interval. Error messages name the dispatcher address; UNIMPLEMENTED
// (something that speaks gRPC but is not a dispatcher) says so. Thread-safe.
#ifndef SLUICE_DATA_WORKER_WORKER_GRPC_DISPATCHER_CLIENT_H_
#define SLUICE_DATA_WORKER_WORKER_GRPC_DISPATCHER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/service/channel_factory.h"
#include "data_worker/worker/worker_impl.h"
#include "grpcpp/grpcpp.h"
#include "proto/dispatcher.grpc.pb.h"

namespace sluice::data_worker {

struct GrpcDispatcherClientOptions {
  std::string address;  // host:port of sluice-dispatcher
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);  // retry budget of the retried calls
  Clock* clock = nullptr;                              // null: RealClock::Get()
  // TLS and bearer token towards the dispatcher (common/service/channel_factory.h).
  service::ChannelOptions channel;
};

class GrpcDispatcherClient final : public DispatcherClient {
 public:
  // InvalidArgument for an empty address. Does not connect (the first call
  // does).
  static absl::StatusOr<std::unique_ptr<GrpcDispatcherClient>> Create(
      GrpcDispatcherClientOptions options);

  absl::Status WorkerRegister(const proto::WorkerRegisterRequest& request,
                              proto::WorkerRegisterResponse* response) override;
  absl::Status WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                               proto::WorkerHeartbeatResponse* response) override;
  absl::Status DrainWorker(const proto::DrainWorkerRequest& request,
                           proto::DrainWorkerResponse* response) override;
  absl::Status WorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                proto::WorkerUnregisterResponse* response) override;
  // Tried once, with a deadline of 2 * max_wait_seconds + rpc_timeout.
  absl::Status WatchAssignment(const proto::WatchAssignmentRequest& request,
                               proto::WatchAssignmentResponse* response) override;
  void CancelWatch() override;

 private:
  GrpcDispatcherClient(GrpcDispatcherClientOptions options, std::shared_ptr<grpc::Channel> channel);

  template <typename Request, typename Response, typename Method>
  absl::Status Call(const char* name, Method method, const Request& request, Response* response,
                    bool retry);

  const GrpcDispatcherClientOptions options_;
  Clock* const clock_;
  std::unique_ptr<proto::DispatcherService::Stub> stub_;
  absl::Mutex watch_mu_;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(watch_mu_) = nullptr;
  bool watch_cancelled_ ABSL_GUARDED_BY(watch_mu_) = false;
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_GRPC_DISPATCHER_CLIENT_H_
