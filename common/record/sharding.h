// How records are ordered and divided, computed identically on every node from
// (seed, epoch).
//
// - Permutation(n, seed, epoch): a Fisher-Yates shuffle of 0..n-1 driven by
//   sluice's own Rng, so the result is fixed by this code, not by a standard
//   library.
// - Partition(...): the records one of `num_shards` nodes reads in an epoch,
//   strided over the permutation like PyTorch's DistributedSampler: node k
//   takes positions k, k+S, k+2S, ... With kPad every node gets ceil(n/S)
//   records (the permutation wraps around to fill), with kDrop floor(n/S) (the
//   tail is dropped), with kUneven the first n%S nodes get one more.
//   Example, n=10, S=3, seed 0, epoch 0, kPad:
//     perm = [9,3,4,2,8,5,0,1,6,7], padded with [9,3]
//     node 0 gets 9,2,0,7; node 1 gets 3,8,1,9; node 2 gets 4,5,6,3.
// - Splits: contiguous record ranges inside one shard, the unit the dispatcher
//   hands to workers.
#ifndef SLUICE_COMMON_RECORD_SHARDING_H_
#define SLUICE_COMMON_RECORD_SHARDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::record {

std::vector<uint64_t> Permutation(uint64_t n, uint64_t seed, uint64_t epoch);

enum class RemainderPolicy { kPad, kDrop, kUneven };

// InvalidArgument if num_shards == 0 or shard_id >= num_shards.
absl::StatusOr<std::vector<uint64_t>> Partition(uint64_t n, uint32_t num_shards,
                                                uint32_t shard_id,
                                                uint64_t seed, uint64_t epoch,
                                                RemainderPolicy policy);

struct Split {
  uint64_t id = 0;            // 0..num_splits-1 in dataset order
  uint32_t shard = 0;         // shard (file) index in the manifest
  uint64_t begin = 0;         // first record, within the shard
  uint64_t end = 0;           // one past the last record, within the shard
  uint64_t first_global = 0;  // global index of `begin`

  uint64_t size() const { return end - begin; }
  bool operator==(const Split&) const = default;
};

// Cuts each shard into splits of `split_size` records (the last split of a
// shard may be shorter). InvalidArgument if split_size == 0.
absl::StatusOr<std::vector<Split>> EnumerateSplits(
    const std::vector<uint64_t>& shard_record_counts, uint64_t split_size);

// The order in which a worker reads the `n` records of a split starting at global index
// `first_global`: natural order, or, when the pipeline shuffles,
// Permutation(n, MixSeed({seed, split_id}), epoch) applied to that range. The same on every
// worker, so a replacement worker re-produces exactly the same batches.
std::vector<uint64_t> SplitRecordOrder(uint64_t first_global, uint64_t n,
                                       bool shuffle, uint64_t seed,
                                       uint64_t split_id, uint64_t epoch);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_SHARDING_H_
