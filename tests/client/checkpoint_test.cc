// Reading saved iterator states (client/internal/checkpoint.h): the runs of slots returned
// whole, and what a damaged or newer state gets.
#include "client/internal/checkpoint.h"

#include <string>
#include <vector>

#include "client/internal/batch_iterator_impl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::client {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "a-job";

proto::ConsumerCheckpoint State(std::vector<uint64_t> ranges) {
  proto::ConsumerCheckpoint c;
  c.set_version(kCheckpointVersion);
  c.set_job_name(kJob);
  c.set_num_consumers(1);
  c.set_epoch(4);
  for (uint64_t r : ranges) c.add_complete_ranges(r);
  return c;
}

TEST(Checkpoint, RunsOfCompleteSlotsRestoreAsCompleteSlotsBesideThePartlyReturnedOnes) {
  proto::ConsumerCheckpoint c = State({0, 3, 5, 6});
  proto::ClientSplitProgress* p = c.add_splits();
  p->set_epoch(4);
  p->set_position(6);
  p->set_delivered_batches(2);
  absl::StatusOr<std::vector<SlotProgress>> slots = RestoredSlots(c, /*max_positions=*/8);
  ASSERT_TRUE(slots.ok()) << slots.status();
  std::vector<std::vector<uint64_t>> got;  // epoch, position, batches, complete
  for (const SlotProgress& s : *slots)
    got.push_back({s.epoch, s.position, s.batches, s.complete ? 1u : 0u});
  const std::vector<std::vector<uint64_t>> want = {
      {4, 0, 0, 1}, {4, 1, 0, 1}, {4, 2, 0, 1}, {4, 5, 0, 1}, {4, 6, 2, 0}};
  EXPECT_EQ(got, want);
  EXPECT_FALSE(AtEpochBoundary(State({0, 1})));
  EXPECT_TRUE(AtEpochBoundary(State({})));
}

TEST(Checkpoint, RangesThatAreNotAscendingPairsWithinTheJobAreADamagedState) {
  for (const std::vector<uint64_t>& ranges : std::vector<std::vector<uint64_t>>{
           {0, 9}, {3, 2}, {4, 6, 1, 2}, {0, 1, 2}, {0, uint64_t{1} << 62}}) {
    absl::StatusOr<std::vector<SlotProgress>> slots =
        RestoredSlots(State(ranges), /*max_positions=*/8);
    EXPECT_EQ(slots.status().code(), absl::StatusCode::kInvalidArgument) << ranges.size();
    EXPECT_THAT(std::string(slots.status().message()), HasSubstr("a damaged state"));
  }
}

TEST(Checkpoint, AStateOfALaterVersionIsRefusedNamingBothVersions) {
  proto::ConsumerCheckpoint c = State({0, 1});
  c.set_version(kCheckpointVersion + 1);
  JobOptions job;
  job.job_name = kJob;
  job.restore_state = c.SerializeAsString();
  absl::StatusOr<RestorePlan> plan = PlanRestore(job);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("has version 3; this client reads 2: upgrade the client"));
}

}  // namespace
}  // namespace sluice::client
