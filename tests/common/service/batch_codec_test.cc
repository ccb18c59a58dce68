// The batch frame both ways, and CheckBatch/DecodeBatch on frames a worker
// could not have produced: what the client relies on before it reads a
// column's bytes.
#include "common/service/batch_codec.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::service {
namespace {

using ::testing::HasSubstr;

proto::Batch OneElement(proto::TensorDType dtype, std::initializer_list<int64_t> shape,
                        std::string data) {
  proto::Batch batch;
  batch.add_global_indices(4);
  proto::Column* c = batch.add_columns();
  c->set_name("image");
  c->set_dtype(dtype);
  for (int64_t d : shape) c->add_shape(d);
  c->set_data_length(data.size());
  return batch;
}

// A worker's batch of two elements: uint8 [2, 3] and int64 [2].
WireBatch TwoColumns(std::shared_ptr<std::string>* image_out = nullptr) {
  WireBatch batch;
  batch.header.mutable_key()->set_job_id(3);
  batch.header.set_batch_index(2);
  batch.header.add_global_indices(10);
  batch.header.add_global_indices(11);
  auto image = std::make_shared<std::string>("abcdef");
  auto label = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{7, 8});
  const int64_t image_shape[] = {2, 3};
  const int64_t label_shape[] = {2};
  EXPECT_TRUE(AppendColumn("image", record::DType::kUint8, image_shape,
                           {reinterpret_cast<const uint8_t*>(image->data()), image->size(), image},
                           &batch)
                  .ok());
  EXPECT_TRUE(AppendColumn("label", record::DType::kInt64, label_shape,
                           {reinterpret_cast<const uint8_t*>(label->data()), 16, label}, &batch)
                  .ok());
  if (image_out != nullptr) *image_out = image;
  return batch;
}

// The bytes of a frame, as one string.
std::string Flatten(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(frame.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` cut into slices of `piece` bytes, as a receiver may get them.
std::vector<grpc::Slice> Cut(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece)
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  return slices;
}

TEST(EncodeBatch, ColumnSlicesReferenceTheBuffersWithoutACopy) {
  std::shared_ptr<std::string> image;
  WireBatch batch = TwoColumns(&image);
  const long before = image.use_count();
  grpc::ByteBuffer frame = EncodeBatch(batch);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(frame.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 3u);  // header, image, label
  EXPECT_EQ(slices[1].begin(), reinterpret_cast<const uint8_t*>(image->data()));
  EXPECT_GT(image.use_count(), before);  // the slice holds the buffer
  slices.clear();
  frame.Clear();
  EXPECT_EQ(image.use_count(), before);  // and lets it go with the slice
}

TEST(DecodeBatch, GivesBackHeaderAndColumnsAtAnySliceBoundaries) {
  const std::string bytes = Flatten(EncodeBatch(TwoColumns()));
  for (size_t piece : {size_t{1}, size_t{3}, size_t{5}, bytes.size()}) {
    absl::StatusOr<ReceivedBatch> got = DecodeBatch(Cut(bytes, piece));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->header.key().job_id(), 3u);
    EXPECT_EQ(got->header.batch_index(), 2u);
    ASSERT_EQ(got->pieces.size(), 2u);
    const ColumnBytes image = Gather(*got, 0, /*alignment=*/1);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(image.data), image.size), "abcdef");
    const ColumnBytes label = Gather(*got, 1, /*alignment=*/8);
    ASSERT_EQ(label.size, 16u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(label.data) % 8, 0u);
    int64_t values[2];
    std::memcpy(values, label.data, 16);
    EXPECT_EQ(values[0], 7);
    EXPECT_EQ(values[1], 8);
  }
}

TEST(Gather, ReferencesAColumnInOneSliceAndCopiesOneThatSpansSeveral) {
  const std::string bytes = Flatten(EncodeBatch(TwoColumns()));
  absl::StatusOr<ReceivedBatch> whole = DecodeBatch(Cut(bytes, bytes.size()));
  ASSERT_TRUE(whole.ok());
  const ColumnBytes in_place = Gather(*whole, 0, /*alignment=*/1);
  EXPECT_EQ(in_place.data, whole->pieces[0][0].data());
  EXPECT_EQ(in_place.owner, whole->slices);
  absl::StatusOr<ReceivedBatch> cut = DecodeBatch(Cut(bytes, 4));
  ASSERT_TRUE(cut.ok());
  ASSERT_GT(cut->pieces[0].size(), 1u);
  const ColumnBytes copied = Gather(*cut, 0, /*alignment=*/1);
  EXPECT_NE(copied.owner, cut->slices);
}

TEST(SharedMemoryFrame, IsTheHeaderAloneAndItsColumnsAreReadFromTheRingAndCopied) {
  absl::StatusOr<std::unique_ptr<SharedMemoryRing>> ring = SharedMemoryRing::Create(1 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  SharedMemoryRingWriters writers;
  absl::StatusOr<std::shared_ptr<SharedMemoryRingWriter>> writer =
      writers.Claim((*ring)->offer(), 1);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const WireBatch batch = TwoColumns();
  std::optional<proto::SharedMemorySpan> span = (*writer)->Write(1, batch.columns);
  ASSERT_TRUE(span.has_value());
  ASSERT_EQ(span->length(), 22u);  // "abcdef" and two int64
  grpc::ByteBuffer frame = EncodeBatch(batch, &*span);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(frame.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 1u);  // the header only
  const std::string bytes = Flatten(frame);

  absl::StatusOr<ReceivedBatch> got = DecodeBatch(Cut(bytes, 5), ring->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->borrowed);
  EXPECT_EQ(got->header.shared_memory().position(), 0u);
  const ColumnBytes image = Gather(*got, 0, /*alignment=*/1);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(image.data), image.size), "abcdef");
  EXPECT_NE(image.data, got->pieces[0][0].data());  // copied out: the ring space is reused
  const ColumnBytes label = Gather(*got, 1, /*alignment=*/8);
  int64_t values[2];
  std::memcpy(values, label.data, 16);
  EXPECT_EQ(values[0], 7);
  EXPECT_EQ(values[1], 8);

  EXPECT_EQ(DecodeBatch(Cut(bytes, 5)).status(),
            absl::InvalidArgumentError(
                "batch frame names a shared-memory ring, but this stream offered none"));
  EXPECT_EQ(DecodeBatch(Cut(bytes + "x", 5), ring->get()).status(),
            absl::InvalidArgumentError("batch columns hold 22 bytes but its shared-memory span "
                                       "has 22 and the frame 1 after the header (want 0)"));
  proto::SharedMemorySpan beyond = *span;
  beyond.set_position((1 << 20) - 10);
  EXPECT_EQ(DecodeBatch(Cut(Flatten(EncodeBatch(batch, &beyond)), 5), ring->get()).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(DecodeBatch, RefusesFramesWhoseLengthsDoNotAddUp) {
  const std::string bytes = Flatten(EncodeBatch(TwoColumns()));
  // One byte missing, one byte too many, a cut-off length prefix.
  for (const std::string& frame :
       {bytes.substr(0, bytes.size() - 1), bytes + "x", bytes.substr(0, 3)}) {
    absl::StatusOr<ReceivedBatch> got = DecodeBatch(Cut(frame, 7));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << frame.size();
  }
  EXPECT_THAT(DecodeBatch(Cut(bytes + "x", 7)).status().message(),
              HasSubstr("columns hold 22 bytes but the frame has 23"));
  std::string huge_header = bytes;
  huge_header[3] = '\x7f';
  EXPECT_THAT(DecodeBatch(Cut(huge_header, 7)).status().message(), HasSubstr("header length"));
}

TEST(CheckBatch, AcceptsExactlyTheBytesTheShapeSays) {
  EXPECT_TRUE(CheckBatch(OneElement(proto::TENSOR_DTYPE_INT64, {1, 2}, std::string(16, 'x'))).ok());
  EXPECT_EQ(CheckBatch(OneElement(proto::TENSOR_DTYPE_INT64, {1, 2}, std::string(15, 'x'))).code(),
            absl::StatusCode::kInvalidArgument);
}

// Found while writing batch_fuzzer's invariant: 2^61 int64 elements are 2^64 bytes, which wrapped
// to 0 and matched an empty data field, so the client would have read 2^61 elements from an empty
// buffer.
TEST(CheckBatch, RefusesAShapeWhoseByteCountWrapsAround) {
  const absl::Status s =
      CheckBatch(OneElement(proto::TENSOR_DTYPE_INT64, {1, int64_t{1} << 61}, ""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("column 'image'"));
  const absl::Status f =
      CheckBatch(OneElement(proto::TENSOR_DTYPE_FLOAT32, {1, int64_t{1} << 31, 4}, ""));
  EXPECT_EQ(f.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::service
