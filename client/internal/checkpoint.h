// The iterator state a trainer restores from (JobOptions::restore_state, `sluice consume
// --restore-state FILE`): a serialized proto::ConsumerCheckpoint that BatchIterator::SaveState
// wrote. These functions read it and check it against the job it is meant to continue; the
// bytes come from a file, so anything may be in them (tests/fuzz/restore_state_fuzzer.cc).
#ifndef SLUICE_CLIENT_INTERNAL_CHECKPOINT_H_
#define SLUICE_CLIENT_INTERNAL_CHECKPOINT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/dispatcher.pb.h"
#include "sluice/client.h"

namespace sluice::client {

// JobOptions::restore_state, checked against `job`: INVALID_ARGUMENT when it is not a state,
// is of a newer version, or belongs to another job, consumer or (mid-epoch) world size.
absl::StatusOr<proto::ConsumerCheckpoint> ParseCheckpoint(const JobOptions& job);

// INVALID_ARGUMENT when `checkpoint` was saved over another pipeline, dataset, seed, split size
// or remainder mode than `fingerprint` names (a state restored there would skip or repeat
// records).
absl::Status CheckSameJob(const proto::ConsumerCheckpoint& checkpoint, const JobOptions& job,
                          uint64_t fingerprint);

// Nothing of the checkpoint's epoch was returned: any consumer of any world size may start there.
bool AtEpochBoundary(const proto::ConsumerCheckpoint& checkpoint);

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_CHECKPOINT_H_
