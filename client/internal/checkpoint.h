// The iterator states a trainer restores from (JobOptions::restore_state and restore_states,
// `sluice consume --restore-state FILE[,FILE...]`): serialized proto::ConsumerCheckpoints that
// BatchIterator::SaveState wrote. These functions read them and check them against the job they
// are meant to continue; the bytes come from files, so anything may be in them
// (tests/fuzz/restore_state_fuzzer.cc).
#ifndef SLUICE_CLIENT_INTERNAL_CHECKPOINT_H_
#define SLUICE_CLIENT_INTERNAL_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/internal/iterator_state.h"
#include "proto/dispatcher.pb.h"
#include "sluice/client.h"

namespace sluice::client {

// What JobOptions asks to continue from: one state of this consumer (`restore`), or the states
// of every old consumer to re-partition over this job's consumers (`resize_from`), or nothing.
struct RestorePlan {
  std::optional<proto::ConsumerCheckpoint> restore;
  std::vector<proto::ConsumerCheckpoint> resize_from;
};

// JobOptions::restore_state / restore_states, read and checked against `job`: INVALID_ARGUMENT
// when one is not a state, is of a newer version, belongs to another job, or (a single state,
// mid-epoch) to another consumer or world size, or the list lacks this consumer's state.
absl::StatusOr<RestorePlan> PlanRestore(const JobOptions& job);

// INVALID_ARGUMENT when `checkpoint` was saved over another pipeline, dataset, seed, split size
// or remainder mode than `fingerprint` names (a state restored there would skip or repeat
// records).
absl::Status CheckSameJob(const proto::ConsumerCheckpoint& checkpoint, const JobOptions& job,
                          uint64_t fingerprint);

// Nothing of the checkpoint's epoch was returned: any consumer of any world size may start there.
bool AtEpochBoundary(const proto::ConsumerCheckpoint& checkpoint);

// The slots `checkpoint` says were returned, as IteratorState::Restore takes them: `splits`,
// and every position of `complete_ranges` as a complete slot (batch count 0: not kept).
// INVALID_ARGUMENT when the ranges are not ascending [begin, end) pairs or reach past
// `max_positions`, a bound on the consumer's slots the caller knows from the dispatcher (no
// number in the file decides an allocation).
absl::StatusOr<std::vector<SlotProgress>> RestoredSlots(const proto::ConsumerCheckpoint& checkpoint,
                                                        uint64_t max_positions);

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_CHECKPOINT_H_
