// Tests of Convert's format-independent behaviour; each format has its own test
// file.
#include "common/record/convert/convert.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/record/convert/test_util.h"

namespace sluice::record {
namespace {

using convert_test::FakeImage;
using convert_test::ScopedTempDir;
using convert_test::WriteFile;
using ::testing::HasSubstr;

TEST(ParseInputFormat, AcceptsTheThreeNames) {
  EXPECT_EQ(ParseInputFormat("imagefolder").value(), InputFormat::kImageFolder);
  EXPECT_EQ(ParseInputFormat("tfrecord").value(), InputFormat::kTfRecord);
  EXPECT_EQ(ParseInputFormat("wds").value(), InputFormat::kWebDataset);
}

TEST(ParseInputFormat, RejectsOtherNamesListingTheChoices) {
  absl::StatusOr<InputFormat> format = ParseInputFormat("parquet");
  EXPECT_EQ(format.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(format.status().message(), HasSubstr("parquet"));
  EXPECT_THAT(format.status().message(), HasSubstr("imagefolder, tfrecord or wds"));
}

class ConvertOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_ / "in/c/x.jpg", FakeImage(1, 100));
    options_.input = dir_ / "in";
    options_.output = dir_ / "out";
  }
  absl::Status Run() { return Convert(options_).status(); }

  ScopedTempDir dir_;
  ConvertOptions options_;
};

TEST_F(ConvertOptionsTest, ZeroThreadsIsInvalidArgumentNamingTheFlag) {
  options_.threads = 0;
  EXPECT_EQ(Run().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Run().message(), HasSubstr("--threads"));
}

TEST_F(ConvertOptionsTest, ZeroShardSizeIsInvalidArgument) {
  options_.shard_size_bytes = 0;
  EXPECT_EQ(Run().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ConvertOptionsTest, EmptyOutputIsInvalidArgumentNamingTheFlag) {
  options_.output = "";
  EXPECT_EQ(Run().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Run().message(), HasSubstr("--output"));
}

TEST_F(ConvertOptionsTest, ExistingDatasetIsFailedPreconditionAndKept) {
  ASSERT_TRUE(Run().ok());
  const std::string manifest = convert_test::ReadFile(dir_ / "out/manifest.json");
  EXPECT_EQ(Run().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(convert_test::ReadFile(dir_ / "out/manifest.json"), manifest);
}

TEST_F(ConvertOptionsTest, ConvertsIntoAnExistingEmptyFolder) {
  std::filesystem::create_directories(dir_ / "out");
  EXPECT_TRUE(Run().ok());
}

}  // namespace
}  // namespace sluice::record
