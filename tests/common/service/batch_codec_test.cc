// CheckBatch on batches a worker could not have produced: what the client
// relies on before it reads a column's bytes.
#include "common/service/batch_codec.h"

#include <cstdint>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::service {
namespace {

using ::testing::HasSubstr;

proto::Batch OneElement(proto::TensorDType dtype,
                        std::initializer_list<int64_t> shape,
                        std::string data) {
  proto::Batch batch;
  batch.add_global_indices(4);
  proto::Column* c = batch.add_columns();
  c->set_name("image");
  c->set_dtype(dtype);
  for (int64_t d : shape) c->add_shape(d);
  c->set_data(std::move(data));
  return batch;
}

TEST(CheckBatch, AcceptsExactlyTheBytesTheShapeSays) {
  EXPECT_TRUE(CheckBatch(OneElement(proto::TENSOR_DTYPE_INT64, {1, 2},
                                    std::string(16, 'x')))
                  .ok());
  EXPECT_EQ(CheckBatch(OneElement(proto::TENSOR_DTYPE_INT64, {1, 2},
                                  std::string(15, 'x')))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Found while writing batch_fuzzer's invariant: 2^61 int64 elements are 2^64 bytes, which wrapped to
// 0 and matched an empty data field, so the client would have read 2^61
// elements from an empty buffer.
TEST(CheckBatch, RefusesAShapeWhoseByteCountWrapsAround) {
  const absl::Status s = CheckBatch(
      OneElement(proto::TENSOR_DTYPE_INT64, {1, int64_t{1} << 61}, ""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("column 'image'"));
  const absl::Status f = CheckBatch(
      OneElement(proto::TENSOR_DTYPE_FLOAT32, {1, int64_t{1} << 31, 4}, ""));
  EXPECT_EQ(f.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::service
