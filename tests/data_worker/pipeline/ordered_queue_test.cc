#include "data_worker/pipeline/ordered_queue.h"

#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "gtest/gtest.h"

namespace sluice::data_worker::pipeline {
namespace {

using Queue = OrderedQueue<std::string>;

TEST(OrderedQueue, PopsInSequenceOrderWhateverThePushOrder) {
  FakeClock clock;
  Queue q(/*capacity=*/8, /*byte_limit=*/1 << 20, &clock);
  ASSERT_TRUE(q.Push(2, "c", 1));
  ASSERT_TRUE(q.Push(0, "a", 1));
  ASSERT_TRUE(q.Push(1, "b", 1));
  q.SetEnd(3);
  std::string item;
  uint64_t seq = 99;
  for (const char* want : {"a", "b", "c"}) {
    ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
    EXPECT_EQ(item, want);
  }
  EXPECT_EQ(seq, 2u);
  EXPECT_EQ(q.Pop(&item, &seq), Queue::PopResult::kEnd);
  EXPECT_EQ(seq, 3u);
  const auto snap = q.snapshot();
  EXPECT_EQ(snap.items, 0);
  EXPECT_EQ(snap.bytes, 0);
  EXPECT_EQ(snap.peak_items, 3);
  EXPECT_EQ(snap.peak_bytes, 3);
}

TEST(OrderedQueue, TryPopGivesTheHeadOnlyIfItIsThere) {
  FakeClock clock;
  Queue q(/*capacity=*/8, /*byte_limit=*/1 << 20, &clock);
  std::string item;
  uint64_t seq = 99;
  ASSERT_TRUE(q.Push(1, "b", 1));
  EXPECT_EQ(q.TryPop(&item, &seq), Queue::PopResult::kNotReady);  // 0 missing
  ASSERT_TRUE(q.Push(0, "a", 1));
  ASSERT_EQ(q.TryPop(&item, &seq), Queue::PopResult::kItem);
  EXPECT_EQ(item, "a");
  EXPECT_EQ(seq, 0u);
  ASSERT_EQ(q.TryPop(&item, &seq), Queue::PopResult::kItem);
  EXPECT_EQ(item, "b");
  EXPECT_EQ(q.TryPop(&item, &seq), Queue::PopResult::kNotReady);
  q.SetEnd(2);
  EXPECT_EQ(q.TryPop(&item, &seq), Queue::PopResult::kEnd);
  EXPECT_EQ(seq, 2u);
  q.Cancel();
  EXPECT_EQ(q.TryPop(&item, &seq), Queue::PopResult::kCancelled);
}

TEST(OrderedQueue, PushBeyondCapacityWaitsForTheHeadToBePopped) {
  FakeClock clock;
  Queue q(/*capacity=*/2, /*byte_limit=*/1 << 20, &clock);
  ASSERT_TRUE(q.Push(1, "b", 1));
  // seq 2 >= head (0) + capacity: waits until 0 is pushed and popped.
  std::thread producer([&] { EXPECT_TRUE(q.Push(2, "c", 1)); });
  ASSERT_TRUE(q.Push(0, "a", 1));  // the head is never blocked
  std::string item;
  uint64_t seq;
  ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
  EXPECT_EQ(item, "a");
  producer.join();
  ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
  EXPECT_EQ(item, "b");
  ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
  EXPECT_EQ(item, "c");
}

TEST(OrderedQueue, ByteLimitKeepsRoomForTheHead) {
  FakeClock clock;
  Queue q(/*capacity=*/100, /*byte_limit=*/10, &clock);
  ASSERT_TRUE(q.Push(1, "b", 4));
  // 4 queued + 4 + room for one more 4-byte item = 12 > 10: seq 2 waits
  // (after the 9-byte head, until it is the head itself), but the head
  // (seq 0) always gets in, even over the limit.
  std::thread producer([&] { EXPECT_TRUE(q.Push(2, "c", 4)); });
  ASSERT_TRUE(q.Push(0, "a", 9));
  std::string item;
  uint64_t seq;
  for (const char* want : {"a", "b", "c"}) {
    ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
    EXPECT_EQ(item, want);
  }
  producer.join();
}

TEST(OrderedQueue, CancelWakesPushAndPop) {
  FakeClock clock;
  Queue q(/*capacity=*/1, /*byte_limit=*/1 << 20, &clock);
  bool pushed = true;
  Queue::PopResult popped = Queue::PopResult::kItem;
  std::thread producer([&] { pushed = q.Push(5, "x", 1); });
  std::thread consumer([&] {
    std::string item;
    uint64_t seq;
    popped = q.Pop(&item, &seq);
  });
  q.Cancel();
  producer.join();
  consumer.join();
  EXPECT_FALSE(pushed);
  EXPECT_EQ(popped, Queue::PopResult::kCancelled);
  EXPECT_FALSE(q.Push(0, "y", 1));
}

TEST(OrderedQueue, SetEndKeepsTheSmallestEnd) {
  FakeClock clock;
  Queue q(/*capacity=*/4, /*byte_limit=*/1 << 20, &clock);
  q.SetEnd(3);
  q.SetEnd(5);  // ignored
  ASSERT_TRUE(q.Push(0, "a", 1));
  q.SetEnd(1);
  std::string item;
  uint64_t seq;
  ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
  ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kEnd);
  EXPECT_EQ(seq, 1u);
}

TEST(OrderedQueue, PopWaitIsTimedWithTheClock) {
  FakeClock clock;
  Queue q(/*capacity=*/4, /*byte_limit=*/1 << 20, &clock);
  std::string item;
  uint64_t seq;
  // Ready at once: no wait is recorded even if the clock moves.
  ASSERT_TRUE(q.Push(0, "a", 1));
  clock.Advance(absl::Seconds(3));
  ASSERT_EQ(q.Pop(&item, &seq), Queue::PopResult::kItem);
  EXPECT_EQ(q.snapshot().empty_wait, absl::ZeroDuration());
}

TEST(OrderedQueue, AWaitStillGoingOnCountsInTheSnapshot) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  Queue q(/*capacity=*/4, /*byte_limit=*/1 << 20, &clock);
  Queue::PopResult popped = Queue::PopResult::kCancelled;
  std::thread consumer([&] {
    std::string item;
    uint64_t seq;
    popped = q.Pop(&item, &seq);
  });
  while (q.snapshot().waiting != 1) std::this_thread::yield();
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(q.snapshot().empty_wait, absl::Seconds(2));
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(q.snapshot().empty_wait, absl::Seconds(5));
  ASSERT_TRUE(q.Push(0, "a", 1));
  consumer.join();
  EXPECT_EQ(popped, Queue::PopResult::kItem);
  clock.Advance(absl::Seconds(7));
  const Queue::Snapshot after = q.snapshot();
  EXPECT_EQ(after.waiting, 0);
  EXPECT_EQ(after.empty_wait, absl::Seconds(5));
}

TEST(OrderedQueue, ClearDropsQueuedItemsAndSetLimitsApplies) {
  FakeClock clock;
  Queue q(/*capacity=*/4, /*byte_limit=*/100, &clock);
  ASSERT_TRUE(q.Push(1, "b", 7));
  q.SetLimits(/*capacity=*/0, /*byte_limit=*/50);
  auto snap = q.snapshot();
  EXPECT_EQ(snap.capacity, 1);  // at least 1
  EXPECT_EQ(snap.byte_limit, 50);
  EXPECT_EQ(snap.bytes, 7);
  q.Clear();
  snap = q.snapshot();
  EXPECT_EQ(snap.items, 0);
  EXPECT_EQ(snap.bytes, 0);
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
