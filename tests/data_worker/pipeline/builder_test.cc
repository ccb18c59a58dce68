#include <set>

#include "common/pipeline_spec/parse.h"
#include "data_worker/ops/registry.h"
#include "data_worker/pipeline/spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "sluice/pipeline_builder.h"

namespace sluice {
namespace {

TEST(PipelineBuilder, BuildsTheSameProtoAsTheShippedYaml) {
  auto yaml = sluice::pipeline_spec::LoadPipelineSpecFile(std::string(SLUICE_SOURCE_DIR) +
                                                          "/bench/pipelines/imagenet_train.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  const proto::Pipeline built =
      PipelineBuilder()
          .Dataset("/data/imagenet-train")
          .Columns({"image", "label"})
          .SourceWorkers(kAutotune)
          .Seed(0)
          .OnError("fail")
          .Shuffle(0)
          .Map({"image"}, {Decode(), RandomResizedCrop(224), RandomHorizontalFlip(),
                           Normalize(kImageNetMean, kImageNetStd), HWC2CHW()})
          .Batch(64)
          .Prefetch(kAutotune)
          .Build();
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(*yaml, built)) << diff;
}

TEST(PipelineBuilder, BuiltPipelinesAreValidated) {
  const proto::Pipeline bad =
      PipelineBuilder().Synthetic(8, 32, 32).Map({"image"}, {Decode(), CenterCrop(64)}).Build();
  const absl::Status s = data_worker::pipeline::Validate(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("map[0].ops[1] (CenterCrop)"), absl::string_view::npos) << s;
}

TEST(PipelineBuilder, BuildsTheSameCachedEvalPipelineAsTheShippedYaml) {
  auto yaml = sluice::pipeline_spec::LoadPipelineSpecFile(
      std::string(SLUICE_SOURCE_DIR) + "/bench/pipelines/imagenet_eval_cached.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  const proto::Pipeline built =
      PipelineBuilder()
          .Dataset("/data/imagenet-val")
          .Columns({"image", "label"})
          .Seed(0)
          .OnError("fail")
          .Map({"image"}, {Decode(), Resize(256), CenterCrop(224)})
          .Cache("eval")
          .Map({"image"}, {Normalize(kImageNetMean, kImageNetStd), HWC2CHW()})
          .Batch(64)
          .Build();
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(*yaml, built)) << diff;
}

// Adding an op means a builder function too: this list calls one per op, and
// must cover every registration (data_worker/ops/registry.h).
TEST(PipelineBuilder, HasAFunctionForEveryRegisteredOp) {
  const std::vector<proto::OpSpec> ops = {Decode(),
                                          Resize(8),
                                          CenterCrop(8),
                                          RandomResizedCrop(8),
                                          RandomCrop(8),
                                          RandomHorizontalFlip(),
                                          RandomRotation(10),
                                          ColorJitter(0.1f, 0.1f, 0.1f, 0.1f),
                                          Normalize(kImageNetMean, kImageNetStd),
                                          HWC2CHW(),
                                          Cast("float16"),
                                          OneHot(10),
                                          Spin(1),
                                          Sleep(1),
                                          Python("my_team.augment", "jitter", {"float32"})};
  std::set<int> built;
  for (const auto& op : ops) built.insert(op.op_case());
  for (const auto& r : data_worker::RegisteredOps()) {
    EXPECT_EQ(built.count(r.op_case), 1u) << r.type << " has no function in pipeline_builder.h";
  }
  EXPECT_EQ(built.size(), data_worker::RegisteredOps().size());
}

}  // namespace
}  // namespace sluice
