// BusySampler: which of a stage thread's groups of elements it times for
// autotune's busy time, when no metrics need every group timed.
//
// Two clock reads cost ~0.1 µs (bench/kernels/small_records.cc --clocks), a
// fifth of an element's executor overhead on small records, so short groups
// are sampled: one in kSample (the first, then every kSample-th), counted
// kSample times. A long group (a decoded image: milliseconds) is timed every
// time: sampled, one timed group in a 50 ms autotune interval or none would
// swing the stage's busy time between 0 and 2× the truth, and autotune would
// take a thread away from a busy stage for a sample that missed (2026-11-26:
// on 800-1,200 px photos the second thread left and came back every ~250 ms).
// A thread starts by timing every group and switches to sampling after a
// timed group shorter than kLongGroup (and back after a longer one).
//
//   group    0    1    2 ...  8    9 ...   (short groups)
//   weight   1    0    0      8    0       (group 0 timed at weight 1, found short)
//
// One per thread; not thread-safe.
#ifndef SLUICE_DATA_WORKER_PIPELINE_BUSY_SAMPLER_H_
#define SLUICE_DATA_WORKER_PIPELINE_BUSY_SAMPLER_H_

#include <cstdint>

#include "absl/time/time.h"

namespace sluice::data_worker::pipeline {

class BusySampler {
 public:
  static constexpr int64_t kSample = 8;
  static constexpr absl::Duration kLongGroup = absl::Microseconds(50);

  // The weight to count the next group's time with; 0 = do not time it.
  int64_t Next() {
    const uint64_t group = groups_++;
    if (every_) return 1;
    return group % kSample == 0 ? kSample : 0;
  }
  // The time the group Next() gave a weight > 0 took.
  void Timed(absl::Duration busy) { every_ = busy >= kLongGroup; }

 private:
  uint64_t groups_ = 0;
  bool every_ = true;
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_BUSY_SAMPLER_H_
