#include "common/record/schema.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/record/json.h"

namespace sluice::record {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kBytes, "bytes", 0},     {DType::kString, "string", 0}, {DType::kUint8, "uint8", 1},
    {DType::kInt32, "int32", 4},     {DType::kInt64, "int64", 8},   {DType::kFloat16, "float16", 2},
    {DType::kFloat32, "float32", 4},
};

const DTypeInfo& Info(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];
}

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }
bool IsNumeric(DType dtype) { return DTypeSize(dtype) > 0; }
absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "' (expected bytes, string, uint8, int32, int64, float16, float32)"));
}

int Schema::ColumnIndex(std::string_view name) const {
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string> Schema::IndexedColumns() const {
  std::vector<std::string> names;
  for (const auto& c : columns) {
    if (c.indexed) names.push_back(c.name);
  }
  return names;
}

absl::Status Schema::Validate() const {
  if (columns.empty()) return absl::InvalidArgumentError("schema has no columns");
  if (columns.size() > 255) return absl::InvalidArgumentError("schema has more than 255 columns");
  std::set<std::string> seen;
  for (const auto& c : columns) {
    if (c.name.empty()) return absl::InvalidArgumentError("schema has a column with an empty name");
    if (!seen.insert(c.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("schema names column '", c.name, "' twice"));
    }
    if (c.shape.size() > 8) {
      return absl::InvalidArgumentError(absl::StrCat("column '", c.name, "' has more than 8 dims"));
    }
    for (int64_t d : c.shape) {
      if (d < -1) {
        return absl::InvalidArgumentError(
            absl::StrCat("column '", c.name, "' has dimension ", d, " (must be >= -1)"));
      }
    }
    if (c.indexed && (!IsNumeric(c.dtype) || !c.shape.empty() || c.dtype == DType::kFloat16)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column '", c.name, "' is indexed but not a uint8/int32/int64/float32 scalar"));
    }
  }
  return absl::OkStatus();
}

std::string Schema::ToJson() const {
  nlohmann::json columns_json = nlohmann::json::array();
  for (const auto& c : columns) {
    columns_json.push_back({{"name", c.name},
                            {"dtype", std::string(DTypeName(c.dtype))},
                            {"shape", c.shape},
                            {"indexed", c.indexed}});
  }
  return nlohmann::json{{"columns", columns_json}}.dump();
}

absl::StatusOr<Schema> Schema::FromJson(std::string_view json) {
  const auto parsed = ParseJson(json);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("columns") ||
      !parsed["columns"].is_array()) {
    return absl::InvalidArgumentError("schema is not a JSON object with a 'columns' array");
  }
  Schema schema;
  for (const auto& c : parsed["columns"]) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("dtype") ||
        !c["dtype"].is_string()) {
      return absl::InvalidArgumentError("schema column without a string 'name' and 'dtype'");
    }
    ColumnSpec spec;
    spec.name = c["name"].get<std::string>();
    auto dtype = ParseDType(c["dtype"].get<std::string>());
    if (!dtype.ok()) return dtype.status();
    spec.dtype = *dtype;
    if (c.contains("shape")) {
      if (!c["shape"].is_array())
        return absl::InvalidArgumentError("schema 'shape' is not an array");
      for (const auto& d : c["shape"]) {
        if (!d.is_number_integer())
          return absl::InvalidArgumentError("schema dimension not an integer");
        spec.shape.push_back(d.get<int64_t>());
      }
    }
    if (c.contains("indexed")) {
      if (!c["indexed"].is_boolean())
        return absl::InvalidArgumentError("schema 'indexed' not a bool");
      spec.indexed = c["indexed"].get<bool>();
    }
    schema.columns.push_back(std::move(spec));
  }
  if (absl::Status s = schema.Validate(); !s.ok()) return s;
  return schema;
}

Schema ImageClassificationSchema() {
  return Schema{{
      {.name = "image", .dtype = DType::kBytes},
      {.name = "label", .dtype = DType::kInt64, .indexed = true},
      {.name = "key", .dtype = DType::kString},
  }};
}

}  // namespace sluice::record
