// The wire form of a batch (a WireBatch, common/service/wire_batch.h), in one place for the
// worker's gRPC adapter that encodes it and the client that decodes it: a *frame* of gRPC slices
// that the column bytes are never serialized into.
//
//   frame = [u32 little-endian H][H bytes: proto::Batch header][column 0 bytes][column 1 bytes]...
//
// The header (proto/worker_service.proto: Batch, proto/sluice_tensor.proto: Column) holds the
// batch's origin (split key, split id, batch index), one global record index per element, and per
// column its name, dtype, shape and data_length, but no data. The column bytes follow in header
// order, each one contiguous little-endian row-major buffer. The end of a split is a frame of its
// own (end_of_split, no columns), so a split that yields no batch still ends. Example, a batch of
// 64 ImageNet-train elements:
//   slice 0: [u32 H] key {job 3, consumer 0, epoch 1, position 7} split_id 12 batch_index 2
//            columns { name: "image" dtype: FLOAT32 shape: [64, 3, 224, 224]
//                      data_length: 38535168 }
//            columns { name: "label" dtype: INT64   shape: [64]             data_length: 512 }
//            global_indices: [64 record ids, in element order]
//   slice 1: the 38.5 MB image buffer of the batch (the worker's tensor itself, not a copy)
//   slice 2: the 512 B label buffer
// and after the split's last batch:
//   slice 0: [u32 H] key {...} split_id 12 batch_index 4 end_of_split: true  (4 = the batch count)
//
// Through shared memory (a worker on the trainer's host, common/service/shared_memory_ring.h) the
// frame is the header slice alone; its shared_memory span says where in the client's ring the
// column bytes lie, back to back in header order.
//
// Sender: EncodeBatch() builds the frame from a WireBatch whose columns are shared buffers; each
// column slice holds a reference to its buffer until gRPC has written it (no copy in user space).
// Receiver: DecodeBatch() takes the received slices, copies and parses only the header, checks it
// against the frame (a receiver never trusts lengths from the network), and returns each column
// as the pieces of the received slices it spans; Gather() makes a column contiguous, referencing
// the received slice when the column lies in one (and is aligned for its dtype), otherwise with
// exactly one copy into a new buffer the caller owns.
#ifndef SLUICE_COMMON_SERVICE_BATCH_CODEC_H_
#define SLUICE_COMMON_SERVICE_BATCH_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/service/shared_memory_ring.h"
#include "common/service/wire_batch.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/sluice_tensor.pb.h"
#include "proto/worker_service.pb.h"

namespace sluice::service {

// The frame of `batch`: one slice for the length-prefixed header, one per non-empty column that
// references the column's buffer (sharing its owner). With `shared` (the columns already written
// to the client's ring there): the header slice alone, naming the span. REQUIRES: built with
// AppendColumn.
grpc::ByteBuffer EncodeBatch(const WireBatch& batch,
                             const proto::SharedMemorySpan* shared = nullptr);

// A decoded frame: the checked header and, per header column, the pieces of the received slices
// that hold its bytes (in order; concatenated they are exactly data_length bytes).
struct ReceivedBatch {
  proto::Batch header;
  std::vector<std::vector<absl::Span<const uint8_t>>> pieces;
  // Keeps every piece alive (the received slices).
  std::shared_ptr<const void> slices;
  // The pieces lie in the stream's shared-memory ring and stay valid only until the receiver
  // releases the header's span: Gather copies them.
  bool borrowed = false;
};

// Takes the slices of `frame` over (no copy of the column bytes). InvalidArgument naming what is
// wrong: a frame shorter than its header length says, a header that does not parse or fails
// CheckBatch, or column lengths that do not add up to the bytes after the header (for a header
// with a shared-memory span: to the span, with no bytes after the header, and `ring` set; the
// ring's DataLoss for a span outside it).
absl::StatusOr<ReceivedBatch> DecodeBatch(grpc::ByteBuffer* frame,
                                          const SharedMemoryRing* ring = nullptr);
absl::StatusOr<ReceivedBatch> DecodeBatch(std::vector<grpc::Slice> slices,
                                          const SharedMemoryRing* ring = nullptr);

// Column `column` of `batch` as one contiguous buffer: the received bytes themselves (owner = the
// slices) when they lie in one piece whose address is a multiple of `alignment` and are not
// borrowed; otherwise one copy into a new buffer owned by the result. REQUIRES: column < batch.pieces.size().
ColumnBytes Gather(const ReceivedBatch& batch, int column, size_t alignment);

// The GetBatches method, raw: the path of WorkerService.GetBatches (proto/worker_service.proto),
// whose responses are frames. Workers serve it with the generated raw callback method; clients
// call it here, on any channel of service/channel_factory.h (TLS, tokens).
inline constexpr char kGetBatchesMethod[] = "/sluice.proto.WorkerService/GetBatches";
std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> OpenBatchStream(
    grpc::Channel* channel, grpc::ClientContext* context, const proto::GetBatchesRequest& request);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_BATCH_CODEC_H_
