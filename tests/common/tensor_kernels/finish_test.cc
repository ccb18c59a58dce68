// The client's trainer-side finishing gives the bits the worker's ops give
// (fused and vectorized, as the worker runs them), whatever the slices the
// column arrived in; and only tails it can run are accepted.
#include "common/tensor_kernels/finish.h"

#include <cstring>
#include <string>
#include <vector>

#include "data_worker/ops/op.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::kernels {
namespace {

using ::testing::HasSubstr;

proto::OpSpec Normalize(std::vector<float> mean, std::vector<float> std) {
  proto::OpSpec op;
  for (float m : mean) op.mutable_normalize()->add_mean(m);
  for (float s : std) op.mutable_normalize()->add_std(s);
  return op;
}
proto::OpSpec Hwc2Chw() {
  proto::OpSpec op;
  op.mutable_hwc2chw();
  return op;
}
proto::OpSpec Cast(const std::string& dtype) {
  proto::OpSpec op;
  op.mutable_cast()->set_dtype(dtype);
  return op;
}

// What the worker computes: the ops built and fused as the worker builds
// them, run on the batch (ApplyBatch).
data_worker::Tensor OnWorker(const std::vector<proto::OpSpec>& specs, data_worker::Tensor batch) {
  auto ops = data_worker::BuildOps(specs, /*first_position=*/0, /*fuse=*/true);
  EXPECT_TRUE(ops.ok()) << ops.status();
  for (const auto& op : *ops) {
    auto out = op->ApplyBatch(std::move(batch));
    EXPECT_TRUE(out.ok()) << out.status();
    batch = std::move(*out);
  }
  return batch;
}

proto::OpSpec Flip() {
  proto::OpSpec op;
  op.mutable_random_horizontal_flip()->set_p(1.0);  // mirrors every element it is run on
  return op;
}

// What the worker's RandomHorizontalFlip makes of the elements of `batch` whose flag is set.
data_worker::Tensor MirroredOnWorker(const std::vector<bool>& flags, data_worker::Tensor batch) {
  auto flip = data_worker::BuildOps({Flip()}, /*first_position=*/0, /*fuse=*/false);
  EXPECT_TRUE(flip.ok()) << flip.status();
  const std::vector<int64_t> shape(batch.shape().begin() + 1, batch.shape().end());
  const size_t bytes = batch.num_bytes() / flags.size();
  for (size_t i = 0; i < flags.size(); ++i) {
    if (!flags[i]) continue;
    data_worker::Tensor one = data_worker::Tensor::Allocate(batch.dtype(), shape);
    std::memcpy(one.data(), batch.data() + i * bytes, bytes);
    auto out = (*flip)[0]->Apply(std::move(one), data_worker::ElementContext{});
    EXPECT_TRUE(out.ok()) << out.status();
    std::memcpy(batch.data() + i * bytes, out->data(), bytes);
  }
  return batch;
}

TEST(Finisher, GivesTheWorkersBitsAtAnySliceBoundaries) {
  const std::vector<std::vector<proto::OpSpec>> tails = {
      {Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}), Hwc2Chw()},
      {Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}), Hwc2Chw(), Cast("float32")},
      {Normalize({0.5f}, {0.25f})},
      {Normalize({0.1f, 0.2f, 0.3f}, {0.3f, 0.2f, 0.1f}), Cast("float32")},
  };
  // Without a flip, and with one whose draws mirror the first and last element (uint8 into
  // C×H×W: the kernel reads those rows right to left; anything else: mirrored into scratch).
  const std::vector<std::vector<bool>> mirrors = {{}, {true, false, true}};
  for (const record::DType dtype : {record::DType::kUint8, record::DType::kFloat32}) {
    for (const std::vector<bool>& flags : mirrors) {
      for (std::vector<proto::OpSpec> tail : tails) {
        const std::vector<int64_t> shape = {3, 5, 37, 3};  // odd widths
        data_worker::Tensor batch = data_worker::Tensor::Allocate(dtype, shape);
        for (int64_t i = 0; i < batch.num_elements(); ++i) {
          if (dtype == record::DType::kUint8) {
            batch.data()[i] = static_cast<uint8_t>(i * 37 + 11);
          } else {
            batch.data_as<float>()[i] = static_cast<float>(i % 251) / 7.0f;
          }
        }
        const std::string in(reinterpret_cast<const char*>(batch.data()), batch.num_bytes());
        if (!flags.empty()) {
          batch = MirroredOnWorker(flags, std::move(batch));
          tail.insert(tail.begin(), Flip());
        }
        const data_worker::Tensor want =
            OnWorker(std::vector<proto::OpSpec>(tail.begin() + (flags.empty() ? 0 : 1), tail.end()),
                     std::move(batch));
        absl::StatusOr<Finisher> f = Finisher::Create(tail, dtype, shape);
        ASSERT_EQ(f.ok() && f->mirrors(), !flags.empty());
        ASSERT_TRUE(f.ok()) << f.status();
        ASSERT_EQ(f->out_shape(), want.shape());
        ASSERT_EQ(f->out_bytes(), want.num_bytes());
        ASSERT_EQ(f->in_bytes(), in.size());
        for (size_t piece : {size_t{1}, size_t{4}, size_t{1000}, in.size()}) {
          std::vector<absl::Span<const uint8_t>> pieces;
          for (size_t i = 0; i < in.size(); i += piece) {
            pieces.emplace_back(reinterpret_cast<const uint8_t*>(in.data()) + i,
                                std::min(piece, in.size() - i));
          }
          std::vector<float> got(f->out_bytes() / sizeof(float), -1.0f);
          const bool flag_storage[] = {flags.size() > 0 && flags[0], flags.size() > 1 && flags[1],
                                       flags.size() > 2 && flags[2]};
          ASSERT_TRUE(
              f->Run(pieces, absl::MakeConstSpan(flag_storage, flags.size()), got.data()).ok());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.num_bytes()), 0)
              << "tail of " << tail.size() << " ops, pieces of " << piece << ", "
              << (flags.empty() ? "no flip" : "flip");
        }
      }
    }
  }
}

TEST(Finisher, RunsOnlyWithOneMirrorFlagPerElementAfterAFlip) {
  const int64_t shape[] = {2, 4, 4, 3};
  const std::vector<proto::OpSpec> plain = {Normalize({0.5f}, {0.2f}), Hwc2Chw()};
  const std::vector<proto::OpSpec> flipped = {Flip(), Normalize({0.5f}, {0.2f}), Hwc2Chw()};
  const std::string in(2 * 4 * 4 * 3, '\x7f');
  const std::vector<absl::Span<const uint8_t>> pieces = {
      {reinterpret_cast<const uint8_t*>(in.data()), in.size()}};
  std::vector<float> out(2 * 4 * 4 * 3, -1.0f);
  const bool one[] = {true};
  const bool two[] = {true, false};
  absl::StatusOr<Finisher> f = Finisher::Create(flipped, record::DType::kUint8, shape);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Run(pieces, {}, out.data()).message(),
            "finish begins with random_horizontal_flip: 2 mirror flags expected, 0 given");
  EXPECT_EQ(f->Run(pieces, one, out.data()).message(),
            "finish begins with random_horizontal_flip: 2 mirror flags expected, 1 given");
  EXPECT_EQ(out[0], -1.0f);  // nothing written
  EXPECT_TRUE(f->Run(pieces, two, out.data()).ok());
  absl::StatusOr<Finisher> g = Finisher::Create(plain, record::DType::kUint8, shape);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(g->mirrors());
  EXPECT_EQ(g->Run(pieces, two, out.data()).message(),
            "finish carries mirror flags but does not begin with random_horizontal_flip");
  // A flip alone, or one after the normalize, is no tail.
  EXPECT_FALSE(Finisher::Create({Flip()}, record::DType::kUint8, shape).ok());
  EXPECT_FALSE(
      Finisher::Create({Normalize({0.5f}, {0.2f}), Flip()}, record::DType::kUint8, shape).ok());
}

TEST(ClientTailLength, IsTheNormalizeTailWithTheFlipBeforeItAndNothingElse) {
  const proto::OpSpec norm = Normalize({0.5f}, {0.5f});
  proto::OpSpec flip;
  flip.mutable_random_horizontal_flip();
  using Ops = std::vector<proto::OpSpec>;
  EXPECT_EQ(ClientTailLength(Ops{flip, norm, Hwc2Chw()}), 3u);
  EXPECT_EQ(ClientTailLength(Ops{flip, norm, Hwc2Chw(), Cast("float32")}), 4u);
  EXPECT_EQ(ClientTailLength(Ops{flip, flip, norm}), 2u);
  EXPECT_EQ(ClientTailLength(Ops{norm}), 1u);
  EXPECT_EQ(ClientTailLength(Ops{norm, Cast("float16")}), 0u);
  EXPECT_EQ(ClientTailLength(Ops{Hwc2Chw(), norm, flip}), 0u);
  EXPECT_EQ(ClientTailLength(Ops{Hwc2Chw()}), 0u);
  proto::OpSpec chw_norm = norm;
  chw_norm.mutable_normalize()->set_channels_first(true);
  EXPECT_EQ(ClientTailLength(Ops{Hwc2Chw(), chw_norm}), 0u);
}

TEST(Finisher, RefusesWhatItCannotRun) {
  const int64_t shape[] = {2, 4, 4, 3};
  const std::vector<proto::OpSpec> ok = {Normalize({0.5f, 0.5f, 0.5f}, {0.2f, 0.2f, 0.2f}),
                                         Hwc2Chw()};
  EXPECT_TRUE(Finisher::Create(ok, record::DType::kUint8, shape).ok());
  EXPECT_THAT(Finisher::Create({Hwc2Chw()}, record::DType::kUint8, shape).status().message(),
              HasSubstr("not a tail the client runs"));
  EXPECT_THAT(Finisher::Create(ok, record::DType::kInt64, shape).status().message(),
              HasSubstr("uint8 or float32"));
  const int64_t two_channels[] = {2, 4, 4, 2};
  EXPECT_THAT(Finisher::Create(ok, record::DType::kUint8, two_channels).status().message(),
              HasSubstr("2 channels but 3"));
  EXPECT_FALSE(Finisher::Create({Normalize({0.5f}, {0.0f})}, record::DType::kUint8, shape).ok());
  const int64_t rank3[] = {2, 4, 4};
  EXPECT_FALSE(Finisher::Create(ok, record::DType::kUint8, rank3).ok());
}

}  // namespace
}  // namespace sluice::kernels
