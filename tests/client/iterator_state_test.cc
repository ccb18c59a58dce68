#include "client/internal/iterator_state.h"

#include <optional>
#include <set>
#include <string>
#include <utility>
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

// Checks, and accepts when admitted; `last`: the split's end-of-split marker (index + 1)
// follows the batch. Returns the batch's decision.
Admit Offer(IteratorState& state, uint64_t epoch, uint64_t position, uint64_t index, bool last) {
  const Admit admit = state.Check(epoch, position, index, /*marker=*/false);
  if (admit == Admit::kAccept) {
    state.Accept(MakeBatch(epoch, position, index));
    if (last) {
      EXPECT_EQ(state.Check(epoch, position, index + 1, /*marker=*/true), Admit::kAccept);
      state.AcceptMarker(epoch, position, index + 1);
    }
  }
  return admit;
}

void PopAll(IteratorState& state) {
  while (state.Pop().has_value()) {
  }
}

// Default order, epoch 0 of two slots: batches of epoch 1 (produced early) that arrive before
// epoch 0's last batch wait for it, without a heartbeat in between.
TEST(IteratorState, DefaultOrderReleasesTheFollowingEpochOnlyAfterTheCurrentOne) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true, /*prefetch=*/8);
  state.ApplyHeartbeat(/*epoch=*/0, /*num_positions=*/2, {}, /*finished=*/false);
  EXPECT_EQ(Offer(state, 0, 0, 0, /*last=*/true), Admit::kAccept);
  EXPECT_EQ(Offer(state, 1, 0, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 1, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 1, 1, 0, false), Admit::kAccept);
  std::optional<Batch> a = state.Pop();
  std::optional<Batch> b = state.Pop();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(std::make_pair(a->epoch, a->position), std::make_pair(0ul, 0ul));
  EXPECT_EQ(std::make_pair(b->epoch, b->position), std::make_pair(0ul, 1ul));
  EXPECT_FALSE(state.Pop().has_value());  // epoch 0 slot 1's marker has not come
  EXPECT_EQ(state.buffered(), 2);
  EXPECT_FALSE(state.NextBuffered());
  ASSERT_EQ(state.Check(0, 1, 1, /*marker=*/true), Admit::kAccept);
  state.AcceptMarker(0, 1, 1);
  EXPECT_TRUE(state.NextBuffered());
  std::vector<std::pair<uint64_t, uint64_t>> order;
  while (std::optional<Batch> batch = state.Pop())
    order.emplace_back(batch->epoch, batch->position);
  EXPECT_EQ(order, (std::vector<std::pair<uint64_t, uint64_t>>{{1, 0}, {1, 1}}));
  // The epoch-1 reports go out with the next heartbeat, before the dispatcher moved on.
  std::vector<SlotProgress> progress = state.Progress();
  ASSERT_EQ(progress.size(), 4u);
  EXPECT_EQ(progress[2].epoch, 1u);
  EXPECT_EQ(progress[2].batches, 1u);
}

// Prefetch 2: batches of the following epoch fill the buffer; one of the current epoch is still
// taken (it may be queued behind them on a stream), and past 4 x 2 + 4 buffered the following
// epoch's batches are dropped, to be sent again, instead of waiting for room that never comes.
TEST(IteratorState, TheFollowingEpochNeverBlocksTheCurrentOnesLastBatch) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true, /*prefetch=*/2);
  state.ApplyHeartbeat(/*epoch=*/0, /*num_positions=*/1, {}, /*finished=*/false);
  for (uint64_t position = 0; position < 12; ++position) {
    EXPECT_EQ(Offer(state, 1, position, 0, false), Admit::kAccept) << position;
  }
  EXPECT_EQ(Offer(state, 1, 12, 0, false), Admit::kDrop);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 0, 1, false), Admit::kWait);  // the trainer has one to take
  std::optional<Batch> batch = state.Pop();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->epoch, 0u);
  EXPECT_EQ(Offer(state, 0, 0, 1, /*last=*/true), Admit::kAccept);
  ASSERT_TRUE(state.Pop().has_value());
  batch = state.Pop();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->epoch, 1u);
  EXPECT_EQ(batch->position, 0u);
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
  // Held: what the streams need not send again; Progress: what the trainer got.
  std::vector<SlotProgress> held = state.Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].batches, 2u);
  EXPECT_TRUE(held[0].complete);
  std::vector<SlotProgress> progress = state.Progress();
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].batches, 0u);  // nothing returned yet: not delivered
  EXPECT_FALSE(progress[0].complete);
  ASSERT_TRUE(state.Pop().has_value());
  EXPECT_EQ(state.Progress()[0].batches, 1u);
  EXPECT_FALSE(state.Progress()[0].complete);
  ASSERT_TRUE(state.Pop().has_value());
  EXPECT_EQ(state.Progress()[0].batches, 2u);
  EXPECT_TRUE(state.Progress()[0].complete);
  EXPECT_TRUE(state.TakeProgressDue());
}

TEST(IteratorState, AnEmptySplitCompletesWithItsMarkerAlone) {
  IteratorState state(/*deterministic=*/true, /*track_splits=*/true,
                      /*prefetch=*/4);
  state.ApplyHeartbeat(0, 2, {}, false);
  ASSERT_EQ(state.Check(0, 0, 0, /*marker=*/true), Admit::kAccept);
  state.AcceptMarker(0, 0, 0);  // position 0 yielded no batch (all filtered)
  EXPECT_EQ(Offer(state, 0, 1, 0, true), Admit::kAccept);
  std::optional<Batch> b = state.Pop();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->position, 1u);  // the cursor moved past the empty split
  std::vector<SlotProgress> progress = state.Progress();
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[0].batches, 0u);
  EXPECT_TRUE(progress[0].complete);
  EXPECT_TRUE(progress[1].complete);
}

TEST(IteratorState, AnEpochIsReturnedOnlyWhenEverySlotsMarkerArrivedAndAllWasReturned) {
  using Returned = IteratorState::Returned;
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/8);
  EXPECT_EQ(state.EpochReturned(0), Returned::kNo);  // slot count unknown
  state.ApplyHeartbeat(0, 2, {}, false);
  EXPECT_EQ(state.EpochReturned(0), Returned::kNo);  // nothing started
  EXPECT_EQ(Offer(state, 0, 0, 0, /*last=*/true), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 1, 0, /*last=*/false), Admit::kAccept);
  EXPECT_EQ(state.EpochReturned(0), Returned::kNo);  // buffered, not returned
  PopAll(state);
  // Slot 1's batch 0 was returned; whether more follow, its marker will tell.
  EXPECT_EQ(state.EpochReturned(0), Returned::kMaybe);
  ASSERT_EQ(state.Check(0, 1, 1, /*marker=*/true), Admit::kAccept);
  state.AcceptMarker(0, 1, 1);
  EXPECT_EQ(state.EpochReturned(0), Returned::kYes);
}

TEST(IteratorState, AMarkerAheadOfMissingBatchesIsNotAccepted) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/4);
  state.ApplyHeartbeat(0, 1, {}, false);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kAccept);
  // Batch 1 was lost in flight: the marker (count 2) must not complete the split.
  EXPECT_EQ(state.Check(0, 0, 2, /*marker=*/true), Admit::kAhead);
  EXPECT_EQ(state.Held()[0].batches, 1u);
  EXPECT_FALSE(state.Held()[0].complete);
}

TEST(IteratorState, DeterministicModeDropsPastTheHardCapWhileTheCursorWaits) {
  IteratorState state(/*deterministic=*/true, /*track_splits=*/true,
                      /*prefetch=*/1);
  state.ApplyHeartbeat(0, 12, {}, false);
  // The cursor (0, 0) is stalled; later splits fill the buffer up to 4 x 1 + 4 = 8.
  for (uint64_t p = 1; p <= 8; ++p) EXPECT_EQ(Offer(state, 0, p, 0, false), Admit::kAccept);
  EXPECT_EQ(state.Check(0, 9, 0, /*marker=*/false), Admit::kDrop);
  EXPECT_EQ(state.buffered(), 8);
  // The cursor's own batch is always taken.
  EXPECT_EQ(Offer(state, 0, 0, 0, true), Admit::kAccept);
}

TEST(IteratorState, RestoreContinuesFromWhatWasReturned) {
  IteratorState state(/*deterministic=*/true, /*track_splits=*/true,
                      /*prefetch=*/4);
  state.Restore(/*epoch=*/2, {{.epoch = 2, .position = 0, .batches = 3, .complete = true},
                              {.epoch = 2, .position = 1, .batches = 1, .complete = false}});
  state.ApplyHeartbeat(2, 2, /*done_positions=*/{0}, false);
  EXPECT_EQ(state.Check(2, 1, 0, false),
            Admit::kDuplicate);  // returned before the save
  EXPECT_EQ(Offer(state, 2, 1, 1, true), Admit::kAccept);
  std::optional<Batch> b = state.Pop();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->position, 1u);
  EXPECT_EQ(b->batch_index, 1u);
  // SaveState() gets every slot; a heartbeat only those not listed done yet (position 0 was).
  std::vector<SlotProgress> progress = state.Progress(/*acknowledged=*/true);
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_EQ(progress[1].batches, 2u);
  EXPECT_TRUE(progress[1].complete);
  progress = state.Progress();
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].position, 1u);
  EXPECT_EQ(progress[0].batches, 2u);
}

TEST(IteratorState, TreatsBatchesOfAFinishedEpochAsDuplicates) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/8);
  state.ApplyHeartbeat(1, 2, {}, false);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kDuplicate);
  EXPECT_EQ(Offer(state, 1, 0, 0, false), Admit::kAccept);
}

TEST(IteratorState, ReportsProgressWhenASplitIsFullyReturned) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/8);
  state.ApplyHeartbeat(0, 2, {}, false);
  EXPECT_EQ(Offer(state, 0, 1, 0, true), Admit::kAccept);
  EXPECT_FALSE(state.TakeProgressDue());  // received, not returned
  ASSERT_TRUE(state.Pop().has_value());
  EXPECT_TRUE(state.TakeProgressDue());
  EXPECT_FALSE(state.TakeProgressDue());
}

TEST(IteratorState, WaitsWhenTheBufferIsFull) {
  IteratorState state(/*deterministic=*/false, /*track_splits=*/true,
                      /*prefetch=*/2);
  state.ApplyHeartbeat(0, 3, {}, false);
  EXPECT_EQ(Offer(state, 0, 0, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 1, 0, false), Admit::kAccept);
  EXPECT_EQ(Offer(state, 0, 2, 0, false), Admit::kWait);
  EXPECT_EQ(state.Check(0, 0, 0, false),
            Admit::kDuplicate);  // duplicates never wait
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
  EXPECT_EQ(Offer(state, 0, 1, 2, true), Admit::kDuplicate);  // complete
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
  EXPECT_EQ(order, (std::vector<std::pair<uint64_t, uint64_t>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
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
  PopAll(state);
}

TEST(HeldLists, KeepsAListTheAnswerOmitsAndReplacesAChangedOne) {
  HeldLists lists;
  EXPECT_EQ(lists.tasks_version(), 0u);
  lists.Apply(
      /*sent_tasks=*/0, /*sent_splits=*/0,
      {.tasks_version = 7, .addresses = {"a:1", "b:1"}, .splits_version = 3, .num_splits = 26});
  EXPECT_EQ(lists.addresses(), (std::set<std::string>{"a:1", "b:1"}));
  EXPECT_EQ(lists.num_splits(), 26u);
  EXPECT_EQ(lists.tasks_version(), 7u);
  EXPECT_EQ(lists.splits_version(), 3u);

  // Unchanged: both omitted.
  lists.Apply(7, 3, {.tasks_version = 7, .splits_version = 3});
  EXPECT_EQ(lists.addresses(), (std::set<std::string>{"a:1", "b:1"}));
  EXPECT_EQ(lists.num_splits(), 26u);

  // The task list changed (a worker left), the split sequence did not.
  lists.Apply(7, 3, {.tasks_version = 9, .addresses = {"a:1"}, .splits_version = 3});
  EXPECT_EQ(lists.addresses(), (std::set<std::string>{"a:1"}));
  EXPECT_EQ(lists.num_splits(), 26u);
  EXPECT_EQ(lists.tasks_version(), 9u);

  // A new version with an empty list is an empty list (every worker gone).
  lists.Apply(9, 3, {.tasks_version = 11, .splits_version = 5});
  EXPECT_TRUE(lists.addresses().empty());
  EXPECT_EQ(lists.num_splits(), 0u);
}

TEST(HeldLists, AnAnswerWithoutVersionsAlwaysCarriesTheWholeLists) {
  HeldLists lists;
  lists.Apply(0, 0, {.addresses = {"a:1"}, .num_splits = 4});
  EXPECT_EQ(lists.tasks_version(), 0u);  // echoes 0: never omitted
  lists.Apply(0, 0, {});
  EXPECT_TRUE(lists.addresses().empty());
  EXPECT_EQ(lists.num_splits(), 0u);
}

}  // namespace
}  // namespace sluice::client
