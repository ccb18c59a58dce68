#include "data_worker/ops/color.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <utility>

#include "gtest/gtest.h"
#include "tests/data_worker/ops/test_images.h"

namespace sluice::data_worker {
namespace {

// Per-pixel double-precision reference of torchvision's formulas.
void Reference(const ColorJitterParams& p, cv::Mat& img) {
  cv::Mat f;
  img.convertTo(f, CV_64F);
  auto gray = [](const cv::Vec3d& v) { return 0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2]; };
  auto clamp = [](double v) { return std::clamp(v, 0.0, 255.0); };
  for (int id : p.order) {
    if (id == 0 && p.has_brightness) {
      f.forEach<cv::Vec3d>([&](cv::Vec3d& v, const int*) {
        for (int c = 0; c < 3; ++c) v[c] = clamp(v[c] * p.brightness);
      });
    } else if (id == 1 && p.has_contrast) {
      double mean = 0;
      for (int r = 0; r < f.rows; ++r)
        for (int c = 0; c < f.cols; ++c) mean += gray(f.at<cv::Vec3d>(r, c));
      mean /= f.total();
      f.forEach<cv::Vec3d>([&](cv::Vec3d& v, const int*) {
        for (int c = 0; c < 3; ++c) v[c] = clamp(v[c] * p.contrast + mean * (1 - p.contrast));
      });
    } else if (id == 2 && p.has_saturation) {
      f.forEach<cv::Vec3d>([&](cv::Vec3d& v, const int*) {
        const double g = gray(v);
        for (int c = 0; c < 3; ++c) v[c] = clamp(v[c] * p.saturation + g * (1 - p.saturation));
      });
    } else if (id == 3 && p.has_hue) {
      f.forEach<cv::Vec3d>([&](cv::Vec3d& v, const int*) {
        const double r = v[0] / 255, g = v[1] / 255, b = v[2] / 255;
        const double mx = std::max({r, g, b}), mn = std::min({r, g, b}), d = mx - mn;
        double h = 0;
        if (d > 0) {
          if (mx == r)
            h = std::fmod((g - b) / d, 6.0);
          else if (mx == g)
            h = (b - r) / d + 2;
          else
            h = (r - g) / d + 4;
          h /= 6;
        }
        h = h + p.hue;
        h -= std::floor(h);
        const double s = mx > 0 ? d / mx : 0, val = mx;
        const double hh = h * 6;
        const int i = static_cast<int>(std::floor(hh)) % 6;
        const double fr = hh - std::floor(hh);
        const double pp = val * (1 - s), q = val * (1 - s * fr), t = val * (1 - s * (1 - fr));
        const double rgb[6][3] = {{val, t, pp}, {q, val, pp}, {pp, val, t},
                                  {pp, q, val}, {t, pp, val}, {val, pp, q}};
        for (int c = 0; c < 3; ++c) v[c] = clamp(rgb[i][c] * 255);
      });
    }
  }
  f.convertTo(img, CV_8U);
}

// The expected draws, independent of DrawColorJitterParams: torchvision's
// ColorJitter.get_params: torch.randperm(4) (Fisher-Yates from the last index
// down), then one factor per enabled component in the order brightness,
// contrast, saturation (uniform in [max(0, 1 - v), 1 + v]) and hue (uniform in
// [-v, v]), from the element's generator as the op is documented to.
ColorJitterParams TorchvisionDraws(float b, float c, float s, float h, Rng& rng) {
  ColorJitterParams p;
  for (int i = 3; i > 0; --i) {
    const int j = static_cast<int>(rng.UniformInt(i + 1));
    std::swap(p.order[i], p.order[j]);
  }
  auto factor = [&](float v) { return rng.Uniform(std::max(0.0, 1.0 - v), 1.0 + v); };
  if (b > 0) {
    p.has_brightness = true;
    p.brightness = factor(b);
  }
  if (c > 0) {
    p.has_contrast = true;
    p.contrast = factor(c);
  }
  if (s > 0) {
    p.has_saturation = true;
    p.saturation = factor(s);
  }
  if (h > 0) {
    p.has_hue = true;
    p.hue = rng.Uniform(-h, h);
  }
  return p;
}

TEST(ColorJitter, DrawsWhatTorchvisionsGetParamsDraws) {
  proto::ColorJitterOp spec;
  spec.set_brightness(0.4f);
  spec.set_contrast(0.3f);
  spec.set_saturation(1.5f);  // clamped below at 0
  spec.set_hue(0.1f);
  std::set<std::array<int, 4>> orders;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Rng rng(seed), reference(seed);
    const ColorJitterParams p = DrawColorJitterParams(spec, rng);
    const ColorJitterParams want = TorchvisionDraws(0.4f, 0.3f, 1.5f, 0.1f, reference);
    EXPECT_EQ(p.order, want.order);
    EXPECT_EQ(p.brightness, want.brightness);
    EXPECT_EQ(p.contrast, want.contrast);
    EXPECT_EQ(p.saturation, want.saturation);
    EXPECT_EQ(p.hue, want.hue);
    EXPECT_GE(p.saturation, 0.0);
    EXPECT_LE(p.saturation, 2.5);
    EXPECT_GE(p.brightness, 0.6);
    EXPECT_LE(p.brightness, 1.4);
    EXPECT_GE(p.hue, -0.1f);
    EXPECT_LE(p.hue, 0.1f);
    orders.insert(p.order);
  }
  EXPECT_EQ(orders.size(), 24u);  // every order of the four components occurs
}

TEST(ColorJitter, MatchesPerPixelReferenceWithinTwoLevels) {
  const cv::Mat img = testing::MakeRgb(24, 32);
  const float none = 0;
  struct Case {
    float b, c, s, h;
  };
  for (const Case& k :
       {Case{0.4f, none, none, none}, Case{none, 0.4f, none, none}, Case{none, none, 0.4f, none},
        Case{none, none, none, 0.1f}, Case{0.4f, 0.4f, 0.4f, 0.1f}}) {
    proto::OpSpec spec;
    spec.mutable_color_jitter()->set_brightness(k.b);
    spec.mutable_color_jitter()->set_contrast(k.c);
    spec.mutable_color_jitter()->set_saturation(k.s);
    spec.mutable_color_jitter()->set_hue(k.h);
    auto ops = BuildOps({spec}, 6, true);
    ASSERT_TRUE(ops.ok());
    for (uint64_t i = 0; i < 8; ++i) {
      const ElementContext ctx{5, 0, i};
      absl::StatusOr<Tensor> out = (*ops)[0]->Apply(Tensor::FromMat(img), ctx);
      ASSERT_TRUE(out.ok()) << out.status();
      Rng rng = ctx.RngFor(6);
      const ColorJitterParams p = TorchvisionDraws(k.b, k.c, k.s, k.h, rng);
      cv::Mat ref = img.clone();
      Reference(p, ref);
      const testing::Diff d = testing::Compare(out->AsMat(), ref);
      EXPECT_LE(d.max, 2) << "case b=" << k.b << " c=" << k.c << " s=" << k.s << " h=" << k.h;
      absl::StatusOr<Tensor> again = (*ops)[0]->Apply(Tensor::FromMat(img), ctx);
      EXPECT_EQ(again->bytes(), out->bytes());
    }
  }
}

TEST(ColorJitter, ZeroJitterIsIdentity) {
  proto::OpSpec spec;
  spec.mutable_color_jitter();
  auto ops = BuildOps({spec}, 0, true);
  ASSERT_TRUE(ops.ok());
  const cv::Mat img = testing::MakeRgb(8, 8);
  absl::StatusOr<Tensor> out = (*ops)[0]->Apply(Tensor::FromMat(img), {});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(testing::Compare(out->AsMat(), img).max, 0);
}

}  // namespace
}  // namespace sluice::data_worker
