#include "dispatcher/grpc_dispatcher_service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/service/grpc_status.h"
#include "common/service/identity.h"

namespace sluice::dispatcher {
namespace {

using service::Identity;
using service::Role;

// The caller of `context`'s call; the reactor is finished with the error when the caller
// cannot be named.
std::optional<Identity> Caller(grpc::CallbackServerContext* context,
                               grpc::ServerUnaryReactor* reactor) {
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  absl::StatusOr<Identity> identity =
      auth == nullptr ? Identity::Development() : service::IdentityOf(*auth);
  if (!identity.ok()) {
    reactor->Finish(service::ToGrpcStatus(identity.status()));
    return std::nullopt;
  }
  return *identity;
}

// Forwards to the impl; `done` finishes the reactor (from this thread or DurableAcks').
template <typename Request, typename Response>
void Forward(grpc::ServerUnaryReactor* reactor, const Request& request, Response* response,
             DispatcherImpl* impl,
             void (DispatcherImpl::*method)(const Request&, Response*, DispatcherImpl::Done),
             std::function<void()> on_ok = nullptr) {
  (impl->*method)(request, response, [reactor, on_ok = std::move(on_ok)](absl::Status status) {
    if (status.ok() && on_ok) on_ok();
    reactor->Finish(service::ToGrpcStatus(status));
  });
}

// Finishes the reactor with `check`'s error, or forwards the call to the impl.
template <typename Request, typename Response>
void ForwardIfAllowed(const absl::Status& check, grpc::ServerUnaryReactor* reactor,
                      const Request& request, Response* response, DispatcherImpl* impl,
                      void (DispatcherImpl::*method)(const Request&, Response*,
                                                     DispatcherImpl::Done),
                      std::function<void()> on_ok = nullptr) {
  if (!check.ok()) {
    reactor->Finish(service::ToGrpcStatus(check));
    return;
  }
  Forward(reactor, request, response, impl, method, std::move(on_ok));
}

}  // namespace

template <typename Request, typename Response>
grpc::ServerUnaryReactor* GrpcDispatcherService::ServeWorkerCall(
    grpc::CallbackServerContext* context, const Request* request, Response* response,
    void (DispatcherImpl::*method)(const Request&, Response*, DispatcherImpl::Done),
    absl::string_view rpc) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  ForwardIfAllowed(authorization_.CheckWorker(*caller, request->worker_id(), rpc), reactor,
                   *request, response, impl_, method);
  return reactor;
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* GrpcDispatcherService::ServeJobCall(
    grpc::CallbackServerContext* context, const Request* request, Response* response,
    void (DispatcherImpl::*method)(const Request&, Response*, DispatcherImpl::Done),
    absl::string_view rpc) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  if (caller->Has(Role::kOperator)) {  // may act for every job
    Forward(reactor, *request, response, impl_, method);
    return reactor;
  }
  WithJobOwner(request->job_id(), [this, reactor, request, response, method, rpc,
                                   caller = *caller](std::optional<std::string> owner) {
    // An unknown job needs only the trainer role; the impl then answers NotFound.
    ForwardIfAllowed(owner ? authorization_.CheckJobAccess(caller, Role::kTrainer, rpc,
                                                           request->job_id(), *owner)
                           : service::RequireRole(caller, Role::kTrainer, rpc),
                     reactor, *request, response, impl_, method);
  });
  return reactor;
}

void GrpcDispatcherService::WithJobOwner(uint64_t job_id,
                                         std::function<void(std::optional<std::string>)> then) {
  if (std::optional<std::string> owner = authorization_.JobOwner(job_id)) {
    then(std::move(owner));
    return;
  }
  WithFullStatus([this, job_id, then = std::move(then)](absl::Status s,
                                                        const proto::GetStatusResponse& status) {
    if (s.ok()) authorization_.LearnJobs(status);
    then(authorization_.JobOwner(job_id));
  });
}

void GrpcDispatcherService::WithFullStatus(
    std::function<void(absl::Status, const proto::GetStatusResponse&)> then) {
  auto request = std::make_shared<proto::GetStatusRequest>();
  request->set_protocol_version(kProtocolVersion);
  request->set_starting_workers(-1);
  auto status = std::make_shared<proto::GetStatusResponse>();
  impl_->GetStatus(
      *request, status.get(),
      [request, status, then = std::move(then)](absl::Status s) { then(std::move(s), *status); });
}

grpc::ServerUnaryReactor* GrpcDispatcherService::RegisterDataset(
    grpc::CallbackServerContext* context, const proto::RegisterDatasetRequest* request,
    proto::RegisterDatasetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  if (!caller->all_roles) {
    authorization_.ForgetDatasets(caller->user,
                                  [this](uint64_t id) { return impl_->HasDataset(id); });
  }
  ForwardIfAllowed(authorization_.CheckRegisterDataset(*caller, *request), reactor, *request,
                   response, impl_, &DispatcherImpl::RegisterDataset,
                   [this, caller = *caller, request, response] {
                     authorization_.DatasetRegistered(caller, *request, response->dataset_id());
                   });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDispatcherService::GetOrCreateJob(
    grpc::CallbackServerContext* context, const proto::GetOrCreateJobRequest* request,
    proto::GetOrCreateJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  proto::GetOrCreateJobRequest scoped = *request;
  const std::string anonymous_id =
      absl::StrCat(impl_->incarnation(), "-", anonymous_jobs_.fetch_add(1));
  ForwardIfAllowed(authorization_.CheckGetOrCreateJob(*caller, anonymous_id, &scoped), reactor,
                   scoped, response, impl_, &DispatcherImpl::GetOrCreateJob,
                   [this, caller = *caller, response] {
                     authorization_.JobCreated(caller, response->job_id());
                   });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDispatcherService::ClientHeartbeat(
    grpc::CallbackServerContext* context, const proto::ClientHeartbeatRequest* request,
    proto::ClientHeartbeatResponse* response) {
  return ServeJobCall(context, request, response, &DispatcherImpl::ClientHeartbeat,
                      "ClientHeartbeat");
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WorkerRegister(
    grpc::CallbackServerContext* context, const proto::WorkerRegisterRequest* request,
    proto::WorkerRegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  uint64_t holder = 0;
  if (absl::Status s = authorization_.CheckWorkerRegister(*caller, *request, &holder); !s.ok()) {
    reactor->Finish(service::ToGrpcStatus(s));
    return reactor;
  }
  auto forward = [this, reactor, request, response, caller = *caller] {
    Forward(reactor, *request, response, impl_, &DispatcherImpl::WorkerRegister,
            [this, caller, request, response] {
              authorization_.WorkerRegistered(caller, response->worker_id(), request->address());
            });
  };
  if (holder == 0) {
    forward();
    return reactor;
  }
  // The address was last registered by another identity: refused while that worker lives.
  WithFullStatus([reactor, request, holder, caller = *caller, forward = std::move(forward)](
                     absl::Status s, const proto::GetStatusResponse& status) {
    if (!s.ok()) {
      reactor->Finish(service::ToGrpcStatus(s));
      return;
    }
    for (const proto::WorkerStatus& worker : status.workers()) {
      if (worker.worker_id() != holder) continue;
      reactor->Finish(service::ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrCat(caller.Describe(), " may not register at ", request->address(),
                       ": live worker ", holder, " of another identity serves there"))));
      return;
    }
    forward();
  });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WorkerHeartbeat(
    grpc::CallbackServerContext* context, const proto::WorkerHeartbeatRequest* request,
    proto::WorkerHeartbeatResponse* response) {
  return ServeWorkerCall(context, request, response, &DispatcherImpl::WorkerHeartbeat,
                         "WorkerHeartbeat");
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WorkerUnregister(
    grpc::CallbackServerContext* context, const proto::WorkerUnregisterRequest* request,
    proto::WorkerUnregisterResponse* response) {
  return ServeWorkerCall(context, request, response, &DispatcherImpl::WorkerUnregister,
                         "WorkerUnregister");
}

grpc::ServerUnaryReactor* GrpcDispatcherService::RemoveCache(
    grpc::CallbackServerContext* context, const proto::RemoveCacheRequest* request,
    proto::RemoveCacheResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  if (absl::Status s = authorization_.CheckRemoveCache(*caller); !s.ok()) {
    reactor->Finish(service::ToGrpcStatus(s));
    return reactor;
  }
  Forward(reactor, *request, response, impl_, &DispatcherImpl::RemoveCache);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDispatcherService::DrainWorker(
    grpc::CallbackServerContext* context, const proto::DrainWorkerRequest* request,
    proto::DrainWorkerResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  ForwardIfAllowed(authorization_.CheckDrainWorker(*caller), reactor, *request, response, impl_,
                   &DispatcherImpl::DrainWorker);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDispatcherService::GetJobState(
    grpc::CallbackServerContext* context, const proto::GetJobStateRequest* request,
    proto::GetJobStateResponse* response) {
  return ServeJobCall(context, request, response, &DispatcherImpl::GetJobState, "GetJobState");
}

grpc::ServerUnaryReactor* GrpcDispatcherService::GetStatus(grpc::CallbackServerContext* context,
                                                           const proto::GetStatusRequest* request,
                                                           proto::GetStatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<Identity> caller = Caller(context, reactor);
  if (!caller) return reactor;
  proto::GetStatusRequest allowed = *request;
  ForwardIfAllowed(authorization_.CheckGetStatus(*caller, &allowed), reactor, allowed, response,
                   impl_, &DispatcherImpl::GetStatus, [this, caller = *caller, response] {
                     authorization_.LearnJobs(*response);
                     authorization_.FilterStatus(caller, response);
                   });
  return reactor;
}

grpc::ServerUnaryReactor* GrpcDispatcherService::WatchAssignment(
    grpc::CallbackServerContext* context, const proto::WatchAssignmentRequest* request,
    proto::WatchAssignmentResponse* response) {
  return ServeWorkerCall(context, request, response, &DispatcherImpl::WatchAssignment,
                         "WatchAssignment");
}

}  // namespace sluice::dispatcher
