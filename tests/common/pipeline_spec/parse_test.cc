#include "common/pipeline_spec/parse.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/pipeline_spec/location.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::pipeline_spec {
namespace {

using ::testing::HasSubstr;

TEST(ParsePipelineSpec, YamlAndJsonGiveTheSameProto) {
  auto yaml = ParsePipelineSpec(R"(
seed: 18446744073709551615
source: {synthetic: {num_records: 4}}
nodes:
  - map: {input_columns: [image], ops: [decode, {resize: {size: 8}}],
          num_parallel_workers: autotune}
  - batch: {size: 2}
)");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto json = ParsePipelineSpec(R"(  {"seed": 18446744073709551615,
    "source": {"synthetic": {"num_records": 4}},
    "nodes": [{"map": {"input_columns": ["image"],
                       "ops": ["decode", {"resize": {"size": 8}}],
                       "num_parallel_workers": "AUTOTUNE"}},
              {"batch": {"size": 2}}]})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(yaml->SerializeAsString(), json->SerializeAsString());
  EXPECT_EQ(yaml->seed(), 18446744073709551615u);
  EXPECT_EQ(yaml->nodes(0).map().num_parallel_workers(), -1);
  EXPECT_TRUE(yaml->nodes(0).map().ops(0).has_decode());
  EXPECT_EQ(yaml->nodes(0).map().ops(1).resize().size(), 8);
}

TEST(ParsePipelineSpec, YamlFlowMappingIsNotMistakenForJson) {
  auto p = ParsePipelineSpec("{source: {synthetic: {num_records: 3}}}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source().synthetic().num_records(), 3);
}

TEST(ParsePipelineSpec, QuotedNumbersStayStrings) {
  auto p = ParsePipelineSpec(R"(
source: {dataset: {path: "123"}}
nodes: [{filter: {predicate: "5"}}]
)");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source().dataset().path(), "123");
  EXPECT_EQ(p->nodes(0).filter().predicate(), "5");
}

TEST(ParsePipelineSpec, UnknownOpCarriesItsLocationAndTheOpList) {
  const absl::Status s = ParsePipelineSpec(R"(
nodes:
  - map: {ops: [decode]}
  - map: {ops: [resize, hwc2chw, {blur: {sigma: 2}}]}
)")
                             .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("map[1].ops[2]: unknown op 'blur' (ops: decode, "
                                     "resize, center_crop, random_resized_crop"));
  auto loc = GetSpecLocation(s);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->node, "map");
  EXPECT_EQ(loc->node_index, 1);
  EXPECT_EQ(loc->op_index, 2);
}

TEST(ParsePipelineSpec, KnownOpNamesFollowTheProto) {
  const auto names = KnownOpNames();
  ASSERT_EQ(names.size(), 15u);
  EXPECT_EQ(names.front(), "decode");
  EXPECT_EQ(names[13], "sleep");
  EXPECT_EQ(names.back(), "python");
}

TEST(ParsePipelineSpec, ErrorsNameNodeAndField) {
  const absl::Status field = ParsePipelineSpec(
                                 "nodes: [{shuffle: {seed: 1}}, {shuffle: "
                                 "{sed: 2}}]")
                                 .status();
  EXPECT_EQ(field.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(field.message(), HasSubstr("shuffle[1]: "));
  EXPECT_THAT(ParsePipelineSpec("nodes: [{teleport: {}}]").status().message(),
              HasSubstr("nodes[0]: unknown node 'teleport'"));
  EXPECT_THAT(ParsePipelineSpec("color: blue").status().message(),
              HasSubstr("pipeline: unknown field 'color'"));
  EXPECT_THAT(ParsePipelineSpec("- a\n- b").status().message(),
              HasSubstr("pipeline: expected a mapping at the top"));
  EXPECT_THAT(ParsePipelineSpec("seed: -4").status().message(),
              HasSubstr("seed: expected a non-negative integer"));
  EXPECT_THAT(ParsePipelineSpec("nodes: {a: 1}").status().message(),
              HasSubstr("nodes: expected a list"));
  EXPECT_THAT(ParsePipelineSpec("source: [1, 2]: x: :").status().message(),
              HasSubstr("pipeline: cannot parse YAML/JSON"));
}

TEST(SpecLocation, FormatsLikeTheMessagesAlwaysDid) {
  EXPECT_EQ((SpecLocation{"map", 1, 2, "Resize", "size"}).ToString(), "map[1].ops[2] (Resize)");
  EXPECT_EQ((SpecLocation{"batch", -1, -1, "", "size"}).ToString(), "batch.size");
  EXPECT_EQ((SpecLocation{"", -1, 7, "Resize", ""}).ToString(), "op 7 (Resize)");
  const absl::Status s = SpecError(SpecLocation{"map", 0, 1, "Resize", "size"}, "size must be > 0");
  EXPECT_EQ(s.message(), "map[0].ops[1] (Resize): size must be > 0");
  auto loc = GetSpecLocation(s);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(*loc, (SpecLocation{"map", 0, 1, "Resize", "size"}));
  EXPECT_FALSE(GetSpecLocation(absl::InvalidArgumentError("x")).has_value());
}

TEST(YamlToJson, EmitsTypedScalars) {
  auto j = YamlToJson("{a: 1, b: 2.5, c: true, d: x, e: '7', f: Autotune}");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j, R"({"a":1,"b":2.5,"c":true,"d":"x","e":"7","f":-1})");
}

TEST(YamlToJson, AHugeNumberStaysAStringInsteadOfCrashing) {
  const std::string digits(200000, '7');
  auto j = YamlToJson("{a: " + digits + "}");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j, "{\"a\":\"" + digits + "\"}");
}

TEST(YamlToJson, AliasBombIsRefused) {
  // Nine levels of nine aliases: 9^9 = 387 M values once expanded.
  std::string yaml = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    yaml += absl::StrCat("a", i, ": &a", i, " [");
    for (int k = 0; k < 9; ++k) yaml += absl::StrCat(k ? ", " : "", "*a", i - 1);
    yaml += "]\n";
  }
  const absl::Status s = YamlToJson(yaml).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "pipeline: the spec is more than 1048576 values (after expanding "
            "aliases)");
}

TEST(YamlToJson, DeepNestingIsRefused) {
  const std::string yaml = std::string(100, '[') + std::string(100, ']');
  const absl::Status s = YamlToJson(yaml).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "pipeline: the spec is nested deeper than 64 levels");
}

TEST(LoadPipelineSpecFile, MissingFileIsNotFound) {
  const absl::Status s = LoadPipelineSpecFile("/nonexistent/sluice/spec.yaml").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/sluice/spec.yaml"));
}

}  // namespace
}  // namespace sluice::pipeline_spec

namespace sluice::pipeline_spec {
namespace {

// Found by pipeline_spec_fuzzer: a YAML string that is not UTF-8 made nlohmann throw while the
// map node was serialized back; it must be an InvalidArgument, never an exception.
TEST(ParsePipelineSpec, TextThatIsNotUtf8IsInvalidArgument) {
  const std::string spec =
      "source: {synthetic: {num_records: 8}, columns: [image]}\n"
      "nodes:\n  - map: {input_columns: [image], ops: [{resize: {height: "
      "\"\xff\xfe\"}}]}\n";
  absl::StatusOr<proto::Pipeline> p = ParsePipelineSpec(spec);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
}

}  // namespace
}  // namespace sluice::pipeline_spec

namespace sluice::pipeline_spec {
namespace {

// Found by pipeline_spec_fuzzer: a number no double holds (in the forms JSON rejects, "5.e999")
// made std::stod throw. It is an InvalidArgument naming the field, whatever its spelling.
TEST(ParsePipelineSpec, NumberOutOfRangeIsInvalidArgumentNamingTheField) {
  for (const char* number : {"5.e999", "1e999", ".5e99999", "55550e0000801269684535296"}) {
    const std::string spec = absl::StrCat(
        "source: {synthetic: {num_records: 8}, columns: [image]}\n"
        "nodes:\n  - map: {input_columns: [image], ops: [{resize: {height: 4, "
        "width: ",
        number, "}}]}\n");
    absl::StatusOr<proto::Pipeline> p = ParsePipelineSpec(spec);
    ASSERT_FALSE(p.ok()) << number;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_THAT(p.status().message(), HasSubstr("width")) << p.status();
  }
}

}  // namespace
}  // namespace sluice::pipeline_spec
