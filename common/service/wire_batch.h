// A batch as sluice moves it, without the transport: the header that describes its columns
// (proto/worker_service.proto: Batch; proto/sluice_tensor.proto: Column) and one shared buffer
// per column. The worker's pipeline, queues and producers hold batches in this form; the gRPC
// framing that puts them on the wire and takes them off is common/service/batch_codec.h.
#ifndef SLUICE_COMMON_SERVICE_WIRE_BATCH_H_
#define SLUICE_COMMON_SERVICE_WIRE_BATCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/record/schema.h"
#include "proto/sluice_tensor.pb.h"
#include "proto/worker_service.pb.h"

namespace sluice::service {

// Explicit both ways (no arithmetic on enum values). FromWireDType: InvalidArgument for
// TENSOR_DTYPE_UNSPECIFIED or an unknown value.
proto::TensorDType ToWireDType(record::DType dtype);
absl::StatusOr<record::DType> FromWireDType(proto::TensorDType dtype);

// One contiguous column buffer and what keeps it alive (shared: the wire, a queue and a trainer
// may hold it at once). `owner` may be null only when size == 0.
struct ColumnBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};

// A batch as the worker queues and sends it: the header (columns described, no data) and one
// buffer per header column, in order.
struct WireBatch {
  proto::Batch header;
  std::vector<ColumnBytes> columns;
};

// Appends a column (by reference: `bytes.owner` is shared, the bytes are not copied).
// InvalidArgument when the shape's element count times the dtype size differs from bytes.size
// (fixed-size dtypes only).
absl::Status AppendColumn(std::string name, record::DType dtype, absl::Span<const int64_t> shape,
                          ColumnBytes bytes, WireBatch* batch);

// The checks a receiver makes before it trusts a header from the network: a data batch has at
// least one column, every column a known dtype, a shape whose leading dimension is the element
// count, and a data_length equal to what its shape says; one global index per element; every
// `finish` entry names an existing column, at most once, with no mirror flags or one per element.
// An end-of-split marker has no columns, indices or finish entries. InvalidArgument naming the
// column otherwise.
absl::Status CheckBatch(const proto::Batch& header);

// Bytes of all column buffers (what a queue accounts; what the frame carries beyond its header).
int64_t BatchBytes(const proto::Batch& header);
inline int64_t BatchBytes(const WireBatch& batch) { return BatchBytes(batch.header); }

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_WIRE_BATCH_H_
