// libFuzzer target for a saved iterator state as a trainer restores it (JobOptions::restore_state,
// `sluice consume --restore-state FILE`): the bytes come from a file, so anything may be in
// them. client::PlanRestore reads and checks them; what it accepts is restored into the
// iterator's bookkeeping (IteratorState::Restore, as BatchIteratorImpl does), which then gets a
// dispatcher's answer and a few end-of-split markers and batches. A bad state must be an error
// Status, never a crash, a hang or an allocation by a number it holds.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/internal/checkpoint.h"
#include "client/internal/iterator_state.h"
#include "proto/dispatcher.pb.h"
#include "sluice/client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::client::IteratorState;
  sluice::JobOptions job;
  job.job_name = "fuzz";
  job.num_consumers = 2;
  job.consumer_index = 1;
  job.restore_state.assign(reinterpret_cast<const char*>(data), size);
  // Half of the inputs are restored into the job, consumer and world size they name, so that
  // the checks after the name pass and the state reaches the iterator.
  sluice::proto::ConsumerCheckpoint peek;
  if (size % 2 == 0 && peek.ParseFromString(job.restore_state)) {
    job.job_name = peek.job_name();
    job.num_consumers = peek.num_consumers();
    job.consumer_index = peek.consumer_index();
  }
  absl::StatusOr<sluice::client::RestorePlan> plan = sluice::client::PlanRestore(job);
  if (!plan.ok() || !plan->restore.has_value()) return 0;
  const std::optional<sluice::proto::ConsumerCheckpoint>& checkpoint = plan->restore;
  (void)sluice::client::CheckSameJob(*checkpoint, job, /*fingerprint=*/0x5eed);
  (void)sluice::client::AtEpochBoundary(*checkpoint);

  IteratorState state(/*deterministic=*/size % 3 == 0, /*track_splits=*/true,
                      /*prefetch=*/4);
  const uint64_t epoch = checkpoint->epoch();
  // A dispatcher answering that the job has 4,096 slots per epoch bounds the ranges.
  absl::StatusOr<std::vector<sluice::client::SlotProgress>> slots =
      sluice::client::RestoredSlots(*checkpoint, /*max_positions=*/4096);
  if (!slots.ok()) return 0;
  uint64_t positions = 0;  // what a dispatcher would answer: the slots the state names
  for (const sluice::client::SlotProgress& p : *slots) {
    if (p.epoch == epoch) positions = std::max(positions, std::min<uint64_t>(p.position, 4095) + 1);
  }
  state.Restore(epoch, *slots);
  state.ApplyHeartbeat(epoch, positions, /*done_positions=*/{}, checkpoint->finished());
  (void)state.Progress(/*acknowledged=*/false);
  (void)state.Progress(/*acknowledged=*/true);
  (void)state.Held();
  (void)state.EpochReturned(epoch);
  for (uint64_t position = 0; position < std::min<uint64_t>(positions, 8); ++position) {
    for (uint64_t index = 0; index < 3; ++index) {
      const bool marker = index == 2;
      if (state.Check(epoch, position, index, marker) != IteratorState::Admit::kAccept) continue;
      if (marker) {
        state.AcceptMarker(epoch, position, index);
      } else {
        sluice::Batch batch;
        batch.epoch = epoch;
        batch.position = position;
        batch.batch_index = index;
        state.Accept(std::move(batch));
      }
    }
    while (state.Pop().has_value()) {
    }
  }
  (void)state.Done();
  return 0;
}
