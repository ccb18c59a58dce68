#include "common/record/sharding.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/random.h"

namespace sluice::record {

std::vector<uint64_t> Permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(MixSeed({seed, epoch, 0x5e17a11e}));
  for (uint64_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.UniformInt(i)]);
  return perm;
}

uint64_t CountSplits(const std::vector<uint64_t>& shard_record_counts, uint64_t split_size) {
  uint64_t splits = 0;
  for (uint64_t n : shard_record_counts) {
    const uint64_t more = n / split_size + (n % split_size != 0 ? 1 : 0);
    if (more > ~uint64_t{0} - splits) return ~uint64_t{0};
    splits += more;
  }
  return splits;
}

absl::StatusOr<std::vector<Split>> EnumerateSplits(const std::vector<uint64_t>& shard_record_counts,
                                                   uint64_t split_size) {
  if (split_size == 0) return absl::InvalidArgumentError("split size must be > 0");
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

uint64_t ShareSize(uint64_t num_records, uint32_t num_consumers, RemainderPolicy policy) {
  if (num_consumers == 0) return 0;
  return policy == RemainderPolicy::kDrop ? num_records / num_consumers
                                          : (num_records + num_consumers - 1) / num_consumers;
}

absl::StatusOr<std::vector<SlotPieces>> ConsumerSlots(const std::vector<Split>& splits,
                                                      uint32_t num_consumers, uint32_t consumer,
                                                      uint64_t seed, uint64_t epoch,
                                                      RemainderPolicy policy, uint64_t slot_size,
                                                      bool cut_at_splits) {
  if (num_consumers == 0) return absl::InvalidArgumentError("num_consumers must be > 0");
  if (consumer >= num_consumers) {
    return absl::InvalidArgumentError(
        absl::StrCat("consumer ", consumer, " must be < num_consumers ", num_consumers));
  }
  if (slot_size == 0) return absl::InvalidArgumentError("slot size must be > 0");
  // The epoch's sequence: splits in permuted order; starts[i] = position of order[i]'s first
  // record.
  const std::vector<uint64_t> order = Permutation(splits.size(), seed, epoch);
  std::vector<uint64_t> starts(order.size() + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) starts[i + 1] = starts[i] + splits[order[i]].size();
  const uint64_t n = starts.back();
  const uint64_t share = ShareSize(n, num_consumers, policy);
  if (share == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the dataset has ", n, " records, fewer than the ", num_consumers,
                     " consumers: with remainder DROP consumer ", consumer,
                     " gets nothing; use remainder PAD or fewer consumers"));
  }
  std::vector<SlotPieces> slots;
  const uint64_t first = static_cast<uint64_t>(consumer) * share;
  for (uint64_t slot_begin = 0, taken = 0; slot_begin < share; slot_begin += taken) {
    SlotPieces pieces;
    uint64_t pos = first + slot_begin;
    uint64_t left = std::min(slot_size, share - slot_begin);
    if (cut_at_splits) {
      const uint64_t at = pos % n;
      const size_t i =
          static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), at) - starts.begin()) -
          1;
      left = std::min(left, starts[i + 1] - at);
    }
    taken = left;
    while (left > 0) {
      const uint64_t at = pos % n;  // kPad wraps around to the start of the sequence
      const size_t i =
          static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), at) - starts.begin()) -
          1;
      const uint64_t offset = at - starts[i];
      const uint64_t count = std::min(left, starts[i + 1] - at);
      if (!pieces.empty() && pieces.back().split_id == order[i] &&
          pieces.back().offset + pieces.back().count == offset) {
        pieces.back().count += count;
      } else {
        pieces.push_back({order[i], offset, count});
      }
      pos += count;
      left -= count;
    }
    slots.push_back(std::move(pieces));
  }
  return slots;
}

std::vector<uint64_t> SplitRecordOrder(uint64_t first_global, uint64_t n, bool shuffle,
                                       uint64_t seed, uint64_t split_id, uint64_t epoch) {
  std::vector<uint64_t> indices(n);
  if (shuffle) {
    const std::vector<uint64_t> perm = Permutation(n, MixSeed({seed, split_id}), epoch);
    for (uint64_t i = 0; i < n; ++i) indices[i] = first_global + perm[i];
  } else {
    for (uint64_t i = 0; i < n; ++i) indices[i] = first_global + i;
  }
  return indices;
}

}  // namespace sluice::record
