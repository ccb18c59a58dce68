#include "dispatcher/dispatcher_state.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::dispatcher {
namespace {

using ::testing::ElementsAre;

proto::Update RegisterDataset(uint64_t id, std::vector<uint64_t> counts, uint64_t batch) {
  proto::Update u;
  auto* d = u.mutable_register_dataset();
  d->set_dataset_id(id);
  d->set_pipeline("p");
  for (uint64_t c : counts) d->add_shard_record_counts(c);
  d->set_batch_size(batch);
  return u;
}

proto::Update CreateJob(uint64_t id, uint64_t dataset, uint32_t consumers, uint64_t split_size,
                        uint64_t epochs,
                        proto::RemainderMode remainder = proto::REMAINDER_MODE_PAD) {
  proto::Update u;
  auto* j = u.mutable_create_job();
  j->set_job_id(id);
  j->set_job_name(absl::StrCat("job", id));
  j->set_dataset_id(dataset);
  auto* c = j->mutable_config();
  c->set_mode(proto::PROCESSING_MODE_DISTRIBUTED_EPOCH);
  c->set_seed(7);
  c->set_num_epochs(epochs);
  c->set_num_consumers(consumers);
  c->set_remainder(remainder);
  c->set_split_size(split_size);
  return u;
}

proto::Update RegisterWorker(uint64_t id) {
  proto::Update u;
  u.mutable_register_worker()->set_worker_id(id);
  u.mutable_register_worker()->set_address(absl::StrCat("w", id));
  u.mutable_register_worker()->set_capacity(2);
  return u;
}

proto::Update Assign(SlotKey key, uint64_t worker, uint64_t skip = 0) {
  proto::Update u;
  *u.mutable_assign_split()->mutable_key() = key.ToProto();
  u.mutable_assign_split()->set_worker_id(worker);
  u.mutable_assign_split()->set_skip_batches(skip);
  return u;
}

proto::Update Progress(uint64_t job, uint32_t consumer, uint64_t epoch, uint64_t position,
                       uint64_t delivered, bool complete) {
  proto::Update u;
  auto* p = u.mutable_client_progress();
  p->set_job_id(job);
  p->set_consumer_index(consumer);
  auto* s = p->add_progress();
  s->set_epoch(epoch);
  s->set_position(position);
  s->set_delivered_batches(delivered);
  s->set_complete(complete);
  return u;
}

proto::Update Lost(uint64_t worker) {
  proto::Update u;
  u.mutable_worker_lost()->set_worker_id(worker);
  return u;
}

TEST(DispatcherState, CreateJobBuildsEachConsumersSplitSequence) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {1000, 600}, 64)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 3, 256, 2)).ok());
  const DispatcherState::Job* job = state.FindJob(1);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->splits.size(), 7u);
  ASSERT_EQ(job->consumers.size(), 3u);
  for (const auto& c : job->consumers) {
    EXPECT_EQ(c.slots.size(), 3u);  // ceil(7 / 3), padded
    EXPECT_EQ(c.epoch, 0u);
  }
  EXPECT_EQ(state.FindJobByName("job1"), job);
  EXPECT_EQ(state.NextJobId(), 2u);
}

TEST(DispatcherState, RejectsUpdatesThatDoNotFit) {
  DispatcherState state;
  EXPECT_EQ(state.Apply(CreateJob(1, 9, 1, 256, 1)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  EXPECT_EQ(state.Apply(RegisterDataset(1, {100}, 10)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 1)).ok());
  EXPECT_EQ(state.Apply(Assign({1, 0, 0, 0}, 5)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(state.Apply(RegisterWorker(5)).ok());
  EXPECT_EQ(state.Apply(Assign({1, 0, 0, 9}, 5)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 0}, 5)).ok());
  EXPECT_EQ(state.Apply(Assign({1, 0, 0, 0}, 5)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state.Apply(proto::Update()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DispatcherState, AJobRecordSizedToExhaustMemoryDoesNotReplay) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {1000000000000ull}, 10)).ok());
  absl::Status s = state.Apply(CreateJob(2, 1, 1, /*split_size=*/1024, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "split_size 1024 gives no splits or more than 16777216");
  ASSERT_TRUE(state.Apply(RegisterDataset(3, {100}, 10)).ok());
  s = state.Apply(CreateJob(4, 3, /*consumers=*/4000000000u, 50, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "num_consumers must be in [1, 65536], got 4000000000");
  EXPECT_EQ(state.jobs().size(), 0u);
}

TEST(DispatcherState, CompletingEverySplitAdvancesTheEpochThenFinishes) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 2)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(1)).ok());
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    for (uint64_t pos = 0; pos < 2; ++pos) {
      ASSERT_TRUE(state.Apply(Assign({1, 0, epoch, pos}, 1)).ok());
      EXPECT_EQ(state.FindSlot({1, 0, epoch, pos})->status, proto::SPLIT_STATUS_ASSIGNED);
      ASSERT_TRUE(state.Apply(Progress(1, 0, epoch, pos, 5, /*complete=*/true)).ok());
    }
    EXPECT_TRUE(state.FindWorker(1)->slots.empty());
  }
  EXPECT_TRUE(state.FindJob(1)->consumers[0].finished);
  EXPECT_TRUE(state.FindJob(1)->finished());
  EXPECT_EQ(state.FindJob(1)->consumers[0].epoch, 2u);
}

// Epoch 0 of one consumer over 100 records in splits of 50: positions 0 and 1. Once both are
// assigned, epoch 1 opens (its slots may be produced while epoch 0's last batches are read);
// the last epoch opens nothing after it.
TEST(DispatcherState, TheNextEpochOpensOnceTheCurrentHasNothingLeftToHandOut) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 2)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(1)).ok());
  const DispatcherState::Consumer& consumer = state.FindJob(1)->consumers[0];
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 0}, 1)).ok());
  EXPECT_EQ(consumer.next, nullptr);
  EXPECT_EQ(state.Apply(Assign({1, 0, 1, 0}, 1)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 1}, 1)).ok());
  ASSERT_NE(consumer.next, nullptr);
  EXPECT_EQ(consumer.next->epoch, 1u);
  EXPECT_THAT(consumer.next->pending, ElementsAre(0, 1));
  ASSERT_TRUE(state.Apply(Assign({1, 0, 1, 1}, 1)).ok());
  EXPECT_EQ(state.FindSlot({1, 0, 1, 1})->status, proto::SPLIT_STATUS_ASSIGNED);
  EXPECT_THAT(state.FindWorker(1)->slots,
              ElementsAre(SlotKey{1, 0, 0, 0}, SlotKey{1, 0, 0, 1}, SlotKey{1, 0, 1, 1}));
  // A report about the following epoch counts before the current one is done.
  ASSERT_TRUE(state.Apply(Progress(1, 0, 1, 1, 2, false)).ok());
  EXPECT_EQ(state.FindSlot({1, 0, 1, 1})->delivered_batches, 2u);
  EXPECT_EQ(consumer.epoch, 0u);
  // Epoch 0 done: epoch 1, with its assignment, is the consumer's; it is the last.
  ASSERT_TRUE(state.Apply(Progress(1, 0, 0, 0, 5, true)).ok());
  ASSERT_TRUE(state.Apply(Progress(1, 0, 0, 1, 5, true)).ok());
  EXPECT_EQ(consumer.epoch, 1u);
  EXPECT_EQ(consumer.done, 0u);
  EXPECT_EQ(consumer.slots[1].status, proto::SPLIT_STATUS_ASSIGNED);
  EXPECT_EQ(consumer.slots[1].delivered_batches, 2u);
  EXPECT_THAT(consumer.pending, ElementsAre(0));
  EXPECT_THAT(state.FindWorker(1)->slots, ElementsAre(SlotKey{1, 0, 1, 1}));
  ASSERT_TRUE(state.Apply(Assign({1, 0, 1, 0}, 1)).ok());
  EXPECT_EQ(consumer.next, nullptr);
  ASSERT_TRUE(state.Apply(Progress(1, 0, 1, 0, 5, true)).ok());
  ASSERT_TRUE(state.Apply(Progress(1, 0, 1, 1, 5, true)).ok());
  EXPECT_TRUE(consumer.finished);
}

// A worker lost while it held a slot of the following epoch hands it back like any other; the
// snapshot carries the following epoch, and a restart replays to the same state.
TEST(DispatcherState, TheFollowingEpochSurvivesALostWorkerAndASnapshot) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 0)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(1)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(2)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 0}, 1)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 1}, 1)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 1, 0}, 2)).ok());
  ASSERT_TRUE(state.Apply(Lost(2)).ok());
  EXPECT_EQ(state.FindSlot({1, 0, 1, 0})->status, proto::SPLIT_STATUS_AWAITING_PROGRESS);
  const DispatcherState::Consumer& consumer = state.FindJob(1)->consumers[0];
  EXPECT_TRUE(consumer.next->pending.count(0) == 0 && consumer.next->awaiting.count(0) == 1);
  // The consumer's next report (nothing of epoch 1 delivered) makes it assignable again.
  ASSERT_TRUE(state.Apply(Progress(1, 0, 0, 0, 1, false)).ok());
  EXPECT_THAT(consumer.next->pending, ElementsAre(0, 1));
  ASSERT_TRUE(state.Apply(Assign({1, 0, 1, 1}, 1)).ok());

  const proto::DispatcherSnapshot snapshot = state.Snapshot();
  DispatcherState replayed;
  for (const proto::Update& u : snapshot.updates())
    ASSERT_TRUE(replayed.Apply(u).ok()) << u.DebugString();
  EXPECT_EQ(replayed.Snapshot().SerializeAsString(), snapshot.SerializeAsString());
  const DispatcherState::Consumer& again = replayed.FindJob(1)->consumers[0];
  ASSERT_NE(again.next, nullptr);
  EXPECT_EQ(again.next->epoch, 1u);
  EXPECT_THAT(again.next->pending, ElementsAre(0));
  EXPECT_EQ(replayed.FindSlot({1, 0, 1, 1})->status, proto::SPLIT_STATUS_ASSIGNED);
  EXPECT_THAT(replayed.FindWorker(1)->slots,
              ElementsAre(SlotKey{1, 0, 0, 0}, SlotKey{1, 0, 0, 1}, SlotKey{1, 0, 1, 1}));
  // A following-epoch state for a consumer not right before it is refused.
  proto::Update wrong;
  *wrong.mutable_consumer_state() = snapshot.updates(snapshot.updates_size() - 1).consumer_state();
  ASSERT_TRUE(wrong.consumer_state().lookahead());
  wrong.mutable_consumer_state()->set_epoch(5);
  const absl::Status refused = replayed.Apply(wrong);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "consumer 0 of job 1 is at epoch 0: it has no following epoch 5 to restore");
}

// The compact consumer state (a restore's record, snapshots): 4 slots of 25 records; slots 0-1
// DONE as a run, slot 3 returned in part; slot 2 fresh, not named.
TEST(DispatcherState, ACompactConsumerStateNamesOnlyWhatIsNotFresh) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 5)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 25, 1)).ok());
  proto::Update u;
  proto::UpdateConsumerState* cs = u.mutable_consumer_state();
  cs->set_job_id(1);
  cs->set_num_slots(4);
  cs->add_done_ranges(0);
  cs->add_done_ranges(2);
  proto::SplitState* part = cs->add_slots();
  part->set_position(3);
  part->set_status(proto::SPLIT_STATUS_PENDING);
  part->set_delivered_batches(2);
  part->set_skip_batches(2);
  ASSERT_TRUE(state.Apply(u).ok());
  const DispatcherState::Consumer& consumer = state.FindJob(1)->consumers[0];
  EXPECT_EQ(consumer.done, 2u);
  EXPECT_THAT(consumer.pending, ElementsAre(2, 3));
  EXPECT_EQ(consumer.slots[3].skip_batches, 2u);
  EXPECT_EQ(consumer.slots[2].skip_batches, 0u);
  // The snapshot writes the same compact form.
  const proto::DispatcherSnapshot snapshot = state.Snapshot();
  const proto::UpdateConsumerState& saved =
      snapshot.updates(snapshot.updates_size() - 1).consumer_state();
  EXPECT_EQ(saved.num_slots(), 4u);
  EXPECT_THAT(saved.done_ranges(), ElementsAre(0, 2));
  ASSERT_EQ(saved.slots_size(), 1);
  EXPECT_EQ(saved.slots(0).position(), 3u);

  const auto refused = [&](proto::Update bad) {
    const absl::Status s = state.Apply(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  proto::Update bad = u;
  bad.mutable_consumer_state()->set_num_slots(5);
  EXPECT_EQ(refused(bad), "consumer 0 of job 1 has 4 slots in epoch 0, the update 5");
  bad = u;
  bad.mutable_consumer_state()->set_done_ranges(1, 5);
  EXPECT_EQ(refused(bad), "done_ranges must be ascending [begin, end) pairs within 4 slots");
  bad = u;
  bad.mutable_consumer_state()->mutable_slots(0)->set_position(4);
  EXPECT_EQ(refused(bad), "a listed slot's position 4 is not below 4");
  EXPECT_EQ(consumer.done, 2u);  // unchanged
}

TEST(DispatcherState, LostWorkersSplitsWaitForTheConsumersReportThenSkipItsPrefix) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 1)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(1)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 0}, 1)).ok());
  ASSERT_TRUE(state.Apply(Progress(1, 0, 0, 0, 2, false)).ok());
  ASSERT_TRUE(state.Apply(Lost(1)).ok());
  EXPECT_EQ(state.FindWorker(1), nullptr);
  const DispatcherState::Slot* slot = state.FindSlot({1, 0, 0, 0});
  EXPECT_EQ(slot->status, proto::SPLIT_STATUS_AWAITING_PROGRESS);
  ASSERT_TRUE(state.Apply(Progress(1, 0, 0, 0, 3, false)).ok());
  EXPECT_EQ(slot->status, proto::SPLIT_STATUS_PENDING);
  EXPECT_EQ(slot->skip_batches, 3u);
}

TEST(DispatcherState, DrainHandsBackOnlySplitsStillBeingProduced) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 1)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(1)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 0}, 1)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 1}, 1)).ok());
  proto::Update produced;
  produced.mutable_worker_progress()->set_worker_id(1);
  auto* p = produced.mutable_worker_progress()->add_splits();
  *p->mutable_key() = SlotKey{1, 0, 0, 0}.ToProto();
  p->set_produced_batches(5);
  p->set_finished_producing(true);
  ASSERT_TRUE(state.Apply(produced).ok());
  proto::Update drain;
  drain.mutable_drain_worker()->set_worker_id(1);
  ASSERT_TRUE(state.Apply(drain).ok());
  EXPECT_TRUE(state.FindWorker(1)->draining);
  EXPECT_THAT(state.FindWorker(1)->slots, ElementsAre(SlotKey{1, 0, 0, 0}));
  EXPECT_EQ(state.FindSlot({1, 0, 0, 1})->status, proto::SPLIT_STATUS_AWAITING_PROGRESS);
  EXPECT_EQ(state.Apply(Assign({1, 0, 0, 1}, 1)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DispatcherState, ReleasedSplitsLeaveTheWorker) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100}, 10)).ok());
  ASSERT_TRUE(state.Apply(CreateJob(1, 1, 1, 50, 1)).ok());
  ASSERT_TRUE(state.Apply(RegisterWorker(1)).ok());
  ASSERT_TRUE(state.Apply(Assign({1, 0, 0, 1}, 1)).ok());
  proto::Update release;
  release.mutable_release_splits()->set_worker_id(1);
  *release.mutable_release_splits()->add_keys() = SlotKey{1, 0, 0, 1}.ToProto();
  ASSERT_TRUE(state.Apply(release).ok());
  EXPECT_TRUE(state.FindWorker(1)->slots.empty());
  EXPECT_EQ(state.FindSlot({1, 0, 0, 1})->status, proto::SPLIT_STATUS_AWAITING_PROGRESS);
}

TEST(DispatcherState, ReplayingTheSameUpdatesGivesTheSameState) {
  std::vector<proto::Update> log = {RegisterDataset(1, {100, 30}, 10), CreateJob(1, 1, 2, 20, 3),
                                    RegisterWorker(1), Assign({1, 1, 0, 0}, 1),
                                    Progress(1, 1, 0, 0, 2, true)};
  DispatcherState a, b;
  for (const auto& u : log) ASSERT_TRUE(a.Apply(u).ok());
  for (const auto& u : log) ASSERT_TRUE(b.Apply(u).ok());
  const auto& ca = a.FindJob(1)->consumers;
  const auto& cb = b.FindJob(1)->consumers;
  ASSERT_EQ(ca.size(), cb.size());
  for (size_t i = 0; i < ca.size(); ++i) {
    ASSERT_EQ(ca[i].slots.size(), cb[i].slots.size());
    for (size_t s = 0; s < ca[i].slots.size(); ++s) {
      EXPECT_EQ(ca[i].slots[s].pieces, cb[i].slots[s].pieces);
      EXPECT_EQ(ca[i].slots[s].status, cb[i].slots[s].status);
    }
  }
}

// A job resumed mid-epoch 1 on 2 consumers: consumer 0 reads batches [1, end) of split 3,
// consumer 1 was left nothing of epoch 1 and starts at epoch 2.
proto::Update CreateResizedJob() {
  proto::Update u = CreateJob(1, 1, 2, 20, 3);
  proto::UpdateCreateJob* j = u.mutable_create_job();
  j->set_first_epoch(1);
  proto::ResizedEpoch* r = j->mutable_resized();
  r->set_epoch(1);
  r->set_from_consumers(3);
  r->set_digest(99);
  proto::SlotRange* slot = r->add_consumers()->add_slots();
  slot->set_first_batch(1);
  proto::SplitPiece* piece = slot->add_pieces();
  piece->set_split_id(3);
  piece->set_count(20);
  r->add_consumers();
  return u;
}

TEST(DispatcherState, AResizedEpochReadsItsLayoutAndSurvivesASnapshot) {
  DispatcherState a;
  ASSERT_TRUE(a.Apply(RegisterDataset(1, {100, 30}, 10)).ok());
  ASSERT_TRUE(a.Apply(CreateResizedJob()).ok());
  proto::DispatcherSnapshot snapshot = a.Snapshot();
  DispatcherState b;
  for (const proto::Update& u : snapshot.updates()) ASSERT_TRUE(b.Apply(u).ok()) << u.DebugString();
  for (const DispatcherState* s : {&a, &b}) {
    const DispatcherState::Job& job = *s->FindJob(1);
    ASSERT_EQ(job.consumers[0].epoch, 1u);
    ASSERT_EQ(job.consumers[0].slots.size(), 1u);
    const DispatcherState::Slot& slot = job.consumers[0].slots[0];
    EXPECT_EQ(slot.pieces, (record::SlotPieces{{.split_id = 3, .offset = 0, .count = 20}}));
    EXPECT_EQ(slot.first_batch, 1u);
    EXPECT_EQ(slot.end_batch, 0u);
    EXPECT_EQ(job.consumers[1].epoch, 2u);         // nothing of epoch 1 for it
    EXPECT_EQ(job.consumers[1].slots.size(), 4u);  // 130 records / 2 = 65: 20, 20, 20, 5
  }
  // Consumer 1 restored into epoch 1 (where it has nothing) starts epoch 2 again.
  proto::Update restore;
  restore.mutable_consumer_state()->set_job_id(1);
  restore.mutable_consumer_state()->set_consumer_index(1);
  restore.mutable_consumer_state()->set_epoch(1);
  ASSERT_TRUE(a.Apply(restore).ok());
  EXPECT_EQ(a.FindJob(1)->consumers[1].epoch, 2u);
  EXPECT_EQ(a.FindJob(1)->consumers[1].slots.size(), 4u);
  // Consumer 0 completes its one slot: epoch 2 is an ordinary one.
  ASSERT_TRUE(a.Apply(Progress(1, 0, 1, 0, 1, true)).ok());
  EXPECT_EQ(a.FindJob(1)->consumers[0].epoch, 2u);
  EXPECT_EQ(a.FindJob(1)->consumers[0].slots[0].first_batch, 0u);
}

TEST(DispatcherState, AResizedEpochReadingASplitTheJobLacksIsRefused) {
  DispatcherState state;
  ASSERT_TRUE(state.Apply(RegisterDataset(1, {100, 30}, 10)).ok());
  proto::Update u = CreateResizedJob();
  u.mutable_create_job()
      ->mutable_resized()
      ->mutable_consumers(0)
      ->mutable_slots(0)
      ->mutable_pieces(0)
      ->set_split_id(7);  // 7 splits: 0..6
  const absl::Status status = state.Validate(u);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("reads split 7"));
  EXPECT_EQ(state.Apply(u).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::dispatcher
