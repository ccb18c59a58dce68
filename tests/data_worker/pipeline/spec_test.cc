#include "data_worker/pipeline/spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/location.h"
#include "common/pipeline_spec/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker::pipeline {
namespace {

using ::testing::HasSubstr;

constexpr char kTrain[] = R"(
seed: 3
on_error: skip
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - shuffle: {seed: 5}
  - map:
      input_columns: [image]
      ops:
        - decode: {}
        - random_resized_crop: {size: 32}
        - random_horizontal_flip: {}
        - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
        - hwc2chw: {}
      num_parallel_workers: AUTOTUNE
  - filter: {predicate: "label in [1, 3]"}
  - batch: {size: 8, drop_remainder: true}
  - prefetch: {buffer_size: 4}
)";

class SpecTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::MakeDataset(dir_.Join("ds"), 12); }
  std::string Yaml(std::string text) const {
    return absl::StrReplaceAll(text, {{"DIR", dir_.Join("ds")}});
  }
  absl::Status ValidateYaml(const std::string& text) const {
    auto p = sluice::pipeline_spec::ParsePipelineSpec(Yaml(text));
    if (!p.ok()) return p.status();
    return Validate(*p).status();
  }
  sluice::testing::TempDir dir_;
};

TEST_F(SpecTest, YamlParsesIntoTheProto) {
  auto p = sluice::pipeline_spec::ParsePipelineSpec(Yaml(kTrain));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->seed(), 3u);
  EXPECT_EQ(p->on_error(), "skip");
  ASSERT_EQ(p->nodes_size(), 5);
  EXPECT_EQ(p->nodes(1).map().ops_size(), 5);
  EXPECT_EQ(p->nodes(1).map().ops(1).random_resized_crop().size(), 32);
  EXPECT_EQ(p->nodes(1).map().num_parallel_workers(), -1);
  EXPECT_EQ(p->nodes(2).filter().predicate(), "label in [1, 3]");
  EXPECT_TRUE(p->nodes(3).batch().drop_remainder());
  auto lp = Validate(*p);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_TRUE(lp->shuffle);
  EXPECT_TRUE(lp->skip_errors);
  EXPECT_EQ(lp->prefetch, 4);
  ASSERT_EQ(lp->nodes.size(), 2u);
  EXPECT_TRUE(lp->nodes[1].filter->pushable);
}

TEST_F(SpecTest, JsonIsAcceptedToo) {
  const std::string json = Yaml(
      R"({"source": {"dataset": {"path": "DIR"}, "columns": ["image", "label"]},
    "nodes": [{"map": {"input_columns": ["image"], "ops": [{"decode": {}}, {"resize": {"height": 16, "width": 16}}],
                       "num_parallel_workers": "AUTOTUNE"}},
              {"batch": {"size": 4}}]})");
  auto p = sluice::pipeline_spec::ParsePipelineSpec(json);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->nodes(0).map().ops(1).resize().height(), 16);
  EXPECT_TRUE(Validate(*p).ok());
}

TEST_F(SpecTest, UnknownOpNamesTheNode) {
  const absl::Status s = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map: {input_columns: [image], ops: [{resize: {size: 8}}, {hwc2chw: {}}, {blur: {sigma: 2}}]}
)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("map[1].ops[2]: unknown op 'blur'"));
}

TEST_F(SpecTest, UnknownFieldOfAnOpIsRejected) {
  const absl::Status s = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {sise: 8}}]}
)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("map[0].ops[1]"));
}

TEST_F(SpecTest, UnknownColumnNamesTheNode) {
  const absl::Status s = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [picture], ops: [{decode: {}}]}
)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("map[0].input_columns: unknown column 'picture'"));
}

TEST_F(SpecTest, WrongDtypeNamesTheOp) {
  const absl::Status s = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map: {input_columns: [label], ops: [{decode: {}}]}
)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("map[1].ops[0] (Decode): expected encoded image bytes"));
  EXPECT_THAT(s.message(), HasSubstr("int64"));
  const absl::Status n = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{normalize: {mean: [0.5], std: [0.5]}}]}
)");
  EXPECT_THAT(n.message(), HasSubstr("map[0].ops[0] (Normalize)"));
}

TEST_F(SpecTest, ZeroAndNegativeSizesAreRejected) {
  const absl::Status zero = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 8}}]}
  - map: {input_columns: [image], ops: [{center_crop: {size: 4}}, {resize: {size: 4}}, {random_resized_crop: {size: 0}}]}
)");
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("map[1].ops[2] (RandomResizedCrop)"));
  const absl::Status neg = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: -3}}]}
)");
  EXPECT_EQ(neg.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(neg.message(), HasSubstr("map[0].ops[1] (Resize)"));
  const absl::Status batch = ValidateYaml(R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes: [{batch: {size: 0}}]
)");
  EXPECT_THAT(batch.message(), HasSubstr("batch.size: must be > 0"));
}

TEST_F(SpecTest, ThreadCountsOverTheCapAreRejectedBeforeAnyThreadStarts) {
  const absl::Status map = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}], num_parallel_workers: 2147483647}
)");
  EXPECT_EQ(map.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(map.message(), HasSubstr("num_parallel_workers: must be > 0 or AUTOTUNE, and at "
                                       "most 256"));
  const absl::Status source = ValidateYaml(R"(
source: {dataset: {path: DIR}, num_parallel_workers: 257}
)");
  EXPECT_THAT(source.message(), HasSubstr("num_parallel_workers must be > 0 or AUTOTUNE, and at "
                                          "most 256"));
  const absl::Status batch = ValidateYaml(R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes: [{batch: {size: 4, num_parallel_workers: 100000}}]
)");
  EXPECT_THAT(batch.message(), HasSubstr("batch.num_parallel_workers"));
  EXPECT_TRUE(ValidateYaml(R"(
source: {dataset: {path: DIR}, columns: [label], num_parallel_workers: 256}
)")
                  .ok());
}

TEST_F(SpecTest, ValidationErrorsCarryAStructuredLocation) {
  const absl::Status op = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map: {input_columns: [image], ops: [{resize: {size: 8}}, {hwc2chw: {}}, {random_resized_crop: {size: 0}}]}
)");
  auto loc = pipeline_spec::GetSpecLocation(op);
  ASSERT_TRUE(loc.has_value()) << op;
  EXPECT_EQ(*loc, (pipeline_spec::SpecLocation{"map", 1, 2, "RandomResizedCrop", "size"}));
  EXPECT_EQ(op.message(), "map[1].ops[2] (RandomResizedCrop): size must be > 0");
  const absl::Status batch = ValidateYaml(R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes: [{batch: {size: 0}}]
)");
  loc = pipeline_spec::GetSpecLocation(batch);
  ASSERT_TRUE(loc.has_value()) << batch;
  EXPECT_EQ(*loc, (pipeline_spec::SpecLocation{"batch", -1, -1, "", "size"}));
  const absl::Status column = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [picture], ops: [{decode: {}}]}
)");
  loc = pipeline_spec::GetSpecLocation(column);
  ASSERT_TRUE(loc.has_value()) << column;
  EXPECT_EQ(*loc, (pipeline_spec::SpecLocation{"map", 0, -1, "", "input_columns"}));
}

TEST_F(SpecTest, CropLargerThanTheImageIsRejected) {
  const absl::Status s = ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {size: 32}}, {center_crop: {size: 48}}]}
)");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("map[0].ops[2] (CenterCrop): crop 48x48 is larger than the image"));
  auto p = sluice::pipeline_spec::ParsePipelineSpec(R"(
source: {synthetic: {num_records: 4, height: 64, width: 80}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {center_crop: {height: 70, width: 10}}]}
)");
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(Validate(*p).status().message(),
              HasSubstr("crop 70x10 is larger than the image (64x80)"));
}

TEST_F(SpecTest, MissingSourcePathIsNotFound) {
  auto p = sluice::pipeline_spec::ParsePipelineSpec(
      "source: {dataset: {path: /nonexistent/sluice-ds}}\n");
  ASSERT_TRUE(p.ok());
  const absl::Status s = Validate(*p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("source: path '/nonexistent/sluice-ds' does not exist"));
  auto f = sluice::pipeline_spec::ParsePipelineSpec(
      "source: {image_folder: {path: /nonexistent/imgs}}\n");
  EXPECT_EQ(Validate(*f).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SpecTest, OrderRulesAndBatchOfStrings) {
  EXPECT_THAT(ValidateYaml(R"(
source: {dataset: {path: DIR}, columns: [label]}
nodes: [{batch: {size: 2}}, {shuffle: {seed: 1}}]
)")
                  .message(),
              HasSubstr("shuffle must be the first node"));
  EXPECT_THAT(ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes: [{map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 8}}]}}, {batch: {size: 2}}]
)")
                  .message(),
              HasSubstr("batch: column 'key' is string"));
  EXPECT_THAT(ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes: [{filter: {predicate: "key == 3"}}]
)")
                  .message(),
              HasSubstr("filter[0].predicate: column 'key' is string"));
  EXPECT_THAT(ValidateYaml(R"(
source: {dataset: {path: DIR}}
nodes: [{teleport: {}}]
)")
                  .message(),
              HasSubstr("nodes[0]: unknown node 'teleport'"));
  EXPECT_THAT(ValidateYaml("source: {dataset: {path: DIR}}\non_error: ignore\n").message(),
              HasSubstr("on_error"));
  const absl::Status finish = ValidateYaml("source: {dataset: {path: DIR}}\nfinish: gpu\n");
  EXPECT_EQ(finish.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(finish.message(), HasSubstr("finish: 'gpu' is not one of auto, worker, client"));
  for (const char* ok : {"auto", "worker", "client"}) {
    EXPECT_TRUE(
        ValidateYaml(absl::StrCat("source: {dataset: {path: DIR}}\nfinish: ", ok, "\n")).ok())
        << ok;
  }
}

TEST_F(SpecTest, OutputsAreCheckedAgainstTheInferredTypes) {
  auto p = sluice::pipeline_spec::ParsePipelineSpec(R"(
source: {synthetic: {num_records: 4, height: 64, width: 80}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [decode, {resize: {size: 32}}, hwc2chw]}
  - batch: {size: 2}
)");
  ASSERT_TRUE(p.ok()) << p.status();
  auto lp = Validate(*p);
  ASSERT_TRUE(lp.ok()) << lp.status();
  ASSERT_EQ(lp->column_types.size(), 2u);
  EXPECT_EQ(lp->column_types[0].ToString(), "uint8[3,32,40]");
  std::vector<Tensor> batch;
  batch.push_back(Tensor::Allocate(DType::kUint8, {2, 3, 32, 40}));
  batch.push_back(Tensor::Allocate(DType::kInt64, {2}));
  EXPECT_TRUE(CheckOutputType(*lp, batch, /*batched=*/true).ok());
  batch[0] = Tensor::Allocate(DType::kUint8, {2, 3, 32, 41});
  const absl::Status s = CheckOutputType(*lp, batch, /*batched=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "output column 'image' is uint8[2,3,32,41], the spec says "
            "uint8[N,3,32,40] (-1: any size)");
  batch[0] = Tensor::Allocate(DType::kFloat32, {2, 3, 32, 40});
  EXPECT_EQ(CheckOutputType(*lp, batch, true).code(), absl::StatusCode::kInternal);
  batch.pop_back();
  EXPECT_EQ(CheckOutputType(*lp, batch, true).code(), absl::StatusCode::kInternal);
}

TEST(SpecFileTest, ShippedBenchSpecsParse) {
  for (const char* name : {"imagenet_train.yaml", "imagenet_eval.yaml"}) {
    auto p = sluice::pipeline_spec::LoadPipelineSpecFile(
        absl::StrCat(SLUICE_SOURCE_DIR, "/bench/pipelines/", name));
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    // Point them at a synthetic source: everything else must validate.
    p->mutable_source()->clear_dataset();
    p->mutable_source()->mutable_synthetic()->set_num_records(4);
    EXPECT_TRUE(Validate(*p).ok()) << name << ": " << Validate(*p).status();
  }
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
