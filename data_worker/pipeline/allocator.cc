#include "data_worker/pipeline/allocator.h"

#include <malloc.h>

namespace sluice::data_worker::pipeline {

void ConfigureAllocatorForPipelines() {
  mallopt(M_MMAP_THRESHOLD,
          256 << 20);  // allocations up to 256 MB come from the heap
  mallopt(M_TRIM_THRESHOLD,
          1 << 30);  // and freed heap memory is kept for reuse
}

}  // namespace sluice::data_worker::pipeline
