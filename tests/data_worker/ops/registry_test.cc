#include "data_worker/ops/registry.h"

#include <set>
#include <string>

#include "common/pipeline_spec/location.h"
#include "data_worker/python/python_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::data_worker {
namespace {

// Every case of OpSpec's oneof has exactly one registration, with the proto
// field name, a factory and type inference.
TEST(Registry, EveryOneofCaseIsRegisteredOnce) {
  const auto* oneof = proto::OpSpec::descriptor()->FindOneofByName("op");
  ASSERT_NE(oneof, nullptr);
  std::set<int> seen;
  for (const OpRegistration& r : RegisteredOps()) {
    EXPECT_TRUE(seen.insert(r.op_case).second) << r.type;
    EXPECT_NE(r.make, nullptr) << r.type;
    EXPECT_NE(r.infer, nullptr) << r.type;
  }
  ASSERT_EQ(static_cast<int>(RegisteredOps().size()), oneof->field_count());
  for (int i = 0; i < oneof->field_count(); ++i) {
    const auto* field = oneof->field(i);
    const OpRegistration* r = FindOp(static_cast<proto::OpSpec::OpCase>(field->number()));
    ASSERT_NE(r, nullptr) << field->name();
    EXPECT_EQ(r->field, field->name());
  }
  EXPECT_EQ(FindOp(proto::OpSpec::OP_NOT_SET), nullptr);
  EXPECT_EQ(OpTypeName(proto::OpSpec::OP_NOT_SET), "unknown");
  EXPECT_EQ(OpTypeName(proto::OpSpec::kRandomResizedCrop), "RandomResizedCrop");
}

// The registry's batched-kernel flag is what the built op reports.
TEST(Registry, BatchedKernelFlagMatchesTheBuiltOps) {
  for (const OpRegistration& r : RegisteredOps()) {
    proto::OpSpec spec;
    const auto* field = proto::OpSpec::descriptor()->FindFieldByNumber(r.op_case);
    spec.GetReflection()->MutableMessage(&spec, field);
    // Fill the required fields of the ops that have some.
    if (spec.has_resize()) spec.mutable_resize()->set_size(8);
    if (spec.has_center_crop()) spec.mutable_center_crop()->set_size(8);
    if (spec.has_random_resized_crop()) {
      spec.mutable_random_resized_crop()->set_size(8);
    }
    if (spec.has_random_crop()) spec.mutable_random_crop()->set_size(8);
    if (spec.has_normalize()) {
      spec.mutable_normalize()->add_mean(0.5f);
      spec.mutable_normalize()->add_std(0.5f);
    }
    if (spec.has_cast()) spec.mutable_cast()->set_dtype("float32");
    if (spec.has_one_hot()) spec.mutable_one_hot()->set_num_classes(3);
    if (spec.has_python()) {
      // Built only (no process starts before the first Apply).
      python::PythonOptions allow;
      allow.allow = true;
      python::ConfigurePython(allow);
      spec.mutable_python()->set_module("m");
      spec.mutable_python()->set_function("f");
    }
    auto op = r.make(spec, OpLabel{0, std::string(r.type)});
    ASSERT_TRUE(op.ok()) << r.type << ": " << op.status();
    EXPECT_EQ((*op)->has_batched_kernel(), r.batched_kernel) << r.type;
    EXPECT_EQ((*op)->name(), r.type);
  }
}

TEST(Registry, TypeInferenceFollowsTheOps) {
  InferContext ctx;
  ctx.source_image_shape = {64, 80, 3};
  ColumnType t{DType::kBytes, {}};
  proto::OpSpec decode, resize, crop, chw, normalize;
  decode.mutable_decode();
  resize.mutable_resize()->set_size(32);
  crop.mutable_center_crop()->set_size(30);
  normalize.mutable_normalize()->add_mean(0.5f);
  chw.mutable_hwc2chw();
  const OpLabel label{0, "X"};
  ASSERT_TRUE(InferOpType(decode, label, ctx, &t).ok());
  EXPECT_EQ(t.ToString(), "uint8[64,80,3]");
  ASSERT_TRUE(InferOpType(resize, label, ctx, &t).ok());
  EXPECT_EQ(t.ToString(), "uint8[32,40,3]");
  ASSERT_TRUE(InferOpType(crop, label, ctx, &t).ok());
  ASSERT_TRUE(InferOpType(normalize, label, ctx, &t).ok());
  ASSERT_TRUE(InferOpType(chw, label, ctx, &t).ok());
  EXPECT_EQ(t.ToString(), "float32[3,30,30]");
  // Decode of a float tensor names the op and the column type.
  const absl::Status s = InferOpType(decode, OpLabel{4, "Decode"}, ctx, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "op 4 (Decode): expected encoded image bytes, the column is "
            "float32[3,30,30]");
}

TEST(Registry, FieldErrorsCarryAStructuredLocation) {
  proto::OpSpec rrc;
  rrc.mutable_random_resized_crop()->set_size(0);
  pipeline_spec::SpecLocation at;
  at.node = "map";
  at.node_index = 1;
  at.op_index = 2;
  const absl::Status s = BuildOps({rrc}, {OpLabel{9, "RandomResizedCrop", at}}, false).status();
  EXPECT_EQ(s.message(), "map[1].ops[2] (RandomResizedCrop): size must be > 0");
  auto loc = pipeline_spec::GetSpecLocation(s);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(*loc, (pipeline_spec::SpecLocation{"map", 1, 2, "RandomResizedCrop", "size"}));
  // Without a spec location the op is named by its position.
  const absl::Status p = BuildOps({rrc}, 9, false).status();
  EXPECT_EQ(p.message(), "op 9 (RandomResizedCrop): size must be > 0");
  EXPECT_EQ(pipeline_spec::GetSpecLocation(p)->op_index, 9);
}

}  // namespace
}  // namespace sluice::data_worker
