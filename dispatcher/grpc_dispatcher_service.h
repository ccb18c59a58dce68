// GrpcDispatcherService: the gRPC face of DispatcherImpl, one line per RPC.
//
// Callback API: a handler runs DispatcherImpl's short critical section on the
// gRPC thread that received the call and returns; the call is finished then, or
// by DispatcherImpl's DurableAcks thread once the journal made the change
// durable. No thread is parked per waiting call, so the thread count stays
// bounded whatever the number of workers and consumers (the synchronous API
// started a thread per blocked call and convoyed on the dispatcher's mutex;
// docs/BENCHMARKS.md "Control-plane scale").
//
// Every call is authorized first (dispatcher/authorization.h: the caller's role, the job's
// owner); a refused call never reaches the impl. Converts absl::Status to grpc::Status with
// the same code. Thread-safe; does
// not own the impl, which must outlive the server.
#ifndef SLUICE_DISPATCHER_GRPC_DISPATCHER_SERVICE_H_
#define SLUICE_DISPATCHER_GRPC_DISPATCHER_SERVICE_H_

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dispatcher/authorization.h"
#include "dispatcher/dispatcher_impl.h"
#include "grpcpp/grpcpp.h"
#include "proto/dispatcher.grpc.pb.h"

namespace sluice::dispatcher {

class GrpcDispatcherService final : public proto::DispatcherService::CallbackService {
 public:
  explicit GrpcDispatcherService(DispatcherImpl* impl, Authorization::Options authorization = {})
      : impl_(impl), authorization_(authorization) {}

  grpc::ServerUnaryReactor* RegisterDataset(grpc::CallbackServerContext* context,
                                            const proto::RegisterDatasetRequest* request,
                                            proto::RegisterDatasetResponse* response) override;
  grpc::ServerUnaryReactor* GetOrCreateJob(grpc::CallbackServerContext* context,
                                           const proto::GetOrCreateJobRequest* request,
                                           proto::GetOrCreateJobResponse* response) override;
  grpc::ServerUnaryReactor* ClientHeartbeat(grpc::CallbackServerContext* context,
                                            const proto::ClientHeartbeatRequest* request,
                                            proto::ClientHeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* WorkerRegister(grpc::CallbackServerContext* context,
                                           const proto::WorkerRegisterRequest* request,
                                           proto::WorkerRegisterResponse* response) override;
  grpc::ServerUnaryReactor* WorkerHeartbeat(grpc::CallbackServerContext* context,
                                            const proto::WorkerHeartbeatRequest* request,
                                            proto::WorkerHeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* WorkerUnregister(grpc::CallbackServerContext* context,
                                             const proto::WorkerUnregisterRequest* request,
                                             proto::WorkerUnregisterResponse* response) override;
  grpc::ServerUnaryReactor* RemoveCache(grpc::CallbackServerContext* context,
                                        const proto::RemoveCacheRequest* request,
                                        proto::RemoveCacheResponse* response) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* context,
                                        const proto::DrainWorkerRequest* request,
                                        proto::DrainWorkerResponse* response) override;
  grpc::ServerUnaryReactor* GetJobState(grpc::CallbackServerContext* context,
                                        const proto::GetJobStateRequest* request,
                                        proto::GetJobStateResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const proto::GetStatusRequest* request,
                                      proto::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* WatchAssignment(grpc::CallbackServerContext* context,
                                            const proto::WatchAssignmentRequest* request,
                                            proto::WatchAssignmentResponse* response) override;

 private:
  // Calls `then` with the owner of `job_id` (nullopt: no such job), asking the impl's
  // GetStatus for the names of jobs not seen yet.
  void WithJobOwner(uint64_t job_id, std::function<void(std::optional<std::string>)> then);
  // Calls `then` with the impl's full GetStatus answer (every job and worker).
  void WithFullStatus(std::function<void(absl::Status, const proto::GetStatusResponse&)> then);

  // The worker RPCs: the caller must be the identity that registered the request's worker_id.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* ServeWorkerCall(
      grpc::CallbackServerContext* context, const Request* request, Response* response,
      void (DispatcherImpl::*method)(const Request&, Response*, DispatcherImpl::Done),
      absl::string_view rpc);
  // The RPCs about one job: an operator, or a trainer that owns the request's job_id (an unknown
  // job needs only the trainer role; the impl answers NotFound).
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* ServeJobCall(grpc::CallbackServerContext* context,
                                         const Request* request, Response* response,
                                         void (DispatcherImpl::*method)(const Request&, Response*,
                                                                        DispatcherImpl::Done),
                                         absl::string_view rpc);

  DispatcherImpl* const impl_;
  Authorization authorization_;
  std::atomic<uint64_t> anonymous_jobs_{0};
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_GRPC_DISPATCHER_SERVICE_H_
