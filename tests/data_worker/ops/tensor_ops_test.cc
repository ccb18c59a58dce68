#include "data_worker/ops/tensor_ops.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_worker/ops/test_images.h"

namespace sluice::data_worker {
namespace {

using ::testing::HasSubstr;

std::vector<std::unique_ptr<Op>> Build(const std::vector<proto::OpSpec>& specs, bool fuse) {
  auto ops = BuildOps(specs, 0, fuse);
  EXPECT_TRUE(ops.ok()) << ops.status();
  return std::move(*ops);
}

Tensor Chain(const std::vector<std::unique_ptr<Op>>& ops, Tensor t) {
  for (const auto& op : ops) {
    absl::StatusOr<Tensor> next = op->Apply(std::move(t), {});
    EXPECT_TRUE(next.ok()) << next.status();
    t = std::move(*next);
  }
  return t;
}

proto::OpSpec Normalize() {
  proto::OpSpec s;
  for (float m : {0.485f, 0.456f, 0.406f}) s.mutable_normalize()->add_mean(m);
  for (float v : {0.229f, 0.224f, 0.225f}) s.mutable_normalize()->add_std(v);
  return s;
}
proto::OpSpec Hwc2Chw() {
  proto::OpSpec s;
  s.mutable_hwc2chw();
  return s;
}
proto::OpSpec Cast(const std::string& dtype, bool scale = false) {
  proto::OpSpec s;
  s.mutable_cast()->set_dtype(dtype);
  s.mutable_cast()->set_scale(scale);
  return s;
}

TEST(Normalize, MatchesToTensorNormalizeFormula) {
  const cv::Mat img = testing::MakeRgb(7, 9);
  Tensor out = Chain(Build({Normalize()}, false), Tensor::FromMat(img));
  ASSERT_EQ(out.dtype(), DType::kFloat32);
  const double mean[] = {0.485, 0.456, 0.406}, stdv[] = {0.229, 0.224, 0.225};
  for (int i = 0; i < 7 * 9 * 3; ++i) {
    const double ref = (img.data[i] / 255.0 - mean[i % 3]) / stdv[i % 3];
    EXPECT_NEAR(out.data_as<float>()[i], ref, 1e-5);
  }
  absl::StatusOr<Tensor> bad =
      Build({Normalize()}, false)[0]->Apply(Tensor::Allocate(DType::kUint8, {2, 2, 4}), {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("op 0 (Normalize): expected uint8 or float32"));
}

TEST(Hwc2Chw, TransposesAnyDtype) {
  for (DType dtype : {DType::kUint8, DType::kFloat32, DType::kInt64}) {
    Tensor t = Tensor::Allocate(dtype, {3, 4, 5});
    for (size_t i = 0; i < t.num_bytes(); ++i) t.data()[i] = static_cast<uint8_t>(i * 31);
    Tensor copy = t.Clone();
    Tensor out = Chain(Build({Hwc2Chw()}, false), std::move(t));
    ASSERT_EQ(out.shape(), (std::vector<int64_t>{5, 3, 4}));
    const size_t es = record::DTypeSize(dtype);
    for (int h = 0; h < 3; ++h)
      for (int w = 0; w < 4; ++w)
        for (int c = 0; c < 5; ++c)
          EXPECT_EQ(std::memcmp(out.data() + ((c * 3 + h) * 4 + w) * es,
                                copy.data() + ((h * 4 + w) * 5 + c) * es, es),
                    0);
  }
}

TEST(Cast, ScalesRoundsAndSaturates) {
  Tensor u8 = Tensor::Allocate(DType::kUint8, {3});
  u8.data()[0] = 0;
  u8.data()[1] = 51;
  u8.data()[2] = 255;
  Tensor f = Chain(Build({Cast("float32", true)}, false), u8.Clone());
  EXPECT_FLOAT_EQ(f.data_as<float>()[1], 0.2f);
  EXPECT_FLOAT_EQ(f.data_as<float>()[2], 1.0f);
  Tensor g = Tensor::Allocate(DType::kFloat32, {3});
  g.data_as<float>()[0] = -4.0f;
  g.data_as<float>()[1] = 2.6f;
  g.data_as<float>()[2] = 300.0f;
  Tensor back = Chain(Build({Cast("uint8")}, false), std::move(g));
  EXPECT_EQ(back.data()[0], 0);
  EXPECT_EQ(back.data()[1], 3);
  EXPECT_EQ(back.data()[2], 255);
  Tensor big = Tensor::Scalar<int64_t>(int64_t{1} << 40);
  EXPECT_EQ(*Chain(Build({Cast("int32")}, false), std::move(big)).data_as<int32_t>(), INT32_MAX);
}

TEST(NormalizeHwc2ChwCast, FusedIsBitIdenticalToUnfused) {
  const cv::Mat img = testing::MakeRgb(31, 17);
  for (const std::string dtype : {"float32", "float16"}) {
    SCOPED_TRACE(dtype);
    const std::vector<proto::OpSpec> specs = {Normalize(), Hwc2Chw(), Cast(dtype)};
    auto fused = Build(specs, true);
    ASSERT_EQ(fused.size(), 1u);
    Tensor a = Chain(fused, Tensor::FromMat(img));
    Tensor b = Chain(Build(specs, false), Tensor::FromMat(img));
    ASSERT_EQ(a.shape(), (std::vector<int64_t>{3, 31, 17}));
    ASSERT_EQ(a.dtype(), b.dtype());
    EXPECT_EQ(a.bytes(), b.bytes());
  }
  // float32 input (already scaled to [0, 1]) too.
  Tensor f = Chain(Build({Cast("float32", true)}, false), Tensor::FromMat(img));
  const std::vector<proto::OpSpec> specs = {Normalize(), Hwc2Chw()};
  EXPECT_EQ(Chain(Build(specs, true), f.Clone()).bytes(),
            Chain(Build(specs, false), f.Clone()).bytes());
}

TEST(BatchedKernels, ApplyBatchEqualsPerElementApply) {
  std::vector<Tensor> images;
  for (int i = 0; i < 4; ++i) images.push_back(Tensor::FromMat(testing::MakeRgb(6, 5, i + 1)));
  proto::OpSpec one_hot;
  one_hot.mutable_one_hot()->set_num_classes(5);
  const std::vector<std::vector<proto::OpSpec>> cases = {{Normalize()},
                                                         {Hwc2Chw()},
                                                         {Cast("float16", true)},
                                                         {Normalize(), Hwc2Chw(), Cast("float32")}};
  for (const auto& specs : cases) {
    auto ops = Build(specs, true);
    ASSERT_EQ(ops.size(), 1u);
    SCOPED_TRACE(std::string(ops[0]->name()));
    ASSERT_TRUE(ops[0]->has_batched_kernel());
    std::vector<Tensor> outs;
    for (const Tensor& t : images) outs.push_back(*ops[0]->Apply(t.Clone(), {}));
    absl::StatusOr<Tensor> batch = Stack(images);
    ASSERT_TRUE(batch.ok());
    absl::StatusOr<Tensor> batched = ops[0]->ApplyBatch(std::move(*batch));
    ASSERT_TRUE(batched.ok()) << batched.status();
    EXPECT_EQ(batched->bytes(), Stack(outs)->bytes());
    EXPECT_EQ(batched->shape(), Stack(outs)->shape());
  }
  auto oh = Build({one_hot}, true);
  std::vector<Tensor> labels, outs;
  for (int64_t l : {0, 4, 2}) {
    labels.push_back(Tensor::Scalar<int64_t>(l));
    outs.push_back(*oh[0]->Apply(Tensor::Scalar<int64_t>(l), {}));
  }
  absl::StatusOr<Tensor> batched = oh[0]->ApplyBatch(*Stack(labels));
  ASSERT_TRUE(batched.ok());
  EXPECT_EQ(batched->bytes(), Stack(outs)->bytes());
  EXPECT_EQ(outs[1].data_as<float>()[4], 1.0f);
  EXPECT_EQ(outs[1].data_as<float>()[3], 0.0f);
  absl::StatusOr<Tensor> bad = oh[0]->Apply(Tensor::Scalar<int64_t>(5), {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("label 5"));
}

}  // namespace
}  // namespace sluice::data_worker
