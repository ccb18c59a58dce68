#include "common/record/sharding.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/random.h"

namespace sluice::record {

std::vector<uint64_t> Permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(MixSeed({seed, epoch, 0x5e17a11e}));
  for (uint64_t i = n; i > 1; --i)
    std::swap(perm[i - 1], perm[rng.UniformInt(i)]);
  return perm;
}

absl::StatusOr<std::vector<uint64_t>> Partition(uint64_t n, uint32_t num_shards,
                                                uint32_t shard_id,
                                                uint64_t seed, uint64_t epoch,
                                                RemainderPolicy policy) {
  if (num_shards == 0)
    return absl::InvalidArgumentError("num_shards must be > 0");
  if (shard_id >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard_id ", shard_id, " must be < num_shards ", num_shards));
  }
  const std::vector<uint64_t> perm = Permutation(n, seed, epoch);
  uint64_t count = 0;
  switch (policy) {
    case RemainderPolicy::kPad:
      count = (n + num_shards - 1) / num_shards;
      break;
    case RemainderPolicy::kDrop:
      count = n / num_shards;
      break;
    case RemainderPolicy::kUneven:
      count = n / num_shards + (shard_id < n % num_shards ? 1 : 0);
      break;
  }
  if (n == 0) count = 0;
  std::vector<uint64_t> out;
  out.reserve(count);
  for (uint64_t j = 0; j < count; ++j)
    out.push_back(perm[(shard_id + j * num_shards) % n]);
  return out;
}

absl::StatusOr<std::vector<Split>> EnumerateSplits(
    const std::vector<uint64_t>& shard_record_counts, uint64_t split_size) {
  if (split_size == 0)
    return absl::InvalidArgumentError("split size must be > 0");
  std::vector<Split> splits;
  uint64_t global = 0;
  for (uint32_t shard = 0; shard < shard_record_counts.size(); ++shard) {
    const uint64_t records = shard_record_counts[shard];
    for (uint64_t begin = 0; begin < records; begin += split_size) {
      const uint64_t end = std::min(records, begin + split_size);
      splits.push_back({splits.size(), shard, begin, end, global + begin});
    }
    global += records;
  }
  return splits;
}

std::vector<uint64_t> SplitRecordOrder(uint64_t first_global, uint64_t n,
                                       bool shuffle, uint64_t seed,
                                       uint64_t split_id, uint64_t epoch) {
  std::vector<uint64_t> indices(n);
  if (shuffle) {
    const std::vector<uint64_t> perm =
        Permutation(n, MixSeed({seed, split_id}), epoch);
    for (uint64_t i = 0; i < n; ++i) indices[i] = first_global + perm[i];
  } else {
    for (uint64_t i = 0; i < n; ++i) indices[i] = first_global + i;
  }
  return indices;
}

}  // namespace sluice::record
