// Validating a pipeline spec (proto/pipeline.proto).
//
// Parsing (YAML/JSON text → proto::Pipeline) lives in
// common/pipeline_spec/parse.h. Validate() checks order rules, columns,
// dtypes and shapes statically (as far as they are known; each op's type
// inference is its registration in data_worker/ops/registry.h) and returns the
// LogicalPipeline the optimizer rewrites. Nodes are named by kind and index
// among nodes of that kind: map[0], filter[1], batch. Errors carry a
// pipeline_spec::SpecLocation payload (common/pipeline_spec/location.h):
//
//   map[1].ops[2] (RandomResizedCrop): size must be > 0
#ifndef SLUICE_DATA_WORKER_PIPELINE_SPEC_H_
#define SLUICE_DATA_WORKER_PIPELINE_SPEC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/record/filter.h"
#include "data_worker/ops/registry.h"
#include "data_worker/pipeline/source.h"
#include "proto/pipeline.pb.h"

namespace sluice::data_worker::pipeline {

inline constexpr int kAutotune = -1;

struct LogicalMap {
  std::string name;        // "map[0]"
  std::vector<int> slots;  // columns the ops run on (positions in the element)
  std::vector<proto::OpSpec> ops;
  // One per op: its pipeline-wide position (seeds randomness) and its place in the spec, which
  // its errors name ("map[1].ops[0] (Python): ...") at validation and at run time alike.
  std::vector<OpLabel> labels;
  int parallelism = kAutotune;
};

struct LogicalFilter {
  std::string name;  // "filter[0]"
  std::string predicate;
  int slot = 0;
  record::Filter filter;
  // True if the column is an indexed column of a dataset source, untouched by
  // earlier maps: the filter can run on the shard index (pushdown).
  bool pushable = false;
};

// The cache node (docs/cache.md): the element's columns at this point are what its files hold.
struct LogicalCache {
  std::string name;
  std::vector<ColumnType> column_types;  // each slot's type at the cache node
};

// One of map, filter or cache.
struct LogicalNode {
  std::optional<LogicalMap> map;
  std::optional<LogicalFilter> filter;
  std::optional<LogicalCache> cache;
};

struct LogicalBatch {
  int size = 0;
  bool drop_remainder = false;
  int parallelism = kAutotune;
};

// A validated pipeline, bound to its opened source.
struct LogicalPipeline {
  proto::Pipeline spec;
  std::shared_ptr<const Source> source;
  std::vector<int> source_columns;        // schema column of each element slot
  std::vector<std::string> column_names;  // final name of each slot
  // Type of each slot after the last map, as inferred (-1: any size); a
  // batch adds a leading dimension.
  std::vector<ColumnType> column_types;
  bool shuffle = false;
  uint64_t shuffle_seed = 0;
  // What random ops draw from: the spec's seed (Validate), mixed with the
  // service job's by Executor::Create (JobPipelineSeed).
  uint64_t seed = 0;
  bool skip_errors = false;
  int source_parallelism = kAutotune;
  std::vector<LogicalNode> nodes;  // maps, filters and the cache, in order
  std::optional<LogicalCache> cache;
  std::optional<LogicalBatch> batch;
  int prefetch = kAutotune;
};

// Opens the source and checks the pipeline. InvalidArgument (naming node and
// field) for a bad pipeline; NotFound for a missing source path; DataLoss for a
// corrupt dataset manifest.
absl::StatusOr<LogicalPipeline> Validate(const proto::Pipeline& spec);

// Checks one output of the pipeline (an element, or a batch with a leading
// dimension) against the inferred column types: Internal "output column
// 'image' is float32[64,3,200,200], the spec says float32[N,3,224,224]" if an
// op produced something its type inference did not promise.
absl::Status CheckOutputType(const LogicalPipeline& lp, const std::vector<Tensor>& columns,
                             bool batched);

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_SPEC_H_
