#include "common/record/sharding.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace sluice::record {
namespace {

TEST(Permutation, IsAPermutationFixedBySeedAndEpoch) {
  const auto p = Permutation(1000, /*seed=*/7, /*epoch=*/0);
  std::vector<uint64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  // Every "node" computes it independently and gets the same order.
  EXPECT_EQ(Permutation(1000, 7, 0), p);
  EXPECT_NE(Permutation(1000, 7, 1), p);
  EXPECT_NE(Permutation(1000, 8, 0), p);
}

TEST(Permutation, KnownValuesPinTheAlgorithm) {
  // A change here reorders every existing job's epochs; it must be deliberate.
  EXPECT_EQ(Permutation(10, 0, 0),
            (std::vector<uint64_t>{9, 3, 4, 2, 8, 5, 0, 1, 6, 7}));
  EXPECT_EQ(Permutation(10, 0, 1),
            (std::vector<uint64_t>{0, 9, 5, 8, 7, 6, 4, 1, 2, 3}));
  EXPECT_TRUE(Permutation(0, 1, 2).empty());
  EXPECT_EQ(Permutation(1, 1, 2), std::vector<uint64_t>{0});
}

TEST(Partition, DisjointAndCoveringWhenEven) {
  std::set<uint64_t> seen;
  for (uint32_t k = 0; k < 4; ++k) {
    auto part = Partition(100, 4, k, 3, 1, RemainderPolicy::kDrop);
    ASSERT_TRUE(part.ok());
    EXPECT_EQ(part->size(), 25u);
    for (uint64_t r : *part)
      EXPECT_TRUE(seen.insert(r).second) << "record " << r << " twice";
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(Partition, PadGivesEqualSharesCoveringEverything) {
  std::set<uint64_t> seen;
  size_t total = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    auto part = Partition(10, 3, k, 0, 0, RemainderPolicy::kPad);
    ASSERT_TRUE(part.ok());
    EXPECT_EQ(part->size(), 4u);
    total += part->size();
    seen.insert(part->begin(), part->end());
  }
  EXPECT_EQ(total, 12u);
  EXPECT_EQ(seen.size(), 10u);  // all covered; two repeated to pad
}

TEST(Partition, DropGivesEqualDisjointShares) {
  std::set<uint64_t> seen;
  for (uint32_t k = 0; k < 3; ++k) {
    auto part = Partition(10, 3, k, 0, 0, RemainderPolicy::kDrop);
    ASSERT_TRUE(part.ok());
    EXPECT_EQ(part->size(), 3u);
    for (uint64_t r : *part) EXPECT_TRUE(seen.insert(r).second);
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(Partition, UnevenCoversExactlyOnce) {
  std::multiset<uint64_t> seen;
  std::vector<size_t> sizes;
  for (uint32_t k = 0; k < 3; ++k) {
    auto part = Partition(10, 3, k, 5, 5, RemainderPolicy::kUneven);
    ASSERT_TRUE(part.ok());
    sizes.push_back(part->size());
    seen.insert(part->begin(), part->end());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 3, 3}));
  EXPECT_EQ(seen.size(), 10u);
  for (uint64_t r = 0; r < 10; ++r) EXPECT_EQ(seen.count(r), 1u);
}

TEST(Partition, IsStridedOverThePermutation) {
  const auto perm = Permutation(10, 0, 0);
  auto part = Partition(10, 3, 1, 0, 0, RemainderPolicy::kPad);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(*part, (std::vector<uint64_t>{perm[1], perm[4], perm[7], perm[0]}));
}

TEST(Partition, BadArgumentsAreInvalidArgument) {
  EXPECT_EQ(Partition(10, 0, 0, 0, 0, RemainderPolicy::kPad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Partition(10, 2, 2, 0, 0, RemainderPolicy::kPad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Splits, ContiguousRangesWithinShards) {
  auto splits = EnumerateSplits({10, 0, 5}, 4);
  ASSERT_TRUE(splits.ok());
  const std::vector<Split> expected = {{0, 0, 0, 4, 0},
                                       {1, 0, 4, 8, 4},
                                       {2, 0, 8, 10, 8},
                                       {3, 2, 0, 4, 10},
                                       {4, 2, 4, 5, 14}};
  EXPECT_EQ(*splits, expected);
  EXPECT_EQ(EnumerateSplits({10}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::record
