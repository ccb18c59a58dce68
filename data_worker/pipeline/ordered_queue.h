// OrderedQueue: the bounded queue between two stages, which hands out items in
// sequence order.
//
// Producers Push(seq, item) in any order; consumers Pop() the item with the
// lowest sequence number not yet popped (the head), waiting for it if it is
// still being produced. Every sequence number from 0 to the end (SetEnd) must
// be pushed exactly once; a dropped element is pushed as a hole.
//
// Bounds: Push of `seq` waits while seq >= head + capacity, and, unless seq is
// the head, while the queued bytes plus the item plus one more item of the
// largest size seen would exceed byte_limit (room is kept for the head, so a
// full queue can always make progress). The head is never blocked, so a stage
// whose workers each hold one element cannot deadlock.
//
// Thread-safe. Cancel() wakes every waiter; later calls return at once.
#ifndef SLUICE_DATA_WORKER_PIPELINE_ORDERED_QUEUE_H_
#define SLUICE_DATA_WORKER_PIPELINE_ORDERED_QUEUE_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace sluice::data_worker::pipeline {

template <typename T>
class OrderedQueue {
 public:
  // kNotReady: TryPop only.
  enum class PopResult { kItem, kEnd, kCancelled, kNotReady };

  // `clock` times how long Pop waits (autotune's consumer-starvation signal);
  // not owned.
  OrderedQueue(int64_t capacity, int64_t byte_limit, Clock* clock)
      : clock_(clock), capacity_(capacity), byte_limit_(byte_limit) {}

  // False if cancelled (the item is dropped).
  bool Push(uint64_t seq, T item, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (cancelled_) return true;
      if (seq == head_) return true;
      if (seq >= head_ + static_cast<uint64_t>(capacity_)) return false;
      return bytes_ + bytes + std::max(max_item_bytes_, bytes) <= byte_limit_;
    };
    mu_.Await(absl::Condition(&fits));
    if (cancelled_) return false;
    items_.emplace(seq, Entry{std::move(item), bytes});
    bytes_ += bytes;
    max_item_bytes_ = std::max(max_item_bytes_, bytes);
    peak_bytes_ = std::max(peak_bytes_, bytes_);
    peak_items_ = std::max<int64_t>(peak_items_, items_.size());
    return true;
  }

  // The head item (in *item, with its sequence number in *seq); kEnd (with the
  // end in *seq) once every item before the end was popped; kCancelled after
  // Cancel().
  PopResult Pop(T* item, uint64_t* seq) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!Ready()) {
      const absl::Duration start = clock_->Now() - absl::UnixEpoch();
      ++waiting_;
      waiting_since_sum_ += start;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Ready(); };
      mu_.Await(absl::Condition(&ready));
      empty_wait_ += (clock_->Now() - absl::UnixEpoch()) - start;
      --waiting_;
      waiting_since_sum_ -= start;
    }
    return Take(item, seq);
  }

  // Pop without waiting: kNotReady if the head is not there yet.
  PopResult TryPop(T* item, uint64_t* seq) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!Ready()) return PopResult::kNotReady;
    return Take(item, seq);
  }

  // The number of items the producer will push in total (0..end-1).
  void SetEnd(uint64_t end) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!end_ || end < *end_) end_ = end;
  }
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  // Destroys the queued items (after the threads that use the queue were
  // joined).
  void Clear() ABSL_LOCKS_EXCLUDED(mu_) {
    std::map<uint64_t, Entry> items;
    {
      absl::MutexLock lock(&mu_);
      items.swap(items_);
      bytes_ = 0;
    }
  }
  void SetLimits(int64_t capacity, int64_t byte_limit) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    capacity_ = std::max<int64_t>(1, capacity);
    byte_limit_ = byte_limit;
  }

  struct Snapshot {
    int64_t items = 0;
    int64_t bytes = 0;
    int64_t peak_items = 0;
    int64_t peak_bytes = 0;
    int64_t max_item_bytes = 0;
    int64_t capacity = 0;
    int64_t byte_limit = 0;
    // Total time Pop waited for the head, including the waits still going on:
    // a consumer that has been waiting for its first item since the start
    // counts as starved in every interval, not only once the item arrives.
    absl::Duration empty_wait;
    int64_t waiting = 0;  // Pops waiting for the head now
  };
  Snapshot snapshot() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const absl::Duration now = clock_->Now() - absl::UnixEpoch();
    return Snapshot{static_cast<int64_t>(items_.size()),
                    bytes_,
                    peak_items_,
                    peak_bytes_,
                    max_item_bytes_,
                    capacity_,
                    byte_limit_,
                    empty_wait_ + waiting_ * now - waiting_since_sum_,
                    waiting_};
  }

 private:
  struct Entry {
    T item;
    int64_t bytes;
  };
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || (end_ && head_ >= *end_) ||
           (!items_.empty() && items_.begin()->first == head_);
  }
  // Pop's answer once Ready().
  PopResult Take(T* item, uint64_t* seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) return PopResult::kCancelled;
    if (items_.empty() || items_.begin()->first != head_) {
      *seq = head_;  // == the end
      return PopResult::kEnd;
    }
    auto it = items_.begin();
    *item = std::move(it->second.item);
    *seq = it->first;
    bytes_ -= it->second.bytes;
    items_.erase(it);
    ++head_;
    return PopResult::kItem;
  }
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> items_ ABSL_GUARDED_BY(mu_);
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> end_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t capacity_ ABSL_GUARDED_BY(mu_);
  int64_t byte_limit_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_item_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_items_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration empty_wait_ ABSL_GUARDED_BY(mu_);  // of the waits that ended
  // The Pops waiting now, and the sum of their start times (since the Unix
  // epoch): their waits so far are waiting_ × now − waiting_since_sum_.
  int64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration waiting_since_sum_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_ORDERED_QUEUE_H_
