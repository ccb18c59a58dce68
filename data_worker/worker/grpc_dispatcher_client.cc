#include "data_worker/worker/grpc_dispatcher_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/retry.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"

namespace sluice::data_worker {

absl::StatusOr<std::unique_ptr<GrpcDispatcherClient>>
GrpcDispatcherClient::Create(GrpcDispatcherClientOptions options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError(
        "--dispatcher: empty address (want host:port)");
  }
  return std::unique_ptr<GrpcDispatcherClient>(
      new GrpcDispatcherClient(std::move(options)));
}

GrpcDispatcherClient::GrpcDispatcherClient(GrpcDispatcherClientOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      stub_(proto::DispatcherService::NewStub(
          *service::CreateChannel(options_.address))) {}

template <typename Request, typename Response, typename Method>
absl::Status GrpcDispatcherClient::Call(const char* name, Method method,
                                        const Request& request,
                                        Response* response, bool retry) {
  const absl::Time give_up = clock_->Now() + options_.connect_timeout;
  auto attempt = [&]() -> absl::Status {
    grpc::ClientContext context;
    // No attempt outlives the retry budget, so an unresponsive peer fails
    // within it.
    absl::Duration timeout = options_.rpc_timeout;
    if (retry)
      timeout = std::max(absl::Milliseconds(100),
                         std::min(timeout, give_up - clock_->Now()));
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return service::FromGrpcStatus(
        ((*stub_).*method)(&context, request, response));
  };
  absl::Status status;
  if (retry) {
    RetryOptions retry_options;
    retry_options.deadline = options_.connect_timeout;
    retry_options.max_backoff =
        std::min(absl::Seconds(2), options_.connect_timeout);
    retry_options.retry_on = {absl::StatusCode::kUnavailable,
                              absl::StatusCode::kDeadlineExceeded};
    status = RetryWithBackoff(attempt, retry_options, clock_);
  } else {
    status = attempt();
  }
  if (status.ok()) return status;
  if (absl::IsUnimplemented(status)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " to ", options_.address, ": ", status.message(),
                     " (is --dispatcher the address of a sluice-dispatcher?)"));
  }
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return absl::Status(
        status.code(), absl::StrCat(name, ": dispatcher ", options_.address,
                                    " unreachable or not answering: ",
                                    status.message(), " (check --dispatcher)"));
  }
  return absl::Status(status.code(),
                      absl::StrCat(name, " (dispatcher ", options_.address,
                                   "): ", status.message()));
}

absl::Status GrpcDispatcherClient::WorkerRegister(
    const proto::WorkerRegisterRequest& request,
    proto::WorkerRegisterResponse* response) {
  return Call("WorkerRegister", &proto::DispatcherService::Stub::WorkerRegister,
              request, response, /*retry=*/true);
}

absl::Status GrpcDispatcherClient::WorkerHeartbeat(
    const proto::WorkerHeartbeatRequest& request,
    proto::WorkerHeartbeatResponse* response) {
  return Call("WorkerHeartbeat",
              &proto::DispatcherService::Stub::WorkerHeartbeat, request,
              response, /*retry=*/false);
}

absl::Status GrpcDispatcherClient::DrainWorker(
    const proto::DrainWorkerRequest& request,
    proto::DrainWorkerResponse* response) {
  return Call("DrainWorker", &proto::DispatcherService::Stub::DrainWorker,
              request, response,
              /*retry=*/true);
}

absl::Status GrpcDispatcherClient::WorkerUnregister(
    const proto::WorkerUnregisterRequest& request,
    proto::WorkerUnregisterResponse* response) {
  return Call("WorkerUnregister",
              &proto::DispatcherService::Stub::WorkerUnregister, request,
              response, /*retry=*/true);
}

}  // namespace sluice::data_worker
