// ConsumerQueues' stream-resume rules on their own: which batches a reopened stream discards,
// which tasks it restarts from the client's count, and that a producer blocked on a full queue
// wakes up when that queue is emptied by a resume.
#include "data_worker/worker/consumer_queues.h"

#include <future>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace sluice::data_worker {
namespace {

constexpr uint64_t kJob = 7;

proto::SplitAssignment Assignment(uint64_t position, uint64_t skip) {
  proto::SplitAssignment a;
  a.mutable_key()->set_job_id(kJob);
  a.mutable_key()->set_consumer_index(0);
  a.mutable_key()->set_epoch(0);
  a.mutable_key()->set_position(position);
  a.set_skip_batches(skip);
  return a;
}

// A data batch of one element (no columns: ConsumerQueues never looks at them).
service::WireBatch Batch(uint64_t position, uint64_t index) {
  service::WireBatch b;
  *b.header.mutable_key() = Assignment(position, 0).key();
  b.header.set_batch_index(index);
  b.header.add_global_indices(position * 100 + index);
  return b;
}

proto::HeldSplit Held(uint64_t position, uint64_t batches) {
  proto::HeldSplit h;
  *h.mutable_key() = Assignment(position, 0).key();
  h.set_batches(batches);
  return h;
}

TEST(ConsumerQueues, AProducerBlockedOnAFullQueueWakesWhenAResumeDiscardsIt) {
  // A replacement worker filled the queue (2 batches) with batches the client already holds
  // and its producer waits for space; the client's stream then attaches holding 3 batches.
  prometheus::Registry registry;
  ConsumerQueues queues(/*queue_batches=*/2, /*queue_bytes=*/0, registry);
  const uint64_t task = queues.AddTask(Assignment(0, 0), /*parallel=*/false);
  ASSERT_TRUE(queues.Push(task, Batch(0, 0)));
  ASSERT_TRUE(queues.Push(task, Batch(0, 1)));
  std::future<bool> third =
      std::async(std::launch::async, [&] { return queues.Push(task, Batch(0, 2)); });
  while (queues.blocked_producers() == 0) std::this_thread::yield();
  const ConsumerQueues::Opened opened = queues.Open({kJob, 0}, {Held(0, 3)}, [] {});
  EXPECT_TRUE(opened.restart.empty());
  // Without a wake-up this waits forever (the test times out).
  EXPECT_TRUE(third.get());
  // The two held batches were discarded; only batch 2, pushed after the wake-up, is queued.
  // (Counted after the producer returned: right after Open it may or may not have pushed yet.)
  EXPECT_EQ(queues.queued_batches(), 1u);
  ASSERT_TRUE(queues.Push(task, Batch(0, 3)));
  StreamEvent event = queues.Poll(opened.stream_id);
  // The held batch 2 was queued after the discard and is still queued: the client drops it
  // as a duplicate. Batch 3 follows.
  ASSERT_EQ(event.kind, StreamEvent::kBatch);
  EXPECT_EQ(event.batch.header.batch_index(), 2u);
  event = queues.Poll(opened.stream_id);
  ASSERT_EQ(event.kind, StreamEvent::kBatch);
  EXPECT_EQ(event.batch.header.batch_index(), 3u);
}

TEST(ConsumerQueues, AClientHoldingLessThanTheTaskSkipsRestartsItFromItsCount) {
  // The split was reassigned here with skip 12 (what the client had returned then); the client
  // restored an older state that holds 5 batches of it. Producing from 12 would be rejected
  // at every resume: the task restarts from 5. A split the client holds no batch of, with skip
  // 4, restarts from 0; one with skip 0 is kept.
  prometheus::Registry registry;
  ConsumerQueues queues(/*queue_batches=*/4, /*queue_bytes=*/0, registry);
  const uint64_t t0 = queues.AddTask(Assignment(0, 12), /*parallel=*/false);
  const uint64_t t1 = queues.AddTask(Assignment(1, 4), /*parallel=*/false);
  const uint64_t t2 = queues.AddTask(Assignment(2, 0), /*parallel=*/false);
  ASSERT_TRUE(queues.Push(t0, Batch(0, 12)));
  const ConsumerQueues::Opened opened = queues.Open({kJob, 0}, {Held(0, 5)}, [] {});
  ASSERT_EQ(opened.restart.size(), 2u);
  EXPECT_EQ(opened.restart[0].key().position(), 0u);
  EXPECT_EQ(opened.restart[0].skip_batches(), 5u);
  EXPECT_EQ(opened.restart[1].key().position(), 1u);
  EXPECT_EQ(opened.restart[1].skip_batches(), 0u);
  EXPECT_FALSE(queues.IsLive(t0));
  EXPECT_FALSE(queues.IsLive(t1));
  EXPECT_TRUE(queues.IsLive(t2));
  EXPECT_EQ(queues.queued_batches(), 0u);
}

TEST(ConsumerQueues, ABatchLostInFlightRestartsTheTaskFromTheClientsCount) {
  prometheus::Registry registry;
  ConsumerQueues queues(/*queue_batches=*/4, /*queue_bytes=*/0, registry);
  const uint64_t task = queues.AddTask(Assignment(0, 0), /*parallel=*/false);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(queues.Push(task, Batch(0, i)));
  const ConsumerQueues::Opened first = queues.Open({kJob, 0}, {}, [] {});
  for (int i = 0; i < 3; ++i) ASSERT_EQ(queues.Poll(first.stream_id).kind, StreamEvent::kBatch);
  // Only batch 0 arrived.
  const ConsumerQueues::Opened second = queues.Open({kJob, 0}, {Held(0, 1)}, [] {});
  ASSERT_EQ(second.restart.size(), 1u);
  EXPECT_EQ(second.restart[0].skip_batches(), 1u);
}

// The fan-out of a production group (task_runner.h) pushes with a bound: a queue that stays
// full answers kFull and keeps what it holds; a dropped task answers kGone.
TEST(ConsumerQueues, PushWithinAnswersFullAfterTheBoundAndGoneForADroppedTask) {
  prometheus::Registry registry;
  ConsumerQueues queues(/*queue_batches=*/1, /*queue_bytes=*/0, registry);
  const uint64_t task = queues.AddTask(Assignment(0, 0), /*parallel=*/false);
  EXPECT_TRUE(queues.HasRoom(task));
  EXPECT_EQ(queues.PushWithin(task, Batch(0, 0), absl::Milliseconds(1)),
            ConsumerQueues::PushResult::kPushed);
  EXPECT_FALSE(queues.HasRoom(task));
  EXPECT_EQ(queues.PushWithin(task, Batch(0, 1), absl::Milliseconds(1)),
            ConsumerQueues::PushResult::kFull);
  EXPECT_EQ(queues.queued_batches(), 1u);
  EXPECT_EQ(queues.blocked_producers(), 0);
  // Read: room again.
  const ConsumerQueues::Opened opened = queues.Open({kJob, 0}, {}, [] {});
  StreamEvent e = queues.Poll(opened.stream_id);
  ASSERT_EQ(e.kind, StreamEvent::kBatch);
  EXPECT_EQ(e.batch.header.batch_index(), 0u);
  EXPECT_TRUE(queues.HasRoom(task));
  EXPECT_EQ(queues.PushWithin(task, Batch(0, 1), absl::Milliseconds(1)),
            ConsumerQueues::PushResult::kPushed);
  queues.DropTask(KeyOf(Assignment(0, 0).key()));
  EXPECT_EQ(queues.PushWithin(task, Batch(0, 2), absl::Milliseconds(1)),
            ConsumerQueues::PushResult::kGone);
  EXPECT_TRUE(queues.HasRoom(task));  // gone: its producer finds out at once
}

TEST(ConsumerQueues, PushUnlessUnreadGivesUpOnlyOnAQueueNobodyReads) {
  prometheus::Registry registry;
  ConsumerQueues queues(/*queue_batches=*/1, /*queue_bytes=*/0, registry);
  const uint64_t task = queues.AddTask(Assignment(0, 0), /*parallel=*/false);
  const ConsumerQueues::Opened opened = queues.Open({kJob, 0}, {}, [] {});
  ASSERT_TRUE(queues.Push(task, Batch(0, 0)));
  // Nobody reads: the batch is not queued.
  EXPECT_EQ(queues.PushUnlessUnread(task, Batch(0, 1), absl::Milliseconds(20)),
            ConsumerQueues::PushResult::kFull);
  EXPECT_EQ(queues.queued_batches(), 1u);
  EXPECT_EQ(queues.blocked_producers(), 0);
  // A consumer that reads, however late, gets the batch: the bound (here longer than any test)
  // counts from the last read, not from the start of the wait.
  std::future<ConsumerQueues::PushResult> pushed = std::async(std::launch::async, [&] {
    return queues.PushUnlessUnread(task, Batch(0, 1), absl::Minutes(10));
  });
  while (queues.blocked_producers() == 0) std::this_thread::yield();
  StreamEvent event = queues.Poll(opened.stream_id);
  ASSERT_EQ(event.kind, StreamEvent::kBatch);
  EXPECT_EQ(event.batch.header.batch_index(), 0u);
  EXPECT_EQ(pushed.get(), ConsumerQueues::PushResult::kPushed);
  event = queues.Poll(opened.stream_id);
  ASSERT_EQ(event.kind, StreamEvent::kBatch);
  EXPECT_EQ(event.batch.header.batch_index(), 1u);
  // A dropped task's producer finds out at once.
  ASSERT_TRUE(queues.Push(task, Batch(0, 2)));
  std::future<ConsumerQueues::PushResult> gone = std::async(std::launch::async, [&] {
    return queues.PushUnlessUnread(task, Batch(0, 3), absl::Minutes(10));
  });
  while (queues.blocked_producers() == 0) std::this_thread::yield();
  queues.DropTask({kJob, 0, 0, 0});
  EXPECT_EQ(gone.get(), ConsumerQueues::PushResult::kGone);
}

}  // namespace
}  // namespace sluice::data_worker
