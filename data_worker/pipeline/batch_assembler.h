// BatchAssembler: the batch stage's reorder buffer and batch buffers.
//
// The stage's threads pop elements from the previous queue in sequence order
// but finish them in any order. Each one Add()s its item (an element, a hole
// or an error) at its input sequence number; the assembler commits items in
// sequence order, gives each committed element the next slot of the next
// batch, and the adding thread then copies the element into its slot outside
// the lock, so threads fill one batch concurrently. A batch is emitted (to
// `emit`) by whichever thread fills its last slot.
//
//   input seq:    0   1   2   3   4   5   6        batch_size = 3
//   item:         e0  e1  --  e2  e3  e4  e5       (-- = hole: filtered or
//   committed to: b0  b0      b0  b1  b1  b1        skipped, takes no slot)
//   slot:         0   1       2   0   1   2
//
// A batch owns one buffer per column, [batch_size, ...element shape], allocated
// when its first element is committed; element i of the batch is written at
// byte offset i * element_bytes of each column (BatchBuffer). The worker hands
// those buffers to the wire without another copy (common/service/batch_codec.h).
//
// End of input (SetInputEnd): the last batch is short (emitted with its
// leading dimension cut to the elements it has) or, with drop_remainder,
// discarded; `set_end` learns the number of batches. An error item ends the
// epoch: the batch it falls into is emitted as that error once the elements
// committed before it are written, and nothing after it is committed. An
// element whose dtype/shape differs from the batch's first element turns the
// batch into an InvalidArgument error naming the column (through `wrap`).
//
// Runs (Options::runs): the input is a sequence of runs, each ending with a
// marker element (Element::end_of_run). The marker cuts its run's last batch
// as the input end does (short, or discarded with drop_remainder) and is
// emitted itself at the next index, so batches never mix records of two runs;
// an error ends only its run (the run's items up to its marker are dropped);
// `set_end` counts batches and markers. The input must end with a marker.
//
// Batch write fusion (Options::writes, plan.h): a written column is not
// copied but written into its slot by its op (Op::ApplyInto), mirrored first
// if the write's flip draws so for the element; the batch's column has the
// op's output type (e.g. float32 C×H×W of a uint8 H×W×C element).
//
// Memory: batch buffers are counted in Options::live while they are being
// filled. Reserve() bounds the items popped but not committed to `window`.
//
// Thread-safe. Cancel() wakes Reserve(); Clear() frees what is left after
// the stage's threads were joined.
#ifndef SLUICE_DATA_WORKER_PIPELINE_BATCH_ASSEMBLER_H_
#define SLUICE_DATA_WORKER_PIPELINE_BATCH_ASSEMBLER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "data_worker/pipeline/element.h"
#include "data_worker/pipeline/plan.h"

namespace sluice::data_worker::pipeline {

// The buffers of one batch being filled: one Tensor per column with a
// leading dimension of batch_size, and the global index of each slot.
struct BatchBuffer {
  std::vector<Tensor> columns;
  std::vector<uint64_t> ids;
};

class BatchAssembler {
 public:
  struct Options {
    int64_t batch_size = 1;
    bool drop_remainder = false;
    // Items reserved (Reserve) but not yet committed, at most.
    uint64_t window = 1;
    // Column names, for shape errors.
    std::vector<std::string> column_names;
    LiveBytes* live = nullptr;  // null: not counted
    bool runs = false;          // the input carries end-of-run markers
    // A batch whose buffer (batch_size x the first element's bytes, plus its ids) would be
    // larger is not allocated: RESOURCE_EXHAUSTED at its place. 0: no bound.
    int64_t max_buffer_bytes = 0;
    // Takes each element back once it is written into its batch (element.h);
    // null: the element is freed. Not owned.
    ElementPool* pool = nullptr;
    // Columns written through an op instead of copied, and the job's seed
    // (the flip's draw: ElementContext{seed, epoch, global index}).
    std::vector<StagePlan::SlotWrite> writes;
    uint64_t seed = 0;
  };
  // Batch `index` is complete: the batch (the epoch of its first element), a run's marker or the
  // error at its place. Called outside the lock, once per batch, in any order.
  using EmitFn = std::function<void(uint64_t index, absl::StatusOr<Element> batch)>;
  // There will be `num_batches` batches (called once).
  using EndFn = std::function<void(uint64_t num_batches)>;
  // Adds context (record, node) to a shape error of element `global`.
  using WrapFn = std::function<absl::Status(absl::Status, uint64_t global)>;

  BatchAssembler(Options options, EmitFn emit, EndFn set_end, WrapFn wrap);
  BatchAssembler(const BatchAssembler&) = delete;
  BatchAssembler& operator=(const BatchAssembler&) = delete;

  // Waits until fewer than `window` items are reserved and uncommitted, then
  // reserves one; false once cancelled. Call before popping an input item.
  bool Reserve() ABSL_LOCKS_EXCLUDED(mu_);
  // Reserve without waiting: false if the window is full (or cancelled).
  bool TryReserve() ABSL_LOCKS_EXCLUDED(mu_);
  // Gives a reservation back (the input ended instead of giving an item).
  void Unreserve() ABSL_LOCKS_EXCLUDED(mu_);
  // The item at input sequence `seq` (each seq exactly once, any order).
  // Commits what is ready and writes the committed elements into their
  // batches on the calling thread.
  void Add(uint64_t seq, Item item) ABSL_LOCKS_EXCLUDED(mu_);
  // The input has `end` items (0..end-1).
  void SetInputEnd(uint64_t end) ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  // Frees pending items and unfinished batches. REQUIRES: no concurrent
  // calls.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A batch being filled. Its buffer (and epoch, counted and alloc_error) is
  // set once, by the first write to reach it, through `allocate` (no lock:
  // call_once orders it before every other write's reads); the counters and
  // `error` are changed under mu_.
  struct Batch {
    absl::once_flag allocate;
    BatchBuffer buffer;
    absl::Status alloc_error;  // the buffer would pass max_buffer_bytes
    int64_t assigned = 0;      // slots given to committed elements
    int64_t filled = 0;        // slots written
    int64_t expected = 0;      // slots the batch will have (0 = not yet known)
    bool discard = false;      // short last batch under drop_remainder
    absl::Status error;
    int64_t counted = 0;  // live bytes counted for the buffer
    uint64_t epoch = 0;   // of its first element
  };
  // Work decided under the lock, done outside it.
  struct Action {
    // kMarker: emit `item` (a run's marker) as output `batch`.
    enum Kind { kWrite, kFinish, kMarker } kind;
    uint64_t batch;
    int64_t slot = 0;
    Item item;
    // kWrite: batch `batch` (stays put until this write has counted itself
    // filled).
    Batch* target = nullptr;
  };
  // Inline: an Add that commits a few items does not allocate.
  using Actions = absl::InlinedVector<Action, 4>;

  void Commit(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts the current run's last batch (as the input end does) and returns the
  // number of the first output after the run's batches.
  uint64_t CutLastBatch(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Actions* actions) ABSL_LOCKS_EXCLUDED(mu_);
  void Write(Action& a) ABSL_LOCKS_EXCLUDED(mu_);
  // A written column of element `e`: how its op reads it (mirrored or not)
  // and the type it writes; mirrors the column first where the op cannot
  // read it mirrored. Errors: the op's (or the flip's) InvalidArgument.
  struct Written {
    int slot = 0;
    const Op* op = nullptr;  // writes the column into its batch slot (StagePlan::SlotWrite)
    bool mirror = false;
    TensorType type;
  };
  absl::StatusOr<Written> PrepareWrite(const StagePlan::SlotWrite& w, Element& e) const;
  void Finish(uint64_t k) ABSL_LOCKS_EXCLUDED(mu_);
  // The window, but never a huge reservation for a huge batch size (which
  // fails at its first batch, max_buffer_bytes).
  size_t MaxSpareNodes() const { return std::min<uint64_t>(options_.window, 4096); }
  void AddLive(int64_t delta) {
    if (options_.live != nullptr) options_.live->Add(delta);
  }

  const Options options_;
  const EmitFn emit_;
  const EndFn set_end_;
  const WrapFn wrap_;

  absl::Mutex mu_;
  std::map<uint64_t, Item> pending_ ABSL_GUARDED_BY(mu_);  // by input seq
  // Nodes of pending_ already committed, reused by Add (at most
  // MaxSpareNodes(), reserved: no allocation per item in steady state).
  std::vector<std::map<uint64_t, Item>::node_type> spare_nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_commit_ ABSL_GUARDED_BY(mu_) = 0;
  // Elements committed (with runs: in the current run).
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  // The current run's first batch index (0 without runs).
  uint64_t base_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> input_end_ ABSL_GUARDED_BY(mu_);
  // End or error committed (with runs: an error of the current run).
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // with runs: set_end called
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Batches being filled. Node-based: a Batch stays put while its slots are
  // written outside the lock.
  std::map<uint64_t, Batch> batches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::data_worker::pipeline

#endif  // SLUICE_DATA_WORKER_PIPELINE_BATCH_ASSEMBLER_H_
