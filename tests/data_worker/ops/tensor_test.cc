#include "data_worker/ops/tensor.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::data_worker {
namespace {

using ::testing::HasSubstr;

TEST(Tensor, AllocateSetsShapeAndSize) {
  Tensor t = Tensor::Allocate(DType::kFloat32, {2, 3, 4});
  EXPECT_EQ(t.num_elements(), 24);
  EXPECT_EQ(t.num_bytes(), 96u);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4}));
}

TEST(Tensor, FromBytesSurvivesMovesOfShortStrings) {
  Tensor a = Tensor::FromBytes("abc");
  Tensor b = std::move(a);
  Tensor c;
  c = std::move(b);
  EXPECT_EQ(c.bytes(), "abc");
  EXPECT_EQ(c.dtype(), DType::kBytes);
  EXPECT_TRUE(c.shape().empty());
}

TEST(Tensor, TruncateLeadingKeepsTheFirstRowsInPlace) {
  Tensor t = Tensor::Allocate(DType::kInt32, {4, 3});
  for (int i = 0; i < 12; ++i) t.data_as<int32_t>()[i] = i;
  const uint8_t* before = t.data();
  t.TruncateLeading(2);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.num_bytes(), 24u);
  EXPECT_EQ(t.data(), before);
  EXPECT_EQ(t.data_as<int32_t>()[5], 5);
  Tensor moved = std::move(t);
  EXPECT_EQ(moved.num_bytes(), 24u);
  EXPECT_EQ(moved.Clone().num_bytes(), 24u);
}

TEST(Tensor, ReallocateReusesTheBufferWhenItIsLargeEnough) {
  Tensor t = Tensor::Allocate(DType::kFloat32, {4, 4});
  const uint8_t* buffer = t.data();
  t.Clear();
  EXPECT_EQ(t.num_bytes(), 0u);
  EXPECT_EQ(t.shape(), std::vector<int64_t>({0}));
  EXPECT_EQ(t.capacity(), 64u);
  t.Reallocate(DType::kInt64, {2});
  EXPECT_EQ(t.dtype(), DType::kInt64);
  EXPECT_EQ(t.shape(), std::vector<int64_t>({2}));
  EXPECT_EQ(t.num_bytes(), 16u);
  EXPECT_EQ(t.data(), buffer);
  t.Reallocate(DType::kUint8, {65});
  EXPECT_EQ(t.num_bytes(), 65u);
  EXPECT_EQ(t.capacity(), 65u);
  EXPECT_NE(t.data(), buffer);
  // A bytes tensor becomes numeric.
  Tensor b = Tensor::FromBytes("key");
  b.Reallocate(DType::kInt32, {});
  EXPECT_EQ(b.dtype(), DType::kInt32);
  EXPECT_EQ(b.num_bytes(), 4u);
  EXPECT_TRUE(b.shape().empty());
}

TEST(Tensor, ScalarAndCloneAreIndependent) {
  Tensor s = Tensor::Scalar<int64_t>(7);
  Tensor c = s.Clone();
  *s.data_as<int64_t>() = 8;
  EXPECT_EQ(*c.data_as<int64_t>(), 7);
  EXPECT_EQ(c.dtype(), DType::kInt64);
  EXPECT_EQ(c.rank(), 0);
}

TEST(Tensor, AsMatViewsWithoutCopy) {
  Tensor t = Tensor::Allocate(DType::kUint8, {4, 5, 3});
  cv::Mat m = t.AsMat();
  EXPECT_EQ(m.data, t.data());
  EXPECT_EQ(m.rows, 4);
  EXPECT_EQ(m.cols, 5);
  EXPECT_EQ(m.type(), CV_8UC3);
  m.setTo(cv::Scalar::all(9));
  EXPECT_EQ(t.data()[59], 9);
  EXPECT_TRUE(Tensor::Allocate(DType::kInt64, {2, 2}).AsMat().empty());
  EXPECT_EQ(Tensor::Allocate(DType::kFloat32, {2, 2}).AsMat().type(), CV_32FC1);
}

TEST(Tensor, StackAndUnstackRoundTrip) {
  std::vector<Tensor> parts;
  for (int i = 0; i < 3; ++i) {
    Tensor t = Tensor::Allocate(DType::kInt32, {2});
    t.data_as<int32_t>()[0] = i;
    t.data_as<int32_t>()[1] = 10 * i;
    parts.push_back(std::move(t));
  }
  absl::StatusOr<Tensor> batch = Stack(parts);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(batch->data_as<int32_t>()[5], 20);
  absl::StatusOr<std::vector<Tensor>> back = Unstack(*batch);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*back)[i].bytes(), parts[i].bytes());
}

TEST(Tensor, StackRejectsRaggedAndEmptyInput) {
  std::vector<Tensor> parts;
  parts.push_back(Tensor::Allocate(DType::kUint8, {4, 4, 3}));
  parts.push_back(Tensor::Allocate(DType::kUint8, {4, 5, 3}));
  absl::StatusOr<Tensor> batch = Stack(parts);
  ASSERT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batch.status().message(), HasSubstr("[4,4,3]"));
  EXPECT_THAT(batch.status().message(), HasSubstr("[4,5,3]"));
  EXPECT_EQ(Stack({}).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<Tensor> bytes;
  bytes.push_back(Tensor::FromBytes("x"));
  EXPECT_EQ(Stack(bytes).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::data_worker
