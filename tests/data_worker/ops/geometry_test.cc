#include "data_worker/ops/geometry.h"

#include <cmath>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_worker/ops/test_images.h"
#include "tests/data_worker/ops/torchvision_reference.h"

namespace sluice::data_worker {
namespace {

using ::sluice::data_worker::testing::Compare;
using ::sluice::data_worker::testing::MakeRgb;
using ::sluice::data_worker::testing::TorchvisionBox;
using ::testing::HasSubstr;

std::unique_ptr<Op> One(const proto::OpSpec& spec, int position = 0) {
  auto ops = BuildOps({spec}, position, /*fuse=*/true);
  EXPECT_TRUE(ops.ok()) << ops.status();
  return std::move((*ops)[0]);
}

Tensor ApplyTo(const Op& op, const cv::Mat& rgb, ElementContext ctx = {}) {
  absl::StatusOr<Tensor> out = op.Apply(Tensor::FromMat(rgb), ctx);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move(*out) : Tensor();
}

TEST(Resize, ShorterSideLikeTorchvisionAndExactVsOpenCv) {
  const cv::Mat img = MakeRgb(375, 500);
  proto::OpSpec spec;
  spec.mutable_resize()->set_size(256);
  Tensor out = ApplyTo(*One(spec), img);
  ASSERT_EQ(out.shape(), (std::vector<int64_t>{256, 341, 3}));
  cv::Mat ref;
  cv::resize(img, ref, cv::Size(341, 256), 0, 0, cv::INTER_LINEAR);
  EXPECT_EQ(Compare(out.AsMat(), ref).max, 0);
  proto::OpSpec hw;
  hw.mutable_resize()->set_height(10);
  hw.mutable_resize()->set_width(30);
  hw.mutable_resize()->set_interpolation(proto::INTERPOLATION_AREA);
  Tensor out2 = ApplyTo(*One(hw), img);
  cv::resize(img, ref, cv::Size(30, 10), 0, 0, cv::INTER_AREA);
  EXPECT_EQ(Compare(out2.AsMat(), ref).max, 0);
}

// OpenCV's resize has no int32 or float16 kernel; the ops take both (as their checks say).
// 1x2 -> 1x4, bilinear with half-pixel centres: source x = -0.25 (clamped), 0.25, 0.75, 1.25
// (clamped): {0, a/4, 3a/4, a}.
TEST(Resize, Int32AndFloat16ImagesAreResized) {
  proto::OpSpec spec;
  spec.mutable_resize()->set_height(1);
  spec.mutable_resize()->set_width(4);
  Tensor ints = Tensor::Allocate(DType::kInt32, {1, 2, 1});
  ints.data_as<int32_t>()[0] = 0;
  ints.data_as<int32_t>()[1] = 1'000'000;
  absl::StatusOr<Tensor> out = One(spec)->Apply(std::move(ints), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->dtype(), DType::kInt32);
  ASSERT_EQ(out->shape(), (std::vector<int64_t>{1, 4, 1}));
  EXPECT_EQ(std::vector<int32_t>(out->data_as<int32_t>(), out->data_as<int32_t>() + 4),
            (std::vector<int32_t>{0, 250'000, 750'000, 1'000'000}));
  Tensor halves = Tensor::Allocate(DType::kFloat16, {1, 2, 1});
  halves.data_as<uint16_t>()[0] = 0x0000;  // 0.0
  halves.data_as<uint16_t>()[1] = 0x4400;  // 4.0
  out = One(spec)->Apply(std::move(halves), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->dtype(), DType::kFloat16);
  // 0.0, 1.0, 3.0, 4.0 in IEEE half precision.
  EXPECT_EQ(std::vector<uint16_t>(out->data_as<uint16_t>(), out->data_as<uint16_t>() + 4),
            (std::vector<uint16_t>{0x0000, 0x3C00, 0x4200, 0x4400}));
}

TEST(Resize, AThinImageResizedByItsShorterSideIsRefusedBeforeAllocating) {
  // 2 x 4000 resized to a shorter side of 16384: the longer side would be 32768000.
  const cv::Mat img = MakeRgb(2, 4000);
  proto::OpSpec spec;
  spec.mutable_resize()->set_size(16384);
  absl::StatusOr<Tensor> out = One(spec, 1)->Apply(Tensor::FromMat(img), {});
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              HasSubstr("op 1 (Resize): an output of 16384x32768000 (HxW) is "
                        "too large (at most 16384 a side and 67108864 pixels)"));
  // Fused with the decode (Decode+Resize), the check comes before the decode's buffer.
  proto::OpSpec decode;
  decode.mutable_decode();
  auto fused = BuildOps({decode, spec}, /*first_position=*/0, /*fuse=*/true);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_EQ(fused->size(), 1u);
  out = (*fused)[0]->Apply(testing::Bytes(testing::Encode(img, ".png")), {});
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("an output of 16384x32768000 (HxW) is too large"));
}

TEST(RandomCrop, PaddingThatMakesTheImageTooLargeIsRefusedBeforeAllocating) {
  proto::OpSpec spec;
  spec.mutable_random_crop()->set_size(8);
  spec.mutable_random_crop()->set_padding(16384);
  absl::StatusOr<Tensor> out = One(spec, 2)->Apply(Tensor::FromMat(MakeRgb(8, 8)), {});
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              HasSubstr("op 2 (RandomCrop): an output of 32776x32776 (HxW) is "
                        "too large"));
}

TEST(CenterCrop, MatchesRoiAndRejectsLargerCrop) {
  const cv::Mat img = MakeRgb(11, 20);
  proto::OpSpec spec;
  spec.mutable_center_crop()->set_height(4);
  spec.mutable_center_crop()->set_width(5);
  Tensor out = ApplyTo(*One(spec), img);
  // torchvision: top = round(3.5) = 4, left = round(7.5) = 8 (half to even).
  EXPECT_EQ(Compare(out.AsMat(), img(cv::Rect(8, 4, 5, 4))).max, 0);
  spec.mutable_center_crop()->set_height(12);
  absl::StatusOr<Tensor> bad = One(spec, 3)->Apply(Tensor::FromMat(img), {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("op 3 (CenterCrop)"));
  EXPECT_THAT(bad.status().message(), HasSubstr("12x5"));
  EXPECT_THAT(bad.status().message(), HasSubstr("11x20"));
}

TEST(RandomResizedCrop, MatchesOpenCvCropResizeAndIsDeterministic) {
  const cv::Mat img = MakeRgb(120, 160);
  proto::OpSpec spec;
  spec.mutable_random_resized_crop()->set_size(32);
  auto op = One(spec, /*position=*/4);
  std::set<std::string> distinct;
  for (uint64_t i = 0; i < 20; ++i) {
    const ElementContext ctx{3, 0, i};
    Tensor out = ApplyTo(*op, img, ctx);
    Rng rng = ctx.RngFor(4);
    const CropBox b = TorchvisionBox(120, 160, rng);
    ASSERT_GT(b.height, 0);
    ASSERT_LE(b.top + b.height, 120);
    ASSERT_LE(b.left + b.width, 160);
    cv::Mat ref;
    cv::resize(img(cv::Rect(b.left, b.top, b.width, b.height)), ref, cv::Size(32, 32), 0, 0,
               cv::INTER_LINEAR);
    EXPECT_EQ(Compare(out.AsMat(), ref).max, 0);
    EXPECT_EQ(ApplyTo(*op, img, ctx).bytes(), out.bytes());
    distinct.insert(std::string(out.bytes()));
  }
  EXPECT_GT(distinct.size(), 15u);
}

TEST(RandomResizedCrop, BoxesAreTorchvisionsGetParams) {
  RandomResizedCropSpec spec;
  spec.height = spec.width = 32;
  // Images of every shape, 10 x 1000 strips (the fallback) included.
  const std::pair<int, int> sizes[] = {{120, 160}, {300, 400}, {7, 5},
                                       {10, 1000}, {1000, 10}, {1, 1}};
  for (const auto& [h, w] : sizes) {
    for (uint64_t seed = 0; seed < 100; ++seed) {
      Rng rng(seed), reference(seed);
      const CropBox got = RandomResizedCropBox(spec, h, w, rng);
      const CropBox want = TorchvisionBox(h, w, reference);
      EXPECT_EQ(got.top, want.top) << h << "x" << w << " seed " << seed;
      EXPECT_EQ(got.left, want.left) << h << "x" << w << " seed " << seed;
      EXPECT_EQ(got.height, want.height) << h << "x" << w << " seed " << seed;
      EXPECT_EQ(got.width, want.width) << h << "x" << w << " seed " << seed;
    }
  }
}

TEST(RandomResizedCrop, BoxesFollowScaleAndRatioAndFallBackToCenter) {
  RandomResizedCropSpec spec;
  Rng rng(1);
  for (int i = 0; i < 1000; ++i) {
    const CropBox b = RandomResizedCropBox(spec, 300, 400, rng);
    const double frac = double(b.height) * b.width / (300.0 * 400.0);
    EXPECT_GE(frac, 0.07);
    EXPECT_LE(frac, 1.01);
    const double ratio = double(b.width) / b.height;
    EXPECT_GE(ratio, 0.7);
    EXPECT_LE(ratio, 1.4);
  }
  // A 1000x10 strip never fits a 3/4..4/3 crop: center crop with ratio clamped
  // to 4/3.
  const CropBox f = RandomResizedCropBox(spec, 10, 1000, rng);
  EXPECT_EQ(f.height, 10);
  EXPECT_EQ(f.width, 13);
  EXPECT_EQ(f.left, (1000 - 13) / 2);
}

// True iff `out` equals some crop of `img`.
bool IsCropOf(const cv::Mat& out, const cv::Mat& img) {
  for (int r = 0; r + out.rows <= img.rows; ++r) {
    for (int c = 0; c + out.cols <= img.cols; ++c) {
      if (Compare(out, img(cv::Rect(c, r, out.cols, out.rows))).max == 0) return true;
    }
  }
  return false;
}

TEST(RandomCrop, IsACropOfThePaddedImageAndRejectsTooLarge) {
  const cv::Mat img = MakeRgb(12, 14);
  proto::OpSpec spec;
  spec.mutable_random_crop()->set_size(8);
  auto op = One(spec);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(IsCropOf(ApplyTo(*op, img, {0, 0, i}).AsMat(), img));
  spec.mutable_random_crop()->set_padding(3);
  spec.mutable_random_crop()->set_size(16);
  cv::Mat padded;
  cv::copyMakeBorder(img, padded, 3, 3, 3, 3, cv::BORDER_CONSTANT, cv::Scalar::all(0));
  auto padded_op = One(spec);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(IsCropOf(ApplyTo(*padded_op, img, {0, 0, i}).AsMat(), padded));
  }
  proto::OpSpec big;
  big.mutable_random_crop()->set_size(13);
  absl::StatusOr<Tensor> bad = One(big)->Apply(Tensor::FromMat(img), {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("13x13"));
  EXPECT_THAT(bad.status().message(), HasSubstr("12x14"));
  big.mutable_random_crop()->set_pad_if_needed(true);
  EXPECT_EQ(ApplyTo(*One(big), img).shape(), (std::vector<int64_t>{13, 13, 3}));
}

TEST(RandomHorizontalFlip, FlipsOrKeepsLikeOpenCv) {
  const cv::Mat img = MakeRgb(9, 13);
  cv::Mat flipped;
  cv::flip(img, flipped, 1);
  proto::OpSpec always;
  always.mutable_random_horizontal_flip()->set_p(1);
  EXPECT_EQ(Compare(ApplyTo(*One(always), img).AsMat(), flipped).max, 0);
  proto::OpSpec never;
  never.mutable_random_horizontal_flip()->set_p(0);
  EXPECT_EQ(Compare(ApplyTo(*One(never), img).AsMat(), img).max, 0);
  proto::OpSpec half;
  half.mutable_random_horizontal_flip();
  auto op = One(half);
  int flips = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    Tensor out = ApplyTo(*op, img, {0, 0, i});
    const bool is_flipped = Compare(out.AsMat(), flipped).max == 0;
    EXPECT_TRUE(is_flipped || Compare(out.AsMat(), img).max == 0);
    flips += is_flipped;
  }
  EXPECT_GT(flips, 25);
  EXPECT_LT(flips, 75);
}

TEST(RandomRotation, MatchesWarpAffineWithTheDrawnAngle) {
  const cv::Mat img = MakeRgb(30, 40);
  proto::OpSpec spec;
  spec.mutable_random_rotation()->set_degrees(30);
  auto op = One(spec, 2);
  for (uint64_t i = 0; i < 5; ++i) {
    const ElementContext ctx{0, 0, i};
    Rng rng = ctx.RngFor(2);
    const double angle = rng.Uniform(-30, 30);
    cv::Mat ref;
    cv::warpAffine(img, ref, cv::getRotationMatrix2D(cv::Point2f(19.5f, 14.5f), angle, 1.0),
                   img.size(), cv::INTER_NEAREST, cv::BORDER_CONSTANT, cv::Scalar::all(0));
    EXPECT_EQ(Compare(ApplyTo(*op, img, ctx).AsMat(), ref).max, 0);
  }
  absl::StatusOr<Tensor> bad = op->Apply(Tensor::FromBytes("x"), {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("op 2 (RandomRotation): expected"));
}

}  // namespace
}  // namespace sluice::data_worker
