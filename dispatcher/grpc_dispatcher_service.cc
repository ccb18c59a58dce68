#include "dispatcher/grpc_dispatcher_service.h"

#include "common/service/grpc_status.h"

namespace sluice::dispatcher {
namespace {

// The reactor that the impl's `done` finishes (from this thread or DurableAcks').
template <typename Request, typename Response>
grpc::ServerUnaryReactor* Serve(
    grpc::CallbackServerContext* context, const Request* request,
    Response* response, DispatcherImpl* impl,
    void (DispatcherImpl::*method)(const Request&, Response*,
                                   DispatcherImpl::Done)) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  (impl->*method)(*request, response, [reactor](absl::Status status) {
    reactor->Finish(service::ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* GrpcDispatcherService::RegisterDataset(
    grpc::CallbackServerContext* context,
    const proto::RegisterDatasetRequest* request,
    proto::RegisterDatasetResponse* response) {
  return Serve(context, request, response, impl_,
               &DispatcherImpl::RegisterDataset);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::GetOrCreateJob(
    grpc::CallbackServerContext* context,
    const proto::GetOrCreateJobRequest* request,
    proto::GetOrCreateJobResponse* response) {
  return Serve(context, request, response, impl_,
               &DispatcherImpl::GetOrCreateJob);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::ClientHeartbeat(
    grpc::CallbackServerContext* context,
    const proto::ClientHeartbeatRequest* request,
    proto::ClientHeartbeatResponse* response) {
  return Serve(context, request, response, impl_,
               &DispatcherImpl::ClientHeartbeat);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WorkerRegister(
    grpc::CallbackServerContext* context,
    const proto::WorkerRegisterRequest* request,
    proto::WorkerRegisterResponse* response) {
  return Serve(context, request, response, impl_,
               &DispatcherImpl::WorkerRegister);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WorkerHeartbeat(
    grpc::CallbackServerContext* context,
    const proto::WorkerHeartbeatRequest* request,
    proto::WorkerHeartbeatResponse* response) {
  return Serve(context, request, response, impl_,
               &DispatcherImpl::WorkerHeartbeat);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WorkerUnregister(
    grpc::CallbackServerContext* context,
    const proto::WorkerUnregisterRequest* request,
    proto::WorkerUnregisterResponse* response) {
  return Serve(context, request, response, impl_,
               &DispatcherImpl::WorkerUnregister);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::DrainWorker(
    grpc::CallbackServerContext* context,
    const proto::DrainWorkerRequest* request,
    proto::DrainWorkerResponse* response) {
  return Serve(context, request, response, impl_, &DispatcherImpl::DrainWorker);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::GetJobState(
    grpc::CallbackServerContext* context,
    const proto::GetJobStateRequest* request,
    proto::GetJobStateResponse* response) {
  return Serve(context, request, response, impl_, &DispatcherImpl::GetJobState);
}

grpc::ServerUnaryReactor* GrpcDispatcherService::GetStatus(
    grpc::CallbackServerContext* context,
    const proto::GetStatusRequest* request,
    proto::GetStatusResponse* response) {
  return Serve(context, request, response, impl_, &DispatcherImpl::GetStatus);
}

}  // namespace sluice::dispatcher
