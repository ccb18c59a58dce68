#include "common/record/shard.h"

#include <filesystem>

#include "common/record/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace sluice::record {
namespace {

using ::sluice::testing::ReadFile;
using ::sluice::testing::TempDir;
using ::sluice::testing::WriteFile;
using ::testing::HasSubstr;

Schema TestSchema() {
  return Schema{{
      {.name = "payload", .dtype = DType::kBytes},
      {.name = "label", .dtype = DType::kInt64, .indexed = true},
  }};
}

std::string Payload(int i) { return std::string(100 + 37 * i, static_cast<char>('a' + i % 26)); }

// Writes `n` records: payload i, label i % 5.
std::string WriteShard(const TempDir& dir, int n) {
  const std::string path = dir.Join("s.urec");
  auto writer = ShardWriter::Create(path, TestSchema());
  EXPECT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE((*writer)->Add({Tensor::Bytes(Payload(i)), Tensor::Int64(i % 5)}).ok());
  }
  EXPECT_TRUE((*writer)->Finish().ok());
  return path;
}

template <typename T>
T Load(const std::string& bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

template <typename T>
void Store(std::string& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

struct Layout {
  uint64_t data_offset, index_offset, index_size;
};

Layout LayoutOf(const std::string& file) {
  const uint64_t footer = file.size() - kFooterSize;
  return {16 + Load<uint32_t>(file, 12) + 8, Load<uint64_t>(file, footer),
          Load<uint64_t>(file, footer + 8)};
}

absl::Status OpenStatus(const std::string& path) { return ShardReader::Open(path).status(); }

TEST(Shard, RandomAccessToEveryRecord) {
  TempDir dir;
  const std::string path = WriteShard(dir, 50);
  auto reader = ShardReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->record_count(), 50u);
  EXPECT_EQ((*reader)->schema(), TestSchema());
  EXPECT_EQ((*reader)->indexed_columns(), std::vector<std::string>{"label"});
  for (int i : {49, 0, 17, 3, 48, 25}) {
    auto record = (*reader)->Read(i);
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->columns[0].data, Payload(i));
    EXPECT_EQ(record->columns[1].AsInt64(), i % 5);
    EXPECT_EQ((*reader)->key(i, 0), i % 5);
  }
  EXPECT_EQ((*reader)->Read(50).status().code(), absl::StatusCode::kOutOfRange);
  auto view = (*reader)->ReadView(9);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(*view, *(*reader)->ReadEncoded(9));
}

TEST(Shard, EmptyRecordValuesRoundTrip) {
  TempDir dir;
  const std::string path = dir.Join("e.urec");
  auto writer = ShardWriter::Create(path, TestSchema());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Add({Tensor::Bytes(""), Tensor::Int64(0)}).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto reader = ShardReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->Read(0)->columns[0].data, "");
}

TEST(Shard, WriterRejectsAnEmptyEncodedRecord) {
  TempDir dir;
  auto writer = ShardWriter::Create(dir.Join("z.urec"), TestSchema());
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->AddEncoded("").code(), absl::StatusCode::kDataLoss);
}

TEST(Shard, WrongMagicIsInvalidArgument) {
  TempDir dir;
  WriteFile(dir.Join("x.urec"),
            "PK\x03\x04 this is a zip file, not a shard........................");
  const absl::Status s = OpenStatus(dir.Join("x.urec"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a Unirecord shard"));
  EXPECT_THAT(s.message(), HasSubstr("x.urec"));
}

TEST(Shard, MissingFileIsNotFound) {
  TempDir dir;
  EXPECT_EQ(OpenStatus(dir.Join("nope.urec")).code(), absl::StatusCode::kNotFound);
}

// Truncation at every region must be DataLoss naming the file, never a crash.
TEST(Shard, TruncatedInsideEachRegionIsDataLoss) {
  TempDir dir;
  const std::string path = WriteShard(dir, 20);
  const std::string file = ReadFile(path);
  const Layout l = LayoutOf(file);
  const std::vector<std::pair<std::string, size_t>> cuts = {
      {"header", 12},
      {"header", l.data_offset - 3},
      {"data", l.data_offset + 50},
      {"data", l.index_offset - 1},
      {"index", l.index_offset + l.index_size / 2},
      {"footer", file.size() - kFooterSize + 10},
      {"footer", file.size() - 1},
  };
  for (const auto& [region, size] : cuts) {
    WriteFile(dir.Join("cut.urec"), file.substr(0, size));
    const absl::Status s = OpenStatus(dir.Join("cut.urec"));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << region << " cut at " << size << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("cut.urec")) << region;
  }
  WriteFile(dir.Join("cut.urec"), file.substr(0, 12));
  EXPECT_THAT(OpenStatus(dir.Join("cut.urec")).message(), HasSubstr("truncated inside the header"));
  WriteFile(dir.Join("cut.urec"), file.substr(0, l.data_offset + 50));
  EXPECT_THAT(OpenStatus(dir.Join("cut.urec")).message(),
              HasSubstr("truncated or was not finished"));
}

TEST(Shard, FlippedByteInRecordIsDataLossNamingFileAndRecord) {
  TempDir dir;
  const std::string path = WriteShard(dir, 20);
  std::string file = ReadFile(path);
  auto reader = ShardReader::Open(path);
  ASSERT_TRUE(reader.ok());
  const IndexEntry e = (*reader)->index()[7];
  file[e.offset + e.size / 2] ^= 0x01;
  WriteFile(path, file);
  reader = ShardReader::Open(path);
  ASSERT_TRUE(reader.ok()) << "a record flip is found on read, not on open";
  const absl::Status s = (*reader)->Read(7).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("s.urec"));
  EXPECT_THAT(s.message(), HasSubstr("record 7 checksum mismatch"));
  EXPECT_TRUE((*reader)->Read(6).ok());
  EXPECT_TRUE((*reader)->Read(8).ok());
}

TEST(Shard, FlippedByteInHeaderIndexOrFooterIsDataLoss) {
  TempDir dir;
  const std::string path = WriteShard(dir, 20);
  const std::string file = ReadFile(path);
  const Layout l = LayoutOf(file);
  const std::vector<std::pair<size_t, std::string>> flips = {
      {20, "header checksum mismatch"},
      {l.index_offset + 30, "index checksum mismatch"},
      {file.size() - kFooterSize + 2, "footer checksum mismatch"},
  };
  for (const auto& [at, message] : flips) {
    std::string bad = file;
    bad[at] ^= 0x10;
    WriteFile(path, bad);
    const absl::Status s = OpenStatus(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << message;
    EXPECT_THAT(s.message(), HasSubstr(message));
  }
}

// An index that is internally consistent (checksums recomputed) but describes a
// zero-length record.
TEST(Shard, ZeroLengthIndexEntryIsDataLoss) {
  TempDir dir;
  const std::string path = WriteShard(dir, 3);
  std::string file = ReadFile(path);
  const Layout l = LayoutOf(file);
  Store<uint64_t>(file, l.index_offset + 8, 0);  // record 0 size := 0
  const uint64_t footer = file.size() - kFooterSize;
  Store<uint64_t>(file, footer + 24,
                  Checksum(std::string_view(file).substr(l.index_offset, l.index_size)));
  Store<uint64_t>(file, footer + 32, Checksum(std::string_view(file).substr(footer, 32)));
  WriteFile(path, file);
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("index entry of record 0 is out of place"));
}

TEST(Shard, UnknownVersionIsFailedPrecondition) {
  TempDir dir;
  const std::string path = WriteShard(dir, 2);
  std::string file = ReadFile(path);
  Store<uint32_t>(file, 8, 99);
  const uint64_t header_end = LayoutOf(file).data_offset - 8;
  Store<uint64_t>(file, header_end, Checksum(std::string_view(file).substr(0, header_end)));
  WriteFile(path, file);
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("format version 99"));
}

TEST(Shard, UnfinishedWriterLeavesAFileReadersReject) {
  TempDir dir;
  {
    auto writer = ShardWriter::Create(dir.Join("u.urec"), TestSchema());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Add({Tensor::Bytes("x"), Tensor::Int64(1)}).ok());
  }
  EXPECT_EQ(OpenStatus(dir.Join("u.urec")).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace sluice::record
