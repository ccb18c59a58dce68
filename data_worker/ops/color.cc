#include "data_worker/ops/color.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "opencv2/core.hpp"
#include "opencv2/imgproc.hpp"

namespace sluice::data_worker {
namespace {

void Clamp255(cv::Mat& f) {
  cv::max(f, 0.0, f);
  cv::min(f, 255.0, f);
}

class ColorJitterOpImpl final : public Op {
 public:
  ColorJitterOpImpl(OpLabel label, proto::ColorJitterOp spec)
      : label_(std::move(label)), spec_(std::move(spec)) {}
  std::string_view name() const override { return label_.name; }

  absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const override {
    if (input.dtype() != DType::kUint8 || input.rank() != 3 || input.dim(2) != 3) {
      return label_.InputError("uint8 RGB image H×W×3", input);
    }
    Rng rng = ctx.RngFor(label_.position);
    const ColorJitterParams p = DrawColorJitterParams(spec_, rng);
    return CatchCv(label_, [&]() -> absl::StatusOr<Tensor> {
      cv::Mat f;
      input.AsMat().convertTo(f, CV_32F);
      for (int id : p.order) {
        if (id == 0 && p.has_brightness) {
          f.convertTo(f, CV_32F, p.brightness);
          cv::min(f, 255.0, f);
        } else if (id == 1 && p.has_contrast) {
          cv::Mat gray;
          cv::cvtColor(f, gray, cv::COLOR_RGB2GRAY);
          const double mean = cv::mean(gray)[0];
          f.convertTo(f, CV_32F, p.contrast, mean * (1 - p.contrast));
          Clamp255(f);
        } else if (id == 2 && p.has_saturation) {
          cv::Mat gray, gray3;
          cv::cvtColor(f, gray, cv::COLOR_RGB2GRAY);
          cv::cvtColor(gray, gray3, cv::COLOR_GRAY2RGB);
          cv::addWeighted(f, p.saturation, gray3, 1 - p.saturation, 0, f);
          Clamp255(f);
        } else if (id == 3 && p.has_hue) {
          cv::Mat hsv;
          f.convertTo(f, CV_32F, 1.0 / 255);
          cv::cvtColor(f, hsv, cv::COLOR_RGB2HSV);  // H in [0, 360)
          const float shift = static_cast<float>(p.hue * 360.0);
          for (int r = 0; r < hsv.rows; ++r) {
            float* px = hsv.ptr<float>(r);
            for (int c = 0; c < hsv.cols; ++c) {
              float h = px[3 * c] + shift;
              if (h >= 360.f) h -= 360.f;
              if (h < 0.f) h += 360.f;
              px[3 * c] = h;
            }
          }
          cv::cvtColor(hsv, f, cv::COLOR_HSV2RGB);
          f.convertTo(f, CV_32F, 255.0);
          Clamp255(f);
        }
      }
      cv::Mat dst = input.AsMat();  // written in place
      f.convertTo(dst, CV_8U);
      return std::move(input);
    });
  }

 private:
  OpLabel label_;
  proto::ColorJitterOp spec_;
};

}  // namespace

ColorJitterParams DrawColorJitterParams(const proto::ColorJitterOp& spec, Rng& rng) {
  ColorJitterParams p;
  // Fisher-Yates, like torch.randperm(4).
  for (int i = 3; i > 0; --i) {
    std::swap(p.order[i], p.order[rng.UniformInt(i + 1)]);
  }
  auto factor = [&](float v) { return rng.Uniform(std::max(0.0, 1.0 - v), 1.0 + v); };
  if (spec.brightness() > 0) {
    p.has_brightness = true;
    p.brightness = factor(spec.brightness());
  }
  if (spec.contrast() > 0) {
    p.has_contrast = true;
    p.contrast = factor(spec.contrast());
  }
  if (spec.saturation() > 0) {
    p.has_saturation = true;
    p.saturation = factor(spec.saturation());
  }
  if (spec.hue() > 0) {
    p.has_hue = true;
    p.hue = rng.Uniform(-spec.hue(), spec.hue());
  }
  return p;
}

absl::StatusOr<std::unique_ptr<Op>> MakeColorJitter(const proto::ColorJitterOp& spec,
                                                    OpLabel label) {
  const std::pair<const char*, float> fields[] = {{"brightness", spec.brightness()},
                                                  {"contrast", spec.contrast()},
                                                  {"saturation", spec.saturation()},
                                                  {"hue", spec.hue()}};
  for (const auto& [field, v] : fields) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return label.FieldError(field, absl::StrCat("must be >= 0, got ", v));
    }
  }
  if (spec.hue() > 0.5) {
    return label.FieldError("hue", absl::StrCat("must be in [0, 0.5], got ", spec.hue()));
  }
  return std::make_unique<ColorJitterOpImpl>(std::move(label), spec);
}

}  // namespace sluice::data_worker
