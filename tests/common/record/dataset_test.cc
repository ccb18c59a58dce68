#include "common/record/dataset.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace sluice::record {
namespace {

using ::sluice::testing::ReadFile;
using ::sluice::testing::TempDir;
using ::sluice::testing::WriteFile;
using ::testing::HasSubstr;

std::string Payload(int i) { return std::string(1000 + i, static_cast<char>(i)); }

// 30 records of ~1 KB with a 4 KiB shard limit: several shards.
std::string WriteDataset(const TempDir& tmp, int n = 30, uint64_t shard_size = 4096) {
  const std::string dir = tmp.Join("ds");
  auto writer =
      DatasetWriter::Create(dir, ImageClassificationSchema(), {.shard_size_bytes = shard_size});
  EXPECT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE((*writer)
                    ->Add({Tensor::Bytes(Payload(i)), Tensor::Int64(i % 3),
                           Tensor::Bytes("img" + std::to_string(i))})
                    .ok());
  }
  auto manifest = (*writer)->Finish();
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return dir;
}

TEST(Dataset, ShardSizeLimitSplitsIntoShardsAndGlobalIndicesSpanThem) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  auto ds = Dataset::Open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->size(), 30u);
  EXPECT_GT((*ds)->num_shards(), 5u);
  for (const ShardInfo& s : (*ds)->manifest().shards) {
    EXPECT_LE(s.bytes, 4096u) << s.file;
    EXPECT_EQ(s.bytes, std::filesystem::file_size(dir + "/" + s.file));
  }
  for (int i = 29; i >= 0; --i) {
    auto r = (*ds)->Read(i);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->columns[0].data, Payload(i));
    EXPECT_EQ(r->columns[1].AsInt64(), i % 3);
    EXPECT_EQ(r->columns[2].data, "img" + std::to_string(i));
  }
  EXPECT_EQ((*ds)->Read(30).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*ds)->ReadView(30).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*(*ds)->ReadView(17), *(*ds)->ReadEncoded(17));
  EXPECT_TRUE(VerifyDataset(dir).empty());
}

TEST(Dataset, RecordLargerThanTheLimitGetsItsOwnShard) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp, 3, /*shard_size=*/100);
  auto ds = Dataset::Open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_shards(), 3u);
}

TEST(Dataset, ManifestRoundTripsThroughJson) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  auto m = Manifest::ReadFile(dir + "/manifest.json");
  ASSERT_TRUE(m.ok()) << m.status();
  auto again = Manifest::FromJson(m->ToJson(), "copy");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->shards, m->shards);
  EXPECT_EQ(again->total_records, 30u);
}

TEST(Dataset, MissingShardIsNotFoundNamingIt) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  std::filesystem::remove(dir + "/shard-00002.urec");
  const absl::Status s = Dataset::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("shard 'shard-00002.urec' named in the manifest is missing"));
  const auto problems = VerifyDataset(dir);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr("shard-00002.urec"));
}

TEST(Dataset, ShardSymlinkOutOfTheFolderIsPermissionDenied) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  // The shard's bytes moved outside, a symlink left in its place: a dataset
  // under a worker's --data-root must not reach outside it.
  const std::string outside = tmp.Join("outside.urec");
  std::filesystem::rename(dir + "/shard-00001.urec", outside);
  std::filesystem::create_symlink(outside, dir + "/shard-00001.urec");
  const absl::Status s = Dataset::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("shard-00001.urec' resolves to '" +
                                     std::filesystem::canonical(outside).string() +
                                     "', outside its dataset folder"));
  // A symlink that stays inside is fine.
  std::filesystem::remove(dir + "/shard-00001.urec");
  std::filesystem::rename(outside, dir + "/real-00001.urec");
  std::filesystem::create_symlink("real-00001.urec", dir + "/shard-00001.urec");
  EXPECT_TRUE(Dataset::Open(dir).ok());
}

TEST(Dataset, ManifestNamingAShardOutsideItsFolderIsRefused) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  auto manifest = Manifest::ReadFile(dir + "/manifest.json");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (const std::string file : {"..", "../ds/shard-00000.urec", "/etc/passwd", "."}) {
    Manifest bad = *manifest;
    bad.shards[0].file = file;
    const absl::Status s = Manifest::FromJson(bad.ToJson(), "m.json").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << file;
    EXPECT_THAT(s.message(), HasSubstr("shard file '" + file +
                                       "' must be a plain file name inside the dataset"));
  }
}

TEST(Dataset, MissingFolderOrManifestIsNotFound) {
  TempDir tmp;
  EXPECT_EQ(Dataset::Open(tmp.Join("nothing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Dataset::Open(tmp.path()).status().message(), HasSubstr("no manifest"));
}

TEST(Dataset, FlippedByteInManifestIsDataLoss) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  const std::string manifest = ReadFile(dir + "/manifest.json");
  // A digit of a record count: still valid JSON, caught by the checksum.
  std::string changed = manifest;
  const size_t at = changed.find("\"records\": ") + 11;
  changed[at] = changed[at] == '9' ? '8' : changed[at] + 1;
  WriteFile(dir + "/manifest.json", changed);
  absl::Status s = Dataset::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("checksum mismatch"));
  // A brace: no longer JSON.
  changed = manifest;
  changed[0] = '[';
  WriteFile(dir + "/manifest.json", changed);
  s = Dataset::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
}

// Found by the manifest fuzzer: wrong JSON types and hostile nesting are
// DataLoss, not a crash.
TEST(Dataset, MalformedManifestJsonIsDataLoss) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"format":1})", "'format' is not"},
      {R"({"format":"unirecord","checksum":7})", "'checksum' is not 16 hex digits"},
      {"{\"schema\":" + std::string(200000, '[') + std::string(200000, ']') + "}",
       "not valid JSON"},
  };
  for (const auto& [json, message] : cases) {
    auto m = Manifest::FromJson(json, "m.json");
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << json.substr(0, 40);
    EXPECT_THAT(m.status().message(), HasSubstr(message)) << json.substr(0, 40);
    EXPECT_THAT(m.status().message(), HasSubstr("m.json"));
  }
}

TEST(Dataset, ShardNotMatchingManifestIsDataLoss) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  // Swap two shards' contents: each is a valid shard, but not the one the
  // manifest describes.
  const std::string a = ReadFile(dir + "/shard-00000.urec");
  const std::string b = ReadFile(dir + "/shard-00001.urec");
  WriteFile(dir + "/shard-00000.urec", b);
  WriteFile(dir + "/shard-00001.urec", a);
  EXPECT_EQ(Dataset::Open(dir).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Dataset, EmptyDatasetIsRefused) {
  TempDir tmp;
  auto writer = DatasetWriter::Create(tmp.Join("empty"), ImageClassificationSchema(), {});
  ASSERT_TRUE(writer.ok());
  const absl::Status s = (*writer)->Finish().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no records"));
  // A hand-made manifest with no shards.
  Manifest empty{ImageClassificationSchema(), {}, 0};
  WriteFile(tmp.Join("empty/manifest.json"), empty.ToJson());
  const absl::Status open = Dataset::Open(tmp.Join("empty")).status();
  EXPECT_EQ(open.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(open.message(), HasSubstr("is empty (0 records)"));
}

TEST(Dataset, WriterRefusesToOverwriteADataset) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp, 2);
  EXPECT_EQ(DatasetWriter::Create(dir, ImageClassificationSchema(), {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Dataset, VerifyNamesShardAndRecordOfEachFlippedRecord) {
  TempDir tmp;
  const std::string dir = WriteDataset(tmp);
  auto ds = Dataset::Open(dir);
  ASSERT_TRUE(ds.ok());
  const IndexEntry e = (*ds)->shard(1).index()[1];
  ds->reset();
  std::string shard = ReadFile(dir + "/shard-00001.urec");
  shard[e.offset + 40] ^= 0x7f;
  WriteFile(dir + "/shard-00001.urec", shard);
  const auto problems = VerifyDataset(dir);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr("shard-00001.urec"));
  EXPECT_THAT(problems[0], HasSubstr("record 1 checksum mismatch"));
}

}  // namespace
}  // namespace sluice::record
