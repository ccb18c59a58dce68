#include "common/service/wire_batch.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace sluice::service {

proto::TensorDType ToWireDType(record::DType dtype) {
  switch (dtype) {
    case record::DType::kBytes:
      return proto::TENSOR_DTYPE_BYTES;
    case record::DType::kString:
      return proto::TENSOR_DTYPE_STRING;
    case record::DType::kUint8:
      return proto::TENSOR_DTYPE_UINT8;
    case record::DType::kInt32:
      return proto::TENSOR_DTYPE_INT32;
    case record::DType::kInt64:
      return proto::TENSOR_DTYPE_INT64;
    case record::DType::kFloat16:
      return proto::TENSOR_DTYPE_FLOAT16;
    case record::DType::kFloat32:
      return proto::TENSOR_DTYPE_FLOAT32;
  }
  return proto::TENSOR_DTYPE_UNSPECIFIED;
}

absl::StatusOr<record::DType> FromWireDType(proto::TensorDType dtype) {
  switch (dtype) {
    case proto::TENSOR_DTYPE_BYTES:
      return record::DType::kBytes;
    case proto::TENSOR_DTYPE_STRING:
      return record::DType::kString;
    case proto::TENSOR_DTYPE_UINT8:
      return record::DType::kUint8;
    case proto::TENSOR_DTYPE_INT32:
      return record::DType::kInt32;
    case proto::TENSOR_DTYPE_INT64:
      return record::DType::kInt64;
    case proto::TENSOR_DTYPE_FLOAT16:
      return record::DType::kFloat16;
    case proto::TENSOR_DTYPE_FLOAT32:
      return record::DType::kFloat32;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor dtype ", static_cast<int>(dtype)));
  }
}

namespace {

// No frame carries a column this large; bounding each data_length keeps their sum from wrapping.
constexpr uint64_t kMaxColumnBytes = uint64_t{1} << 48;

// Elements of `shape`, or an error for a negative or overflowing dimension.
absl::StatusOr<uint64_t> NumElements(absl::Span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (d != 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(d))
      return absl::InvalidArgumentError("shape overflows");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

absl::Status CheckColumnBytes(absl::string_view name, record::DType dtype,
                              absl::Span<const int64_t> shape, size_t bytes) {
  const size_t element = record::DTypeSize(dtype);
  if (element == 0) return absl::OkStatus();  // bytes/string: the producer's encoding
  absl::StatusOr<uint64_t> n = NumElements(shape);
  if (!n.ok())
    return absl::InvalidArgumentError(absl::StrCat("column '", name, "': ", n.status().message()));
  // By division: n * element can wrap (n <= 2^62, element up to 8), and a wrapped product let a
  // shape claim far more elements than the data holds.
  if (bytes % element != 0 || *n != bytes / element) {
    return absl::InvalidArgumentError(absl::StrCat("column '", name, "': shape holds ", *n,
                                                   " elements of ", element, " bytes, data has ",
                                                   bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AppendColumn(std::string name, record::DType dtype, absl::Span<const int64_t> shape,
                          ColumnBytes bytes, WireBatch* batch) {
  if (absl::Status s = CheckColumnBytes(name, dtype, shape, bytes.size); !s.ok()) return s;
  proto::Column* c = batch->header.add_columns();
  c->set_name(std::move(name));
  c->set_dtype(ToWireDType(dtype));
  c->mutable_shape()->Add(shape.begin(), shape.end());
  c->set_data_length(bytes.size);
  batch->columns.push_back(std::move(bytes));
  return absl::OkStatus();
}

absl::Status CheckBatch(const proto::Batch& batch) {
  if (batch.end_of_split()) {
    if (batch.columns_size() != 0 || batch.global_indices_size() != 0 || batch.finish_size() != 0 ||
        batch.has_shared_memory())
      return absl::InvalidArgumentError(
          "an end-of-split marker carries columns, indices, finish ops or a shared-memory span");
    return absl::OkStatus();
  }
  if (batch.columns_size() == 0) return absl::InvalidArgumentError("a batch without columns");
  const int64_t elements = batch.global_indices_size();
  for (const proto::Column& c : batch.columns()) {
    absl::StatusOr<record::DType> dtype = FromWireDType(c.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("column '", c.name(), "': ", dtype.status().message()));
    }
    if (c.shape_size() == 0 || c.shape(0) != elements) {
      return absl::InvalidArgumentError(absl::StrCat("column '", c.name(), "': leading dimension ",
                                                     c.shape_size() == 0 ? -1 : c.shape(0),
                                                     " but the batch has ", elements, " elements"));
    }
    if (c.data_length() > kMaxColumnBytes) {
      return absl::InvalidArgumentError(absl::StrCat("column '", c.name(), "': data_length ",
                                                     c.data_length(), " is beyond any frame"));
    }
    if (absl::Status s =
            CheckColumnBytes(c.name(), *dtype, c.shape(), static_cast<size_t>(c.data_length()));
        !s.ok())
      return s;
  }
  std::vector<bool> seen(batch.columns_size(), false);
  for (const proto::ColumnFinish& f : batch.finish()) {
    if (f.column() >= static_cast<uint32_t>(batch.columns_size()) || seen[f.column()]) {
      return absl::InvalidArgumentError(absl::StrCat("finish names column ", f.column(), " of ",
                                                     batch.columns_size(), " (or twice)"));
    }
    seen[f.column()] = true;
    if (!f.mirrored().empty() && f.mirrored_size() != elements) {
      return absl::InvalidArgumentError(absl::StrCat("finish of column ", f.column(), ": ",
                                                     f.mirrored_size(), " mirror flags but ",
                                                     elements, " elements"));
    }
  }
  return absl::OkStatus();
}

int64_t BatchBytes(const proto::Batch& batch) {
  int64_t bytes = 0;
  for (const proto::Column& c : batch.columns()) bytes += static_cast<int64_t>(c.data_length());
  return bytes;
}

}  // namespace sluice::service
