#include "data_worker/ops/tensor.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data_worker/ops/op_util.h"

namespace sluice::data_worker {

// The dtype table lives in common/record/schema.cc; these forward to it.
size_t ElementSize(DType dtype) { return record::DTypeSize(dtype); }

std::string_view DTypeToString(DType dtype) {
  const absl::string_view name = record::DTypeName(dtype);
  return std::string_view(name.data(), name.size());
}

absl::StatusOr<DType> DTypeFromString(std::string_view name) {
  return record::ParseDType(Sv(name));
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  dtype_ = other.dtype_;
  shape_ = std::move(other.shape_);
  buffer_ = std::move(other.buffer_);
  str_ = std::move(other.str_);
  size_ = other.size_;
  capacity_ = other.capacity_;
  // A short string moves its bytes (SSO), so re-point into whichever storage we
  // now own.
  data_ = buffer_ ? buffer_.get() : reinterpret_cast<uint8_t*>(str_.data());
  other.dtype_ = DType::kBytes;
  other.shape_.clear();
  other.str_.clear();
  other.data_ = reinterpret_cast<uint8_t*>(other.str_.data());
  other.size_ = 0;
  other.capacity_ = 0;
  return *this;
}

Tensor Tensor::Allocate(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.size_ = ElementSize(dtype) * t.num_elements();
  // make_unique_for_overwrite: default-initialized, i.e. no zero fill.
  t.capacity_ = t.size_ == 0 ? 1 : t.size_;
  t.buffer_ = std::make_unique_for_overwrite<uint8_t[]>(t.capacity_);
  t.data_ = t.buffer_.get();
  return t;
}

void Tensor::Reallocate(DType dtype, absl::Span<const int64_t> shape) {
  size_t size = ElementSize(dtype);
  for (int64_t d : shape) size *= static_cast<size_t>(d);
  if (!buffer_ || capacity_ < size) {
    capacity_ = size == 0 ? 1 : size;
    buffer_ = std::make_unique_for_overwrite<uint8_t[]>(capacity_);
  }
  str_ = std::string();
  dtype_ = dtype;
  shape_.assign(shape.begin(), shape.end());
  size_ = size;
  data_ = buffer_.get();
}

void Tensor::Clear() {
  size_ = 0;
  if (buffer_) {
    shape_.assign(1, 0);
    return;
  }
  shape_.clear();
  str_.clear();
  data_ = reinterpret_cast<uint8_t*>(str_.data());
}

Tensor Tensor::FromBytes(std::string bytes) {
  Tensor t;
  t.dtype_ = DType::kBytes;
  t.str_ = std::move(bytes);
  t.data_ = reinterpret_cast<uint8_t*>(t.str_.data());
  t.size_ = t.str_.size();
  return t;
}

int64_t Tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::Clone() const {
  if (!buffer_) {
    Tensor t = FromBytes(str_);
    t.dtype_ = dtype_;
    t.shape_ = shape_;
    return t;
  }
  Tensor t = Allocate(dtype_, shape_);
  std::memcpy(t.data_, data_, size_);
  return t;
}

int Tensor::CvDepth(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return CV_8U;
    case DType::kInt32:
      return CV_32S;
    case DType::kFloat16:
      return CV_16F;
    case DType::kFloat32:
      return CV_32F;
    default:
      return -1;
  }
}

cv::Mat Tensor::AsMat() const {
  const int depth = CvDepth(dtype_);
  if (depth < 0 || (rank() != 2 && rank() != 3)) return cv::Mat();
  const int channels = rank() == 3 ? static_cast<int>(shape_[2]) : 1;
  if (channels < 1 || channels > CV_CN_MAX) return cv::Mat();
  return cv::Mat(static_cast<int>(shape_[0]), static_cast<int>(shape_[1]),
                 CV_MAKETYPE(depth, channels), data_);
}

void Tensor::TruncateLeading(int64_t n) {
  const size_t per = shape_[0] == 0 ? 0 : size_ / shape_[0];
  shape_[0] = n;
  size_ = per * n;
}

Tensor Tensor::FromMat(const cv::Mat& mat) {
  DType dtype = DType::kUint8;
  switch (mat.depth()) {
    case CV_32S:
      dtype = DType::kInt32;
      break;
    case CV_16F:
      dtype = DType::kFloat16;
      break;
    case CV_32F:
      dtype = DType::kFloat32;
      break;
    default:
      break;
  }
  std::vector<int64_t> shape = {mat.rows, mat.cols};
  if (mat.channels() > 1) shape.push_back(mat.channels());
  Tensor t = Allocate(dtype, std::move(shape));
  mat.copyTo(t.AsMat());
  return t;
}

absl::StatusOr<Tensor> Stack(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) {
    return absl::InvalidArgumentError("Stack: no tensors to stack");
  }
  const Tensor& first = tensors[0];
  if (ElementSize(first.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Stack: cannot stack ", Sv(DTypeToString(first.dtype())), " tensors; decode them first"));
  }
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.dtype() != first.dtype() || t.shape() != first.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Stack: ragged batch: element 0 is ", Sv(DTypeToString(first.dtype())),
          ShapeToString(first.shape()), " but element ", i, " is ", Sv(DTypeToString(t.dtype())),
          ShapeToString(t.shape()), "; resize or crop to a fixed size before batching"));
    }
  }
  std::vector<int64_t> shape = {static_cast<int64_t>(tensors.size())};
  shape.insert(shape.end(), first.shape().begin(), first.shape().end());
  Tensor out = Tensor::Allocate(first.dtype(), std::move(shape));
  const size_t each = first.num_bytes();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (each > 0) std::memcpy(out.data() + i * each, tensors[i].data(), each);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> Unstack(const Tensor& batch) {
  if (batch.rank() == 0 || ElementSize(batch.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Unstack: need a numeric tensor of rank >= 1, got ",
                     Sv(DTypeToString(batch.dtype())), ShapeToString(batch.shape())));
  }
  std::vector<int64_t> shape(batch.shape().begin() + 1, batch.shape().end());
  const int64_t n = batch.dim(0);
  std::vector<Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    Tensor t = Tensor::Allocate(batch.dtype(), shape);
    if (t.num_bytes() > 0) {
      std::memcpy(t.data(), batch.data() + i * t.num_bytes(), t.num_bytes());
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace sluice::data_worker
