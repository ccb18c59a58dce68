// PythonPool: the Python processes of one data worker, which run the python
// op's user functions (docs/python.md, "Python transforms").
//
// Debian's Python has a GIL, so user functions run in separate processes
// (python_process.h), never in the worker's threads. Each process has one
// owner, a pipeline (of one job), and serves no other (Owner). A pipeline
// thread that applies a python op takes an idle process of its pipeline
// (starting one if none is idle), makes the call and gives it back: there are
// as many busy processes as threads in python-op stages, and those threads are
// what the autotuner sizes like any stage's. The op's first call starts
// `warm` processes at once (Warm); retiring it stops its processes.
// Idle processes beyond `max_idle` (all owners') are stopped. `spares`
// processes wait, started and owned by none, for the next pipeline.
//
// Failures: a process that dies during a call (signal, exit, out of memory) or
// does not answer within `timeout` (then it is killed) is replaced and the call
// is made again on a fresh process with the same inputs and seed, so the
// element is computed once from the caller's point of view: never lost, never
// delivered twice. After `max_attempts` such failures on one call, the call
// fails with DataLoss (the record is bad under on_error: skip).
//
// Groups: CallGroup hands one process several elements in one request (the
// python op's `group`), so the per-element round trip (two wake-ups) is paid
// once per group; a crash or timeout during a group redoes its elements one
// by one on fresh processes (see CallGroup).
//
// Thread-safe.
//
//   PythonPool pool(options);
//   const PythonPool::Owner owner = pool.NewOwner();
//   ASSIGN_OR_RETURN(std::vector<Tensor> out,
//                    pool.Call(owner, "my_aug", "jitter", seed, {&image}));
//   pool.Retire(owner);
#ifndef SLUICE_DATA_WORKER_PYTHON_PYTHON_POOL_H_
#define SLUICE_DATA_WORKER_PYTHON_PYTHON_POOL_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data_worker/ops/tensor.h"
#include "data_worker/python/python_process.h"

namespace prometheus {
class Counter;
class Registry;
}  // namespace prometheus
namespace spdlog {
class logger;
}  // namespace spdlog

namespace sluice::data_worker::python {

struct PythonOptions {
  // Python ops are refused unless true (sluice-worker --allow-python-ops).
  bool allow = false;
  // Folders searched for user modules before the image's own packages
  // (--python-path).
  std::vector<std::string> python_path;
  // The modules python ops may name (--python-modules): each entry allows
  // that module and its submodules ("team_a" allows "team_a.color"). Empty:
  // any module the worker can import.
  std::vector<std::string> modules;
  // A call that takes longer is treated like a crash (--python-op-timeout;
  // zero or InfiniteDuration: no limit).
  absl::Duration timeout = absl::Seconds(60);
  // The most bytes one element's results may take (the worker's memory
  // budget, --memory-mb): larger results are the element's DataLoss (a bad
  // record, skipped under on_error: skip), and a group's answer stops once
  // its results pass it (the rest go in the next request). 0: no limit.
  int64_t max_result_bytes = 0;
  // Empty: the python3 sluice was built against (CMake SLUICE_PYTHON_EXECUTABLE).
  std::string interpreter;
  int max_attempts = 3;
  int max_idle = 64;
  // Processes Warm starts ahead of a python op's first call (the worker's
  // threads per pipeline, which bound the processes one pipeline keeps busy);
  // 0: none, each starts when a thread first needs it.
  int warm = 0;
  // Processes kept started ahead of any pipeline, owned by none: numpy
  // imported, no module loaded, no user code run. A new pipeline takes them
  // (Warm, or a first call) before it starts processes of its own, so that a
  // new job's first batch does not wait for interpreters to start and import
  // numpy. Started with the pool, again `spare_refill_delay` after spares
  // were taken, and whenever an owner retires. 0: none (sluice-worker keeps
  // `warm` of them; `sluice pipeline run`, which builds one pipeline right
  // away, none).
  int spares = 0;
  // Not at once: their imports would slow the first batch of the pipeline
  // that took the spares. InfiniteDuration: only when an owner retires.
  absl::Duration spare_refill_delay = absl::Seconds(1);
};

class PythonPool {
 public:
  // `registry`, if given, gets sluice_worker_python_processes_total{event="started"|"replaced"};
  // `logger`, if given, a warning for each process replaced (what ended it, what is redone).
  explicit PythonPool(PythonOptions options, prometheus::Registry* registry = nullptr,
                      std::shared_ptr<spdlog::logger> logger = nullptr);
  ~PythonPool();
  PythonPool(const PythonPool&) = delete;
  PythonPool& operator=(const PythonPool&) = delete;

  // Whom a process serves: only one owner, ever, so that what a function
  // leaves in its process (numpy's error settings, warnings filters, signal
  // handlers, module globals, a library it patched) reaches no other owner's
  // calls or data. Each pipeline (of one job) is an owner, shared by its
  // python ops (PipelineOwnerScope; NewOwner, never 0); its processes are
  // stopped when it is gone (Retire).
  using Owner = uint64_t;
  Owner NewOwner() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the owner's idle processes. REQUIRES: none of its calls is running.
  void Retire(Owner owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs module.function on `columns` (PythonProcess::Call's contract), on an
  // idle or new process of `owner`, again on a new one after a crash or a
  // timeout.
  // Errors: as PythonProcess::Call, except that Unavailable becomes DataLoss
  // ("... died N times on this element: <last reason>") after max_attempts;
  // Internal if the interpreter cannot start; FailedPrecondition
  // (CheckPythonInterpreter's message) if every attempt's process died before
  // numpy was imported and the interpreter indeed cannot import it.
  absl::StatusOr<std::vector<Tensor>> Call(Owner owner, const std::string& module,
                                           const std::string& function, uint64_t seed,
                                           const std::vector<const Tensor*>& columns)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs module.function once per element (PythonProcess::CallGroup) on one
  // process, in one request: one result per element, in order, each as Call
  // would return it. If the process dies or hangs during the group, it is
  // replaced and the group is redone element by element on fresh processes
  // (each element with Call's max_attempts), so an element that kills its
  // process fails alone and no result is delivered twice. With
  // `first_error_ends` (on_error: fail: the first failed element ends the
  // run), that redo stops at the first failed element and the rest get
  // NotComputed() (op.h), so a group of elements that hang costs one element's
  // attempts, not every element's. Errors of the whole call: Internal if the
  // interpreter cannot start or for a garbled answer. REQUIRES: elements is
  // not empty.
  absl::StatusOr<std::vector<CallResult>> CallGroup(Owner owner, const std::string& module,
                                                    const std::string& function,
                                                    const std::vector<CallInput>& elements,
                                                    bool first_error_ends = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  // At the owner's first Warm, starts processes of `owner` until
  // options().warm are idle; at every Warm, has every idle one import
  // module.function ahead of its first call (PythonProcess::Preload),
  // without waiting for any: the interpreters, numpy and the module start
  // together, not one process after another as the autotuner adds threads.
  // Called at a python op's first call (not when it is built: a pipeline built
  // only to be validated starts none); a process that fails to start is left
  // to the call that would have started it (its error is the call's).
  void Warm(Owner owner, const std::string& module, const std::string& function)
      ABSL_LOCKS_EXCLUDED(mu_);

  const PythonOptions& options() const { return options_; }
  // Processes started so far (replacements included), and processes replaced
  // after a crash or timeout: for tests and metrics.
  int processes_started() const ABSL_LOCKS_EXCLUDED(mu_);
  int processes_replaced() const ABSL_LOCKS_EXCLUDED(mu_);
  // Requests sent to processes (a Call or a whole group is one; redone ones
  // count again): for tests and metrics.
  int requests() const ABSL_LOCKS_EXCLUDED(mu_);
  // CPU seconds (user + system) the idle processes have used since they
  // started, read from /proc (0 for one that cannot be read): for benchmarks,
  // between epochs, when every process is idle (sluice pipeline run's
  // "python cpu" line).
  double idle_cpu_seconds() const ABSL_LOCKS_EXCLUDED(mu_);
  // The idle processes' pids (tests).
  std::vector<pid_t> idle_pids() const ABSL_LOCKS_EXCLUDED(mu_);
  // The spare processes' pids (tests).
  std::vector<pid_t> spare_pids() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<std::unique_ptr<PythonProcess>> Acquire(Owner owner) ABSL_LOCKS_EXCLUDED(mu_);
  // A spare if one is alive (ones that ended are dropped, and said so),
  // else a new process (counted as started).
  absl::StatusOr<std::unique_ptr<PythonProcess>> TakeSpareOrStart() ABSL_LOCKS_EXCLUDED(mu_);
  // A new process (counted as started).
  absl::StatusOr<std::unique_ptr<PythonProcess>> StartProcess() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts processes until options().spares are spare.
  void StartSpares() ABSL_LOCKS_EXCLUDED(mu_, start_spares_mu_);
  // The refiller_ thread: StartSpares at each refill_at_, until stopping_.
  void RefillSpares() ABSL_LOCKS_EXCLUDED(mu_);
  void Release(Owner owner, std::unique_ptr<PythonProcess> p) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a process replaced after `why` (its end, and what is redone).
  void CountReplaced(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  const PythonOptions options_;
  prometheus::Counter* const started_total_;   // null without a registry
  prometheus::Counter* const replaced_total_;  // null without a registry
  const std::shared_ptr<spdlog::logger> logger_;
  mutable absl::Mutex mu_;
  absl::Mutex start_spares_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held through StartSpares
  struct Idle {
    Owner owner;
    std::unique_ptr<PythonProcess> process;
  };
  std::vector<Idle> idle_ ABSL_GUARDED_BY(mu_);  // all owners' (at most max_idle)
  std::vector<std::unique_ptr<PythonProcess>> spares_ ABSL_GUARDED_BY(mu_);
  std::set<Owner> warmed_ ABSL_GUARDED_BY(mu_);  // owners Warm started processes for
  // When spares start again (InfiniteFuture: none taken since they last did).
  absl::Time refill_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::CondVar refill_;  // refill_at_ or stopping_ changed
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread refiller_;  // with spares only
  Owner last_owner_ ABSL_GUARDED_BY(mu_) = 0;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int replaced_ ABSL_GUARDED_BY(mu_) = 0;
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
};

// While one lives on this thread, the python ops built (MakePython) share one
// owner: the ops of one pipeline share its processes, which serve no other
// pipeline. Executor::Create holds one while it builds the plan; outside one,
// each op is an owner of its own.
class PipelineOwnerScope {
 public:
  PipelineOwnerScope();
  ~PipelineOwnerScope();
  PipelineOwnerScope(const PipelineOwnerScope&) = delete;
  PipelineOwnerScope& operator=(const PipelineOwnerScope&) = delete;

  // The owner of an op being built: the scope's (the first op takes it from
  // `pool`), or a new one outside a scope.
  static PythonPool::Owner ForNewOp(PythonPool& pool);

 private:
  PipelineOwnerScope* const outer_;
  PythonPool::Owner owner_ = 0;
};

// The worker's pool, configured once by main() from its flags (and by tests)
// before pipelines are built; the python op takes it when it is built, so a
// later ConfigurePython affects only ops built after it. Not configured:
// python ops are refused.
// `registry` and `logger`: the pool's metrics and warnings (PythonPool's constructor).
void ConfigurePython(PythonOptions options, prometheus::Registry* registry = nullptr,
                     std::shared_ptr<spdlog::logger> logger = nullptr);
// With options.allow: whether the interpreter starts and imports numpy, as every Python
// process of the pool must (a worker checks at start-up, so that an image without Python fails
// its rollout with this message, not each job that names a python op later).
// FailedPrecondition naming the interpreter and what it printed; OK without options.allow.
absl::Status CheckPythonInterpreter(const PythonOptions& options);
// The configured pool, or null if python ops are not allowed.
std::shared_ptr<PythonPool> ConfiguredPythonPool();

// Whether `options.modules` lets a python op name `module` (a dotted name).
bool ModuleAllowed(const PythonOptions& options, const std::string& module);

}  // namespace sluice::data_worker::python

#endif  // SLUICE_DATA_WORKER_PYTHON_PYTHON_POOL_H_
