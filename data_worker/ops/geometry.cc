#include "data_worker/ops/geometry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "opencv2/core.hpp"
#include "opencv2/imgproc.hpp"

namespace sluice::data_worker {
namespace {

// Checked when the op is built: an output size taken from the spec.
absl::Status CheckSpecSize(int height, int width, const OpLabel& label) {
  if (height > kMaxOpSide || width > kMaxOpSide) {
    return label.FieldError(
        height == width ? "size" : (height > kMaxOpSide ? "height" : "width"),
        absl::StrCat("must be at most ", kMaxOpSide, ", got ", std::max(height, width)));
  }
  if (int64_t{height} * width > kMaxOpPixels) {
    return label.FieldError(
        "size", absl::StrCat(height, "x", width, " is more than ", kMaxOpPixels, " pixels"));
  }
  return absl::OkStatus();
}

// Reads `size` (square) or `height` + `width` into *h, *w.
absl::Status ParseSize(int size, int height, int width, const OpLabel& label, int* h, int* w) {
  if (size != 0 && (height != 0 || width != 0)) {
    return label.SpecError("set either size or height and width, not both");
  }
  if (size < 0) return label.FieldError("size", "must be > 0");
  if (size > 0) {
    *h = *w = size;
    return CheckSpecSize(size, size, label);
  }
  if (height == 0 && width == 0) return label.FieldError("size", "must be > 0");
  if (height <= 0) return label.FieldError("height", "must be > 0");
  if (width <= 0) return label.FieldError("width", "must be > 0");
  *h = height;
  *w = width;
  return CheckSpecSize(height, width, label);
}

// Python's round(): half to even (nearbyint in the default rounding mode).
int PyRound(double v) { return static_cast<int>(std::nearbyint(v)); }

class ResizeOpImpl final : public Op {
 public:
  ResizeOpImpl(OpLabel label, ResizeSpec spec) : label_(std::move(label)), spec_(spec) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    if (!IsCvImage(input)) return label_.InputError(kCvImageExpectation, input);
    int oh, ow;
    ResizeOutputSize(spec_, input.dim(0), input.dim(1), &oh, &ow);
    RETURN_IF_ERROR(CheckOutputSize(label_, oh, ow));
    const CropBox full{0, 0, static_cast<int>(input.dim(0)), static_cast<int>(input.dim(1))};
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      return CropAndResize(input, full, oh, ow, spec_.interpolation);
    });
  }

 private:
  OpLabel label_;
  ResizeSpec spec_;
};

class CenterCropOpImpl final : public Op {
 public:
  CenterCropOpImpl(OpLabel label, CenterCropSpec spec) : label_(std::move(label)), spec_(spec) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext&) const override {
    if (!IsCvImage(input)) return label_.InputError(kCvImageExpectation, input);
    ASSIGN_OR_RETURN(CropBox box, CenterCropBox(spec_, input.dim(0), input.dim(1), label_));
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      return CropAndResize(input, box, box.height, box.width, cv::INTER_LINEAR);
    });
  }

 private:
  OpLabel label_;
  CenterCropSpec spec_;
};

class RandomResizedCropOpImpl final : public Op {
 public:
  RandomResizedCropOpImpl(OpLabel label, RandomResizedCropSpec spec)
      : label_(std::move(label)), spec_(spec) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    if (!IsCvImage(input)) return label_.InputError(kCvImageExpectation, input);
    Rng rng = ctx.RngFor(label_.position);
    const CropBox box = RandomResizedCropBox(spec_, input.dim(0), input.dim(1), rng);
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      return CropAndResize(input, box, spec_.height, spec_.width, spec_.interpolation);
    });
  }

 private:
  OpLabel label_;
  RandomResizedCropSpec spec_;
};

class RandomCropOpImpl final : public Op {
 public:
  RandomCropOpImpl(OpLabel label, int height, int width, int padding, bool pad_if_needed)
      : label_(std::move(label)),
        height_(height),
        width_(width),
        padding_(padding),
        pad_if_needed_(pad_if_needed) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    if (!IsCvImage(input)) return label_.InputError(kCvImageExpectation, input);
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      int h = input.dim(0), w = input.dim(1);
      int top = padding_, bottom = padding_, left = padding_, right = padding_;
      // torchvision pads both sides by the whole shortfall.
      if (pad_if_needed_ && h + 2 * padding_ < height_) {
        top += height_ - (h + 2 * padding_);
        bottom += height_ - (h + 2 * padding_);
      }
      if (pad_if_needed_ && w + 2 * padding_ < width_) {
        left += width_ - (w + 2 * padding_);
        right += width_ - (w + 2 * padding_);
      }
      const int ph = h + top + bottom, pw = w + left + right;
      RETURN_IF_ERROR(CheckOutputSize(label_, ph, pw));
      if (ph < height_ || pw < width_) {
        return absl::InvalidArgumentError(absl::StrCat(label_.ToString(), ": crop ", height_, "x",
                                                       width_, " (HxW) is larger than the ",
                                                       padding_ > 0 ? "padded " : "", "image ", ph,
                                                       "x", pw, "; set padding or pad_if_needed"));
      }
      Rng rng = ctx.RngFor(label_.position);
      int i = 0, j = 0;
      if (ph != height_ || pw != width_) {
        i = static_cast<int>(rng.UniformInt(ph - height_ + 1));
        j = static_cast<int>(rng.UniformInt(pw - width_ + 1));
      }
      const CropBox box{i, j, height_, width_};
      if (top == 0 && bottom == 0 && left == 0 && right == 0) {
        return CropAndResize(input, box, height_, width_, cv::INTER_LINEAR);
      }
      Tensor padded = Tensor::Allocate(input.dtype(), ImageShape(input, ph, pw));
      cv::Mat padded_mat = padded.AsMat();
      cv::copyMakeBorder(input.AsMat(), padded_mat, top, bottom, left, right, cv::BORDER_CONSTANT,
                         cv::Scalar::all(0));
      return CropAndResize(padded, box, height_, width_, cv::INTER_LINEAR);
    });
  }

 private:
  OpLabel label_;
  int height_, width_, padding_;
  bool pad_if_needed_;
};

class RandomHorizontalFlipOpImpl final : public Op {
 public:
  RandomHorizontalFlipOpImpl(OpLabel label, double p) : label_(std::move(label)), p_(p) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    if (!IsCvImage(input)) return label_.InputError(kCvImageExpectation, input);
    if (!Mirrors(ctx)) return input;
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      // cv::flip swaps mirrored pairs, so flipping in place is safe.
      cv::Mat mat = input.AsMat();
      cv::flip(mat, mat, /*flipCode=*/1);
      return std::move(input);
    });
  }
  bool mirrors() const override { return true; }
  bool Mirrors(const ElementContext& ctx) const override {
    Rng rng = ctx.RngFor(label_.position);
    return rng.Bernoulli(p_);
  }

 private:
  OpLabel label_;
  double p_;
};

class RandomRotationOpImpl final : public Op {
 public:
  RandomRotationOpImpl(OpLabel label, double degrees, int interpolation, double fill)
      : label_(std::move(label)), degrees_(degrees), interpolation_(interpolation), fill_(fill) {}
  std::string_view name() const override { return label_.name; }
  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    if (!IsCvImage(input)) return label_.InputError(kCvImageExpectation, input);
    Rng rng = ctx.RngFor(label_.position);
    const double angle = rng.Uniform(-degrees_, degrees_);
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      const cv::Point2f center((input.dim(1) - 1) * 0.5f, (input.dim(0) - 1) * 0.5f);
      const cv::Mat m = cv::getRotationMatrix2D(center, angle, 1.0);
      Tensor out = Tensor::Allocate(input.dtype(), input.shape());
      cv::Mat dst = out.AsMat();
      cv::warpAffine(input.AsMat(), dst, m, dst.size(), interpolation_, cv::BORDER_CONSTANT,
                     cv::Scalar::all(fill_));
      return out;
    });
  }

 private:
  OpLabel label_;
  double degrees_;
  int interpolation_;
  double fill_;
};

}  // namespace

absl::StatusOr<ResizeSpec> ParseResize(const proto::ResizeOp& spec, const OpLabel& label) {
  ResizeSpec out;
  if (spec.size() != 0) {
    if (spec.height() != 0 || spec.width() != 0) {
      return label.SpecError("set either size or height and width, not both");
    }
    if (spec.size() < 0) return label.FieldError("size", "must be > 0");
    if (spec.size() > kMaxOpSide) {
      return label.FieldError("size",
                              absl::StrCat("must be at most ", kMaxOpSide, ", got ", spec.size()));
    }
    out.size = spec.size();
  } else {
    RETURN_IF_ERROR(ParseSize(0, spec.height(), spec.width(), label, &out.height, &out.width));
  }
  out.interpolation = CvInterpolation(spec.interpolation(), cv::INTER_LINEAR);
  return out;
}

absl::StatusOr<CenterCropSpec> ParseCenterCrop(const proto::CenterCropOp& spec,
                                               const OpLabel& label) {
  CenterCropSpec out;
  RETURN_IF_ERROR(
      ParseSize(spec.size(), spec.height(), spec.width(), label, &out.height, &out.width));
  return out;
}

absl::StatusOr<RandomResizedCropSpec> ParseRandomResizedCrop(const proto::RandomResizedCropOp& spec,
                                                             const OpLabel& label) {
  RandomResizedCropSpec out;
  RETURN_IF_ERROR(
      ParseSize(spec.size(), spec.height(), spec.width(), label, &out.height, &out.width));
  if (spec.has_scale_min()) out.scale_min = spec.scale_min();
  if (spec.has_scale_max()) out.scale_max = spec.scale_max();
  if (spec.has_ratio_min()) out.ratio_min = spec.ratio_min();
  if (spec.has_ratio_max()) out.ratio_max = spec.ratio_max();
  if (!(out.scale_min > 0) || !(out.scale_max <= 1.0) || !(out.scale_min <= out.scale_max)) {
    return label.FieldError(
        "scale", absl::StrCat("must satisfy 0 < scale_min <= scale_max <= 1, got (", out.scale_min,
                              ", ", out.scale_max, ")"));
  }
  if (!(out.ratio_min > 0) || !(out.ratio_min <= out.ratio_max) || !std::isfinite(out.ratio_max)) {
    return label.FieldError("ratio", absl::StrCat("must satisfy 0 < ratio_min <= ratio_max, got (",
                                                  out.ratio_min, ", ", out.ratio_max, ")"));
  }
  out.interpolation = CvInterpolation(spec.interpolation(), cv::INTER_LINEAR);
  return out;
}

void ResizeOutputSize(const ResizeSpec& spec, int height, int width, int* out_height,
                      int* out_width) {
  if (spec.size == 0) {
    *out_height = spec.height;
    *out_width = spec.width;
    return;
  }
  const int shorter = std::min(height, width), longer = std::max(height, width);
  const int new_short = spec.size;
  // Saturated, not wrapped: an extreme aspect ratio gives a size CheckOutputSize refuses.
  const int new_long = static_cast<int>(std::clamp<int64_t>(
      static_cast<int64_t>(new_short) * longer / shorter, 1, std::numeric_limits<int>::max()));
  if (width <= height) {
    *out_width = new_short;
    *out_height = new_long;
  } else {
    *out_height = new_short;
    *out_width = new_long;
  }
}

absl::StatusOr<CropBox> CenterCropBox(const CenterCropSpec& spec, int height, int width,
                                      const OpLabel& label) {
  if (spec.height > height || spec.width > width) {
    return absl::InvalidArgumentError(absl::StrCat(label.ToString(), ": crop ", spec.height, "x",
                                                   spec.width, " (HxW) is larger than the image ",
                                                   height, "x", width, "; resize first"));
  }
  return CropBox{PyRound((height - spec.height) / 2.0), PyRound((width - spec.width) / 2.0),
                 spec.height, spec.width};
}

CropBox RandomResizedCropBox(const RandomResizedCropSpec& spec, int height, int width, Rng& rng) {
  const double area = static_cast<double>(height) * width;
  const double log_r0 = std::log(spec.ratio_min);
  const double log_r1 = std::log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(spec.scale_min, spec.scale_max);
    const double aspect = std::exp(rng.Uniform(log_r0, log_r1));
    const int w = PyRound(std::sqrt(target_area * aspect));
    const int h = PyRound(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int i = static_cast<int>(rng.UniformInt(height - h + 1));
      const int j = static_cast<int>(rng.UniformInt(width - w + 1));
      return CropBox{i, j, h, w};
    }
  }
  // Fallback: the central crop with the ratio clamped into range.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < spec.ratio_min) {
    h = std::max(1, PyRound(w / spec.ratio_min));
  } else if (in_ratio > spec.ratio_max) {
    w = std::max(1, PyRound(h * spec.ratio_max));
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

Tensor CropAndResize(const Tensor& src, const CropBox& box, int out_height, int out_width,
                     int cv_interpolation) {
  const cv::Mat roi = src.AsMat()(cv::Rect(box.left, box.top, box.width, box.height));
  Tensor out = Tensor::Allocate(src.dtype(), ImageShape(src, out_height, out_width));
  cv::Mat dst = out.AsMat();
  if (box.height == out_height && box.width == out_width) {
    roi.copyTo(dst);
  } else if (roi.depth() == CV_32S || roi.depth() == CV_16F) {
    // OpenCV's resize has no int32 or float16 kernel (an assertion, not an error): through
    // float32, rounded and saturated back (int32 exact up to 2^24).
    cv::Mat wide, resized;
    roi.convertTo(wide, CV_32F);
    cv::resize(wide, resized, dst.size(), 0, 0, cv_interpolation);
    resized.convertTo(dst, dst.type());
  } else {
    cv::resize(roi, dst, dst.size(), 0, 0, cv_interpolation);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Op>> MakeResize(const proto::ResizeOp& spec, OpLabel label) {
  ASSIGN_OR_RETURN(ResizeSpec parsed, ParseResize(spec, label));
  return std::make_unique<ResizeOpImpl>(std::move(label), parsed);
}

absl::StatusOr<std::unique_ptr<Op>> MakeCenterCrop(const proto::CenterCropOp& spec, OpLabel label) {
  ASSIGN_OR_RETURN(CenterCropSpec parsed, ParseCenterCrop(spec, label));
  return std::make_unique<CenterCropOpImpl>(std::move(label), parsed);
}

absl::StatusOr<std::unique_ptr<Op>> MakeRandomResizedCrop(const proto::RandomResizedCropOp& spec,
                                                          OpLabel label) {
  ASSIGN_OR_RETURN(RandomResizedCropSpec parsed, ParseRandomResizedCrop(spec, label));
  return std::make_unique<RandomResizedCropOpImpl>(std::move(label), parsed);
}

absl::StatusOr<std::unique_ptr<Op>> MakeRandomCrop(const proto::RandomCropOp& spec, OpLabel label) {
  int h = 0, w = 0;
  RETURN_IF_ERROR(ParseSize(spec.size(), spec.height(), spec.width(), label, &h, &w));
  if (spec.padding() < 0 || spec.padding() > kMaxOpSide) {
    return label.FieldError("padding",
                            absl::StrCat("must be in [0, ", kMaxOpSide, "], got ", spec.padding()));
  }
  return std::make_unique<RandomCropOpImpl>(std::move(label), h, w, spec.padding(),
                                            spec.pad_if_needed());
}

absl::StatusOr<std::unique_ptr<Op>> MakeRandomHorizontalFlip(
    const proto::RandomHorizontalFlipOp& spec, OpLabel label) {
  const double p = spec.has_p() ? spec.p() : 0.5;
  if (!(p >= 0 && p <= 1)) {
    return label.FieldError("p", absl::StrCat("must be in [0, 1], got ", p));
  }
  return std::make_unique<RandomHorizontalFlipOpImpl>(std::move(label), p);
}

absl::StatusOr<std::unique_ptr<Op>> MakeRandomRotation(const proto::RandomRotationOp& spec,
                                                       OpLabel label) {
  if (!(spec.degrees() >= 0) || !std::isfinite(spec.degrees())) {
    return label.FieldError("degrees", absl::StrCat("must be >= 0, got ", spec.degrees()));
  }
  return std::make_unique<RandomRotationOpImpl>(
      std::move(label), spec.degrees(), CvInterpolation(spec.interpolation(), cv::INTER_NEAREST),
      spec.fill());
}

}  // namespace sluice::data_worker
