#include "data_worker/pipeline/source.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data_worker/ops/decode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker::pipeline {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Columns of ImageClassificationSchema: image, label, key.
constexpr int kImage = 0, kLabel = 1, kKey = 2;

std::string KeyOf(const Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data()), t.num_bytes());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(SyntheticSource, RefusesHugeImagesBeforeAllocating) {
  proto::SourceNode node;
  node.mutable_synthetic()->set_num_records(1);
  node.mutable_synthetic()->set_height(100000);
  node.mutable_synthetic()->set_width(100000);
  const absl::Status s = OpenSource(node).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "source.synthetic: 100000 x 100000 is too large (at most 16384 a "
            "side and 16777216 pixels)");
  node.mutable_synthetic()->set_height(16384);
  node.mutable_synthetic()->set_width(2048);  // 32 M pixels
  EXPECT_EQ(OpenSource(node).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticSource, ReadsFixedSizeJpegsAndCyclicLabels) {
  proto::SourceNode node;
  node.mutable_synthetic()->set_num_records(20);
  node.mutable_synthetic()->set_height(24);
  node.mutable_synthetic()->set_width(40);
  node.mutable_synthetic()->set_num_classes(3);
  auto src = OpenSource(node);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->size(), 20u);
  EXPECT_EQ((*src)->image_shape(), (std::vector<int64_t>{24, 40, 3}));
  EXPECT_EQ((*src)->Describe(7), "synthetic:7");
  EXPECT_EQ((*src)->dataset(), nullptr);
  auto rec = (*src)->Read(7, {kImage, kLabel, kKey});
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->size(), 3u);
  EXPECT_EQ(*(*rec)[1].data_as<int64_t>(), 7 % 3);
  EXPECT_EQ(KeyOf((*rec)[2]), "synthetic/7");
  auto img = DecodeImage(
      std::string_view(reinterpret_cast<const char*>((*rec)[0].data()), (*rec)[0].num_bytes()));
  ASSERT_TRUE(img.ok()) << img.status();
  EXPECT_EQ(img->shape(), (std::vector<int64_t>{24, 40, 3}));
  // Only the columns asked for, in the order asked.
  auto label_only = (*src)->Read(4, {kLabel});
  ASSERT_TRUE(label_only.ok());
  ASSERT_EQ(label_only->size(), 1u);
  EXPECT_EQ(*(*label_only)[0].data_as<int64_t>(), 1);
}

TEST(ImageFolderSource, NumbersClassesAndFilesInSortedOrder) {
  sluice::testing::TempDir dir;
  const std::string jpg = testing::Jpeg(0, 8, 8);
  WriteFile(dir.Join("cat/b.jpg"), jpg);
  WriteFile(dir.Join("cat/a.jpg"), jpg);
  WriteFile(dir.Join("ant/sub/z.png"), jpg);  // any name ending .png counts
  WriteFile(dir.Join("ant/notes.txt"), "x");
  WriteFile(dir.Join("ant/.hidden.jpg"), jpg);
  proto::SourceNode node;
  node.mutable_image_folder()->set_path(dir.path());
  auto src = OpenSource(node);
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_EQ((*src)->size(), 3u);
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"ant/sub/z.png", 0}, {"cat/a.jpg", 1}, {"cat/b.jpg", 1}};
  for (uint64_t g = 0; g < 3; ++g) {
    auto rec = (*src)->Read(g, {kLabel, kKey});
    ASSERT_TRUE(rec.ok()) << rec.status();
    EXPECT_EQ(KeyOf((*rec)[1]), want[g].first);
    EXPECT_EQ(*(*rec)[0].data_as<int64_t>(), want[g].second);
    EXPECT_EQ((*src)->Describe(g), dir.Join(want[g].first));
  }
  // A file removed after opening: NotFound naming it.
  fs::remove(dir.Join("cat/a.jpg"));
  const absl::Status gone = (*src)->Read(1, {kImage}).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.message(), HasSubstr(dir.Join("cat/a.jpg")));
}

// A file of the folder that is a symlink out of it (out of the worker's --data-root): the
// source is refused naming both paths, instead of streaming the file back.
TEST(ImageFolderSource, AFileThatIsASymlinkOutOfTheFolderIsRefused) {
  sluice::testing::TempDir dir;
  WriteFile(dir.Join("imgs/cat/a.jpg"), testing::Jpeg(0, 8, 8));
  WriteFile(dir.Join("outside/secret.jpg"), "secret");
  fs::create_symlink("../../outside/secret.jpg", dir.Join("imgs/cat/b.jpg"));
  proto::SourceNode node;
  node.mutable_image_folder()->set_path(dir.Join("imgs"));
  const absl::Status s = OpenSource(node).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  const std::string root = fs::canonical(dir.path()).string();
  EXPECT_EQ(s.message(),
            absl::StrCat("source: image file ", dir.Join("imgs/cat/b.jpg"), " resolves to ", root,
                         "/outside/secret.jpg, outside the "
                         "image folder ",
                         root, "/imgs"));
  // A link that stays in the folder is read like the file it names.
  fs::remove(dir.Join("imgs/cat/b.jpg"));
  fs::create_symlink("a.jpg", dir.Join("imgs/cat/b.jpg"));
  auto src = OpenSource(node);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->size(), 2u);
}

// A file that links to itself and a class folder that links to itself (ELOOP): the throwing
// forms of std::filesystem's calls (directory_entry::is_directory(), is_regular_file()) would
// end the worker with an uncaught filesystem_error; both are skipped like any entry that is not
// an image.
TEST(ImageFolderSource, SymlinkLoopsAreSkippedInsteadOfThrowing) {
  sluice::testing::TempDir dir;
  WriteFile(dir.Join("cat/a.jpg"), testing::Jpeg(0, 8, 8));
  fs::create_symlink("loop.jpg", dir.Join("cat/loop.jpg"));
  fs::create_symlink("dog", dir.Join("dog"));
  proto::SourceNode node;
  node.mutable_image_folder()->set_path(dir.path());
  auto src = OpenSource(node);
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_EQ((*src)->size(), 1u);
  EXPECT_EQ((*src)->Describe(0), dir.Join("cat/a.jpg"));
}

// A file replaced by a symlink out of the folder after the folder was listed: refused when
// it is read.
TEST(ImageFolderSource, AFileSwappedForASymlinkOutIsRefusedWhenRead) {
  sluice::testing::TempDir dir;
  WriteFile(dir.Join("imgs/cat/a.jpg"), testing::Jpeg(0, 8, 8));
  WriteFile(dir.Join("outside.jpg"), "secret");
  proto::SourceNode node;
  node.mutable_image_folder()->set_path(dir.Join("imgs"));
  auto src = OpenSource(node);
  ASSERT_TRUE(src.ok()) << src.status();
  fs::remove(dir.Join("imgs/cat/a.jpg"));
  fs::create_symlink("../../outside.jpg", dir.Join("imgs/cat/a.jpg"));
  const absl::Status s = (*src)->Read(0, {kImage}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("outside the image folder"));
}

TEST(DatasetSource, ReadsRecordsAndExposesTheDataset) {
  sluice::testing::TempDir dir;
  testing::MakeDataset(dir.Join("ds"), 6, /*classes=*/4);
  proto::SourceNode node;
  node.mutable_dataset()->set_path(dir.Join("ds"));
  auto src = OpenSource(node);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->size(), 6u);
  ASSERT_NE((*src)->dataset(), nullptr);
  EXPECT_EQ((*src)->image_shape(), (std::vector<int64_t>{-1, -1, 3}));
  auto rec = (*src)->Read(5, {kKey, kLabel});
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(KeyOf((*rec)[0]), "img_5.jpg");
  EXPECT_EQ(*(*rec)[1].data_as<int64_t>(), 1);
  EXPECT_THAT((*src)->Describe(5), HasSubstr(dir.Join("ds")));
}

TEST(OpenSource, BadSourcesAreRejectedWithTheirField) {
  proto::SourceNode none;
  EXPECT_EQ(OpenSource(none).status().message(),
            "source: set one of dataset, image_folder, synthetic");
  proto::SourceNode missing;
  missing.mutable_dataset()->set_path("/nonexistent/sluice-ds");
  EXPECT_EQ(OpenSource(missing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(OpenSource(missing).status().message(),
            "source: path '/nonexistent/sluice-ds' does not exist");
  proto::SourceNode empty_path;
  empty_path.mutable_image_folder();
  EXPECT_EQ(OpenSource(empty_path).status().code(), absl::StatusCode::kInvalidArgument);
  proto::SourceNode zero;
  zero.mutable_synthetic()->set_num_records(0);
  EXPECT_EQ(OpenSource(zero).status().message(), "source.synthetic: num_records must be > 0");
  sluice::testing::TempDir dir;
  fs::create_directories(dir.Join("only/dirs"));
  proto::SourceNode no_images;
  no_images.mutable_image_folder()->set_path(dir.path());
  EXPECT_THAT(OpenSource(no_images).status().message(), HasSubstr("has no .jpg/.jpeg/.png files"));
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
