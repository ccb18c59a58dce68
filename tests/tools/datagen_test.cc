#include "tools/datagen/datagen.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/record/convert/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class DatagenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/sluice_datagen_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  DatagenOptions Options(const std::string& name, int images, int classes, uint64_t seed) {
    DatagenOptions options;
    options.output = dir_ + "/" + name;
    options.images = images;
    options.classes = classes;
    options.seed = seed;
    return options;
  }

  // Relative path -> content of every file under `root`.
  static std::map<std::string, std::string> Files(const std::string& root) {
    std::map<std::string, std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      files[fs::relative(entry.path(), root).generic_string()] =
          std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return files;
  }

  std::string dir_;
};

TEST_F(DatagenTest, WritesTheDocumentedTreeWithBalancedClasses) {
  ASSERT_TRUE(GenerateImageFolder(Options("out", 10, 3, 1)).ok());
  const std::map<std::string, std::string> files = Files(dir_ + "/out");
  std::vector<std::string> names;
  std::map<std::string, int> per_class;
  for (const auto& [name, data] : files) {
    names.push_back(name);
    ++per_class[name.substr(0, name.find('/'))];
  }
  EXPECT_EQ(names.size(), 10u);
  EXPECT_EQ(names[0], "class_000/img_000000.jpg");
  EXPECT_TRUE(files.contains("class_001/img_000004.jpg"));
  EXPECT_TRUE(files.contains("class_000/img_000009.jpg"));
  EXPECT_EQ(per_class,
            (std::map<std::string, int>{{"class_000", 4}, {"class_001", 3}, {"class_002", 3}}));
}

TEST_F(DatagenTest, SameSeedGivesIdenticalBytesForAnyThreadCount) {
  DatagenOptions one = Options("one", 8, 2, 42);
  DatagenOptions four = Options("four", 8, 2, 42);
  four.threads = 4;
  ASSERT_TRUE(GenerateImageFolder(one).ok());
  ASSERT_TRUE(GenerateImageFolder(four).ok());
  const auto a = Files(one.output), b = Files(four.output);
  ASSERT_EQ(a.size(), 8u);
  EXPECT_TRUE(a == b);
}

TEST_F(DatagenTest, OtherSeedGivesOtherImages) {
  ASSERT_TRUE(GenerateImageFolder(Options("a", 4, 2, 1)).ok());
  ASSERT_TRUE(GenerateImageFolder(Options("b", 4, 2, 2)).ok());
  const auto a = Files(dir_ + "/a"), b = Files(dir_ + "/b");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, data] : a) EXPECT_NE(data, b.at(name)) << name;
}

TEST_F(DatagenTest, ImagesDecodeWithImageNetLikeSizes) {
  constexpr int kImages = 24;
  ASSERT_TRUE(GenerateImageFolder(Options("out", kImages, 4, 7)).ok());
  uint64_t total_bytes = 0;
  std::set<double> aspects;
  for (const auto& [name, data] : Files(dir_ + "/out")) {
    total_bytes += data.size();
    EXPECT_GT(data.size(), 5000u) << name << " is too simple to stand for a photo";
    EXPECT_LT(data.size(), 200000u) << name;
    const cv::Mat image = cv::imread(dir_ + "/out/" + name, cv::IMREAD_COLOR);
    ASSERT_FALSE(image.empty()) << name << " does not decode";
    EXPECT_EQ(image.channels(), 3);
    const int long_side = std::max(image.cols, image.rows);
    const int short_side = std::min(image.cols, image.rows);
    EXPECT_GE(long_side, 300) << name;
    EXPECT_LE(long_side, 600) << name;
    EXPECT_GE(short_side, 150) << name;
    aspects.insert(static_cast<double>(image.cols) / image.rows);
  }
  const double average_kb = total_bytes / 1024.0 / kImages;
  EXPECT_GE(average_kb, 25.0);
  EXPECT_LE(average_kb, 70.0);
  EXPECT_GT(aspects.size(), static_cast<size_t>(kImages / 2)) << "aspect ratios must vary";
}

TEST_F(DatagenTest, ProgressCountsEveryImage) {
  DatagenOptions options = Options("out", 6, 2, 3);
  options.threads = 3;
  std::vector<uint64_t> done;
  options.progress = [&](uint64_t d, uint64_t total) {
    EXPECT_EQ(total, 6u);
    done.push_back(d);
  };
  ASSERT_TRUE(GenerateImageFolder(options).ok());
  EXPECT_EQ(done, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
}

TEST_F(DatagenTest, BadOptionsAreRejectedNamingTheFlag) {
  DatagenOptions options = Options("out", 0, 2, 0);
  absl::Status status = GenerateImageFolder(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--images"));

  options = Options("out", 5, 0, 0);
  status = GenerateImageFolder(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--classes"));

  options = Options("out", 5, 6, 0);
  status = GenerateImageFolder(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--classes"));

  options = Options("", 5, 2, 0);
  options.output = "";
  status = GenerateImageFolder(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--output"));

  options = Options("out", 5, 2, 0);
  options.threads = 0;
  EXPECT_EQ(GenerateImageFolder(options).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir_ + "/out")) << "rejected options write nothing";
}

TEST_F(DatagenTest, NonEmptyOutputIsFailedPrecondition) {
  fs::create_directories(dir_ + "/out");
  std::ofstream(dir_ + "/out/precious.txt") << "keep me";
  absl::Status status = GenerateImageFolder(Options("out", 2, 1, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("--output"));
  EXPECT_TRUE(fs::exists(dir_ + "/out/precious.txt"));
}

TEST_F(DatagenTest, GeneratedTreeConvertsWithTheImageFolderConverter) {
  ASSERT_TRUE(GenerateImageFolder(Options("images", 6, 3, 5)).ok());
  record::ConvertOptions options;
  options.input = dir_ + "/images";
  options.output = dir_ + "/dataset";
  absl::StatusOr<record::Manifest> manifest = record::Convert(options);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->total_records, 6u);
}

}  // namespace
}  // namespace sluice::tools
