#include "dispatcher/repartition.h"

#include <gtest/gtest.h>

#include "dispatcher/dispatcher_state.h"

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

TEST(Repartition, WhatConsumersReturnedIsJournaledAsRuns) {
  // Consumer 0: slots 0, 1 and 4 whole, slot 2 one batch; consumer 1 nothing.
  const Returned returned = {{{0, {.batches = 3, .complete = true}},
                              {1, {.batches = 3, .complete = true}},
                              {2, {.batches = 1}},
                              {4, {.batches = 2, .complete = true}}},
                             {}};
  proto::ResizedEpoch p;
  ReturnedToProto(returned, &p);
  ASSERT_EQ(p.returned_size(), 2);
  EXPECT_EQ(std::vector<uint64_t>(p.returned(0).complete_ranges().begin(),
                                  p.returned(0).complete_ranges().end()),
            (std::vector<uint64_t>{0, 2, 4, 5}));
  ASSERT_EQ(p.returned(0).partial_size(), 1);
  EXPECT_EQ(p.returned(0).partial(0).position(), 2u);
  EXPECT_EQ(p.returned(0).partial(0).delivered_batches(), 1u);
  EXPECT_EQ(p.returned(1).complete_ranges_size() + p.returned(1).partial_size(), 0);
  // Read back over a layout of 5 and 1 slots: the same, but a whole slot's count is not kept.
  const Layout old = {{Whole(0, 6), Whole(1, 6), Whole(2, 6), Whole(3, 6), Whole(4, 6)},
                      {Whole(5, 6)}};
  absl::StatusOr<Returned> back = ReturnedFromProto(p, old);
  ASSERT_TRUE(back.ok()) << back.status();
  const Returned want = {{{0, {.complete = true}},
                          {1, {.complete = true}},
                          {2, {.batches = 1}},
                          {4, {.complete = true}}},
                         {}};
  ASSERT_EQ(back->size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    ASSERT_EQ((*back)[k].size(), want[k].size()) << k;
    for (const auto& [position, slot] : want[k]) {
      ASSERT_TRUE((*back)[k].contains(position)) << k << " " << position;
      EXPECT_EQ((*back)[k].at(position).batches, slot.batches) << k << " " << position;
      EXPECT_EQ((*back)[k].at(position).complete, slot.complete) << k << " " << position;
    }
  }
  // Over a layout where consumer 0 has 4 slots: position 4 is refused, naming it.
  const Layout shorter = {{Whole(0, 6), Whole(1, 6), Whole(2, 6), Whole(3, 6)}, {Whole(5, 6)}};
  absl::StatusOr<Returned> refused = ReturnedFromProto(p, shorter);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("old consumer 0 position 4 is past its 4 slots"),
            std::string::npos)
      << refused.status();
}

// The header's example through the computed form, over an old layout in the listed form (a
// state or journal of an older version): the same cut.
TEST(Repartition, TheComputedFormGivesTheHandWorkedCutOverAListedOldLayout) {
  const Layout old = {
      {Whole(0, 4), Whole(1, 4)}, {Whole(2, 4), Whole(3, 4)}, {Whole(4, 4), Whole(5, 4)}};
  proto::ResizedEpoch resized;
  resized.set_epoch(0);
  resized.set_from_consumers(3);
  resized.set_num_consumers(2);
  LayoutToProto(old, resized.mutable_previous());
  ReturnedToProto({{{0, {.batches = 1}}}, {{0, {.batches = 1}}}, {{0, {.batches = 1}}}}, &resized);
  EXPECT_EQ(LayoutConsumers(resized), 2u);
  EXPECT_EQ(LayoutConsumers(resized.previous()), 3u);
  absl::StatusOr<std::vector<record::Split>> splits = record::EnumerateSplits({24}, 4);
  ASSERT_TRUE(splits.ok());
  proto::JobConfig config;
  config.set_num_consumers(2);
  config.set_split_size(4);
  absl::StatusOr<Layout> out =
      DispatcherState::ResizedLayout(resized, config, *splits, /*batch_size=*/2);
  ASSERT_TRUE(out.ok()) << out.status();
  const Layout want = {{Range(0, 4, 1, 0), Range(1, 4, 0, 0), Range(2, 4, 1, 0), Range(3, 4, 0, 1)},
                       {Range(3, 4, 1, 0), Range(4, 4, 1, 0), Range(5, 4, 0, 0)}};
  EXPECT_EQ(*out, want);
  // A computed form naming what 2 old consumers returned over a layout of 3: refused.
  resized.mutable_returned()->RemoveLast();
  out = DispatcherState::ResizedLayout(resized, config, *splits, /*batch_size=*/2);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("what 2 old consumers returned"), std::string::npos)
      << out.status();
}

}  // namespace
}  // namespace sluice::dispatcher
