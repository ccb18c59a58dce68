// Records: one value per schema column, and their encoding inside a shard's
// data section.
//
// Encoding of one record, columns in schema order, all integers little-endian:
//   u8 ndim | ndim x i64 dims | u64 nbytes | nbytes bytes
// A record is written with `Tensor`s (owning) and read back as `TensorView`s
// into one buffer.
#ifndef SLUICE_COMMON_RECORD_RECORD_H_
#define SLUICE_COMMON_RECORD_RECORD_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/record/schema.h"

namespace sluice::record {

// An owned column value.
struct Tensor {
  std::vector<int64_t> shape;
  std::string data;

  static Tensor Bytes(std::string bytes) { return Tensor{{}, std::move(bytes)}; }
  static Tensor Int64(int64_t v) { return Tensor{{}, std::string(reinterpret_cast<char*>(&v), 8)}; }
  // A numeric tensor from a typed array; `shape` must match values.size().
  template <typename T>
  static Tensor Of(std::vector<int64_t> shape, const std::vector<T>& values) {
    return Tensor{std::move(shape), std::string(reinterpret_cast<const char*>(values.data()),
                                                values.size() * sizeof(T))};
  }
};

// A column value viewed inside a record buffer; valid while that buffer lives.
struct TensorView {
  std::vector<int64_t> shape;
  std::string_view data;

  // REQUIRES: the column is an int64 scalar (8 bytes).
  int64_t AsInt64() const {
    int64_t v;
    std::memcpy(&v, data.data(), sizeof v);
    return v;
  }
};

// A decoded record: the raw bytes and one view per schema column. The buffer is
// held by pointer so the views stay valid when the Record moves.
struct Record {
  std::unique_ptr<const std::string> buffer;
  std::vector<TensorView> columns;
};

// Checks `values` against `schema` (count, dtype sizes, fixed shapes) and
// encodes them. InvalidArgument names the column.
absl::StatusOr<std::string> EncodeRecord(const Schema& schema, const std::vector<Tensor>& values);
// Parses `buffer` (which must outlive the views). DataLoss says what is
// malformed.
absl::StatusOr<std::vector<TensorView>> DecodeRecord(const Schema& schema, std::string_view buffer);
// As DecodeRecord, into `views` (resized to the schema's columns), reusing its
// storage: no allocation when `views` decoded a record of this schema before.
absl::Status DecodeRecordInto(const Schema& schema, std::string_view buffer,
                              std::vector<TensorView>* views);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_RECORD_H_
