#include "data_worker/ops/color.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"
#include "tests/data_worker/ops/test_images.h"

namespace sluice::data_worker {
namespace {

// Per-pixel double-precision reference of torchvision's formulas.
void Reference(const ColorJitterParams& p, cv::Mat& img) {
  cv::Mat f;
  img.convertTo(f, CV_64F);
  auto gray = [](const cv::Vec3d& v) {
    return 0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2];
  };
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
        for (int c = 0; c < 3; ++c)
          v[c] = clamp(v[c] * p.contrast + mean * (1 - p.contrast));
      });
    } else if (id == 2 && p.has_saturation) {
      f.forEach<cv::Vec3d>([&](cv::Vec3d& v, const int*) {
        const double g = gray(v);
        for (int c = 0; c < 3; ++c)
          v[c] = clamp(v[c] * p.saturation + g * (1 - p.saturation));
      });
    } else if (id == 3 && p.has_hue) {
      f.forEach<cv::Vec3d>([&](cv::Vec3d& v, const int*) {
        const double r = v[0] / 255, g = v[1] / 255, b = v[2] / 255;
        const double mx = std::max({r, g, b}), mn = std::min({r, g, b}),
                     d = mx - mn;
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
        const double pp = val * (1 - s), q = val * (1 - s * fr),
                     t = val * (1 - s * (1 - fr));
        const double rgb[6][3] = {{val, t, pp}, {q, val, pp}, {pp, val, t},
                                  {pp, q, val}, {t, pp, val}, {val, pp, q}};
        for (int c = 0; c < 3; ++c) v[c] = clamp(rgb[i][c] * 255);
      });
    }
  }
  f.convertTo(img, CV_8U);
}

TEST(ColorJitter, MatchesPerPixelReferenceWithinTwoLevels) {
  const cv::Mat img = testing::MakeRgb(24, 32);
  const float none = 0;
  struct Case {
    float b, c, s, h;
  };
  for (const Case& k :
       {Case{0.4f, none, none, none}, Case{none, 0.4f, none, none},
        Case{none, none, 0.4f, none}, Case{none, none, none, 0.1f},
        Case{0.4f, 0.4f, 0.4f, 0.1f}}) {
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
      const ColorJitterParams p =
          DrawColorJitterParams(spec.color_jitter(), rng);
      cv::Mat ref = img.clone();
      Reference(p, ref);
      const testing::Diff d = testing::Compare(out->AsMat(), ref);
      EXPECT_LE(d.max, 2) << "case b=" << k.b << " c=" << k.c << " s=" << k.s
                          << " h=" << k.h;
      absl::StatusOr<Tensor> again =
          (*ops)[0]->Apply(Tensor::FromMat(img), ctx);
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
