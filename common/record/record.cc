#include "common/record/record.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace sluice::record {
namespace {

static_assert(std::endian::native == std::endian::little, "sluice assumes a little-endian host");

// Number of elements of `shape`, or -1 on overflow / negative dims.
int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

bool ShapeMatches(const std::vector<int64_t>& spec, const std::vector<int64_t>& shape) {
  if (spec.size() != shape.size()) return false;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] != -1 && spec[i] != shape[i]) return false;
  }
  return true;
}

// Empty if a value of `shape` holding `nbytes` bytes fits column `spec`;
// otherwise why it does not.
std::string Misfit(const ColumnSpec& spec, const std::vector<int64_t>& shape, uint64_t nbytes) {
  if (!IsNumeric(spec.dtype)) {
    if (shape.empty()) return "";
    return absl::StrCat("column '", spec.name, "' is ", DTypeName(spec.dtype),
                        " and takes no shape");
  }
  if (!ShapeMatches(spec.shape, shape)) {
    return absl::StrCat("column '", spec.name, "': shape [", absl::StrJoin(shape, ","),
                        "] does not match the schema's [", absl::StrJoin(spec.shape, ","), "]");
  }
  const int64_t n = NumElements(shape);
  const uint64_t size = DTypeSize(spec.dtype);
  if (n < 0 || static_cast<uint64_t>(n) > UINT64_MAX / size ||
      static_cast<uint64_t>(n) * size != nbytes) {
    return absl::StrCat("column '", spec.name, "': ", nbytes, " bytes for shape [",
                        absl::StrJoin(shape, ","), "] of ", DTypeName(spec.dtype));
  }
  return "";
}

template <typename T>
void Append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

absl::StatusOr<std::string> EncodeRecord(const Schema& schema, const std::vector<Tensor>& values) {
  if (values.size() != schema.columns.size()) {
    return absl::InvalidArgumentError(absl::StrCat("record has ", values.size(),
                                                   " values but the schema has ",
                                                   schema.columns.size(), " columns"));
  }
  size_t total = 0;
  for (const auto& v : values) total += 1 + 8 * v.shape.size() + 8 + v.data.size();
  std::string out;
  out.reserve(total);
  for (size_t i = 0; i < values.size(); ++i) {
    const Tensor& v = values[i];
    if (std::string why = Misfit(schema.columns[i], v.shape, v.data.size()); !why.empty()) {
      return absl::InvalidArgumentError(why);
    }
    out.push_back(static_cast<char>(v.shape.size()));
    for (int64_t d : v.shape) Append<int64_t>(out, d);
    Append<uint64_t>(out, v.data.size());
    out.append(v.data);
  }
  return out;
}

absl::StatusOr<std::vector<TensorView>> DecodeRecord(const Schema& schema,
                                                     std::string_view buffer) {
  std::vector<TensorView> views;
  RETURN_IF_ERROR(DecodeRecordInto(schema, buffer, &views));
  return views;
}

absl::Status DecodeRecordInto(const Schema& schema, std::string_view buffer,
                              std::vector<TensorView>* views) {
  views->resize(schema.columns.size());
  size_t pos = 0;
  auto take = [&](size_t n) -> const char* {
    if (buffer.size() - pos < n) return nullptr;
    const char* p = buffer.data() + pos;
    pos += n;
    return p;
  };
  for (size_t c = 0; c < schema.columns.size(); ++c) {
    const ColumnSpec& spec = schema.columns[c];
    const char* p = take(1);
    if (p == nullptr) {
      return absl::DataLossError(absl::StrCat("record ends before column '", spec.name, "'"));
    }
    const size_t ndim = static_cast<uint8_t>(*p);
    if (ndim > 8) {
      return absl::DataLossError(absl::StrCat("column '", spec.name, "' claims ", ndim, " dims"));
    }
    TensorView& view = (*views)[c];
    view.shape.resize(ndim);
    p = take(8 * ndim + 8);
    if (p == nullptr) {
      return absl::DataLossError(absl::StrCat("record ends inside column '", spec.name, "'"));
    }
    if (ndim > 0) std::memcpy(view.shape.data(), p, 8 * ndim);
    uint64_t nbytes;
    std::memcpy(&nbytes, p + 8 * ndim, 8);
    const char* data = take(nbytes);
    if (data == nullptr) {
      return absl::DataLossError(
          absl::StrCat("column '", spec.name, "' claims ", nbytes, " bytes; the record has fewer"));
    }
    if (std::string why = Misfit(spec, view.shape, nbytes); !why.empty()) {
      return absl::DataLossError(why);
    }
    view.data = std::string_view(data, nbytes);
  }
  if (pos != buffer.size()) {
    return absl::DataLossError(
        absl::StrCat("record has ", buffer.size() - pos, " trailing bytes after its last column"));
  }
  return absl::OkStatus();
}

}  // namespace sluice::record
