#include "data_worker/ops/op.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::data_worker {
namespace {

using ::testing::HasSubstr;

absl::Status BuildStatus(std::vector<proto::OpSpec> specs, int first = 0) {
  return BuildOps(specs, first, /*fuse=*/true).status();
}

void ExpectInvalid(const absl::Status& s, const std::string& what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(what)) << s;
}

TEST(BuildOps, SizesOverTheCapsAreRefusedBeforeAnythingIsAllocated) {
  proto::OpSpec resize;
  resize.mutable_resize()->set_height(100000);
  resize.mutable_resize()->set_width(100);
  ExpectInvalid(BuildStatus({resize}), "op 0 (Resize): height must be at most 16384, got 100000");
  proto::OpSpec shorter;
  shorter.mutable_resize()->set_size(20000);
  ExpectInvalid(BuildStatus({shorter}), "op 0 (Resize): size must be at most 16384, got 20000");
  proto::OpSpec crop;
  crop.mutable_center_crop()->set_size(16385);
  ExpectInvalid(BuildStatus({crop}), "op 0 (CenterCrop): size must be at most 16384, got 16385");
  proto::OpSpec rrc;
  rrc.mutable_random_resized_crop()->set_size(9000);
  ExpectInvalid(BuildStatus({rrc}),
                "op 0 (RandomResizedCrop): size 9000x9000 is more than "
                "67108864 pixels");
  proto::OpSpec pad;
  pad.mutable_random_crop()->set_size(8);
  pad.mutable_random_crop()->set_padding(1 << 30);
  ExpectInvalid(BuildStatus({pad}),
                "op 0 (RandomCrop): padding must be in [0, 16384], got "
                "1073741824");
  proto::OpSpec onehot;
  onehot.mutable_one_hot()->set_num_classes(1 << 30);
  ExpectInvalid(BuildStatus({onehot}),
                "op 0 (OneHot): num_classes must be in [1, 1048576], got "
                "1073741824");
  // The caps themselves are allowed.
  rrc.mutable_random_resized_crop()->set_size(8192);
  onehot.mutable_one_hot()->set_num_classes(1 << 20);
  EXPECT_TRUE(BuildStatus({rrc, onehot}).ok());
}

TEST(BuildOps, BadSpecsNameOpIndexTypeAndField) {
  std::vector<proto::OpSpec> specs(3);
  specs[0].mutable_decode();
  specs[1].mutable_random_horizontal_flip();
  specs[2].mutable_random_resized_crop()->set_size(0);
  ExpectInvalid(BuildStatus(specs), "op 2 (RandomResizedCrop): size must be > 0");
  ExpectInvalid(BuildStatus(specs, /*first=*/5), "op 7 (RandomResizedCrop)");

  proto::OpSpec empty;
  ExpectInvalid(BuildStatus({empty}), "op 0 (unknown): no op set");

  proto::OpSpec neg;
  neg.mutable_resize()->set_size(-3);
  ExpectInvalid(BuildStatus({neg}), "op 0 (Resize): size must be > 0");
  proto::OpSpec both;
  both.mutable_center_crop()->set_size(3);
  both.mutable_center_crop()->set_height(3);
  ExpectInvalid(BuildStatus({both}), "op 0 (CenterCrop): set either size");
  proto::OpSpec no_width;
  no_width.mutable_random_crop()->set_height(3);
  ExpectInvalid(BuildStatus({no_width}), "op 0 (RandomCrop): width must be > 0");

  proto::OpSpec scale;
  scale.mutable_random_resized_crop()->set_size(224);
  scale.mutable_random_resized_crop()->set_scale_min(0.9f);
  scale.mutable_random_resized_crop()->set_scale_max(0.5f);
  ExpectInvalid(BuildStatus({scale}), "op 0 (RandomResizedCrop): scale");
  proto::OpSpec ratio;
  ratio.mutable_random_resized_crop()->set_size(224);
  ratio.mutable_random_resized_crop()->set_ratio_min(2);
  ratio.mutable_random_resized_crop()->set_ratio_max(1);
  ExpectInvalid(BuildStatus({ratio}), "op 0 (RandomResizedCrop): ratio");

  proto::OpSpec std0;
  std0.mutable_normalize()->add_mean(0.5f);
  std0.mutable_normalize()->add_std(0.0f);
  ExpectInvalid(BuildStatus({std0}), "op 0 (Normalize): std must be non-zero");
  proto::OpSpec mismatch;
  mismatch.mutable_normalize()->add_mean(0.5f);
  mismatch.mutable_normalize()->add_mean(0.5f);
  mismatch.mutable_normalize()->add_std(1);
  mismatch.mutable_normalize()->add_std(1);
  mismatch.mutable_normalize()->add_std(1);
  ExpectInvalid(BuildStatus({mismatch}), "op 0 (Normalize): mean has 2 values");

  proto::OpSpec flip;
  flip.mutable_random_horizontal_flip()->set_p(1.5f);
  ExpectInvalid(BuildStatus({flip}), "op 0 (RandomHorizontalFlip): p must be");
  proto::OpSpec hue;
  hue.mutable_color_jitter()->set_hue(0.7f);
  ExpectInvalid(BuildStatus({hue}), "op 0 (ColorJitter): hue");
  proto::OpSpec brightness;
  brightness.mutable_color_jitter()->set_brightness(-1);
  ExpectInvalid(BuildStatus({brightness}), "op 0 (ColorJitter): brightness");
  proto::OpSpec cast;
  cast.mutable_cast()->set_dtype("float64");
  ExpectInvalid(BuildStatus({cast}), "op 0 (Cast): dtype");
  proto::OpSpec onehot;
  onehot.mutable_one_hot()->set_num_classes(0);
  ExpectInvalid(BuildStatus({onehot}), "op 0 (OneHot): num_classes");
  proto::OpSpec rotation;
  rotation.mutable_random_rotation()->set_degrees(-1);
  ExpectInvalid(BuildStatus({rotation}), "op 0 (RandomRotation): degrees");
  proto::OpSpec spin;
  spin.mutable_spin()->set_cpu_micros(-1);
  ExpectInvalid(BuildStatus({spin}), "op 0 (Spin): cpu_micros");
}

TEST(BuildOps, FusesOnlyWhenAskedAndKeepsOtherOps) {
  std::vector<proto::OpSpec> specs(6);
  specs[0].mutable_decode();
  specs[1].mutable_center_crop()->set_size(8);
  specs[2].mutable_normalize()->add_mean(0.5f);
  specs[2].mutable_normalize()->add_std(0.5f);
  specs[3].mutable_hwc2chw();
  specs[4].mutable_cast()->set_dtype("float16");
  specs[5].mutable_sleep();
  auto fused = BuildOps(specs, 0, /*fuse=*/true);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_EQ(fused->size(), 3u);
  EXPECT_EQ((*fused)[0]->name(), "Decode+CenterCrop");
  EXPECT_EQ((*fused)[1]->name(), "Normalize+HWC2CHW+Cast");
  EXPECT_EQ((*fused)[2]->name(), "Sleep");
  auto unfused = BuildOps(specs, 0, /*fuse=*/false);
  ASSERT_TRUE(unfused.ok());
  EXPECT_EQ(unfused->size(), 6u);
}

TEST(BuildOps, SpinBurnsThreadCpuTimeAndPassesInputThrough) {
  proto::OpSpec spin;
  spin.mutable_spin()->set_cpu_micros(20000);
  auto ops = BuildOps({spin}, 0, true);
  ASSERT_TRUE(ops.ok());
  timespec a, b;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  absl::StatusOr<Tensor> out = (*ops)[0]->Apply(Tensor::FromBytes("x"), {});
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->bytes(), "x");
  const double spent = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
  EXPECT_GE(spent, 0.020);
}

TEST(BuildOps, RandomOpsHaveNoBatchedKernel) {
  proto::OpSpec flip;
  flip.mutable_random_horizontal_flip();
  auto ops = BuildOps({flip}, 0, true);
  ASSERT_TRUE(ops.ok());
  EXPECT_FALSE((*ops)[0]->has_batched_kernel());
  EXPECT_EQ((*ops)[0]->ApplyBatch(Tensor::Allocate(DType::kUint8, {1, 2, 2, 3})).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace sluice::data_worker
