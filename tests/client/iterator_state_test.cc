#include "client/internal/iterator_state.h"

#include <vector>

#include "gtest/gtest.h"

namespace sluice::client {
namespace {

using Admit = IteratorState::Admit;

Batch MakeBatch(uint64_t epoch, uint64_t position, uint64_t index) {
  Batch batch;
  batch.epoch = epoch;
  batch.position = position;
  batch.batch_index = index;
  return batch;
}

// Checks, and accepts when admitted. Returns the decision.
Admit Offer(IteratorState& state, uint64_t epoch, uint64_t position,
            uint64_t index, bool last) {
  const Admit admit = state.Check(epoch, position, index);
  if (admit == Admit::kAccept)
    state.Accept(MakeBatch(epoch, position, index), last);
  return admit;
}

TEST(IteratorState, AcceptsTheNextBatchOfASplitOnly) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/8);
  state.ApplyHeartbeat(/*epoch=*/0, /*num_positions=*/1, {},
                       /*finished=*/false);
  EXPECT_EQ(Offer(state, 0, 0, 1, false), Admit::kAhead);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kDuplicate);
  EXPECT_EQ(Offer(state, 0, 0, 1, true), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 0, 2, true),
            Admit::kDuplicate);  // the split is complete
  std::vector<SlotProgress> progress = state.Progress();
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].received, 2u);
  EXPECT_TRUE(progress[0].complete);
}

TEST(IteratorState, TreatsBatchesOfAFinishedEpochAsDuplicates) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/8);
  state.ApplyHeartbeat(1, 2, {}, false);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kDuplicate);
  EXPECT_EQ(Offer(state, 1, 0, 0, false), Admit::kAccept);
}

TEST(IteratorState, ReportsEpochCompletionWhenTheLastSplitCompletes) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/8);
  state.ApplyHeartbeat(0, 2, {}, false);
  ASSERT_EQ(state.Check(0, 1, 0), Admit::kAccept);
  EXPECT_FALSE(state.Accept(MakeBatch(0, 1, 0), /*last_in_split=*/true));
  ASSERT_EQ(state.Check(0, 0, 0), Admit::kAccept);
  EXPECT_TRUE(state.Accept(MakeBatch(0, 0, 0), /*last_in_split=*/true));
}

TEST(IteratorState, WaitsWhenTheBufferIsFull) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/2);
  state.ApplyHeartbeat(0, 3, {}, false);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 1, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 2, 0, false), Admit::kWait);
  EXPECT_EQ(state.Check(0, 0, 0), Admit::kDuplicate);  // duplicates never wait
  ASSERT_TRUE(state.Pop().has_value());
  EXPECT_EQ(Offer(state, 0, 2, 0, false), Admit::kAccept);
}

TEST(IteratorState, DeterministicModeReleasesInSequenceOrder) {
  IteratorState state(/*deterministic=*/true, /*track_splits=*/true,
                      /*prefetch=*/2);
  state.ApplyHeartbeat(0, 2, {}, false);
  // Position 1 first: the head (0, 0) is not buffered, so the bound does not
  // stop it.
  EXPECT_EQ(Offer(state, 0, 1, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 1, 1, true), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 1, 2, true), Admit::kDuplicate);
  EXPECT_FALSE(state.Pop().has_value());
  EXPECT_EQ(Offer(state, 0, 0, 0, false),
            Admit::kAccept);  // the head passes the bound
  // Now the head is buffered and the buffer full: others wait.
  IteratorState other(/*deterministic=*/true, /*track_splits=*/true,
                      /*prefetch=*/1);
  other.ApplyHeartbeat(0, 2, {}, false);
  EXPECT_EQ(Offer(other, 0, 0, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(other, 0, 1, 0, false), Admit::kWait);

  std::vector<std::pair<uint64_t, uint64_t>> order;
  auto pop = [&] {
    std::optional<Batch> b = state.Pop();
    if (b) order.emplace_back(b->position, b->batch_index);
    return b.has_value();
  };
  EXPECT_TRUE(pop());
  EXPECT_FALSE(pop());  // (0, 1) not here yet
  EXPECT_EQ(Offer(state, 0, 0, 1, true), Admit::kAccept);
  while (pop()) {
  }
  EXPECT_EQ(order, (std::vector<std::pair<uint64_t, uint64_t>>{
                       {0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  EXPECT_FALSE(state.Done());
  state.ApplyHeartbeat(1, 2, {}, /*finished=*/true);
  EXPECT_TRUE(state.Done());
}

TEST(IteratorState, DeterministicModeSkipsPositionsDoneElsewhere) {
  IteratorState state(/*deterministic=*/true, /*track_splits=*/true,
                      /*prefetch=*/4);
  state.ApplyHeartbeat(0, 3, /*done_positions=*/{0, 1}, false);
  EXPECT_EQ(Offer(state, 0, 0, 0, true), Admit::kDuplicate);
  EXPECT_EQ(Offer(state, 0, 2, 0, true), Admit::kAccept);
  std::optional<Batch> b = state.Pop();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->position, 2u);
  // Done-elsewhere slots are not reported back.
  std::vector<SlotProgress> progress = state.Progress();
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].position, 2u);
}

}  // namespace
}  // namespace sluice::client
