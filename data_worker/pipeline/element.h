// What flows through the executor: Element (one output of the pipeline: an
// element or a batch), LiveBytes (the executor-wide count of element bytes in
// flight), Item (an Element, a hole or an error on its way between stages,
// counted in LiveBytes while it exists) and ElementPool (elements recycled
// with their storage, so the hot path does not allocate per element).
//
// Item accounting: an Item counts its element's bytes when it is made and
// after Recount() (ops changed the element), and gives them back when it is
// dropped, failed, taken (Take) or destroyed. So LiveBytes is what the queues
// and the workers hold; the back-pressure tests read its peak.
#ifndef SLUICE_DATA_WORKER_PIPELINE_ELEMENT_H_
#define SLUICE_DATA_WORKER_PIPELINE_ELEMENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "data_worker/ops/tensor.h"
#include "data_worker/pipeline/memory_budget.h"

namespace sluice::data_worker::pipeline {

// One output of the pipeline: an element, or a batch (columns stacked,
// leading dimension N).
struct Element {
  std::vector<Tensor> columns;
  // One per element of the batch (one if unbatched).
  std::vector<uint64_t> global_indices;
  uint64_t epoch = 0;
  // Inside the executor only: the marker that follows the last record of a run
  // (executor.h) through every stage, so that the batch stage cuts the run's
  // last batch there and the reader knows where the run's outputs end. No
  // columns.
  bool end_of_run = false;
  // Inside the executor only: the Read step took this element from the cache node's storage
  // (element_cache.h); the steps before the cache step pass it by.
  bool from_cache = false;
};

inline int64_t BytesOf(const Element& e) {
  int64_t n = 0;
  for (const Tensor& t : e.columns) n += t.num_bytes();
  return n;
}

// Bytes of elements alive in an executor, and their peak; also charged to the
// worker's MemoryBudget if given (not owned). Thread-safe.
class LiveBytes {
 public:
  explicit LiveBytes(MemoryBudget* budget = nullptr) : budget_(budget) {}
  void Add(int64_t delta) {
    if (budget_ != nullptr) budget_->Add(delta);
    const int64_t now = live_.fetch_add(delta) + delta;
    int64_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {
    }
  }
  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }

 private:
  MemoryBudget* const budget_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

// An element (counted in `live`), a hole (a dropped element: no element,
// status OK) or the error that ends the epoch at this place in the sequence.
// Move-only.
class Item {
 public:
  Item() = default;
  // `live` may be null (nothing counted); not owned.
  Item(std::unique_ptr<Element> e, LiveBytes* live) : e_(std::move(e)), live_(live) { Recount(); }
  static Item Error(absl::Status s) {
    Item i;
    i.status_ = std::move(s);
    return i;
  }
  Item(Item&& o) noexcept { *this = std::move(o); }
  Item& operator=(Item&& o) noexcept {
    Release();
    e_ = std::move(o.e_);
    status_ = std::move(o.status_);
    live_ = o.live_;
    counted_ = o.counted_;
    o.counted_ = 0;
    return *this;
  }
  ~Item() { Release(); }

  Element* element() { return e_.get(); }
  // The element, no longer counted.
  std::unique_ptr<Element> Take() {
    Release();
    return std::move(e_);
  }
  const absl::Status& status() const { return status_; }
  bool is_hole() const { return e_ == nullptr && status_.ok(); }
  // Bytes counted for this item.
  int64_t bytes() const { return counted_; }
  // Becomes a hole.
  void Drop() {
    Release();
    e_.reset();
  }
  // Becomes the error `s`.
  void Fail(absl::Status s) {
    Drop();
    status_ = std::move(s);
  }
  // Counts the element's current size.
  void Recount() {
    if (live_ == nullptr) return;
    const int64_t n = e_ ? BytesOf(*e_) : 0;
    live_->Add(n - counted_);
    counted_ = n;
  }

 private:
  void Release() {
    if (live_ != nullptr && counted_ != 0) live_->Add(-counted_);
    counted_ = 0;
  }
  std::unique_ptr<Element> e_;
  absl::Status status_;
  LiveBytes* live_ = nullptr;
  int64_t counted_ = 0;
};

// A bounded free list of elements whose storage (the columns' buffers and
// shapes, the global_indices vector) is kept for the next element: the feed
// takes an element with Get(), the batch stage gives it back with Put() once
// it is copied into its batch, and the source reads the next record into the
// same tensors (Source::ReadInto, Tensor::Reallocate). In steady state an
// element costs no heap allocation (tests/data_worker/pipeline/
// allocation_test.cc; docs/engine.md "Element recycling").
//
// Bounds: at most kMaxElements elements of at most kMaxElementBytes of storage
// each (larger ones, e.g. decoded images, are freed as before), so the pool
// holds at most 1 MiB that is not counted in LiveBytes: an element in the pool
// is no longer in flight. Thread-safe.
class ElementPool {
 public:
  static constexpr size_t kMaxElements = 256;
  static constexpr size_t kMaxElementBytes = 4096;

  ElementPool() { free_.reserve(kMaxElements); }
  ElementPool(const ElementPool&) = delete;
  ElementPool& operator=(const ElementPool&) = delete;

  // An element with no global indices, epoch 0, no flags, and columns that
  // hold no bytes (Tensor::Clear: storage kept): recycled, or new if the pool
  // is empty.
  std::unique_ptr<Element> Get() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        std::unique_ptr<Element> e = std::move(free_.back());
        free_.pop_back();
        return e;
      }
    }
    return std::make_unique<Element>();
  }

  // Takes `e` back (clears it) if it is small enough and the pool has room;
  // else frees it. Null is ignored.
  void Put(std::unique_ptr<Element> e) ABSL_LOCKS_EXCLUDED(mu_) {
    if (e == nullptr) return;
    size_t bytes = 0;
    for (const Tensor& t : e->columns) bytes += t.capacity();
    if (bytes > kMaxElementBytes) return;
    for (Tensor& t : e->columns) t.Clear();
    e->global_indices.clear();
    e->epoch = 0;
    e->end_of_run = false;
    e->from_cache = false;
    absl::MutexLock lock(&mu_);
    if (free_.size() < kMaxElements) free_.push_back(std::move(e));
  }

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return free_.size();
  }

 private:
  mutable absl::Mutex mu_;
  // Reserved to kMaxElements: Put never allocates.
  std::vector<std::unique_ptr<Element>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_ELEMENT_H_
