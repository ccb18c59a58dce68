#include "dispatcher/grpc_dispatcher_service.h"

#include "common/service/grpc_status.h"

namespace sluice::dispatcher {

using service::ToGrpcStatus;

grpc::Status GrpcDispatcherService::RegisterDataset(
    grpc::ServerContext*, const proto::RegisterDatasetRequest* request,
    proto::RegisterDatasetResponse* response) {
  return ToGrpcStatus(impl_->RegisterDataset(*request, response));
}

grpc::Status GrpcDispatcherService::GetOrCreateJob(
    grpc::ServerContext*, const proto::GetOrCreateJobRequest* request,
    proto::GetOrCreateJobResponse* response) {
  return ToGrpcStatus(impl_->GetOrCreateJob(*request, response));
}

grpc::Status GrpcDispatcherService::ClientHeartbeat(
    grpc::ServerContext*, const proto::ClientHeartbeatRequest* request,
    proto::ClientHeartbeatResponse* response) {
  return ToGrpcStatus(impl_->ClientHeartbeat(*request, response));
}

grpc::Status GrpcDispatcherService::WorkerRegister(
    grpc::ServerContext*, const proto::WorkerRegisterRequest* request,
    proto::WorkerRegisterResponse* response) {
  return ToGrpcStatus(impl_->WorkerRegister(*request, response));
}

grpc::Status GrpcDispatcherService::WorkerHeartbeat(
    grpc::ServerContext*, const proto::WorkerHeartbeatRequest* request,
    proto::WorkerHeartbeatResponse* response) {
  return ToGrpcStatus(impl_->WorkerHeartbeat(*request, response));
}

grpc::Status GrpcDispatcherService::WorkerUnregister(
    grpc::ServerContext*, const proto::WorkerUnregisterRequest* request,
    proto::WorkerUnregisterResponse* response) {
  return ToGrpcStatus(impl_->WorkerUnregister(*request, response));
}

grpc::Status GrpcDispatcherService::DrainWorker(
    grpc::ServerContext*, const proto::DrainWorkerRequest* request,
    proto::DrainWorkerResponse* response) {
  return ToGrpcStatus(impl_->DrainWorker(*request, response));
}

grpc::Status GrpcDispatcherService::GetJobState(
    grpc::ServerContext*, const proto::GetJobStateRequest* request,
    proto::GetJobStateResponse* response) {
  return ToGrpcStatus(impl_->GetJobState(*request, response));
}

}  // namespace sluice::dispatcher
