// Tensor: the value one column of an element holds while ops transform it.
//
// A dtype, a shape and one contiguous row-major buffer. Allocation does not
// zero the buffer (ops overwrite every byte), moves are cheap, copies are
// explicit (Clone). `bytes`/`string` tensors (encoded images, keys) hold one
// opaque byte string and have shape {}.
//
//   Tensor img = Tensor::Allocate(DType::kUint8, {224, 224, 3});
//   // Writes in place, no extra copy:
//   cv::resize(src, img.AsMat(), cv::Size(224, 224));
//
// Not thread-safe; a Tensor is owned by the one op or stage working on it.
//
// Written once: the batch stage writes each element into its slot of the
// batch's tensor (pipeline/batch_assembler.h), vectorized ops run on that
// tensor, and the worker hands it to the wire by moving it into a shared
// owner that gRPC's slices reference (worker/task_runner.h ToWireBatch,
// common/service/batch_codec.h): no copy after the op that produced it.
#ifndef SLUICE_DATA_WORKER_OPS_TENSOR_H_
#define SLUICE_DATA_WORKER_OPS_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/record/schema.h"
#include "opencv2/core/mat.hpp"

namespace sluice::data_worker {

using record::DType;

// Bytes per element of a numeric dtype; 0 for kBytes/kString.
size_t ElementSize(DType dtype);
// "uint8", "float32", ...
std::string_view DTypeToString(DType dtype);
// Inverse of DTypeToString; InvalidArgument names the bad value.
absl::StatusOr<DType> DTypeFromString(std::string_view name);
// "[224,224,3]".
std::string ShapeToString(const std::vector<int64_t>& shape);

class Tensor {
 public:
  // An empty bytes tensor.
  Tensor() = default;
  Tensor(Tensor&& other) noexcept { *this = std::move(other); }
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // REQUIRES: dtype is numeric and every dimension >= 0. The contents are
  // uninitialized.
  static Tensor Allocate(DType dtype, std::vector<int64_t> shape);
  // Makes this a numeric tensor of `dtype` and `shape` (contents uninitialized),
  // reusing its buffer and shape storage when they are large enough: no
  // allocation when a recycled tensor (Clear) gets a shape no larger than
  // before. REQUIRES: as Allocate.
  void Reallocate(DType dtype, absl::Span<const int64_t> shape);
  // Makes this an empty tensor of the same dtype (shape [0] if numeric, no
  // bytes) that keeps its storage for a later Reallocate (pipeline/element.h
  // ElementPool).
  void Clear();
  // Bytes of storage held (at least num_bytes()).
  size_t capacity() const { return buffer_ ? capacity_ : str_.capacity(); }
  // A kBytes tensor taking ownership of `bytes` (no copy).
  static Tensor FromBytes(std::string bytes);
  template <typename T>
  static Tensor Scalar(T value);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  // Product of the shape (1 for a scalar); 1 for bytes tensors.
  int64_t num_elements() const;
  size_t num_bytes() const { return size_; }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  template <typename T>
  T* data_as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data_);
  }
  std::string_view bytes() const {
    return std::string_view(reinterpret_cast<const char*>(data_), size_);
  }

  Tensor Clone() const;

  // Keeps the first n rows of the leading dimension, in place (the buffer is
  // not reallocated or copied; its tail is simply no longer part of the
  // tensor). REQUIRES: numeric, rank >= 1, 0 <= n <= dim(0).
  void TruncateLeading(int64_t n);

  // A cv::Mat header over this tensor's buffer (no copy): H×W×C (rank 3, C
  // channels) or H×W (rank 2). Returns an empty Mat for other ranks and for
  // int64/bytes/string (OpenCV has no such depth). The Mat must not outlive the
  // tensor; writing through it writes the tensor.
  cv::Mat AsMat() const;
  // OpenCV depth (CV_8U, ...) of `dtype`, or -1.
  static int CvDepth(DType dtype);

  // A copy of `mat` (rank 3 if it has more than one channel, else rank 2).
  // REQUIRES: mat's depth is CV_8U, CV_32S, CV_16F or CV_32F.
  static Tensor FromMat(const cv::Mat& mat);

 private:
  DType dtype_ = DType::kBytes;
  std::vector<int64_t> shape_;
  // Numeric tensors own `buffer_`, bytes tensors own `str_`; data_ points into
  // one of them.
  std::unique_ptr<uint8_t[]> buffer_;
  std::string str_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;  // of buffer_
};

// Stacks N tensors of one dtype and shape S into one of shape [N, S...].
// InvalidArgument for an empty list, bytes tensors, or mismatched dtypes/shapes
// (the message names both shapes).
absl::StatusOr<Tensor> Stack(const std::vector<Tensor>& tensors);
// Splits a tensor of shape [N, S...] into N tensors of shape S. InvalidArgument
// for rank 0.
absl::StatusOr<std::vector<Tensor>> Unstack(const Tensor& batch);

template <typename T>
Tensor Tensor::Scalar(T value) {
  DType dtype;
  if constexpr (std::is_same_v<T, uint8_t>) {
    dtype = DType::kUint8;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    dtype = DType::kInt32;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    dtype = DType::kInt64;
  } else {
    static_assert(std::is_same_v<T, float>, "Scalar<T>: T must be uint8/int32/int64/float");
    dtype = DType::kFloat32;
  }
  Tensor t = Allocate(dtype, {});
  std::memcpy(t.data(), &value, sizeof(T));
  return t;
}

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_TENSOR_H_
