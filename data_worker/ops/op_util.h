// Helpers shared by the op families (not part of the ops' public surface):
// error messages that name the op, input checks, OpenCV exception capture.
#ifndef SLUICE_DATA_WORKER_OPS_OP_UTIL_H_
#define SLUICE_DATA_WORKER_OPS_OP_UTIL_H_

#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/pipeline_spec/location.h"
#include "data_worker/ops/tensor.h"
#include "opencv2/core.hpp"
#include "opencv2/imgproc.hpp"
#include "proto/ops.pb.h"

namespace sluice::data_worker {

// Our Abseil predates std::string_view interop: StrCat needs absl::string_view.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Where an op sits and what it is called in messages. Built by BuildOps with
// only the pipeline-wide position ("op 3 (Resize)") for ops outside a spec;
// a pipeline's ops get theirs from validation (data_worker/pipeline/spec.h),
// with `at` set to the op's place in the spec ("map[1].ops[2] (Resize)"), so
// that validation and run-time errors name the op alike. Errors carry the
// location as a payload (common/pipeline_spec/location.h).
struct OpLabel {
  int position = 0;
  std::string name;
  std::optional<pipeline_spec::SpecLocation> at;

  pipeline_spec::SpecLocation Location(std::string_view field = {}) const {
    pipeline_spec::SpecLocation loc;
    if (at) {
      loc = *at;
    } else {
      loc.op_index = position;
    }
    loc.op_type = name;
    loc.field = std::string(field);
    return loc;
  }
  std::string ToString() const { return Location().ToString(); }
  // A bad spec, not about one field: "op 2 (Cast): ...".
  absl::Status SpecError(std::string_view message) const {
    return pipeline_spec::SpecError(Location(), message);
  }
  // A bad field: "op 2 (RandomResizedCrop): size must be > 0".
  absl::Status FieldError(std::string_view field, std::string_view message) const {
    return pipeline_spec::SpecError(Location(field), absl::StrCat(Sv(field), " ", Sv(message)));
  }
  absl::Status InputError(std::string_view expected, const Tensor& got) const {
    return absl::InvalidArgumentError(absl::StrCat(ToString(), ": expected ", Sv(expected),
                                                   ", got ", record::DTypeName(got.dtype()),
                                                   ShapeToString(got.shape())));
  }
};

// An image an OpenCV function can take: rank 2 (H×W) or rank 3 (H×W×C, 1 <= C
// <= 4) of uint8/int32/float16/float32, non-empty.
inline bool IsCvImage(const Tensor& t) {
  if (Tensor::CvDepth(t.dtype()) < 0) return false;
  if (t.rank() == 2) return t.dim(0) > 0 && t.dim(1) > 0;
  return t.rank() == 3 && t.dim(0) > 0 && t.dim(1) > 0 && t.dim(2) >= 1 && t.dim(2) <= 4;
}
inline constexpr std::string_view kCvImageExpectation =
    "an image H×W×C (C <= 4) or H×W of uint8/int32/float16/float32";

// Shape of an image tensor like `like` with a new height and width.
inline std::vector<int64_t> ImageShape(const Tensor& like, int height, int width) {
  std::vector<int64_t> shape = like.shape();
  shape[0] = height;
  shape[1] = width;
  return shape;
}

// The largest image an op may produce, and the widest one-hot vector. Spec numbers are checked
// against them when the ops are built, and sizes that also depend on the input (Resize by its
// shorter side, RandomCrop's padding) before the output buffer is allocated: a spec cannot make
// a worker allocate gigabytes per element. 8192 x 8192 x 4 channels of float32 is 1 GiB.
inline constexpr int kMaxOpSide = 16384;
inline constexpr int64_t kMaxOpPixels = int64_t{8192} * 8192;
inline constexpr int kMaxOneHotClasses = 1 << 20;

// InvalidArgument naming the op when a `height` x `width` output is over kMaxOpSide a side or
// kMaxOpPixels pixels.
inline absl::Status CheckOutputSize(const OpLabel& label, int64_t height, int64_t width) {
  if (height <= kMaxOpSide && width <= kMaxOpSide && height * width <= kMaxOpPixels) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      label.ToString(), ": an output of ", height, "x", width, " (HxW) is too large (at most ",
      kMaxOpSide, " a side and ", kMaxOpPixels, " pixels); use a smaller size"));
}

// cv::INTER_* for `interp`, or `default_flag` for INTERPOLATION_DEFAULT.
inline int CvInterpolation(proto::Interpolation interp, int default_flag) {
  switch (interp) {
    case proto::INTERPOLATION_NEAREST:
      return cv::INTER_NEAREST;
    case proto::INTERPOLATION_BILINEAR:
      return cv::INTER_LINEAR;
    case proto::INTERPOLATION_BICUBIC:
      return cv::INTER_CUBIC;
    case proto::INTERPOLATION_AREA:
      return cv::INTER_AREA;
    default:
      return default_flag;
  }
}

// Runs `fn` (returning absl::StatusOr<Tensor>), turning a cv::Exception into
// Internal and a failed allocation into ResourceExhausted, naming the op.
template <typename F>
absl::StatusOr<Tensor> CatchCv(const OpLabel& label, F&& fn) {
  try {
    return fn();
  } catch (const cv::Exception& e) {
    return absl::InternalError(absl::StrCat(label.ToString(), ": OpenCV error: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(label.ToString(), ": out of memory for its output"));
  }
}

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_OP_UTIL_H_
