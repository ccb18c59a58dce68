// BufferPool: recycles the buffers of the batches the client finishes (uint8 -> float32).
//
// Why: a float32 ImageNet batch (64 x 3 x 224 x 224 x 4 B = 38.5 MB) is above glibc's largest
// dynamic mmap threshold (32 MB), so every new one is a fresh mmap whose ~9,400 pages fault on
// first write and is unmapped again when the trainer drops the batch. Measured in the Python
// reader (bench/python_client.sh's loop, 2,000 images): 0.67 s of system time and 322,000 page
// faults with a new buffer per batch, 0.11 s and 29,000 with the buffers reused. The sluice
// binaries avoid it by raising the thresholds (data_worker/pipeline/allocator.h); a library must
// not change its host process's malloc settings, so the client reuses its own buffers.
//
// Get() returns a buffer of exactly `bytes` (uninitialized): a freed one of that size if the pool
// holds one, else a new one. When the last owner (a Batch, a numpy array) lets go, the buffer
// goes back to the pool, which keeps at most `max_free` of them (the rest are freed). Buffers may
// outlive the pool. Thread-safe.
#ifndef SLUICE_CLIENT_INTERNAL_BUFFER_POOL_H_
#define SLUICE_CLIENT_INTERNAL_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sluice::client {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> Create(size_t max_free) {
    return std::shared_ptr<BufferPool>(new BufferPool(max_free));
  }

  std::shared_ptr<uint8_t[]> Get(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    std::unique_ptr<uint8_t[]> buffer;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->first != bytes) continue;
        buffer = std::move(it->second);
        free_.erase(it);
        ++reused_;
        break;
      }
    }
    if (buffer == nullptr) buffer.reset(new uint8_t[bytes]);
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<uint8_t[]>(buffer.release(), [pool, bytes](uint8_t* released) {
      std::unique_ptr<uint8_t[]> owned(released);
      if (std::shared_ptr<BufferPool> alive = pool.lock()) {
        alive->Put(bytes, std::move(owned));
      }
    });
  }

  // Buffers Get() handed out again instead of allocating (for tests).
  uint64_t reused() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return reused_;
  }
  size_t free_buffers() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return free_.size();
  }

 private:
  explicit BufferPool(size_t max_free) : max_free_(max_free) {}

  void Put(size_t bytes, std::unique_ptr<uint8_t[]> buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (free_.size() < max_free_) free_.emplace_back(bytes, std::move(buffer));
  }

  const size_t max_free_;
  mutable absl::Mutex mu_;
  std::vector<std::pair<size_t, std::unique_ptr<uint8_t[]>>> free_ ABSL_GUARDED_BY(mu_);
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::client

#endif  // SLUICE_CLIENT_INTERNAL_BUFFER_POOL_H_
