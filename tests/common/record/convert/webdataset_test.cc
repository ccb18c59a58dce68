// Tests of the wds (WebDataset tar) input of Convert
// (common/record/convert/convert.h).
#include <archive.h>
#include <archive_entry.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/record/convert/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
using ::testing::HasSubstr;

// (path, content) of each member, in tar order.
using Members = std::vector<std::pair<std::string, std::string>>;

// Writes a tar with libarchive: pax (restricted) by default, optionally
// gzip-compressed.
void WriteTar(const std::string& path, const Members& members, bool gzip = false) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  archive* a = archive_write_new();
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  if (gzip) {
    ASSERT_EQ(archive_write_add_filter_gzip(a), ARCHIVE_OK);
  }
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK) << archive_error_string(a);
  for (const auto& [name, data] : members) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, name.c_str());
    archive_entry_set_size(entry, static_cast<la_int64_t>(data.size()));
    archive_entry_set_filetype(entry, AE_IFREG);
    archive_entry_set_perm(entry, 0644);
    ASSERT_EQ(archive_write_header(a, entry), ARCHIVE_OK) << archive_error_string(a);
    ASSERT_EQ(archive_write_data(a, data.data(), data.size()),
              static_cast<la_ssize_t>(data.size()));
    archive_entry_free(entry);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

// Members for `items` (key, image, label): <key>.jpg (or .png) then <key>.cls.
Members SampleMembers(const std::vector<Item>& items) {
  Members members;
  for (const Item& item : items) {
    const bool png = item.image[0] == '\x89';
    members.emplace_back(item.key + (png ? ".png" : ".jpg"), item.image);
    members.emplace_back(item.key + ".cls", std::to_string(item.label) + "\n");
  }
  return members;
}

std::vector<Item> SomeItems(const std::string& prefix, int n, uint64_t seed) {
  std::vector<Item> items;
  for (int i = 0; i < n; ++i) {
    char number[16];
    std::snprintf(number, sizeof number, "%06d", i);
    items.push_back(Item{FakeImage(seed * 1000 + i, 80 + 53 * i, /*png=*/i % 4 == 3), (i * 5) % 11,
                         prefix + number});
  }
  return items;
}

absl::StatusOr<Manifest> ConvertWds(const std::string& input, const std::string& output,
                                    int threads = 1, uint64_t shard_size = kDefaultShardSizeBytes) {
  return ConvertAs(InputFormat::kWebDataset, input, output, threads, shard_size);
}

void ExpectDataset(const std::string& dir, const std::vector<Item>& expected) {
  absl::StatusOr<std::vector<Item>> items = ReadDataset(dir);
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, expected);
}

TEST(WebDatasetConvert, RoundTripsSamplesInTarOrder) {
  ScopedTempDir dir;
  Members members = {
      {"b/000009.cls", " 7 \n"},  // label first, whitespace trimmed; key keeps its folder
      {"b/000009.jpg", FakeImage(1, 500)},
      {"b/000009.json", "{\"ignored\": true}"},
      {"a/000001.PNG", FakeImage(2, 400, /*png=*/true)},
      {"a/000001.cls", "3"},
      {"a/000001.seg.png", "ignored: extension seg.png is no image"},
      {"README", "no extension: ignored"},
      {"./c/x.jpeg", FakeImage(3, 300)},  // "./" is dropped from keys
      {"./c/x.cls", "-1"},
  };
  WriteTar(dir / "in.tar", members);
  absl::StatusOr<Manifest> manifest = ConvertWds(dir / "in.tar", dir / "out");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ExpectDataset(dir / "out", {{FakeImage(1, 500), 7, "b/000009"},
                              {FakeImage(2, 400, true), 3, "a/000001"},
                              {FakeImage(3, 300), -1, "c/x"}});
}

TEST(WebDatasetConvert, ReadsAFolderOfTarsSortedByNameIncludingGzip) {
  ScopedTempDir dir;
  const std::vector<Item> a = SomeItems("a", 3, 1), b = SomeItems("b", 4, 2),
                          c = SomeItems("c", 2, 3);
  WriteTar(dir / "in/shard-2.tar", SampleMembers(c));
  WriteTar(dir / "in/shard-1.tar.gz", SampleMembers(b), /*gzip=*/true);
  WriteTar(dir / "in/shard-0.tar", SampleMembers(a));
  WriteFile(dir / "in/notes.txt", "not a tar: skipped");
  absl::StatusOr<Manifest> manifest = ConvertWds(dir / "in", dir / "out");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->total_records, 9u);
  std::vector<Item> expected = a;
  expected.insert(expected.end(), b.begin(), b.end());
  expected.insert(expected.end(), c.begin(), c.end());
  ExpectDataset(dir / "out", expected);
}

// Builds files for `items` in dir/src and archives them with the system tar
// command.
void SystemTar(const ScopedTempDir& dir, const std::vector<Item>& items,
               const std::string& format) {
  std::string names;
  for (const auto& [name, data] : SampleMembers(items)) {
    WriteFile(dir / ("src/" + name), data);
    names += " '" + name + "'";
  }
  const std::string command = "tar --format=" + format + " -cf '" + (dir / "in.tar") + "' -C '" +
                              (dir / "src") + "'" + names;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

TEST(WebDatasetConvert, ReadsGnuTarFromTheSystemTarCommand) {
  ScopedTempDir dir;
  const std::vector<Item> items = SomeItems("sample_", 5, 4);
  SystemTar(dir, items, "gnu");
  ASSERT_TRUE(ConvertWds(dir / "in.tar", dir / "out").ok());
  ExpectDataset(dir / "out", items);
}

TEST(WebDatasetConvert, ReadsPaxTarWithPathsLongerThanUstarAllows) {
  ScopedTempDir dir;
  const std::string deep =
      "a_rather_long_folder_name_for_testing/another_long_folder_name_here/"
      "and_a_third_one_to_pass_the_limit/";
  std::vector<Item> items = SomeItems(deep + "sample_with_a_long_name_", 3, 5);
  ASSERT_GT(items[0].key.size() + 4, 100u) << "must exceed ustar's 100-byte name field";
  SystemTar(dir, items, "pax");
  ASSERT_TRUE(ConvertWds(dir / "in.tar", dir / "out").ok());
  ExpectDataset(dir / "out", items);
}

TEST(WebDatasetConvert, MissingLabelIsInvalidArgumentNamingTarAndKey) {
  ScopedTempDir dir;
  Members members = SampleMembers(SomeItems("k", 2, 6));
  members.emplace_back("k000777.jpg", FakeImage(9, 100));
  members.emplace_back("k000777.txt", "a caption but no class");
  WriteTar(dir / "in.tar", members);
  absl::Status status = ConvertWds(dir / "in.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir / "in.tar"), HasSubstr("k000777"), HasSubstr("label")));
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(WebDatasetConvert, MissingImageIsInvalidArgumentNamingTarAndKey) {
  ScopedTempDir dir;
  WriteTar(dir / "in.tar", {{"x1.cls", "1"}});
  absl::Status status = ConvertWds(dir / "in.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir / "in.tar"), HasSubstr("\"x1\""), HasSubstr("image")));
}

TEST(WebDatasetConvert, NonIntegerClassIsInvalidArgumentNamingTheMember) {
  ScopedTempDir dir;
  WriteTar(dir / "in.tar", {{"x1.jpg", FakeImage(1, 100)}, {"x1.cls", "tench"}});
  absl::Status status = ConvertWds(dir / "in.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir / "in.tar"), HasSubstr("x1.cls"), HasSubstr("tench")));
}

TEST(WebDatasetConvert, NonImageBytesAreInvalidArgument) {
  ScopedTempDir dir;
  WriteTar(dir / "in.tar", {{"x1.jpg", "not a jpeg"}, {"x1.cls", "1"}});
  absl::Status status = ConvertWds(dir / "in.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("x1.jpg"));
}

TEST(WebDatasetConvert, SplitSampleIsInvalidArgument) {
  ScopedTempDir dir;
  WriteTar(dir / "in.tar", {{"x1.jpg", FakeImage(1, 100)},
                            {"x2.jpg", FakeImage(2, 100)},
                            {"x2.cls", "2"},
                            {"x1.cls", "1"}});
  absl::Status status = ConvertWds(dir / "in.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("x1"));
}

TEST(WebDatasetConvert, NonTarIsInvalidArgumentAndTruncatedTarIsDataLoss) {
  ScopedTempDir dir;
  WriteFile(dir / "junk.tar", std::string(2000, 'j'));
  absl::Status status = ConvertWds(dir / "junk.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "junk.tar"));

  WriteTar(dir / "full.tar", SampleMembers(SomeItems("t", 4, 7)));
  const std::string full = ReadFile(dir / "full.tar");
  WriteFile(dir / "cut.tar", full.substr(0, 1800));
  status = ConvertWds(dir / "cut.tar", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "cut.tar"));
}

TEST(WebDatasetConvert, ShardSizeLimitProducesSeveralShards) {
  ScopedTempDir dir;
  const std::vector<Item> items = SomeItems("s", 25, 8);
  WriteTar(dir / "in.tar", SampleMembers(items));
  absl::StatusOr<Manifest> manifest =
      ConvertWds(dir / "in.tar", dir / "out", 1, /*shard_size=*/3000);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_GE(manifest->shards.size(), 4u);
  for (const ShardInfo& shard : manifest->shards) {
    if (shard.records > 1) {
      EXPECT_LE(shard.bytes, 3000u) << shard.file;
    }
  }
  ExpectDataset(dir / "out", items);
}

TEST(WebDatasetConvert, OutputDoesNotDependOnThreadCount) {
  ScopedTempDir dir;
  for (int t = 0; t < 7; ++t) {
    WriteTar(dir / ("in/" + std::to_string(t) + ".tar"),
             SampleMembers(SomeItems(std::to_string(t) + "_", 2 + 3 * t, 10 + t)));
  }
  absl::StatusOr<Manifest> one = ConvertWds(dir / "in", dir / "out1", /*threads=*/1, 5000);
  absl::StatusOr<Manifest> four = ConvertWds(dir / "in", dir / "out4", /*threads=*/4, 5000);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_GT(one->shards.size(), 1u);
  EXPECT_EQ(one->shards, four->shards);
  absl::StatusOr<std::vector<Item>> a = ReadDataset(dir / "out1");
  absl::StatusOr<std::vector<Item>> b = ReadDataset(dir / "out4");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 77u);
  EXPECT_EQ(*a, *b);
}

TEST(WebDatasetConvert, MissingInputIsNotFoundAndEmptyFolderInvalidArgument) {
  ScopedTempDir dir;
  EXPECT_EQ(ConvertWds(dir / "nope.tar", dir / "out").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::create_directories(dir / "empty");
  absl::Status status = ConvertWds(dir / "empty", dir / "out").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(dir / "empty"));
}

}  // namespace
}  // namespace sluice::record
