// libFuzzer target for the client's first look at a batch from the network:
// arbitrary bytes parsed as proto::Batch, then CheckBatch (common/service/
// batch_codec.h), which the client runs before it trusts a batch. A batch that
// passes must be safe to consume: every column's bytes are exactly what its
// dtype and shape say, and there is one global index per element. Anything
// else must be InvalidArgument, never a crash (overflowing shapes included).
#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "common/record/schema.h"
#include "common/service/batch_codec.h"
#include "proto/worker_service.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::proto::Batch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::Status status = sluice::service::CheckBatch(batch);
  if (!status.ok()) {
    if (!absl::IsInvalidArgument(status)) std::abort();
    return 0;
  }
  (void)sluice::service::BatchBytes(batch);
  if (batch.end_of_split()) return 0;
  for (const auto& column : batch.columns()) {
    if (column.shape_size() < 1 ||
        column.shape(0) != batch.global_indices_size()) {
      std::abort();
    }
    auto dtype = sluice::service::FromWireDType(column.dtype());
    if (!dtype.ok()) std::abort();
    // A fixed-size column holds exactly product(shape) elements (computed
    // without overflow: the product is bounded by the bytes present).
    const size_t element = sluice::record::DTypeSize(*dtype);
    if (element != 0) {
      unsigned __int128 n = 1;
      for (int64_t d : column.shape()) {
        if (d < 0) std::abort();
        n *= static_cast<uint64_t>(d);
        if (n > (unsigned __int128)1 << 64) n = (unsigned __int128)1 << 64;
      }
      if (n * element != column.data().size()) std::abort();
    }
    // Reads every byte the client would read.
    volatile uint8_t sink = 0;
    for (char c : column.data()) sink = sink ^ static_cast<uint8_t>(c);
  }
  return 0;
}
