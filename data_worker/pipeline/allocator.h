// Process-wide allocator settings for pipeline processes (the CLI, the worker,
// benchmarks).
//
// A float32 batch of 64 224×224×3 images is 38.5 MB, above glibc's largest
// dynamic mmap threshold (32 MB): every batch would be a fresh mmap, and the
// first write to each of its ~9,400 pages a page fault — measured at ~25% of
// the pipeline's CPU on 2 cores. Raising the mmap and trim thresholds keeps
// freed batch buffers in the heap for the next batch. It also turns off
// Abseil's mutex deadlock detection (a debugging aid costing ~4% of a
// small-record pipeline). The cost: the process
// keeps its peak heap instead of returning it to the OS. Call from main(),
// before any thread starts; libraries never call it.
#ifndef SLUICE_DATA_WORKER_PIPELINE_ALLOCATOR_H_
#define SLUICE_DATA_WORKER_PIPELINE_ALLOCATOR_H_

namespace sluice::data_worker::pipeline {

void ConfigureAllocatorForPipelines();

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_ALLOCATOR_H_
