#include "common/service/batch_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/impl/rpc_method.h"

namespace sluice::service {

namespace {

// The slice's user data: a reference to the column's owner, dropped when gRPC frees the slice.
void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

// Reads a frame's slices front to back.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {}
  size_t remaining() const { return remaining_; }
  void Init() {
    for (const grpc::Slice& s : slices_) remaining_ += s.size();
  }
  // Copies the next n bytes to `out`. REQUIRES: n <= remaining().
  void Copy(size_t n, uint8_t* out) {
    for (absl::Span<const uint8_t> piece : Take(n)) {
      std::memcpy(out, piece.data(), piece.size());
      out += piece.size();
    }
  }
  // The next n bytes as spans of the slices. REQUIRES: n <= remaining().
  std::vector<absl::Span<const uint8_t>> Take(size_t n) {
    std::vector<absl::Span<const uint8_t>> pieces;
    remaining_ -= n;
    while (n > 0) {
      const grpc::Slice& s = slices_[index_];
      const size_t take = std::min(n, s.size() - offset_);
      if (take > 0) pieces.emplace_back(s.begin() + offset_, take);
      n -= take;
      offset_ += take;
      if (offset_ == s.size()) {
        ++index_;
        offset_ = 0;
      }
    }
    return pieces;
  }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
  size_t remaining_ = 0;
};

}  // namespace

namespace {

// The length-prefixed header slice.
grpc::Slice HeaderSlice(const proto::Batch& header) {
  const size_t header_bytes = header.ByteSizeLong();
  std::string head(4 + header_bytes, '\0');
  const uint32_t h = static_cast<uint32_t>(header_bytes);
  for (int i = 0; i < 4; ++i) head[i] = static_cast<char>((h >> (8 * i)) & 0xff);
  header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(head.data() + 4));
  return grpc::Slice(head);  // copies the header only (tens to hundreds of bytes)
}

}  // namespace

grpc::ByteBuffer EncodeBatch(const WireBatch& batch, const proto::SharedMemorySpan* shared) {
  if (shared != nullptr) {
    proto::Batch header = batch.header;
    *header.mutable_shared_memory() = *shared;
    grpc::Slice head = HeaderSlice(header);
    return grpc::ByteBuffer(&head, 1);
  }
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + batch.columns.size());
  slices.push_back(HeaderSlice(batch.header));
  for (const ColumnBytes& c : batch.columns) {
    if (c.size == 0) continue;
    slices.emplace_back(const_cast<uint8_t*>(c.data), c.size, &ReleaseOwner,
                        new std::shared_ptr<const void>(c.owner));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<ReceivedBatch> DecodeBatch(grpc::ByteBuffer* frame, const SharedMemoryRing* ring) {
  std::vector<grpc::Slice> slices;
  if (grpc::Status s = frame->Dump(&slices); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the batch frame: ", s.error_message()));
  }
  frame->Clear();
  return DecodeBatch(std::move(slices), ring);
}

absl::StatusOr<ReceivedBatch> DecodeBatch(std::vector<grpc::Slice> slices,
                                          const SharedMemoryRing* ring) {
  auto owned = std::make_shared<std::vector<grpc::Slice>>(std::move(slices));
  SliceCursor cursor(*owned);
  cursor.Init();
  if (cursor.remaining() < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch frame of ", cursor.remaining(), " bytes has no header length"));
  }
  uint8_t prefix[4];
  cursor.Copy(4, prefix);
  const uint32_t header_bytes = uint32_t{prefix[0]} | uint32_t{prefix[1]} << 8 |
                                uint32_t{prefix[2]} << 16 | uint32_t{prefix[3]} << 24;
  if (header_bytes > cursor.remaining()) {
    return absl::InvalidArgumentError(absl::StrCat("batch frame header length ", header_bytes,
                                                   " but only ", cursor.remaining(),
                                                   " bytes follow"));
  }
  std::string header(header_bytes, '\0');
  cursor.Copy(header_bytes, reinterpret_cast<uint8_t*>(header.data()));
  ReceivedBatch batch;
  if (!batch.header.ParseFromString(header)) {
    return absl::InvalidArgumentError("batch frame header is not a valid Batch message");
  }
  RETURN_IF_ERROR(CheckBatch(batch.header));
  // Each data_length is below kMaxColumnBytes (CheckBatch), so the sum cannot wrap.
  uint64_t total = 0;
  for (const proto::Column& c : batch.header.columns()) total += c.data_length();
  if (batch.header.has_shared_memory()) {
    const proto::SharedMemorySpan& span = batch.header.shared_memory();
    if (ring == nullptr) {
      return absl::InvalidArgumentError(
          "batch frame names a shared-memory ring, but this stream offered none");
    }
    if (cursor.remaining() != 0 || span.length() != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch columns hold ", total, " bytes but its shared-memory span has ", span.length(),
          " and the frame ", cursor.remaining(), " after the header (want 0)"));
    }
    ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes, ring->Read(span));
    batch.pieces.reserve(batch.header.columns_size());
    for (const proto::Column& c : batch.header.columns()) {
      const size_t n = static_cast<size_t>(c.data_length());
      batch.pieces.emplace_back();
      if (n > 0) batch.pieces.back().push_back(bytes.subspan(0, n));
      bytes.remove_prefix(n);
    }
    batch.borrowed = true;
    return batch;
  }
  if (total != cursor.remaining()) {
    return absl::InvalidArgumentError(absl::StrCat("batch columns hold ", total,
                                                   " bytes but the frame has ", cursor.remaining(),
                                                   " after the header"));
  }
  batch.pieces.reserve(batch.header.columns_size());
  for (const proto::Column& c : batch.header.columns()) {
    batch.pieces.push_back(cursor.Take(static_cast<size_t>(c.data_length())));
  }
  batch.slices = std::move(owned);
  return batch;
}

ColumnBytes Gather(const ReceivedBatch& batch, int column, size_t alignment) {
  const std::vector<absl::Span<const uint8_t>>& pieces = batch.pieces[column];
  ColumnBytes out;
  if (pieces.empty()) return out;
  if (pieces.size() == 1 && !batch.borrowed &&
      reinterpret_cast<uintptr_t>(pieces[0].data()) % std::max<size_t>(alignment, 1) == 0) {
    out.data = pieces[0].data();
    out.size = pieces[0].size();
    out.owner = batch.slices;
    return out;
  }
  size_t size = 0;
  for (absl::Span<const uint8_t> p : pieces) size += p.size();
  std::shared_ptr<uint8_t[]> buffer = std::make_shared_for_overwrite<uint8_t[]>(size);
  uint8_t* dst = buffer.get();
  for (absl::Span<const uint8_t> p : pieces) {
    std::memcpy(dst, p.data(), p.size());
    dst += p.size();
  }
  out.data = buffer.get();
  out.size = size;
  out.owner = std::move(buffer);
  return out;
}

std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> OpenBatchStream(
    grpc::Channel* channel, grpc::ClientContext* context, const proto::GetBatchesRequest& request) {
  const grpc::internal::RpcMethod method(kGetBatchesMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING);
  return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, method, context,
                                                                    request));
}

}  // namespace sluice::service
