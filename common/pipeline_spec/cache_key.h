// Which cache a pipeline's cache node names, and the fingerprint that decides whether two
// pipelines may share its files (docs/cache.md).
//
// The fingerprint covers what determines the elements reaching the cache node and how they are
// cut into files: the source, every node before the cache node (parallelism settings cleared:
// they change nothing in the output), the pipeline seed, on_error, and the job's split size (one
// file per split). Two jobs whose pipelines differ only after the cache node, or in their shuffle
// seed or consumer count, get the same fingerprint and read each other's committed files. The
// dispatcher (which journals commits) and the workers (which write and read the files) compute
// it with this one function.
#ifndef SLUICE_COMMON_PIPELINE_SPEC_CACHE_KEY_H_
#define SLUICE_COMMON_PIPELINE_SPEC_CACHE_KEY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "proto/pipeline.pb.h"

namespace sluice::pipeline_spec {

struct CacheKey {
  std::string name;         // the cache node's name
  std::string fingerprint;  // 16 hex digits; the folder under --cache-root
  int node_index = 0;       // the cache node's index in Pipeline.nodes
};

// The pipeline's first cache node and its fingerprint for `split_size`; nullopt without one.
std::optional<CacheKey> CacheKeyOf(const proto::Pipeline& pipeline, uint64_t split_size);

// True for ops whose draws change from epoch to epoch (the Random* ops, ColorJitter: the epoch
// seeds them) and for python ops (sluice cannot see inside them): no cache node may come after
// one, since a cached copy would repeat epoch 1's draws. The validator (data_worker) refuses such
// a cache node; `cache: auto` (dispatcher/cache_auto.h) places none there.
bool DrawsPerEpochRandomness(proto::OpSpec::OpCase op_case);

}  // namespace sluice::pipeline_spec

#endif  // SLUICE_COMMON_PIPELINE_SPEC_CACHE_KEY_H_
