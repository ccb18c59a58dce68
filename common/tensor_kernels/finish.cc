#include "common/tensor_kernels/finish.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::kernels {
namespace {

bool IsFloat32Cast(const proto::OpSpec& op) {
  return op.has_cast() && op.cast().dtype() == "float32";
}

}  // namespace

absl::StatusOr<FinishMode> ParseFinishMode(std::string_view value) {
  if (value.empty() || value == "auto") return FinishMode::kAuto;
  if (value == "worker") return FinishMode::kWorker;
  if (value == "client") return FinishMode::kClient;
  return absl::InvalidArgumentError(absl::StrCat("finish: '",
                                                 absl::string_view(value.data(), value.size()),
                                                 "' is not one of auto, worker, client"));
}

size_t ClientTailLength(absl::Span<const proto::OpSpec> ops) {
  // [random_horizontal_flip] normalize(channels-last) [hwc2chw] [cast float32], ending at the
  // last op.
  size_t end = ops.size();
  size_t len = 0;
  if (end > 0 && IsFloat32Cast(ops[end - 1])) {
    ++len;
    --end;
  }
  if (end > 0 && ops[end - 1].has_hwc2chw()) {
    ++len;
    --end;
  }
  if (end == 0 || !ops[end - 1].has_normalize() || ops[end - 1].normalize().channels_first()) {
    return 0;
  }
  ++len;
  --end;
  if (end > 0 && ops[end - 1].has_random_horizontal_flip()) ++len;
  return len;
}

absl::StatusOr<Finisher> Finisher::Create(absl::Span<const proto::OpSpec> ops, record::DType dtype,
                                          absl::Span<const int64_t> shape) {
  if (ops.empty() || ClientTailLength(ops) != ops.size()) {
    return absl::InvalidArgumentError(
        "finish ops are not a tail the client runs ([random_horizontal_flip,] normalize [, "
        "hwc2chw] [, cast to float32])");
  }
  const bool mirrors = ops[0].has_random_horizontal_flip();
  if (mirrors) ops.remove_prefix(1);
  const proto::NormalizeOp& n = ops[0].normalize();
  std::vector<float> mean(n.mean().begin(), n.mean().end());
  std::vector<float> std(n.std().begin(), n.std().end());
  if (mean.empty() || std.empty() ||
      (mean.size() != std.size() && mean.size() != 1 && std.size() != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("finish normalize: ", mean.size(), " means and ", std.size(), " stds"));
  }
  for (float s : std) {
    if (!(s != 0) || !std::isfinite(s))
      return absl::InvalidArgumentError("finish normalize: std must be non-zero");
  }
  for (float m : mean) {
    if (!std::isfinite(m))
      return absl::InvalidArgumentError("finish normalize: mean must be finite");
  }
  if (dtype != record::DType::kUint8 && dtype != record::DType::kFloat32) {
    return absl::InvalidArgumentError("finish normalize: the column must be uint8 or float32");
  }
  if (shape.size() != 4 || shape[1] < 0 || shape[2] < 0 || shape[3] <= 0 || shape[3] > 4096) {
    return absl::InvalidArgumentError("finish normalize: the column must be N×H×W×C");
  }
  Finisher f(NormalizeCoefficients(mean, std));
  if (!f.norm_.Accepts(shape[3])) {
    return absl::InvalidArgumentError(absl::StrCat("finish normalize: ", shape[3], " channels but ",
                                                   f.norm_.channels(), " means/stds"));
  }
  f.mirrors_ = mirrors;
  f.chw_ = ops.size() >= 2 && ops[1].has_hwc2chw();
  f.float_input_ = dtype == record::DType::kFloat32;
  f.n_ = shape[0];
  f.height_ = shape[1];
  f.width_ = shape[2];
  f.plane_ = shape[1] * shape[2];
  f.channels_ = static_cast<int>(shape[3]);
  if (f.chw_) {
    f.out_shape_ = {shape[0], shape[3], shape[1], shape[2]};
  } else {
    f.out_shape_.assign(shape.begin(), shape.end());
  }
  return f;
}

size_t Finisher::out_bytes() const {
  return static_cast<size_t>(n_ * plane_ * channels_) * sizeof(float);
}

size_t Finisher::in_bytes() const {
  return static_cast<size_t>(n_ * plane_ * channels_) * (float_input_ ? sizeof(float) : 1);
}

absl::Status Finisher::Run(absl::Span<const absl::Span<const uint8_t>> pieces,
                           absl::Span<const bool> mirrored, float* out) const {
  if (mirrored.size() != (mirrors_ ? static_cast<size_t>(n_) : 0)) {
    return absl::InvalidArgumentError(
        mirrors_ ? absl::StrCat("finish begins with random_horizontal_flip: ", n_,
                                " mirror flags expected, ", mirrored.size(), " given")
                 : "finish carries mirror flags but does not begin with random_horizontal_flip");
  }
  const size_t element = float_input_ ? sizeof(float) : 1;
  const size_t pixel_bytes = static_cast<size_t>(channels_) * element;
  const size_t image_bytes = static_cast<size_t>(plane_) * pixel_bytes;
  const int64_t image_values = plane_ * channels_;
  // The kernel that reads rows right to left (the same arithmetic per pixel).
  const bool mirror_in_kernel = !float_input_ && chw_ && channels_ == 3;
  std::unique_ptr<uint8_t[]> scratch;  // one image, when it spans pieces
  std::unique_ptr<uint8_t[]> flipped;  // one image, mirrored
  size_t piece = 0, offset = 0;        // read position
  for (int64_t i = 0; i < n_; ++i) {
    while (piece < pieces.size() && offset == pieces[piece].size()) {
      ++piece;
      offset = 0;
    }
    const uint8_t* src = nullptr;
    if (piece < pieces.size() && pieces[piece].size() - offset >= image_bytes &&
        reinterpret_cast<uintptr_t>(pieces[piece].data() + offset) % element == 0) {
      src = pieces[piece].data() + offset;
      offset += image_bytes;
    } else {
      if (scratch == nullptr) {
        scratch = std::make_unique_for_overwrite<uint8_t[]>(image_bytes);
      }
      for (size_t got = 0; got < image_bytes;) {
        if (offset == pieces[piece].size()) {
          ++piece;
          offset = 0;
          continue;
        }
        const size_t take = std::min(image_bytes - got, pieces[piece].size() - offset);
        std::memcpy(scratch.get() + got, pieces[piece].data() + offset, take);
        got += take;
        offset += take;
      }
      src = scratch.get();
    }
    float* dst = out + i * image_values;
    const bool mirror = mirrors_ && mirrored[i];
    if (mirror && mirror_in_kernel) {
      const float scale[3] = {norm_.scale8(0), norm_.scale8(1), norm_.scale8(2)};
      const float bias[3] = {norm_.bias(0), norm_.bias(1), norm_.bias(2)};
      NormalizeHwc3ToChw(src, height_, width_, /*src_stride=*/width_ * 3, /*flip=*/true, scale,
                         bias, dst);
      continue;
    }
    if (mirror) {
      if (flipped == nullptr) flipped = std::make_unique_for_overwrite<uint8_t[]>(image_bytes);
      const size_t row_bytes = static_cast<size_t>(width_) * pixel_bytes;
      for (int64_t y = 0; y < height_; ++y) {
        const uint8_t* row = src + y * row_bytes;
        uint8_t* to = flipped.get() + y * row_bytes;
        for (int64_t x = 0; x < width_; ++x) {
          std::memcpy(to + x * pixel_bytes, row + (width_ - 1 - x) * pixel_bytes, pixel_bytes);
        }
      }
      src = flipped.get();
    }
    if (float_input_) {
      NormalizeImage(norm_, reinterpret_cast<const float*>(src), plane_, channels_, chw_, dst);
    } else {
      NormalizeImage(norm_, src, plane_, channels_, chw_, dst);
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::kernels
