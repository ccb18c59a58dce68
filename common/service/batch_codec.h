// The wire form of a batch (proto/worker_service.proto: Batch, proto/sluice_tensor.proto: Column), in
// one place for the worker that encodes it and the client that decodes it.
//
// A batch is one message: its origin (split key, split id, batch index), one contiguous
// little-endian row-major buffer per column, and one global record index per element. The end
// of a split is a message of its own (end_of_split, no columns), so a split that yields no
// batch still ends. Example, a batch of 64 ImageNet-train elements:
//   key {job 3, consumer 0, epoch 1, position 7} split_id 12 batch_index 2
//   columns { name: "image" dtype: FLOAT32 shape: [64, 3, 224, 224] data: <38.5 MB> }
//   columns { name: "label" dtype: INT64   shape: [64]             data: <512 B> }
//   global_indices: [64 record ids, in element order]
// and after the split's last batch:
//   key {...} split_id 12 batch_index 4 end_of_split: true      (4 = the split's batch count)
#ifndef SLUICE_COMMON_SERVICE_BATCH_CODEC_H_
#define SLUICE_COMMON_SERVICE_BATCH_CODEC_H_

#include <cstdint>
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

// Appends a column holding a copy of `bytes`. InvalidArgument when the shape's element count
// times the dtype size differs from bytes.size() (fixed-size dtypes only).
absl::Status AppendColumn(std::string name, record::DType dtype,
                          absl::Span<const int64_t> shape,
                          absl::string_view bytes, proto::Batch* batch);

// The checks a receiver makes before it trusts a batch from the network: a data batch has at
// least one column, every column a known dtype, a shape whose leading dimension is the element
// count, and exactly the bytes its shape says; one global index per element. An end-of-split
// marker has no columns and no indices. InvalidArgument naming the column otherwise.
absl::Status CheckBatch(const proto::Batch& batch);

// Bytes of all column buffers (what a queue accounts).
int64_t BatchBytes(const proto::Batch& batch);

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_BATCH_CODEC_H_
