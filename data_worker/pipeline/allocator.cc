#include "data_worker/pipeline/allocator.h"

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace sluice::data_worker::pipeline {

void ConfigureAllocatorForPipelines() {
  mallopt(M_MMAP_THRESHOLD,
          256 << 20);  // allocations up to 256 MB come from the heap
  mallopt(M_TRIM_THRESHOLD,
          1 << 30);  // and freed heap memory is kept for reuse
  // Abseil's mutex deadlock detection (on in this Abseil build) records every
  // lock acquisition in a graph: ~4% of a small-record pipeline's CPU. It is
  // a debugging aid; tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace sluice::data_worker::pipeline
