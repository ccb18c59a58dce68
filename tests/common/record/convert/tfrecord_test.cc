#include "common/record/convert/tfrecord.h"

#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/record/convert/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/tf_example.pb.h"
#include "tests/common/record/convert/test_util.h"

namespace sluice::record {
namespace {

using convert_test::ConvertAs;
using convert_test::FakeImage;
using convert_test::Item;
using convert_test::ReadDataset;
using convert_test::ReadFile;
using convert_test::ScopedTempDir;
using convert_test::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string SerializedExample(const std::string& image, int64_t label) {
  tf::Example example;
  auto& features = *example.mutable_features()->mutable_feature();
  features["image/encoded"].mutable_bytes_list()->add_value(image);
  features["image/class/label"].mutable_int64_list()->add_value(label);
  features["image/format"].mutable_bytes_list()->add_value("JPEG");  // ignored
  return example.SerializeAsString();
}

// A TFRecord file holding `items` (image, label) as tf.train.Examples.
std::string TfRecordFile(const std::vector<Item>& items) {
  std::string file;
  for (const Item& item : items) file += EncodeTfRecord(SerializedExample(item.image, item.label));
  return file;
}

std::vector<Item> SomeItems(const std::string& file_name, int n, uint64_t seed) {
  std::vector<Item> items;
  for (int i = 0; i < n; ++i) {
    items.push_back(Item{FakeImage(seed * 1000 + i, 100 + 37 * i, /*png=*/i % 3 == 2), i % 4,
                         file_name + ":" + std::to_string(i)});
  }
  return items;
}

absl::StatusOr<Manifest> ConvertTfRecord(const std::string& input, const std::string& output,
                                         int threads = 1,
                                         uint64_t shard_size = kDefaultShardSizeBytes) {
  return ConvertAs(InputFormat::kTfRecord, input, output, threads, shard_size);
}

TEST(TfRecordReader, ReadsBackEncodedRecords) {
  ScopedTempDir dir;
  const std::vector<std::string> records = {"abc", "", std::string(100000, 'x')};
  std::string file;
  for (const std::string& r : records) file += EncodeTfRecord(r);
  WriteFile(dir / "f.tfrecord", file);

  auto reader = TfRecordReader::Open(dir / "f.tfrecord");
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string record;
  for (const std::string& expected : records) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(*more);
    EXPECT_EQ(record, expected);
  }
  absl::StatusOr<bool> more = (*reader)->Next(&record);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_FALSE(*more);
  EXPECT_EQ((*reader)->records_read(), 3u);
  EXPECT_FALSE((*reader)->gzipped());
}

TEST(TfRecordReader, EncodesTheDocumentedFraming) {
  const std::string framed = EncodeTfRecord("abc");
  ASSERT_EQ(framed.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(framed.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(framed.substr(12, 3), "abc");
}

TEST(TfRecordReader, MissingFileIsNotFound) {
  ScopedTempDir dir;
  EXPECT_EQ(TfRecordReader::Open(dir / "nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(TfRecordConvert, RoundTripsImagesLabelsAndKeysFromAFolder) {
  ScopedTempDir dir;
  const std::vector<Item> a = SomeItems("a.tfrecord", 3, 1);
  const std::vector<Item> b = SomeItems("b.tfrecord", 4, 2);
  // Written in reverse name order: the converter must sort.
  WriteFile(dir / "in/b.tfrecord", TfRecordFile(b));
  WriteFile(dir / "in/a.tfrecord", TfRecordFile(a));

  absl::StatusOr<Manifest> manifest = ConvertTfRecord(dir / "in", dir / "out");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->total_records, 7u);
  EXPECT_EQ(manifest->schema, ImageClassificationSchema());

  absl::StatusOr<std::vector<Item>> items = ReadDataset(dir / "out");
  ASSERT_TRUE(items.ok()) << items.status();
  std::vector<Item> expected = a;
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(*items, expected);
}

TEST(TfRecordConvert, AcceptsASingleFile) {
  ScopedTempDir dir;
  const std::vector<Item> items = SomeItems("train-00000-of-00001", 5, 3);
  WriteFile(dir / "train-00000-of-00001", TfRecordFile(items));
  ASSERT_TRUE(ConvertTfRecord(dir / "train-00000-of-00001", dir / "out").ok());
  absl::StatusOr<std::vector<Item>> read = ReadDataset(dir / "out");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, items);
}

TEST(TfRecordConvert, ReadsGzipCompressedFiles) {
  ScopedTempDir dir;
  const std::vector<Item> items = SomeItems("data.tfrecord.gz", 6, 4);
  const std::string plain = TfRecordFile(items);
  gzFile gz = gzopen((dir / "data.tfrecord.gz").c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, plain.data(), static_cast<unsigned>(plain.size())),
            static_cast<int>(plain.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
  ASSERT_NE(ReadFile(dir / "data.tfrecord.gz"), plain);

  auto reader = TfRecordReader::Open(dir / "data.tfrecord.gz");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->gzipped());

  ASSERT_TRUE(ConvertTfRecord(dir / "data.tfrecord.gz", dir / "out").ok());
  absl::StatusOr<std::vector<Item>> read = ReadDataset(dir / "out");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, items);
}

// Writes f.tfrecord with 3 records, applies `corrupt` to its bytes and converts
// it.
absl::Status ConvertCorrupted(const ScopedTempDir& dir,
                              const std::function<void(std::string&)>& corrupt,
                              size_t* second_record_offset) {
  const std::vector<Item> items = SomeItems("f.tfrecord", 3, 5);
  std::string file = TfRecordFile(items);
  *second_record_offset = EncodeTfRecord(SerializedExample(items[0].image, items[0].label)).size();
  corrupt(file);
  WriteFile(dir / "in/f.tfrecord", file);
  return ConvertTfRecord(dir / "in", dir / "out").status();
}

TEST(TfRecordConvert, BadLengthChecksumIsDataLossNamingFileRecordAndOffset) {
  ScopedTempDir dir;
  size_t offset = 0;
  absl::Status status = ConvertCorrupted(
      dir, [&](std::string& f) { f[offset + 9] ^= 0x01; }, &offset);
  // The lambda runs after `offset` is set.
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir / "in/f.tfrecord"), HasSubstr("record 1"),
                                      HasSubstr("byte offset " + std::to_string(offset)),
                                      HasSubstr("length checksum")));
  EXPECT_FALSE(std::filesystem::exists(dir / "out")) << "a failed conversion leaves no output";
}

TEST(TfRecordConvert, BadDataChecksumIsDataLossNamingFileRecordAndOffset) {
  ScopedTempDir dir;
  size_t offset = 0;
  absl::Status status = ConvertCorrupted(
      dir, [&](std::string& f) { f[offset + 12 + 20] ^= 0x40; }, &offset);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir / "in/f.tfrecord"), HasSubstr("record 1"),
                                      HasSubstr("byte offset " + std::to_string(offset)),
                                      HasSubstr("data checksum")));
}

TEST(TfRecordConvert, TruncatedFileIsDataLoss) {
  ScopedTempDir dir;
  size_t offset = 0;
  absl::Status status = ConvertCorrupted(
      dir, [](std::string& f) { f.resize(f.size() - 3); }, &offset);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir / "in/f.tfrecord"), HasSubstr("record 2"),
                                      HasSubstr("truncated")));
}

TEST(TfRecordConvert, TruncatedHeaderIsDataLoss) {
  ScopedTempDir dir;
  size_t offset = 0;
  absl::Status status = ConvertCorrupted(
      dir, [](std::string& f) { f += std::string("\x05\0\0", 3); }, &offset);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("record 3"), HasSubstr("truncated")));
}

TEST(TfRecordConvert, MissingFeatureIsInvalidArgumentNamingFileRecordAndFeature) {
  ScopedTempDir dir;
  tf::Example example;
  (*example.mutable_features()->mutable_feature())["image/encoded"].mutable_bytes_list()->add_value(
      FakeImage(1, 50));
  WriteFile(dir / "in/f.tfrecord", TfRecordFile(SomeItems("f.tfrecord", 2, 6)) +
                                       EncodeTfRecord(example.SerializeAsString()));
  absl::Status status = ConvertTfRecord(dir / "in", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir / "in/f.tfrecord"), HasSubstr("record 2"),
                                      HasSubstr("image/class/label"), HasSubstr("missing")));
}

TEST(TfRecordConvert, WrongFeatureTypeIsInvalidArgument) {
  ScopedTempDir dir;
  tf::Example example;
  auto& features = *example.mutable_features()->mutable_feature();
  features["image/encoded"].mutable_bytes_list()->add_value(FakeImage(1, 50));
  features["image/class/label"].mutable_float_list()->add_value(3.0f);
  WriteFile(dir / "in/f.tfrecord", EncodeTfRecord(example.SerializeAsString()));
  absl::Status status = ConvertTfRecord(dir / "in", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("record 0"), HasSubstr("image/class/label"),
                                      HasSubstr("float_list"), HasSubstr("int64_list")));
}

TEST(TfRecordConvert, NonImageBytesAreInvalidArgument) {
  ScopedTempDir dir;
  WriteFile(dir / "in/f.tfrecord", EncodeTfRecord(SerializedExample("GIF89a....", 1)));
  absl::Status status = ConvertTfRecord(dir / "in", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("record 0"), HasSubstr("image/encoded")));
}

TEST(TfRecordConvert, ShardSizeLimitProducesSeveralShards) {
  ScopedTempDir dir;
  std::vector<Item> items;
  for (int i = 0; i < 20; ++i)
    items.push_back(Item{FakeImage(i, 1000), i, "f:" + std::to_string(i)});
  WriteFile(dir / "f", TfRecordFile(items));
  absl::StatusOr<Manifest> manifest =
      ConvertTfRecord(dir / "f", dir / "out", /*threads=*/1, /*shard_size=*/4096);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_GE(manifest->shards.size(), 5u);
  for (const ShardInfo& shard : manifest->shards) {
    if (shard.records > 1) {
      EXPECT_LE(shard.bytes, 4096u) << shard.file;
    }
  }
  absl::StatusOr<std::vector<Item>> read = ReadDataset(dir / "out");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, items);
}

TEST(TfRecordConvert, OutputDoesNotDependOnThreadCount) {
  ScopedTempDir dir;
  for (int f = 0; f < 6; ++f) {
    const std::string name = "part-" + std::to_string(f);
    WriteFile(dir / ("in/" + name), TfRecordFile(SomeItems(name, 3 + f, 10 + f)));
  }
  absl::StatusOr<Manifest> one = ConvertTfRecord(dir / "in", dir / "out1", /*threads=*/1, 3000);
  absl::StatusOr<Manifest> four = ConvertTfRecord(dir / "in", dir / "out4", /*threads=*/4, 3000);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(one->shards, four->shards);
  EXPECT_EQ(one->total_records, four->total_records);
  EXPECT_GT(one->shards.size(), 1u);
  absl::StatusOr<std::vector<Item>> a = ReadDataset(dir / "out1");
  absl::StatusOr<std::vector<Item>> b = ReadDataset(dir / "out4");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(TfRecordConvert, FirstErrorInFileOrderIsReportedWithThreads) {
  ScopedTempDir dir;
  for (int f = 0; f < 6; ++f) {
    const std::string name = "part-" + std::to_string(f);
    std::string file = TfRecordFile(SomeItems(name, 4, 20 + f));
    if (f == 2 || f == 4) file.resize(file.size() - 1);
    WriteFile(dir / ("in/" + name), file);
  }
  absl::Status status = ConvertTfRecord(dir / "in", dir / "out", /*threads=*/4).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("part-2"));
}

TEST(TfRecordConvert, MissingInputIsNotFound) {
  ScopedTempDir dir;
  absl::Status status = ConvertTfRecord(dir / "nope", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "nope"));
}

TEST(TfRecordConvert, EmptyFolderIsInvalidArgument) {
  ScopedTempDir dir;
  std::filesystem::create_directories(dir / "in");
  absl::Status status = ConvertTfRecord(dir / "in", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "in"));
}

}  // namespace
}  // namespace sluice::record
