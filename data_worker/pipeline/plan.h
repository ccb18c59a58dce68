// The physical plan: stages of the executor, produced from a LogicalPipeline by
// the optimizer.
//
// A stage is a list of steps run on each element by the stage's worker threads
// (Read fetches the record, Map runs ops on columns, Filter drops elements),
// optionally followed by batching and by vectorized ops on the batch. Operator
// parallelism starts from one stage per node:
//
//   source[Read] → map[0][Map] → map[1][Map] → filter[0][Filter] → batch
//
// The rewrites (each keeps the output byte-identical; see
// tests/data_worker/pipeline/executor_test.cc):
//   - map fusion: adjacent maps on the same columns become one Map step (so
//     BuildOps can fuse e.g. Decode in map[0] with RandomResizedCrop in
//     map[1]);
//   - filter fusion: adjacent filters become one Filter step (a conjunction);
//   - filter pushdown: filters on indexed dataset columns run on the shard
//     index, before any record is read;
//   - source fusion: the Read step runs in the first stage's threads (no
//     source stage);
//   - map+batch fusion: the last map runs in the batch stage's threads; each
//     thread then copies its element into the element's slot of the batch
//     buffer (one memcpy per column, batch_assembler.h), without a queue
//     hand-off in between;
//   - vectorization: trailing ops of the last map that have batched kernels
//     (Normalize, HWC2CHW, Cast, OneHot and their fusions) run once per batch
//     (ApplyBatch);
//   - batch write fusion (instead of vectorizing them): when those trailing
//     ops are one op that writes into a buffer (Normalize+HWC2CHW[+Cast]) in
//     the batch stage's own map, each thread writes its element through it
//     straight into the element's slot of the batch tensor (Op::ApplyInto),
//     with a RandomHorizontalFlip right before it folded in (mirrored reads).
//     Each element is then written once, in its final form: no uint8 batch
//     and no second pass over the batch:
//
//       source+map[0]+batch[Read map[0]{Decode+RandomResizedCrop} Batch(64)
//                           write[0]{RandomHorizontalFlip,Normalize+HWC2CHW}]
// Pipeline parallelism is the plan with everything in one stage.
#ifndef SLUICE_DATA_WORKER_PIPELINE_PLAN_H_
#define SLUICE_DATA_WORKER_PIPELINE_PLAN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data_worker/ops/op.h"
#include "data_worker/pipeline/spec.h"

namespace sluice::data_worker::pipeline {

struct OptimizerOptions {
  bool map_fusion = true;
  bool filter_fusion = true;
  bool filter_pushdown = true;
  bool source_fusion = true;
  bool map_batch_fusion = true;
  bool vectorization = true;
  // BuildOps kernel fusion (Decode+crop ROI decode, Normalize+HWC2CHW).
  bool op_fusion = true;
  // Everything in one stage (N threads run the whole chain on disjoint
  // elements).
  bool pipeline_parallel = false;
  // Trailing Normalize+HWC2CHW[+Cast] (and a flip before it) written into the
  // batch slot instead of vectorized; needs vectorization and op_fusion.
  bool batch_write_fusion = true;

  static OptimizerOptions None() {
    return OptimizerOptions{false, false, false, false, false, false, false, false, false};
  }
};

struct MapStep {
  std::string name;  // "map[0]" or "map[0]+map[1]"
  std::vector<int> slots;
  std::vector<std::shared_ptr<const Op>> ops;
};

struct FilterStep {
  std::string name;
  // (slot, filter), all must match.
  std::vector<std::pair<int, record::Filter>> predicates;
};

// kCache: the cache node (docs/cache.md). An element the Read step took from the cache skips
// every step up to it; an element computed by the steps before it is offered to the cache.
// The optimizer fuses nothing across it (it ends its stage, so no map before it is vectorized
// or fused with the batch).
struct Step {
  enum Kind { kRead, kMap, kFilter, kCache } kind = kRead;
  MapStep map;
  FilterStep filter;
  std::string cache_name;
};

struct StagePlan {
  std::string name;
  std::vector<Step> steps;
  int parallelism = kAutotune;
  bool batch = false;
  int batch_size = 0;
  bool drop_remainder = false;
  // Ops run on the stacked column `slot` after batching.
  std::vector<std::pair<int, std::vector<std::shared_ptr<const Op>>>> vectorized;
  // Batch write fusion: column `slot` of each element is written into its
  // slot of the batch by op->ApplyInto, mirrored if `mirror` (null: none)
  // mirrors the element (Op::Mirrors), instead of copied.
  struct SlotWrite {
    int slot = 0;
    std::shared_ptr<const Op> mirror;
    std::shared_ptr<const Op> op;
  };
  std::vector<SlotWrite> writes;
};

struct PhysicalPlan {
  std::vector<StagePlan> stages;
  // Pushed-down predicates (run on the dataset index).
  std::vector<record::Filter> source_filters;
  // Applied rewrites, for logs and the CLI.
  std::vector<std::string> rewrites;
  int prefetch = kAutotune;
  std::string Describe() const;  // "source[Read] -> map[0][Map x3] -> batch"
};

absl::StatusOr<PhysicalPlan> Optimize(const LogicalPipeline& lp, const OptimizerOptions& options);

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_PLAN_H_
