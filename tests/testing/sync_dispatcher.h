// SyncDispatcher: calls DispatcherImpl's RPC methods and waits for their answer.
//
// DispatcherImpl has one API per RPC, the asynchronous one the gRPC adapter uses: the handler runs
// in the caller's thread and `done` receives the status once the journal holds what it changed.
// Tests, the fuzzer and benchmarks that drive the impl directly want the answer in hand; this
// wrapper blocks until `done` runs. Thread-safe as DispatcherImpl is; does not own the impl.
//
//   auto impl = DispatcherImpl::Create(options);
//   proto::WorkerRegisterResponse registered;
//   ASSERT_TRUE(Sync(*impl).WorkerRegister(request, &registered).ok());
#ifndef SLUICE_TESTS_TESTING_SYNC_DISPATCHER_H_
#define SLUICE_TESTS_TESTING_SYNC_DISPATCHER_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "dispatcher/dispatcher_impl.h"
#include "proto/dispatcher.pb.h"

namespace sluice::testonly {

class SyncDispatcher {
 public:
  explicit SyncDispatcher(dispatcher::DispatcherImpl* impl) : impl_(impl) {}

  absl::Status RegisterDataset(const proto::RegisterDatasetRequest& request,
                               proto::RegisterDatasetResponse* response) {
    return Call(&Impl::RegisterDataset, request, response);
  }
  absl::Status GetOrCreateJob(const proto::GetOrCreateJobRequest& request,
                              proto::GetOrCreateJobResponse* response) {
    return Call(&Impl::GetOrCreateJob, request, response);
  }
  absl::Status ClientHeartbeat(const proto::ClientHeartbeatRequest& request,
                               proto::ClientHeartbeatResponse* response) {
    return Call(&Impl::ClientHeartbeat, request, response);
  }
  absl::Status WorkerRegister(const proto::WorkerRegisterRequest& request,
                              proto::WorkerRegisterResponse* response) {
    return Call(&Impl::WorkerRegister, request, response);
  }
  absl::Status WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                               proto::WorkerHeartbeatResponse* response) {
    return Call(&Impl::WorkerHeartbeat, request, response);
  }
  absl::Status WorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                proto::WorkerUnregisterResponse* response) {
    return Call(&Impl::WorkerUnregister, request, response);
  }
  absl::Status RemoveCache(const proto::RemoveCacheRequest& request,
                           proto::RemoveCacheResponse* response) {
    return Call(&Impl::RemoveCache, request, response);
  }
  absl::Status DrainWorker(const proto::DrainWorkerRequest& request,
                           proto::DrainWorkerResponse* response) {
    return Call(&Impl::DrainWorker, request, response);
  }
  absl::Status GetJobState(const proto::GetJobStateRequest& request,
                           proto::GetJobStateResponse* response) {
    return Call(&Impl::GetJobState, request, response);
  }
  absl::Status GetStatus(const proto::GetStatusRequest& request,
                         proto::GetStatusResponse* response) {
    return Call(&Impl::GetStatus, request, response);
  }

 private:
  using Impl = dispatcher::DispatcherImpl;
  template <typename Request, typename Response>
  using Method = void (Impl::*)(const Request&, Response*, Impl::Done);

  template <typename Request, typename Response>
  absl::Status Call(Method<Request, Response> method, const Request& request, Response* response) {
    absl::Notification answered;
    absl::Status status;
    (impl_->*method)(request, response, [&](absl::Status s) {
      status = std::move(s);
      answered.Notify();
    });
    answered.WaitForNotification();
    return status;
  }

  Impl* const impl_;
};

inline SyncDispatcher Sync(dispatcher::DispatcherImpl& impl) { return SyncDispatcher(&impl); }
inline SyncDispatcher Sync(const std::unique_ptr<dispatcher::DispatcherImpl>& impl) {
  return SyncDispatcher(impl.get());
}

}  // namespace sluice::testonly

#endif  // SLUICE_TESTS_TESTING_SYNC_DISPATCHER_H_
