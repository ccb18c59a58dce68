// Tests of the imagefolder input of Convert (common/record/convert/convert.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/record/convert/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/record/convert/test_util.h"

namespace sluice::record {
namespace {

using convert_test::FakeImage;
using convert_test::Item;
using convert_test::ReadDataset;
using convert_test::ScopedTempDir;
using convert_test::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

ConvertOptions FolderOptions(const std::string& input, const std::string& output) {
  ConvertOptions options;
  options.input = input;
  options.output = output;
  options.format = InputFormat::kImageFolder;
  return options;
}

// Writes `item.image` at root/item.key for each item.
void WriteTree(const std::string& root, const std::vector<Item>& items) {
  for (const Item& item : items) WriteFile(root + "/" + item.key, item.image);
}

TEST(ImageFolderConvert, LabelsAreSortedClassPositionsAndOrderIsClassThenPath) {
  ScopedTempDir dir;
  // Expected order: class "ant" (0) < "cat" (1) < "dog" (2), then relative
  // path.
  const std::vector<Item> expected = {
      {FakeImage(1, 300), 0, "ant/a.JPG"},  {FakeImage(2, 310, /*png=*/true), 0, "ant/b.png"},
      {FakeImage(3, 320), 1, "cat/1.jpeg"}, {FakeImage(4, 330), 1, "cat/more/0.jpg"},
      {FakeImage(5, 340), 1, "cat/z.jpg"},  {FakeImage(6, 350, /*png=*/true), 2, "dog/x.PNG"},
  };
  std::vector<Item> shuffled = {expected[5], expected[2], expected[0],
                                expected[4], expected[1], expected[3]};
  WriteTree(dir / "in", shuffled);
  WriteFile(dir / "in/cat/notes.txt", "not an image, skipped by extension");
  WriteFile(dir / "in/readme.jpg", "files directly in the root are no class");
  WriteFile(dir / "in/.ipynb_checkpoints/x.jpg", "hidden folders are skipped");
  WriteFile(dir / "in/dog/._x.PNG", "macOS metadata, hidden, skipped");

  absl::StatusOr<Manifest> manifest = Convert(FolderOptions(dir / "in", dir / "out"));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->total_records, expected.size());
  absl::StatusOr<std::vector<Item>> items = ReadDataset(dir / "out");
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, expected);
}

TEST(ImageFolderConvert, ProgressCountsEveryRecordAgainstTheTotal) {
  ScopedTempDir dir;
  for (int i = 0; i < 5; ++i)
    WriteFile(dir / ("in/c/" + std::to_string(i) + ".jpg"), FakeImage(i, 64));
  ConvertOptions options = FolderOptions(dir / "in", dir / "out");
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  options.progress = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
  ASSERT_TRUE(Convert(options).ok());
  EXPECT_EQ(calls,
            (std::vector<std::pair<uint64_t, uint64_t>>{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}}));
}

TEST(ImageFolderConvert, ShardSizeLimitProducesSeveralShards) {
  ScopedTempDir dir;
  std::vector<Item> items;
  for (int i = 0; i < 30; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "c%d/%03d.jpg", i % 3, i);
    items.push_back(Item{FakeImage(i, 900), i % 3, name});
  }
  WriteTree(dir / "in", items);
  ConvertOptions options = FolderOptions(dir / "in", dir / "out");
  options.shard_size_bytes = 5000;
  absl::StatusOr<Manifest> manifest = Convert(options);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_GE(manifest->shards.size(), 6u);
  uint64_t records = 0;
  for (const ShardInfo& shard : manifest->shards) {
    records += shard.records;
    if (shard.records > 1) {
      EXPECT_LE(shard.bytes, 5000u) << shard.file;
    }
  }
  EXPECT_EQ(records, 30u);
  absl::StatusOr<std::vector<Item>> read = ReadDataset(dir / "out");
  ASSERT_TRUE(read.ok()) << read.status();
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.key < b.key; });  // c0/, c1/, c2/
  EXPECT_EQ(*read, items);
}

TEST(ImageFolderConvert, OutputDoesNotDependOnThreadCount) {
  ScopedTempDir dir;
  // More than one 64-image batch per worker, sizes varied so workers finish out
  // of order.
  for (int i = 0; i < 300; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "class%d/img%04d.jpg", i % 7, i);
    WriteFile(dir / ("in/" + std::string(name)), FakeImage(i, 64 + (i * 7919) % 3000));
  }
  ConvertOptions options = FolderOptions(dir / "in", dir / "out1");
  options.shard_size_bytes = 64 << 10;
  absl::StatusOr<Manifest> one = Convert(options);
  options.output = dir / "out4";
  options.threads = 4;
  absl::StatusOr<Manifest> four = Convert(options);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_GT(one->shards.size(), 1u);
  EXPECT_EQ(one->shards, four->shards);
  absl::StatusOr<std::vector<Item>> a = ReadDataset(dir / "out1");
  absl::StatusOr<std::vector<Item>> b = ReadDataset(dir / "out4");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 300u);
  EXPECT_EQ(*a, *b);
}

TEST(ImageFolderConvert, NonImageWithImageExtensionIsInvalidArgumentNamingTheFile) {
  ScopedTempDir dir;
  WriteFile(dir / "in/a/good.jpg", FakeImage(1, 100));
  WriteFile(dir / "in/b/bad.jpg", "<html>404 not found</html>");
  ConvertOptions options = FolderOptions(dir / "in", dir / "out");
  for (int threads : {1, 3}) {
    options.threads = threads;
    absl::Status status = Convert(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(dir / "in/b/bad.jpg"));
    EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  }
}

TEST(ImageFolderConvert, FolderWithoutImagesIsInvalidArgumentNamingIt) {
  ScopedTempDir dir;
  std::filesystem::create_directories(dir / "in/empty_class");
  WriteFile(dir / "in/other/labels.txt", "1");
  absl::Status status = Convert(FolderOptions(dir / "in", dir / "out")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "in"));
}

TEST(ImageFolderConvert, MissingInputIsNotFound) {
  ScopedTempDir dir;
  absl::Status status = Convert(FolderOptions(dir / "missing", dir / "out")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "missing"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(ImageFolderConvert, InputFileIsInvalidArgument) {
  ScopedTempDir dir;
  WriteFile(dir / "file.jpg", FakeImage(1, 100));
  EXPECT_EQ(Convert(FolderOptions(dir / "file.jpg", dir / "out")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::record
