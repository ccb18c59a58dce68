#include "dispatcher/repartition.h"

#include <gtest/gtest.h>

namespace sluice::dispatcher {
namespace {

// A slot of `records` records of split `split` from offset 0.
SlotSource Whole(uint64_t split, uint64_t records) {
  return {.pieces = {{.split_id = split, .offset = 0, .count = records}}};
}
SlotSource Range(uint64_t split, uint64_t records, uint64_t first, uint64_t end) {
  SlotSource s = Whole(split, records);
  s.first_batch = first;
  s.end_batch = end;
  return s;
}

// The header's example: 3 consumers of two 2-batch slots each, each saved after its first batch.
TEST(Repartition, CutsWhatThreeConsumersLeftIntoTwoSharesInGlobalOrder) {
  // Old consumer k reads splits 2k and 2k + 1, 4 records each; batch 2.
  const Layout old = {
      {Whole(0, 4), Whole(1, 4)}, {Whole(2, 4), Whole(3, 4)}, {Whole(4, 4), Whole(5, 4)}};
  const Returned returned = {{{0, {.batches = 1}}}, {{0, {.batches = 1}}}, {{0, {.batches = 1}}}};
  absl::StatusOr<Layout> out = Repartition(old, returned, /*num_consumers=*/2, /*batch_size=*/2);
  ASSERT_TRUE(out.ok()) << out.status();
  const Layout want = {
      {Range(0, 4, 1, 0), Range(1, 4, 0, 0), Range(2, 4, 1, 0), Range(3, 4, 0, 1)},  // 5 batches
      {Range(3, 4, 1, 0), Range(4, 4, 1, 0), Range(5, 4, 0, 0)}};                    // 4 batches
  EXPECT_EQ(*out, want);
}

TEST(Repartition, SpreadsTwoConsumersOverThreeSkippingCompleteSlots) {
  // Consumer 0: slot 0 complete (3 batches of 6 records), slot 1 untouched (3 batches).
  // Consumer 1: slot 0 returned 2 of 3, slot 1 untouched. Batch 2. Left: 3 + 1 + 3 = 7.
  const Layout old = {{Whole(0, 6), Whole(1, 6)}, {Whole(2, 6), Whole(3, 6)}};
  const Returned returned = {{{0, {.batches = 3, .complete = true}}}, {{0, {.batches = 2}}}};
  absl::StatusOr<Layout> out = Repartition(old, returned, /*num_consumers=*/3, /*batch_size=*/2);
  ASSERT_TRUE(out.ok()) << out.status();
  const Layout want = {{Range(1, 6, 0, 0)},                     // c0p1 batches 0..2
                       {Range(2, 6, 2, 0), Range(3, 6, 0, 1)},  // c1p0 batch 2, c1p1 batch 0
                       {Range(3, 6, 1, 0)}};                    // c1p1 batches 1..2
  EXPECT_EQ(*out, want);
}

TEST(Repartition, ARangeOfAnEarlierRepartitionIsCutRelativeToItsFirstBatch) {
  // One old consumer holding batches [3, 7) of a 10-record split (batch 1), 1 returned: left
  // [4, 7), over 2 consumers: [4, 6) and [6, 7).
  const Layout old = {{Range(9, 10, 3, 7)}};
  const Returned returned = {{{0, {.batches = 1}}}};
  absl::StatusOr<Layout> out = Repartition(old, returned, /*num_consumers=*/2, /*batch_size=*/1);
  ASSERT_TRUE(out.ok()) << out.status();
  const Layout want = {{Range(9, 10, 4, 6)}, {Range(9, 10, 6, 7)}};
  EXPECT_EQ(*out, want);
}

TEST(Repartition, AShortLastBatchCountsAsOneAndFewerBatchesThanConsumersLeaveSomeEmpty) {
  // 5 records, batch 2: 3 batches (the last holds 1 record); 2 returned; 3 consumers.
  const Layout old = {{Whole(0, 5)}};
  const Returned returned = {{{0, {.batches = 2}}}};
  absl::StatusOr<Layout> out = Repartition(old, returned, /*num_consumers=*/3, /*batch_size=*/2);
  ASSERT_TRUE(out.ok()) << out.status();
  const Layout want = {{Range(0, 5, 2, 0)}, {}, {}};
  EXPECT_EQ(*out, want);
  EXPECT_EQ(NominalBatches(Whole(0, 5), 2), 3u);
  EXPECT_EQ(NominalBatches(Range(0, 5, 2, 0), 2), 1u);
}

TEST(Repartition, RefusesAStateOfAPositionTheConsumerDoesNotHave) {
  const Layout old = {{Whole(0, 4)}};
  const Returned returned = {{{5, {.batches = 1}}}};
  absl::StatusOr<Layout> out = Repartition(old, returned, /*num_consumers=*/2, /*batch_size=*/2);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("position 5"), std::string::npos) << out.status();
}

TEST(Repartition, LayoutSurvivesItsJournalForm) {
  const Layout layout = {{Range(3, 4, 1, 0), Whole(7, 2)}, {}};
  proto::ResizedEpoch p;
  LayoutToProto(layout, &p);
  EXPECT_EQ(LayoutFromProto(p), layout);
}

}  // namespace
}  // namespace sluice::dispatcher
