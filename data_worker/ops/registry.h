// The op registry: one registration per op, which everything else looks up.
//
// An op is its proto message (proto/ops.proto, a case of OpSpec's oneof) plus
// one row of the table in registry.cc:
//
//   proto case        type name            factory   type inference  batched  fusion rule
//   kDecode           "Decode"             MakeDecode   bytes → uint8 HxWx3  no  +Resize/
//                                                              +CenterCrop/+RandomResizedCrop
//   kNormalize        "Normalize"          MakeNormalize  → float32     yes  +HWC2CHW[+Cast]
//   ...
//
// BuildOps (op.h) builds ops through the factories and fuses through the
// fusion rules; validation (data_worker/pipeline/spec.h) infers column types
// through the type inference; the spec parser (common/pipeline_spec) lists
// the known ops from the same oneof. Adding an op: its message in ops.proto,
// its Op class and factory in the family's .cc, one row in registry.cc, one
// builder function in client/include/sluice/pipeline_builder.h
// (registry_test checks that every oneof case has a row, and builder_test
// that every row has a builder function).
#ifndef SLUICE_DATA_WORKER_OPS_REGISTRY_H_
#define SLUICE_DATA_WORKER_OPS_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"
#include "proto/ops.pb.h"

namespace sluice::data_worker {

// What validation knows about a column before any data is seen: dtype and
// shape, -1 for unknown dimensions.
struct ColumnType {
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;
  // Known lower bound of min(H, W) for images, -1 if unknown (after
  // Resize(size) of an image of unknown size).
  int64_t min_side = -1;

  std::string ToString() const;  // "uint8[-1, -1, 3]", "bytes"
};

struct InferContext {
  // Shape Decode produces: {H, W, 3}, -1 where images differ.
  std::vector<int64_t> source_image_shape = {-1, -1, 3};
  // Index of the column in its map's input_columns (the python op's
  // output_dtypes are per column).
  int column = 0;
};

// A fused op and the number of specs it replaces (>= 2), or {nullptr, 0}.
using FusedOp = std::pair<std::unique_ptr<Op>, int>;

struct OpRegistration {
  proto::OpSpec::OpCase op_case;
  std::string_view type;   // in messages and metrics: "RandomResizedCrop"
  std::string_view field;  // in specs: "random_resized_crop"
  // Validates the spec and builds the op (InvalidArgument names the label and
  // the field).
  absl::StatusOr<std::unique_ptr<Op>> (*make)(const proto::OpSpec& spec, OpLabel label);
  // Output column type from the input type (*t). InvalidArgument
  // "<label>: expected <what>, the column is <type>". The spec is valid.
  absl::Status (*infer)(const proto::OpSpec& spec, const OpLabel& label, const InferContext& ctx,
                        ColumnType* t);
  // The op has a batched kernel (Op::ApplyBatch), so the optimizer may run it
  // once per batch.
  bool batched_kernel = false;
  // Fusion with the ops after it: specs[i] is this op; the specs are valid.
  // Null: the op starts no fusion.
  FusedOp (*fuse)(const std::vector<proto::OpSpec>& specs, size_t i,
                  const std::vector<OpLabel>& labels) = nullptr;
};

// The registration of `op_case`; null for OP_NOT_SET or an unknown case.
const OpRegistration* FindOp(proto::OpSpec::OpCase op_case);
// "Decode", or "unknown" for OP_NOT_SET.
std::string_view OpTypeName(proto::OpSpec::OpCase op_case);
// Every registration, in ops.proto order.
const std::vector<OpRegistration>& RegisteredOps();

// True for ops whose draws change from epoch to epoch (ElementContext's epoch seeds them: the
// Random* ops, ColorJitter) and for python ops (sluice cannot see inside them): a cache node
// after such an op would repeat epoch 1's draws, so the validator refuses it.
bool DrawsPerEpochRandomness(proto::OpSpec::OpCase op_case);

// Infers the output type of `spec` (see OpRegistration::infer);
// InvalidArgument "<label>: no op set" for an empty spec.
absl::Status InferOpType(const proto::OpSpec& spec, const OpLabel& label, const InferContext& ctx,
                         ColumnType* t);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_OPS_REGISTRY_H_
