#include "data_worker/worker/grpc_worker_service.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/service/batch_codec.h"
#include "common/service/grpc_status.h"
#include "common/service/identity.h"
#include "data_worker/worker/grpc_dispatcher_client.h"

namespace sluice::data_worker {
namespace {

class BatchWriter;

// The caller of a call (common/service/identity.h).
absl::StatusOr<service::Identity> CallerOf(const grpc::CallbackServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return service::Identity::Development();
  return service::IdentityOf(*auth);
}

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
// ConsumerQueues' mutex (PollStream and OpenStream reach it through WorkerImpl,
// whose own mutex is never taken here).
class BatchWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // A request that does not parse ends the call at once.
  BatchWriter(WorkerImpl* impl, service::SharedMemoryRingWriters* rings,
              const grpc::ByteBuffer& raw_request, const absl::StatusOr<service::Identity>& caller)
      : impl_(impl), notifier_(std::make_shared<Notifier>()) {
    proto::GetBatchesRequest request;
    grpc::ByteBuffer copy(raw_request);  // shares the slices
    if (!grpc::SerializationTraits<proto::GetBatchesRequest>::Deserialize(&copy, &request).ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "GetBatches: the request is not a GetBatchesRequest"));
      return;
    }
    if (!caller.ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(service::ToGrpcStatus(caller.status()));
      return;
    }
    notifier_->Set(this);
    absl::StatusOr<uint64_t> id =
        impl_->OpenStream(request, *caller, [n = notifier_] { n->Notify(); });
    absl::MutexLock lock(&mu_);
    if (!id.ok()) {
      finished_ = true;
      Finish(service::ToGrpcStatus(id.status()));
      return;
    }
    stream_id_ = *id;
    if (request.has_shared_memory()) {
      // A ring this worker cannot use (another host or container, another user) leaves the
      // batches on the stream.
      absl::StatusOr<std::shared_ptr<service::SharedMemoryRingWriter>> ring =
          rings->Claim(request.shared_memory(), stream_id_);
      if (ring.ok()) ring_ = *std::move(ring);
    }
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
    frame_.Clear();  // gRPC holds its own references to the slices until they are sent
    if (!ok || cancelled_) {
      // Not delivered (as far as we know): the next stream of this consumer
      // sends it again; the client keeps exactly-once by batch index.
      impl_->ReturnBatch(stream_id_, std::move(batch_));
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
      }
      return;
    }
    batch_ = service::WireBatch();  // sent: release the buffers
    WriteNextLocked();
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"));
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
        if (std::optional<proto::SharedMemorySpan> span =
                ring_ == nullptr ? std::nullopt : ring_->Write(stream_id_, batch_.columns)) {
          frame_ = service::EncodeBatch(batch_, &*span);
        } else {
          frame_ = service::EncodeBatch(batch_);
        }
        writing_ = true;
        StartWrite(&frame_);
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
  uint64_t stream_id_ = 0;                                 // written once in the constructor
  std::shared_ptr<service::SharedMemoryRingWriter> ring_;  // likewise; null: all on the stream
  // The write in flight: the batch (handed back if the write fails) and its frame.
  service::WireBatch batch_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer frame_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

void Notifier::Notify() {
  absl::MutexLock lock(&mu_);
  if (writer_ != nullptr) writer_->Wake();
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcWorkerService::GetBatches(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new BatchWriter(impl_, &rings_, *request, CallerOf(*context));
}

grpc::ServerUnaryReactor* GrpcWorkerService::DescribeDataset(
    grpc::CallbackServerContext* context, const proto::DescribeDatasetRequest* request,
    proto::DescribeDatasetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<service::Identity> caller = CallerOf(*context);
  absl::Status allowed =
      caller.ok() ? service::RequireRole(*caller, service::Role::kTrainer, "DescribeDataset")
                  : caller.status();
  if (!allowed.ok()) {
    reactor->Finish(service::ToGrpcStatus(allowed));
    return reactor;
  }
  reactor->Finish(service::ToGrpcStatus(impl_->DescribeDataset(*request, response)));
  return reactor;
}

}  // namespace sluice::data_worker
