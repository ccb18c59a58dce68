#include "common/record/filter.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace sluice::record {
namespace {

using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

class FilterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto writer = DatasetWriter::Create(tmp_.Join("ds"), ImageClassificationSchema(),
                                        {.shard_size_bytes = 2048});
    ASSERT_TRUE(writer.ok());
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE((*writer)
                      ->Add({Tensor::Bytes(std::string(300, 'x')), Tensor::Int64(i % 7),
                             Tensor::Bytes("k")})
                      .ok());
    }
    ASSERT_TRUE((*writer)->Finish().ok());
    auto ds = Dataset::Open(tmp_.Join("ds"));
    ASSERT_TRUE(ds.ok()) << ds.status();
    dataset_ = *std::move(ds);
    ASSERT_GT(dataset_->num_shards(), 1u);
  }

  std::vector<uint64_t> Select(const std::string& expr) {
    auto f = Filter::Parse(expr, dataset_->schema());
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? f->Select(*dataset_) : std::vector<uint64_t>{};
  }

  TempDir tmp_;
  std::unique_ptr<Dataset> dataset_;
};

TEST_F(FilterTest, EqualsSelectsExactRecordsAcrossShards) {
  EXPECT_EQ(Select("label == 3"), (std::vector<uint64_t>{3, 10, 17, 24, 31, 38}));
}

TEST_F(FilterTest, InIsSetMembership) {
  EXPECT_EQ(Select("label in [1, 4]"),
            (std::vector<uint64_t>{1, 4, 8, 11, 15, 18, 22, 25, 29, 32, 36, 39}));
}

TEST_F(FilterTest, Comparisons) {
  EXPECT_EQ(Select("label >= 6"), (std::vector<uint64_t>{6, 13, 20, 27, 34}));
  EXPECT_EQ(Select("label<1"), (std::vector<uint64_t>{0, 7, 14, 21, 28, 35}));
  EXPECT_EQ(Select("label != 0").size(), 34u);
}

TEST_F(FilterTest, BadExpressionsAreInvalidArgumentSayingWhy) {
  const Schema& schema = dataset_->schema();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected a column name"},
      {"color == 3", "no column 'color'"},
      {"key == 3", "is not indexed"},
      {"label ~ 3", "expected one of"},
      {"label == three", "'three' is not a number"},
      {"label in 1,4", "takes a list"},
      {"label in []", "list is empty"},
  };
  for (const auto& [expr, message] : cases) {
    auto f = Filter::Parse(expr, schema);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << expr;
    EXPECT_THAT(f.status().message(), HasSubstr(message)) << expr;
  }
}

}  // namespace
}  // namespace sluice::record
