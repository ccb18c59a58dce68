// GrpcDispatcherService: the gRPC face of DispatcherImpl, one line per RPC
// (sync unary API; every RPC is short and never blocks on another peer).
// Converts absl::Status to grpc::Status with the same code. Thread-safe; does
// not own the impl, which must outlive it.
#ifndef SLUICE_DISPATCHER_GRPC_DISPATCHER_SERVICE_H_
#define SLUICE_DISPATCHER_GRPC_DISPATCHER_SERVICE_H_

#include "absl/status/status.h"
#include "dispatcher/dispatcher_impl.h"
#include "grpcpp/grpcpp.h"
#include "proto/dispatcher.grpc.pb.h"

namespace sluice::dispatcher {

class GrpcDispatcherService final : public proto::DispatcherService::Service {
 public:
  explicit GrpcDispatcherService(DispatcherImpl* impl) : impl_(impl) {}

  grpc::Status RegisterDataset(
      grpc::ServerContext* context,
      const proto::RegisterDatasetRequest* request,
      proto::RegisterDatasetResponse* response) override;
  grpc::Status GetOrCreateJob(grpc::ServerContext* context,
                              const proto::GetOrCreateJobRequest* request,
                              proto::GetOrCreateJobResponse* response) override;
  grpc::Status ClientHeartbeat(
      grpc::ServerContext* context,
      const proto::ClientHeartbeatRequest* request,
      proto::ClientHeartbeatResponse* response) override;
  grpc::Status WorkerRegister(grpc::ServerContext* context,
                              const proto::WorkerRegisterRequest* request,
                              proto::WorkerRegisterResponse* response) override;
  grpc::Status WorkerHeartbeat(
      grpc::ServerContext* context,
      const proto::WorkerHeartbeatRequest* request,
      proto::WorkerHeartbeatResponse* response) override;
  grpc::Status WorkerUnregister(
      grpc::ServerContext* context,
      const proto::WorkerUnregisterRequest* request,
      proto::WorkerUnregisterResponse* response) override;
  grpc::Status DrainWorker(grpc::ServerContext* context,
                           const proto::DrainWorkerRequest* request,
                           proto::DrainWorkerResponse* response) override;
  grpc::Status GetJobState(grpc::ServerContext* context,
                           const proto::GetJobStateRequest* request,
                           proto::GetJobStateResponse* response) override;

 private:
  DispatcherImpl* const impl_;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_GRPC_DISPATCHER_SERVICE_H_
