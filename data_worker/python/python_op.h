// The python op (proto::PythonOp): a user function run in the worker's Python
// process pool (python_pool.h) on all of a map's input columns at once.
//
// The function is module.function(*columns, rng=numpy.random.Generator): the
// columns in input_columns order as numpy arrays, the generator seeded from
// MixSeed({job seed, epoch, global index, op position}), so its output depends
// only on the element, never on the worker, the thread or the process that ran
// it. It returns one array or a tuple with one array per column.
//
// Groups: group_size() is the spec's `group` (0: 8), and ApplyColumnsGroup
// sends up to that many elements (and at most 1 MiB of inputs) to one process
// per request (PythonPool::CallGroup): the same calls, seeds and per-element
// errors as ApplyColumns on each, one round trip instead of one per element.
//
// Errors (the op's label first, then the Python text):
//   FailedPrecondition  python ops are disabled on this worker (no
//                       --allow-python-ops), or the module is not on its
//                       --python-modules list: when the op is built
//   DataLoss            the function raised (with its traceback), or its process
//                       died max_attempts times: a bad record, skipped and
//                       counted under on_error: skip
//   InvalidArgument     the module or function cannot be imported (with the
//                       ImportError), wrong number of results, or a dtype
//                       that differs from output_dtypes (or from the
//                       input's), or a `group` outside [0, 1024] (when the
//                       op is built): ends the job whatever on_error says
#ifndef SLUICE_DATA_WORKER_PYTHON_PYTHON_OP_H_
#define SLUICE_DATA_WORKER_PYTHON_PYTHON_OP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "data_worker/ops/op.h"
#include "data_worker/ops/op_util.h"
#include "data_worker/ops/registry.h"

namespace sluice::data_worker {

// The spec's own fields: the names (a dotted module of identifiers, an
// identifier), `group` and output_dtypes; InvalidArgument naming the field.
// What a consumer can check: whether a worker runs python ops, and from which
// modules, is that worker's (MakePython).
absl::Status CheckPython(const proto::PythonOp& spec, const OpLabel& label);

// CheckPython, then the op on the configured pool (ConfigurePython):
// FailedPrecondition if python ops are disabled or the module is not on the
// pool's `modules` list. Building never starts a process: the first Apply does.
absl::StatusOr<std::unique_ptr<Op>> MakePython(const proto::PythonOp& spec, OpLabel label);

// Type inference: the column's dtype becomes output_dtypes[ctx.column] (or
// stays), its rank stays and its dimensions become unknown. InvalidArgument
// for a non-numeric column (decode first).
absl::Status InferPython(const proto::OpSpec& spec, const OpLabel& label, const InferContext& ctx,
                         ColumnType* t);

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_PYTHON_PYTHON_OP_H_
