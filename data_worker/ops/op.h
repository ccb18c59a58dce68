// Op: one preprocessing step of a map stage (decode, crop, flip, normalize,
// ...), and BuildOps, which validates a stage's proto::OpSpec list and builds
// its ops (optionally fused).
//
// Ops are immutable after construction and thread-safe: the pipeline calls
// Apply concurrently from its stage threads. Randomness never comes from the
// scheduling: a random op at pipeline position p draws from ctx.RngFor(p), so
// an element gets the same augmentation on any worker, at any parallelism,
// fused or not.
//
//   ASSIGN_OR_RETURN(auto ops,
//                    BuildOps(stage.ops(), /*first_position=*/0, /*fuse=*/true));
//   for (const auto& op : ops) {
//     ASSIGN_OR_RETURN(t, op->Apply(std::move(t), ctx));
//   }
//
// Each op is registered once (registry.h): proto case, factory, type
// inference, batched kernel, fusion rule.
//
// Threads: the library calls cv::setNumThreads(0) once when the first op is
// built, so OpenCV runs on the caller's thread; the pipeline owns all
// parallelism.
#ifndef SLUICE_DATA_WORKER_OPS_OP_H_
#define SLUICE_DATA_WORKER_OPS_OP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/random.h"
#include "data_worker/ops/tensor.h"
#include "proto/ops.pb.h"

namespace sluice::data_worker {

struct OpLabel;  // op_util.h

// Identity of the element being processed; every random op derives its
// generator from it.
// A tensor's dtype and shape: what Op::ApplyInto writes.
struct TensorType {
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;
};

struct ElementContext {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t global_index = 0;

  Rng RngFor(int op_position) const {
    return Rng(MixSeed({seed, epoch, global_index, uint64_t(op_position)}));
  }
};

class Op {
 public:
  virtual ~Op() = default;
  // The op type as written in error messages, e.g. "RandomResizedCrop" or, for
  // a fused op, "Decode+RandomResizedCrop".
  virtual std::string_view name() const = 0;
  // Transforms one element. Errors: InvalidArgument for a wrong dtype/rank or a
  // crop larger than the image (the message names the op); DataLoss "cannot
  // decode image: <reason>" for corrupt encoded images.
  virtual absl::StatusOr<Tensor> Apply(Tensor input, const ElementContext& ctx) const = 0;
  // Vectorization: ops that can run on a whole batch (leading dim N) in one
  // pass, with output identical to applying Apply to each element, return true
  // and implement ApplyBatch.
  virtual bool has_batched_kernel() const { return false; }
  // Default: Unimplemented.
  virtual absl::StatusOr<Tensor> ApplyBatch(Tensor batch) const;
  // Ops that take all of a map's input columns at once (the python op) return
  // true and implement ApplyColumns; the map stage then gives them every
  // column of the element, in input_columns order, and takes one tensor per
  // column back.
  virtual bool takes_all_columns() const { return false; }
  // Default: Unimplemented.
  virtual absl::StatusOr<std::vector<Tensor>> ApplyColumns(std::vector<Tensor> columns,
                                                           const ElementContext& ctx) const;
  // Grouping: an op whose per-call cost is mostly a round trip (the python
  // op) returns the number of elements it wants per call; the map stage then
  // hands it up to that many ready elements at once through
  // ApplyColumnsGroup. REQUIRES for > 1: takes_all_columns().
  virtual int group_size() const { return 1; }
  // ApplyColumns of each element (columns[i] with ctxs[i]): one result per
  // element, in order, each exactly what ApplyColumns would return. With
  // `first_error_ends` (on_error: fail, where the caller ends the run at the
  // first failed element), the elements after a failed one may be left
  // uncomputed: their result is NotComputed(). Default: a loop over
  // ApplyColumns.
  virtual std::vector<absl::StatusOr<std::vector<Tensor>>> ApplyColumnsGroup(
      std::vector<std::vector<Tensor>> columns, const std::vector<ElementContext>& ctxs,
      bool first_error_ends) const;

  // Writing into the batch (batch write fusion, pipeline/plan.h): an op that
  // can write its output for one element straight into a caller's buffer (the
  // element's slot of the batch tensor) returns true and implements
  // OutputType, ApplyInto and, if it can read its input mirrored, MirrorsInto.
  virtual bool writes_into() const { return false; }
  // The dtype and shape Apply would return for `input`, or the error Apply
  // would return. Default: Unimplemented.
  virtual absl::StatusOr<TensorType> OutputType(const Tensor& input) const;
  // True if ApplyInto(input, /*mirror=*/true, ...) is supported for `input`.
  virtual bool MirrorsInto(const Tensor& /*input*/) const { return false; }
  // Writes the bytes Apply(input) would hold (of `input` mirrored left-right
  // first, if `mirror`) at `dst`, OutputType(input)'s size. REQUIRES:
  // writes_into(), OutputType(input) ok, !mirror || MirrorsInto(input).
  virtual void ApplyInto(const Tensor& /*input*/, bool /*mirror*/, uint8_t* /*dst*/) const {}

  // Mirroring ops (RandomHorizontalFlip): an op that does nothing but mirror
  // some elements left-right returns true, and Mirrors says whether it
  // mirrors the element of `ctx` (the draw its Apply makes). The optimizer
  // may then fold it into the next op's ApplyInto.
  virtual bool mirrors() const { return false; }
  virtual bool Mirrors(const ElementContext& /*ctx*/) const { return false; }
};

// The result of an element of a group that was not computed because an element before it
// failed and that failure ends the run (ApplyColumnsGroup's first_error_ends): Aborted.
absl::Status NotComputed();

// Validates and builds the ops of one map stage. `first_position` is the
// pipeline-wide position of specs[0] (positions seed the randomness, so they
// are assigned before any fusion). With fuse=true, adjacent ops are replaced
// by fused kernels (the fusion rules of registry.cc):
//   Decode+RandomResizedCrop, Decode+Resize, Decode+CenterCrop
//       JPEG region-of-interest + DCT-scaled decode through libjpeg-turbo
//   Normalize+HWC2CHW[+Cast to float32/float16]
//       one pass
// A fused op uses the same op positions (same random draws) as the unfused
// chain. InvalidArgument names the op (position and type) and the field, e.g.
//   op 2 (RandomResizedCrop): size must be > 0
// with a pipeline_spec::SpecLocation payload.
absl::StatusOr<std::vector<std::unique_ptr<Op>>> BuildOps(const std::vector<proto::OpSpec>& specs,
                                                          int first_position, bool fuse);
// The same with explicit labels (one per spec; validation passes labels that
// name the spec location, "map[1].ops[2] (Resize)").
absl::StatusOr<std::vector<std::unique_ptr<Op>>> BuildOps(const std::vector<proto::OpSpec>& specs,
                                                          const std::vector<OpLabel>& labels,
                                                          bool fuse);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_OP_H_
