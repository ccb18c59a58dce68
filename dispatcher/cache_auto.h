// `cache: auto` (docs/cache.md): whether and where to cache a job's deterministic prefix, decided
// by the dispatcher from the per-node cost the workers measure.
//
// The rule is Cachew's (Graur et al., "Cachew: Machine Learning Input Data Processing as a
// Service", USENIX ATC 2022): cache the output of a pipeline prefix when reading it back is
// cheaper than computing it again. Here, per epoch and over all workers together:
//
//   compute(k) = records x  sum over nodes n <= k of busy_seconds(n) / records_measured
//   read(k)    = records x  bytes_per_record(k) x read_seconds_per_byte
//   saved(k)   = compute(k) - read(k)
//   bytes(k)   = records x  bytes_per_record(k),   bytes_per_record(k) = out_bytes(k) / records
//
// Candidate cuts k are the ends of map and filter nodes before the batch node and before the
// first op that draws new randomness each epoch (the validator's rule, DrawsPerEpochRandomness):
// a cut after such an op would repeat epoch 1's draws. The decision picks the candidate with the
// largest saved(k) among those with bytes(k) <= the free budget and saved(k) > min_saved_fraction
// x compute(last candidate); none pays: "no cache", with the reason. Worked example (1000 records,
// read 1 ns/byte, budget unlimited):
//
//   node 0 map [decode, resize]   busy 2.0 s, out 150 KB/record   compute 2.0 s, read 0.15 s
//   node 1 map [center_crop]      busy 0.1 s, out  50 KB/record   compute 2.1 s, read 0.05 s
//   node 2 map [random_flip ...]  (per-epoch random: no cut at or after it)
//   -> cache after node 1: saves 2.05 s per epoch, 50 MB.
//
// Pure functions of their inputs; no I/O, no clock. The dispatcher calls DecideAutoCache once a
// job's workers have measured an epoch's records and journals the result.
#ifndef SLUICE_DISPATCHER_CACHE_AUTO_H_
#define SLUICE_DISPATCHER_CACHE_AUTO_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/dispatcher.pb.h"
#include "proto/pipeline.pb.h"
#include "proto/worker.pb.h"

namespace sluice::dispatcher {

struct AutoCacheInput {
  const proto::Pipeline* pipeline = nullptr;  // the job's pipeline, without a cache node
  uint64_t split_size = 0;                    // the job's (part of the cache's fingerprint)
  uint64_t records_per_epoch = 0;
  // Per node, summed over the job's workers (NodeCost.job_id is ignored here).
  std::vector<proto::NodeCost> costs;
  // Decide only once the costs cover this many records (an epoch's: the first epoch measures).
  uint64_t min_records = 0;
  // Bytes the new cache may take: the budget minus what committed caches hold.
  uint64_t free_bytes = std::numeric_limits<uint64_t>::max();
  // The cost of reading one cached byte back (decode from the file, checksum), CPU seconds.
  double read_seconds_per_byte = 1e-9;
  // A cut must save at least this fraction of the prefix's compute cost.
  double min_saved_fraction = 0.1;
};

// The decision: decided=false while the costs cover fewer than min_records ("measuring: 312 of
// 1000 records"); otherwise cache=true with the cut, its name ("auto-<fingerprint>"), estimated
// bytes and CPU saved, or cache=false with the reason.
proto::CacheDecision DecideAutoCache(const AutoCacheInput& in);

// `pipeline` with a cache node named `name` inserted right after nodes[after_node].
// InvalidArgument: after_node out of range, or the pipeline already has a cache node.
absl::StatusOr<proto::Pipeline> WithCacheAfter(const proto::Pipeline& pipeline, int after_node,
                                               const std::string& name);

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_CACHE_AUTO_H_
