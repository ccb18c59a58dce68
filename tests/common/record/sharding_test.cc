#include "common/record/sharding.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
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
  EXPECT_EQ(Permutation(10, 0, 0), (std::vector<uint64_t>{9, 3, 4, 2, 8, 5, 0, 1, 6, 7}));
  EXPECT_EQ(Permutation(10, 0, 1), (std::vector<uint64_t>{0, 9, 5, 8, 7, 6, 4, 1, 2, 3}));
  EXPECT_TRUE(Permutation(0, 1, 2).empty());
  EXPECT_EQ(Permutation(1, 1, 2), std::vector<uint64_t>{0});
}

TEST(Splits, ContiguousRangesWithinShards) {
  auto splits = EnumerateSplits({10, 0, 5}, 4);
  ASSERT_TRUE(splits.ok());
  const std::vector<Split> expected = {
      {0, 0, 0, 4, 0}, {1, 0, 4, 8, 4}, {2, 0, 8, 10, 8}, {3, 2, 0, 4, 10}, {4, 2, 4, 5, 14}};
  EXPECT_EQ(*splits, expected);
  EXPECT_EQ(EnumerateSplits({10}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// The record ids a slot reads: its pieces, each a range of its split's record order.
std::vector<uint64_t> SlotRecords(const std::vector<Split>& splits, const SlotPieces& slot) {
  std::vector<uint64_t> out;
  for (const SplitPiece& p : slot) {
    for (uint64_t i = p.offset; i < p.offset + p.count; ++i)
      out.push_back(splits[p.split_id].first_global + i);
  }
  return out;
}

TEST(ConsumerSlots, TheHeadersWorkedExample) {
  auto splits = EnumerateSplits({4, 4, 2}, 4);
  ASSERT_TRUE(splits.ok());
  uint64_t seed = 0;  // a seed whose split order is [s2, s0, s1], as in the header
  while (Permutation(3, seed, 0) != std::vector<uint64_t>{2, 0, 1}) ++seed;
  auto slots_of = [&](uint32_t consumer) {
    auto slots = ConsumerSlots(*splits, 3, consumer, seed, 0, RemainderPolicy::kPad, 2);
    EXPECT_TRUE(slots.ok()) << slots.status();
    return *slots;
  };
  EXPECT_EQ(slots_of(0), (std::vector<SlotPieces>{{{2, 0, 2}}, {{0, 0, 2}}}));
  EXPECT_EQ(slots_of(1), (std::vector<SlotPieces>{{{0, 2, 2}}, {{1, 0, 2}}}));
  EXPECT_EQ(slots_of(2), (std::vector<SlotPieces>{{{1, 2, 2}}, {{2, 0, 2}}}));
}

TEST(ConsumerSlots, CutAtSplitsEndsEverySlotWhereItsSplitEnds) {
  auto splits = EnumerateSplits({4, 4, 2}, 4);
  ASSERT_TRUE(splits.ok());
  uint64_t seed = 0;  // split order [s2, s0, s1], as in the header
  while (Permutation(3, seed, 0) != std::vector<uint64_t>{2, 0, 1}) ++seed;
  auto slots_of = [&](uint32_t consumer, bool cut) {
    auto slots = ConsumerSlots(*splits, 3, consumer, seed, 0, RemainderPolicy::kPad, 4, cut);
    EXPECT_TRUE(slots.ok()) << slots.status();
    return *slots;
  };
  EXPECT_EQ(slots_of(0, false), (std::vector<SlotPieces>{{{2, 0, 2}, {0, 0, 2}}}));
  EXPECT_EQ(slots_of(0, true), (std::vector<SlotPieces>{{{2, 0, 2}}, {{0, 0, 2}}}));
  EXPECT_EQ(slots_of(1, true), (std::vector<SlotPieces>{{{0, 2, 2}}, {{1, 0, 2}}}));
  EXPECT_EQ(slots_of(2, true), (std::vector<SlotPieces>{{{1, 2, 2}}, {{2, 0, 2}}}));
  // One consumer: every slot is one whole split.
  auto one = ConsumerSlots(*splits, 1, 0, seed, 0, RemainderPolicy::kPad, 4, true);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (std::vector<SlotPieces>{{{2, 0, 2}}, {{0, 0, 4}}, {{1, 0, 4}}}));
}

TEST(ConsumerSlots, EqualSharesWithAtMostConsumersMinusOneRecordsPaddedOrDropped) {
  // Shard sizes that no split size divides, consumer counts that divide nothing.
  const std::vector<uint64_t> shards = {1000, 37, 501, 2, 460};
  const uint64_t n = 2000;
  for (RemainderPolicy policy : {RemainderPolicy::kPad, RemainderPolicy::kDrop}) {
    for (uint32_t consumers : {1u, 2u, 3u, 7u, 64u}) {
      for (uint64_t slot_size : {32u, 96u, 1024u}) {
        auto splits = EnumerateSplits(shards, 128);
        ASSERT_TRUE(splits.ok());
        std::map<uint64_t, int> seen;
        const uint64_t share = ShareSize(n, consumers, policy);
        for (uint32_t c = 0; c < consumers; ++c) {
          auto slots = ConsumerSlots(*splits, consumers, c, 7, 3, policy, slot_size);
          ASSERT_TRUE(slots.ok()) << slots.status();
          uint64_t records = 0;
          for (size_t i = 0; i < slots->size(); ++i) {
            const std::vector<uint64_t> ids = SlotRecords(*splits, (*slots)[i]);
            if (i + 1 < slots->size()) {
              EXPECT_EQ(ids.size(), slot_size);
            }
            for (uint64_t id : ids) ++seen[id];
            records += ids.size();
          }
          EXPECT_EQ(records, share) << "consumer " << c << " of " << consumers;
        }
        uint64_t twice = 0, missing = 0;
        for (uint64_t id = 0; id < n; ++id) {
          const int times = seen.contains(id) ? seen[id] : 0;
          ASSERT_LE(times, 2);
          if (times == 0) ++missing;
          if (times == 2) ++twice;
        }
        if (policy == RemainderPolicy::kPad) {
          EXPECT_EQ(missing, 0u);
          EXPECT_EQ(twice, share * consumers - n);
          EXPECT_LT(twice, consumers);
        } else {
          EXPECT_EQ(twice, 0u);
          EXPECT_EQ(missing, n - share * consumers);
          EXPECT_LT(missing, consumers);
        }
      }
    }
  }
}

TEST(ConsumerSlots, FollowsTheSplitsPermutationAndTheirRecordOrder) {
  auto splits = EnumerateSplits({10, 6}, 4);  // s0 [0,4) s1 [4,8) s2 [8,10) s3 [10,14) s4 [14,16)
  ASSERT_TRUE(splits.ok());
  auto slots = ConsumerSlots(*splits, 1, 0, 5, 2, RemainderPolicy::kPad, 3);
  ASSERT_TRUE(slots.ok());
  std::vector<uint64_t> got;
  for (const SlotPieces& slot : *slots) {
    for (uint64_t id : SlotRecords(*splits, slot)) got.push_back(id);
  }
  // Seed 5, epoch 2 orders the splits s2 s0 s3 s4 s1 (pinned here: a change
  // reorders existing jobs); each split keeps its records' order.
  ASSERT_EQ(Permutation(5, 5, 2), (std::vector<uint64_t>{2, 0, 3, 4, 1}));
  EXPECT_EQ(got, (std::vector<uint64_t>{8, 9, 0, 1, 2, 3, 10, 11, 12, 13, 14, 15, 4, 5, 6, 7}));
}

TEST(ConsumerSlots, BadArgumentsAndEmptySharesAreInvalidArgument) {
  auto splits = EnumerateSplits({3}, 4);
  ASSERT_TRUE(splits.ok());
  EXPECT_EQ(ConsumerSlots(*splits, 0, 0, 0, 0, RemainderPolicy::kPad, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConsumerSlots(*splits, 2, 2, 0, 0, RemainderPolicy::kPad, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConsumerSlots(*splits, 2, 0, 0, 0, RemainderPolicy::kPad, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // 3 records, 4 consumers: dropping gives nothing; padding gives each consumer one record.
  const absl::Status drop = ConsumerSlots(*splits, 4, 3, 0, 0, RemainderPolicy::kDrop, 1).status();
  EXPECT_EQ(drop.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(drop.message()), testing::HasSubstr("fewer than the 4 consumers"));
  auto pad = ConsumerSlots(*splits, 4, 3, 0, 0, RemainderPolicy::kPad, 1);
  ASSERT_TRUE(pad.ok());
  EXPECT_EQ(pad->size(), 1u);
}

}  // namespace
}  // namespace sluice::record
