// The typed schema of a Unirecord dataset: an ordered list of named columns.
//
// Every column value is a tensor: a dtype, a shape and its bytes. `bytes` and
// `string` columns hold one opaque byte string (shape is empty). Numeric
// columns hold product(shape) elements, little-endian. A ColumnSpec's `shape`
// fixes the shape every record must have; -1 leaves one dimension free, and an
// empty shape on a numeric column means a scalar.
//
// A numeric scalar column may be `indexed`: its value is then copied into the
// shard index, so filters (`label == 3`) and label histograms need no data
// reads.
#ifndef SLUICE_COMMON_RECORD_SCHEMA_H_
#define SLUICE_COMMON_RECORD_SCHEMA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::record {

enum class DType : uint8_t {
  kBytes = 0,
  kString = 1,
  kUint8 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kFloat32 = 6,
};

// Size of one element in bytes; 0 for kBytes and kString.
size_t DTypeSize(DType dtype);
bool IsNumeric(DType dtype);
absl::string_view DTypeName(DType dtype);
// Accepts the names DTypeName returns ("bytes", "string", "uint8", "int32",
// "int64", "float16", "float32"). InvalidArgument names the bad value.
absl::StatusOr<DType> ParseDType(absl::string_view name);

struct ColumnSpec {
  std::string name;
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;
  bool indexed = false;

  bool operator==(const ColumnSpec&) const = default;
};

struct Schema {
  std::vector<ColumnSpec> columns;

  // Index of the column called `name`, or -1.
  int ColumnIndex(std::string_view name) const;
  // Names of the indexed columns, in column order.
  std::vector<std::string> IndexedColumns() const;
  // Column names unique and non-empty, shapes >= -1, indexed columns numeric
  // scalars.
  absl::Status Validate() const;
  // JSON text, e.g.
  // {"columns":[{"name":"label","dtype":"int64","shape":[],"indexed":true}]}.
  std::string ToJson() const;
  static absl::StatusOr<Schema> FromJson(std::string_view json);

  bool operator==(const Schema&) const = default;
};

// The schema every image converter writes: image (bytes, encoded JPEG/PNG),
// label (int64, indexed), key (string: the source file or member name).
Schema ImageClassificationSchema();

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_SCHEMA_H_
