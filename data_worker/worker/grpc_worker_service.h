// GrpcWorkerService: the gRPC face of WorkerImpl's data plane
// (worker_service.proto), callback API, raw method: each batch is written as
// its frame (service/batch_codec.h), whose column slices reference the
// batch's buffers, so gRPC writes them to the socket without a copy.
//
// Each GetBatches call gets a BatchWriter reactor (grpc_worker_service.cc) that
// keeps at most one write in flight: it polls WorkerImpl::PollStream when a
// write completes or when the producer notifies it that a batch was queued; it
// never blocks inside a reaction. A batch whose write fails is handed back to
// the queue (ReturnBatch), so a broken stream loses nothing. A client on this
// host that offers a shared-memory ring gets each batch's bytes written there
// and only the header on the stream (common/service/shared_memory_ring.h); a
// batch that does not fit goes on the stream. Does not own the
// impl, which must outlive the server (shut the server down first).
#ifndef SLUICE_DATA_WORKER_WORKER_GRPC_WORKER_SERVICE_H_
#define SLUICE_DATA_WORKER_WORKER_GRPC_WORKER_SERVICE_H_

#include "common/service/shared_memory_ring.h"
#include "data_worker/worker/worker_impl.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker_service.grpc.pb.h"

namespace sluice::data_worker {

// GetBatches is a raw callback method (it writes frames of slices,
// common/service/batch_codec.h), DescribeDataset a typed one; each is added to
// the plain Service by name: over CallbackService the raw method would hide the
// typed one (-Woverloaded-virtual).
class GrpcWorkerService final
    : public proto::WorkerService::WithCallbackMethod_DescribeDataset<
          proto::WorkerService::WithRawCallbackMethod_GetBatches<proto::WorkerService::Service>> {
 public:
  explicit GrpcWorkerService(WorkerImpl* impl) : impl_(impl) {}

  // `request` is a serialized GetBatchesRequest (INVALID_ARGUMENT if not).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetBatches(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;

  // Answered at once in gRPC's thread (reads one manifest file).
  grpc::ServerUnaryReactor* DescribeDataset(grpc::CallbackServerContext* context,
                                            const proto::DescribeDatasetRequest* request,
                                            proto::DescribeDatasetResponse* response) override;

 private:
  WorkerImpl* const impl_;
  service::SharedMemoryRingWriters rings_;
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_GRPC_WORKER_SERVICE_H_
