// Position runs: a set of slot positions kept as ascending [begin, end) pairs in one repeated
// uint64 field, so that a message about the slots returned whole stays small at any number of
// slots (ConsumerCheckpoint.complete_ranges, ClientHeartbeatRequest.restore_complete_ranges,
// ReturnedRuns.complete_ranges, UpdateConsumerState.done_ranges).
//
//   AppendToRuns(&r, 0); AppendToRuns(&r, 1); AppendToRuns(&r, 5)  ->  r = [0, 2, 5, 6]
#ifndef SLUICE_COMMON_SERVICE_POSITION_RUNS_H_
#define SLUICE_COMMON_SERVICE_POSITION_RUNS_H_

#include <cstdint>

#include "google/protobuf/repeated_field.h"

namespace sluice::service {

// Adds `position`, which must be above every position in `runs`: it extends the last run when
// it follows it, else it starts a new one.
inline void AppendToRuns(google::protobuf::RepeatedField<uint64_t>* runs, uint64_t position) {
  const int n = runs->size();
  if (n > 0 && runs->Get(n - 1) == position) {
    runs->Set(n - 1, position + 1);
    return;
  }
  runs->Add(position);
  runs->Add(position + 1);
}

}  // namespace sluice::service

#endif  // SLUICE_COMMON_SERVICE_POSITION_RUNS_H_
