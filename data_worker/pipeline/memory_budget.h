// MemoryBudget: one byte budget for everything a worker holds in batches, over all its jobs
// and consumers: the elements and batch buffers in flight in every executor (charged through
// each executor's LiveBytes, element.h) and the batches in the consumer queues (charged by
// ConsumerQueues).
//
// Where it blocks: an executor's feed admits a new record only while the bytes in use are
// under the limit, or while nothing waits in the executor's output (its reader is keeping up).
// So when the budget is full every pipeline stops at most one output ahead of its reader, and
// a pipeline whose reader waits for it always gets going: each consumer keeps progressing
// whatever the others hold. The consumer queues keep their own bound (ConsumerQueues).
//
// Thread-safe. Add() and Poke() wake the waiters.
#ifndef SLUICE_DATA_WORKER_PIPELINE_MEMORY_BUDGET_H_
#define SLUICE_DATA_WORKER_PIPELINE_MEMORY_BUDGET_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sluice::data_worker::pipeline {

class MemoryBudget {
 public:
  // `limit` <= 0: no limit (bytes are counted, nothing waits).
  explicit MemoryBudget(int64_t limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  void Add(int64_t delta) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    used_ += delta;
    peak_ = std::max(peak_, used_);
  }
  // Makes waiters re-check `go` (it reads state the budget does not guard).
  void Poke() ABSL_LOCKS_EXCLUDED(mu_) { absl::MutexLock lock(&mu_); }
  // Returns once the bytes in use are under the limit or `go()` holds. `go` must not block.
  void WaitForRoom(const std::function<bool()>& go) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return limit_ <= 0 || used_ < limit_ || go();
    };
    mu_.Await(absl::Condition(&room));
  }

  // What WaitForRoom waits for, now: true if it would return at once.
  bool HasRoom(const std::function<bool()>& go) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return limit_ <= 0 || used_ < limit_ || go();
  }
  int64_t limit() const { return limit_; }
  int64_t used() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return used_;
  }
  int64_t peak() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return peak_;
  }

 private:
  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_MEMORY_BUDGET_H_
