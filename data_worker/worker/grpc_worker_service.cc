#include "data_worker/worker/grpc_worker_service.h"

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/service/grpc_status.h"
#include "data_worker/worker/grpc_dispatcher_client.h"

namespace sluice::data_worker {
namespace {

class BatchWriter;

// The producer's way to reach a reactor that may already be gone: WorkerImpl
// keeps a copy of the notify function (which holds this by shared_ptr) until
// the stream is closed or superseded.
class Notifier {
 public:
  void Set(BatchWriter* writer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    writer_ = writer;
  }
  void Notify() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  BatchWriter* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// One GetBatches call. Lock order: Notifier::mu_ -> BatchWriter::mu_ ->
// WorkerImpl's mutex.
class BatchWriter final : public grpc::ServerWriteReactor<proto::Batch> {
 public:
  BatchWriter(WorkerImpl* impl, const proto::GetBatchesRequest& request)
      : impl_(impl), notifier_(std::make_shared<Notifier>()) {
    notifier_->Set(this);
    absl::StatusOr<uint64_t> id =
        impl_->OpenStream(request, [n = notifier_] { n->Notify(); });
    absl::MutexLock lock(&mu_);
    if (!id.ok()) {
      finished_ = true;
      Finish(service::ToGrpcStatus(id.status()));
      return;
    }
    stream_id_ = *id;
    WriteNextLocked();
  }

  // Called by the producer (through Notifier) when something changed for this
  // consumer.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    WriteNextLocked();
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok || cancelled_) {
      // Not delivered (as far as we know): the next stream of this consumer
      // sends it again; the client keeps exactly-once by batch index.
      impl_->ReturnBatch(stream_id_, std::move(batch_));
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "the stream was cancelled"));
      }
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the stream was cancelled"));
    }
  }

  void OnDone() override {
    notifier_->Set(nullptr);  // no Wake() after this returns
    if (stream_id_ != 0) impl_->CloseStream(stream_id_);
    delete this;
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || cancelled_ || stream_id_ == 0) return;
    StreamEvent event = impl_->PollStream(stream_id_);
    switch (event.kind) {
      case StreamEvent::kPending:
        return;
      case StreamEvent::kBatch:
        batch_ = std::move(event.batch);
        writing_ = true;
        StartWrite(&batch_);
        return;
      case StreamEvent::kEnd:
        finished_ = true;
        Finish(service::ToGrpcStatus(event.status));
        return;
    }
  }

  WorkerImpl* const impl_;
  const std::shared_ptr<Notifier> notifier_;
  absl::Mutex mu_;
  uint64_t stream_id_ = 0;                   // written once in the constructor
  proto::Batch batch_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

void Notifier::Notify() {
  absl::MutexLock lock(&mu_);
  if (writer_ != nullptr) writer_->Wake();
}

}  // namespace

grpc::ServerWriteReactor<proto::Batch>* GrpcWorkerService::GetBatches(
    grpc::CallbackServerContext* /*context*/,
    const proto::GetBatchesRequest* request) {
  return new BatchWriter(impl_, *request);
}

}  // namespace sluice::data_worker
