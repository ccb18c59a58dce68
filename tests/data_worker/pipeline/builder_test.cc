#include "data_worker/pipeline/spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "sluice/pipeline_builder.h"

namespace sluice {
namespace {

TEST(PipelineBuilder, BuildsTheSameProtoAsTheShippedYaml) {
  auto yaml = data_worker::pipeline::LoadPipelineFile(
      std::string(SLUICE_SOURCE_DIR) + "/bench/pipelines/imagenet_train.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  const proto::Pipeline built =
      PipelineBuilder()
          .Dataset("/data/imagenet-train")
          .Columns({"image", "label"})
          .SourceWorkers(kAutotune)
          .Seed(0)
          .OnError("fail")
          .Shuffle(0)
          .Map({"image"},
               {Decode(), RandomResizedCrop(224), RandomHorizontalFlip(),
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
  const proto::Pipeline bad = PipelineBuilder()
                                  .Synthetic(8, 32, 32)
                                  .Map({"image"}, {Decode(), CenterCrop(64)})
                                  .Build();
  const absl::Status s = data_worker::pipeline::Validate(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("map[0].ops[1] (CenterCrop)"),
            absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace sluice
