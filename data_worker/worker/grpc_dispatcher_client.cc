#include "data_worker/worker/grpc_dispatcher_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/retry.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/retry_policy.h"

namespace sluice::data_worker {

absl::StatusOr<std::unique_ptr<GrpcDispatcherClient>> GrpcDispatcherClient::Create(
    GrpcDispatcherClientOptions options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("--dispatcher: empty address (want host:port)");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      service::CreateChannel(options.address, options.channel);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<GrpcDispatcherClient>(
      new GrpcDispatcherClient(std::move(options), std::move(*channel)));
}

GrpcDispatcherClient::GrpcDispatcherClient(GrpcDispatcherClientOptions options,
                                           std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      stub_(proto::DispatcherService::NewStub(std::move(channel))) {}

template <typename Request, typename Response, typename Method>
absl::Status GrpcDispatcherClient::Call(const char* name, Method method, const Request& request,
                                        Response* response, bool retry) {
  const absl::Time give_up = clock_->Now() + options_.connect_timeout;
  auto attempt = [&]() -> absl::Status {
    grpc::ClientContext context;
    // No attempt outlives the retry budget, so an unresponsive peer fails
    // within it.
    absl::Duration timeout = options_.rpc_timeout;
    if (retry)
      timeout = std::max(absl::Milliseconds(100), std::min(timeout, give_up - clock_->Now()));
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return service::FromGrpcStatus(((*stub_).*method)(&context, request, response));
  };
  absl::Status status;
  if (retry) {
    RetryOptions retry_options;
    retry_options.deadline = options_.connect_timeout;
    retry_options.max_backoff = std::min(absl::Seconds(2), options_.connect_timeout);
    retry_options.retry_on = service::UnreachableCodes();
    status = RetryWithBackoff(attempt, retry_options, clock_);
  } else {
    status = attempt();
  }
  status = service::PeerCallError(status, "sluice dispatcher", options_.address, name);
  if (status.ok()) return status;
  // The address came from this worker's --dispatcher flag: say which flag to check.
  return absl::Status(status.code(), absl::StrCat(status.message(), " (check --dispatcher)"));
}

absl::Status GrpcDispatcherClient::WorkerRegister(const proto::WorkerRegisterRequest& request,
                                                  proto::WorkerRegisterResponse* response) {
  return Call("WorkerRegister", &proto::DispatcherService::Stub::WorkerRegister, request, response,
              /*retry=*/true);
}

absl::Status GrpcDispatcherClient::WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                                                   proto::WorkerHeartbeatResponse* response) {
  return Call("WorkerHeartbeat", &proto::DispatcherService::Stub::WorkerHeartbeat, request,
              response, /*retry=*/false);
}

absl::Status GrpcDispatcherClient::DrainWorker(const proto::DrainWorkerRequest& request,
                                               proto::DrainWorkerResponse* response) {
  return Call("DrainWorker", &proto::DispatcherService::Stub::DrainWorker, request, response,
              /*retry=*/true);
}

absl::Status GrpcDispatcherClient::WorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                                    proto::WorkerUnregisterResponse* response) {
  return Call("WorkerUnregister", &proto::DispatcherService::Stub::WorkerUnregister, request,
              response, /*retry=*/true);
}

absl::Status GrpcDispatcherClient::WatchAssignment(const proto::WatchAssignmentRequest& request,
                                                   proto::WatchAssignmentResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + 2 * absl::Seconds(request.max_wait_seconds()) + options_.rpc_timeout));
  {
    absl::MutexLock lock(&watch_mu_);
    if (watch_cancelled_) return absl::CancelledError("the worker is stopping");
    watch_context_ = &context;
  }
  const grpc::Status status = stub_->WatchAssignment(&context, request, response);
  {
    absl::MutexLock lock(&watch_mu_);
    watch_context_ = nullptr;
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::UnimplementedError(absl::StrCat("the sluice dispatcher at ", options_.address,
                                                 " has no WatchAssignment (an older version)"));
  }
  return service::PeerCallError(status, "sluice dispatcher", options_.address, "WatchAssignment");
}

void GrpcDispatcherClient::CancelWatch() {
  absl::MutexLock lock(&watch_mu_);
  watch_cancelled_ = true;
  if (watch_context_ != nullptr) watch_context_->TryCancel();
}

}  // namespace sluice::data_worker
