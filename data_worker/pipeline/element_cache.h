// ElementCache: what a running pipeline asks of a cache node's storage (docs/cache.md). The
// executor calls it from its stage threads; the worker implements it (worker/split_cache.h)
// over the files the dispatcher committed. Thread-safe.
//
//   Read step:  Lookup(global) -> kHit: the element's columns as they were at the cache node;
//               the steps up to the cache node are skipped for it.
//               kAbsent: the record's split is cached and the record is not in it (a filter or
//               on_error=skip before the cache dropped it): the element is dropped.
//               kMiss: not cached; the record is read and computed.
//   Cache step: Offer(global, columns) for an element computed by the steps before it.
#ifndef SLUICE_DATA_WORKER_PIPELINE_ELEMENT_CACHE_H_
#define SLUICE_DATA_WORKER_PIPELINE_ELEMENT_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "data_worker/ops/tensor.h"

namespace sluice::data_worker::pipeline {

class ElementCache {
 public:
  enum class Found { kMiss, kHit, kAbsent };
  virtual ~ElementCache() = default;
  // On kHit fills `columns`. DataLoss names the cache file and record.
  virtual absl::StatusOr<Found> Lookup(uint64_t global, std::vector<Tensor>* columns) = 0;
  // An element the steps before the cache node computed; kept if its split is being written.
  virtual void Offer(uint64_t global, const std::vector<Tensor>& columns) = 0;
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_ELEMENT_CACHE_H_
