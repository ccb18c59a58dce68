// How records are ordered and divided, computed identically on every node from (seed, epoch).
//
// - Permutation(n, seed, epoch): a Fisher-Yates shuffle of 0..n-1 driven by sluice's own Rng,
//   so the result is fixed by this code, not by a standard library.
// - Splits: contiguous record ranges inside one shard, the unit of reading.
// - ConsumerSlots(...): a consumer's equal share of an epoch, as PyTorch's DistributedSampler
//   defines it, in slots (the unit the dispatcher hands to workers), each a list of pieces of
//   splits.
// - SplitRecordOrder(...): the order in which a split's records are read.
#ifndef SLUICE_COMMON_RECORD_SHARDING_H_
#define SLUICE_COMMON_RECORD_SHARDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::record {

std::vector<uint64_t> Permutation(uint64_t n, uint64_t seed, uint64_t epoch);

// What happens to the N mod C records that do not divide among C consumers: kPad reads a few
// records twice, kDrop leaves them out.
enum class RemainderPolicy { kPad, kDrop };

struct Split {
  uint64_t id = 0;            // 0..num_splits-1 in dataset order
  uint32_t shard = 0;         // shard (file) index in the manifest
  uint64_t begin = 0;         // first record, within the shard
  uint64_t end = 0;           // one past the last record, within the shard
  uint64_t first_global = 0;  // global index of `begin`

  uint64_t size() const { return end - begin; }
  bool operator==(const Split&) const = default;
};

// How many splits EnumerateSplits would return, counted without building them (saturating at
// UINT64_MAX). REQUIRES: split_size > 0.
uint64_t CountSplits(const std::vector<uint64_t>& shard_record_counts, uint64_t split_size);

// Cuts each shard into splits of `split_size` records (the last split of a
// shard may be shorter). InvalidArgument if split_size == 0.
absl::StatusOr<std::vector<Split>> EnumerateSplits(const std::vector<uint64_t>& shard_record_counts,
                                                   uint64_t split_size);

// Equal shares at record granularity, as DistributedSampler defines them. The epoch's record
// sequence is the splits in Permutation(splits.size(), seed, epoch) order, each split's records
// in their SplitRecordOrder; N records in all. Every consumer gets the same number of records:
// ceil(N / C) with kPad (the sequence wraps around: at most C - 1 records are read twice in
// the epoch), floor(N / C) with kDrop (at most C - 1 records are left out). Consumer k takes
// positions [k * share, (k + 1) * share) of that sequence, cut into slots of `slot_size`
// records (only the last slot of a share may be shorter), so with slot_size a multiple of the
// batch size every consumer gets the same number of batches. A slot may span the end of one
// split and the start of the next: it reads a list of pieces.
//
// Example: splits of 4, 4 and 2 records (N = 10), 3 consumers, kPad, slot_size 2, permuted
// order [s2, s0, s1]: the sequence is s2[0..2) s0[0..4) s1[0..4), share = 4; consumer 0 gets
// slots {s2[0..2)} {s0[0..2)}, consumer 1 {s0[2..4)} {s1[0..2)}, consumer 2 {s1[2..4)}
// {s2[0..2)} (wrapped around: the 2 padding records).
struct SplitPiece {
  uint64_t split_id = 0;
  uint64_t offset = 0;  // first position read, in the split's record order
  uint64_t count = 0;

  bool operator==(const SplitPiece&) const = default;
};
using SlotPieces = std::vector<SplitPiece>;

// Records of each consumer's share: ceil(N / C) with kPad, floor(N / C) with kDrop.
uint64_t ShareSize(uint64_t num_records, uint32_t num_consumers, RemainderPolicy policy);

// The slots of `consumer`'s share in `epoch`, in order. InvalidArgument if num_consumers == 0,
// consumer >= num_consumers, slot_size == 0, or the share is empty (kDrop
// with fewer records than consumers, or no records).
//
// With `cut_at_splits` a slot also ends where a split ends, so it is always one piece and a
// split is cut only at a consumer's share boundary (used by jobs with a cache node, whose
// workers write whole splits). In the example: consumer 0 {s2[0..2)} {s0[0..2)}, consumer 1
// {s0[2..4)} {s1[0..2)}, consumer 2 {s1[2..4)} {s2[0..2)}: the same here, since slots of 2
// never span a split; with slot_size 4, consumer 0 gets {s2[0..2)} {s0[0..2)} instead of
// {s2[0..2) s0[0..2)}.
absl::StatusOr<std::vector<SlotPieces>> ConsumerSlots(const std::vector<Split>& splits,
                                                      uint32_t num_consumers, uint32_t consumer,
                                                      uint64_t seed, uint64_t epoch,
                                                      RemainderPolicy policy, uint64_t slot_size,
                                                      bool cut_at_splits = false);

// The order in which a worker reads the `n` records of a split starting at global index
// `first_global`: natural order, or, when the pipeline shuffles,
// Permutation(n, MixSeed({seed, split_id}), epoch) applied to that range. The same on every
// worker, so a replacement worker re-produces exactly the same batches.
std::vector<uint64_t> SplitRecordOrder(uint64_t first_global, uint64_t n, bool shuffle,
                                       uint64_t seed, uint64_t split_id, uint64_t epoch);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_SHARDING_H_
