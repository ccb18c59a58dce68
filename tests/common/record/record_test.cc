#include "common/record/record.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::record {
namespace {

using ::testing::HasSubstr;

Schema AllDTypes() {
  return Schema{{
      {.name = "b", .dtype = DType::kBytes},
      {.name = "s", .dtype = DType::kString},
      {.name = "u8", .dtype = DType::kUint8, .shape = {2, 3}},
      {.name = "i32", .dtype = DType::kInt32, .shape = {-1}},
      {.name = "i64", .dtype = DType::kInt64},
      {.name = "f16", .dtype = DType::kFloat16, .shape = {2}},
      {.name = "f32", .dtype = DType::kFloat32, .shape = {1, -1}},
  }};
}

TEST(Record, EveryDTypeRoundTrips) {
  const Schema schema = AllDTypes();
  ASSERT_TRUE(schema.Validate().ok());
  std::vector<Tensor> values = {
      Tensor::Bytes(std::string("\x00\xff\x01", 3)),
      Tensor::Bytes("héllo"),
      Tensor::Of<uint8_t>({2, 3}, {1, 2, 3, 4, 5, 255}),
      Tensor::Of<int32_t>({4}, {-1, 0, 1, 2147483647}),
      Tensor::Int64(-9000000000LL),
      Tensor::Of<uint16_t>({2}, {0x3c00, 0xc000}),
      Tensor::Of<float>({1, 2}, {1.5f, -0.25f}),
  };
  auto encoded = EncodeRecord(schema, values);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  auto views = DecodeRecord(schema, *encoded);
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ((*views)[i].shape, values[i].shape) << schema.columns[i].name;
    EXPECT_EQ((*views)[i].data, values[i].data) << schema.columns[i].name;
  }
  EXPECT_EQ((*views)[4].AsInt64(), -9000000000LL);
}

TEST(Record, DecodeRecordIntoReusesTheViewsOfAnEarlierRecord) {
  const Schema schema{{{.name = "label", .dtype = DType::kInt64},
                       {.name = "feature", .dtype = DType::kFloat32, .shape = {-1}}}};
  auto first = EncodeRecord(schema, {Tensor::Int64(7), Tensor::Of<float>({3}, {1, 2, 3})});
  auto second = EncodeRecord(schema, {Tensor::Int64(8), Tensor::Of<float>({2}, {4, 5})});
  ASSERT_TRUE(first.ok() && second.ok());
  std::vector<TensorView> views;
  ASSERT_TRUE(DecodeRecordInto(schema, *first, &views).ok());
  ASSERT_EQ(views.size(), 2u);
  const int64_t* shape_storage = views[1].shape.data();
  ASSERT_TRUE(DecodeRecordInto(schema, *second, &views).ok());
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].AsInt64(), 8);
  EXPECT_EQ(views[1].shape, std::vector<int64_t>({2}));
  EXPECT_EQ(views[1].data.size(), 8u);
  EXPECT_EQ(views[1].shape.data(), shape_storage);  // no new shape vector
  // Errors as DecodeRecord.
  const absl::Status s = DecodeRecordInto(schema, second->substr(0, 20), &views);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "record ends inside column 'feature'");
}

TEST(Record, ZeroLengthBytesRoundTrip) {
  const Schema schema{{{.name = "b", .dtype = DType::kBytes}}};
  auto encoded = EncodeRecord(schema, {Tensor::Bytes("")});
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(encoded->size(), 9u);  // ndim byte + 8-byte length
  auto views = DecodeRecord(schema, *encoded);
  ASSERT_TRUE(views.ok());
  EXPECT_EQ((*views)[0].data, "");
}

TEST(Record, WrongColumnCountIsInvalidArgument) {
  auto encoded = EncodeRecord(AllDTypes(), {Tensor::Bytes("x")});
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(encoded.status().message(), HasSubstr("1 values but the schema has 7 columns"));
}

TEST(Record, ShapeMismatchNamesTheColumn) {
  const Schema schema{{{.name = "img", .dtype = DType::kUint8, .shape = {2, 2}}}};
  auto encoded = EncodeRecord(schema, {Tensor::Of<uint8_t>({4}, {1, 2, 3, 4})});
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(encoded.status().message(), HasSubstr("column 'img'"));
}

TEST(Record, ByteCountNotMatchingShapeIsInvalidArgument) {
  const Schema schema{{{.name = "v", .dtype = DType::kFloat32, .shape = {-1}}}};
  auto encoded = EncodeRecord(schema, {Tensor{{3}, std::string(8, '\0')}});
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(encoded.status().message(), HasSubstr("8 bytes for shape [3] of float32"));
}

TEST(Record, TruncatedBufferIsDataLoss) {
  const Schema schema{{{.name = "b", .dtype = DType::kBytes}}};
  auto encoded = EncodeRecord(schema, {Tensor::Bytes("abcdef")});
  ASSERT_TRUE(encoded.ok());
  for (size_t cut = 0; cut < encoded->size(); ++cut) {
    auto views = DecodeRecord(schema, encoded->substr(0, cut));
    EXPECT_EQ(views.status().code(), absl::StatusCode::kDataLoss) << "cut at " << cut;
  }
  auto trailing = DecodeRecord(schema, *encoded + "x");
  EXPECT_EQ(trailing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(trailing.status().message(), HasSubstr("1 trailing bytes"));
}

// Found by the shard fuzzer: a value whose shape contradicts the schema, or
// whose byte count overflows, must not decode (AsInt64 on it would read out of
// bounds).
TEST(Record, DecodeChecksShapesAgainstTheSchema) {
  const Schema int_schema{{{.name = "label", .dtype = DType::kInt64}}};
  std::string scalar_as_vector("\x01", 1);
  scalar_as_vector += std::string("\x00\x00\x00\x00\x00\x00\x00\x00", 8);  // dim 0
  scalar_as_vector += std::string(8, '\0');                                // 0 bytes
  auto views = DecodeRecord(int_schema, scalar_as_vector);
  EXPECT_EQ(views.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(views.status().message(), HasSubstr("does not match the schema's []"));

  const Schema vec_schema{{{.name = "v", .dtype = DType::kFloat32, .shape = {-1}}}};
  std::string overflowing("\x01", 1);
  const int64_t huge = int64_t{1} << 62;
  overflowing.append(reinterpret_cast<const char*>(&huge), 8);
  overflowing += std::string(8, '\0');
  views = DecodeRecord(vec_schema, overflowing);
  EXPECT_EQ(views.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(views.status().message(), HasSubstr("0 bytes for shape [4611686018427387904]"));
}

TEST(Schema, JsonRoundTrip) {
  const Schema schema = AllDTypes();
  auto parsed = Schema::FromJson(schema.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, schema);
}

TEST(Schema, RejectsDuplicateAndBadIndexedColumns) {
  Schema dup{{{.name = "a"}, {.name = "a"}}};
  EXPECT_THAT(dup.Validate().message(), HasSubstr("names column 'a' twice"));
  Schema indexed_bytes{{{.name = "a", .dtype = DType::kBytes, .indexed = true}}};
  EXPECT_EQ(indexed_bytes.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("complex64").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::record
