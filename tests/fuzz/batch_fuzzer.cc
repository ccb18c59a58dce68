// libFuzzer target for the client's first look at a batch from the network:
// arbitrary bytes as a batch frame, cut into slices at input-chosen places,
// through DecodeBatch (common/service/batch_codec.h: header length, header
// parse, CheckBatch, column lengths against the frame), Gather and the
// trainer-side finishing of columns the header names (common/tensor_kernels/
// finish.h), which the client runs before it trusts a batch. A frame that passes must be safe to
// consume: every column's bytes are exactly what its dtype and shape say and
// lie inside the frame, and there is one global index per element. Anything
// else must be InvalidArgument, never a crash (overflowing shapes included).
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "common/record/schema.h"
#include "common/service/batch_codec.h"
#include "common/tensor_kernels/finish.h"
#include "grpcpp/support/slice.h"
#include "proto/worker_service.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the slice length (1..256), so columns straddle slices.
  const size_t piece = size_t{data[0]} + 1;
  ++data;
  --size;
  std::vector<grpc::Slice> slices;
  size_t frame_bytes = 0;
  for (size_t i = 0; i < size; i += piece) {
    slices.emplace_back(data + i, std::min(piece, size - i));
    frame_bytes += slices.back().size();
  }
  absl::StatusOr<sluice::service::ReceivedBatch> batch =
      sluice::service::DecodeBatch(std::move(slices));
  if (!batch.ok()) {
    if (!absl::IsInvalidArgument(batch.status())) std::abort();
    return 0;
  }
  const sluice::proto::Batch& header = batch->header;
  if (sluice::service::BatchBytes(header) < 0 ||
      static_cast<uint64_t>(sluice::service::BatchBytes(header)) > frame_bytes)
    std::abort();
  if (header.end_of_split()) return 0;
  if (batch->pieces.size() != static_cast<size_t>(header.columns_size())) std::abort();
  // Finishing: refused (InvalidArgument) or it reads exactly the column's
  // bytes and writes exactly out_bytes().
  for (const auto& finish : header.finish()) {
    const auto& column = header.columns(finish.column());
    auto dtype = sluice::service::FromWireDType(column.dtype());
    if (!dtype.ok()) std::abort();
    const std::vector<sluice::proto::OpSpec> ops(finish.ops().begin(), finish.ops().end());
    auto finisher = sluice::kernels::Finisher::Create(ops, *dtype, column.shape());
    if (!finisher.ok()) {
      if (!absl::IsInvalidArgument(finisher.status())) std::abort();
      continue;
    }
    if (finisher->in_bytes() != column.data_length()) std::abort();
    std::vector<float> out(finisher->out_bytes() / sizeof(float));
    const absl::Status run =
        finisher->Run(batch->pieces[finish.column()], finish.mirrored(), out.data());
    if (!run.ok() && !absl::IsInvalidArgument(run)) std::abort();
  }
  for (int i = 0; i < header.columns_size(); ++i) {
    const auto& column = header.columns(i);
    if (column.shape_size() < 1 || column.shape(0) != header.global_indices_size()) {
      std::abort();
    }
    auto dtype = sluice::service::FromWireDType(column.dtype());
    if (!dtype.ok()) std::abort();
    const sluice::service::ColumnBytes bytes = sluice::service::Gather(*batch, i, /*alignment=*/8);
    if (bytes.size != column.data_length()) std::abort();
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
      if (n * element != bytes.size) std::abort();
    }
    // Reads every byte the client would read.
    volatile uint8_t sink = 0;
    for (size_t b = 0; b < bytes.size; ++b) sink = sink ^ bytes.data[b];
  }
  return 0;
}
