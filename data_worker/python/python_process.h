// PythonProcess: one child Python process that runs user functions for the
// python op, with tensors passed through shared memory.
//
// The child is `<interpreter> -c <runner.py>` (runner.py explains the wire
// format) started with posix_spawn: fd 3 is a memfd both sides map, fd 4 a
// stream socket that carries one request line per call and the layout of the
// results (the runner moves both to fds 200 and up before user code runs, so
// a function that closes fds it did not open cannot reach them); stdout goes
// to the worker's stderr, so a user's print() cannot corrupt the protocol, and
// stdin is /dev/null. Inputs are copied once into the memfd and are numpy
// views there; outputs are copied once out of it.
//
// The child is the *guardian* of the process that runs the functions, the
// runner, which it forks: a child subreaper that, once the runner has ended,
// kills and reaps everything the user function started (what it forked, and
// what left its process group or session on purpose), then ends the way the
// runner did. The worker watches the guardian (a pidfd, so that its end is
// seen even while a fork keeps the socket open), asks it to stop the runner
// (SIGTERM), and reaps it; nothing else is left for the worker to reap, which
// matters where the worker is PID 1 (a container).
//
// Not thread-safe: one caller at a time (PythonPool hands a process to one
// thread). A process whose call returns Unavailable (it died, or was killed
// after the timeout) is dead and must be dropped.
#ifndef SLUICE_DATA_WORKER_PYTHON_PYTHON_PROCESS_H_
#define SLUICE_DATA_WORKER_PYTHON_PYTHON_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data_worker/ops/tensor.h"

namespace sluice::data_worker::python {

// One element of a group call (PythonProcess::CallGroup): the seed of its
// generator and its columns (not owned).
struct CallInput {
  uint64_t seed = 0;
  std::vector<const Tensor*> columns;
};

// The result of one element of a group: its arrays, or Call's per-element
// errors (InvalidArgument for a bad result, DataLoss for an exception).
using CallResult = absl::StatusOr<std::vector<Tensor>>;

struct ProcessOptions {
  std::string interpreter;  // absolute path of python3 (needs numpy)
  // Folders searched first for the user's modules (runner.py's sys.path).
  std::vector<std::string> python_path;
  // The most bytes one element's results may take (0: no limit); see
  // PythonOptions::max_result_bytes.
  int64_t max_result_bytes = 0;
};

class PythonProcess {
 public:
  // Starts the child. Internal if the memfd, socket or spawn fail.
  static absl::StatusOr<std::unique_ptr<PythonProcess>> Start(const ProcessOptions& options);
  // Stops the runner and what it started (Stop) and reaps the guardian.
  ~PythonProcess();
  PythonProcess(const PythonProcess&) = delete;
  PythonProcess& operator=(const PythonProcess&) = delete;

  // Calls module.function(*columns, rng=Generator(PCG64(seed))). Returns one
  // tensor per result array. Errors, each with the Python text:
  //   InvalidArgument     the module or function cannot be imported/found, or
  //                       a result is not an array of a supported dtype
  //   DataLoss            the function raised (the traceback), or its results
  //                       take more than max_result_bytes
  //   Unavailable         the process died (signal, exit) or did not answer
  //                       within `timeout` (then it was killed): drop it
  // REQUIRES: numeric or bytes columns (bytes go as 1-D uint8 arrays).
  absl::StatusOr<std::vector<Tensor>> Call(const std::string& module, const std::string& function,
                                           uint64_t seed, const std::vector<const Tensor*>& columns,
                                           absl::Duration timeout);

  // Calls module.function once per element, in order, in one request and one
  // answer (runner.py's GROUP): the same calls, generators and per-element
  // errors as that many Call()s. The answer may cover only the first k >= 1
  // elements, when their results passed max_result_bytes: the caller asks
  // again for the rest. The whole group fails with InvalidArgument
  // (the import error) or Unavailable (the process died, or one call did not
  // end within `timeout` of the one before, as the child's progress reports
  // tell: drop it; no result of the group was delivered). REQUIRES: elements
  // is not empty.
  absl::StatusOr<std::vector<CallResult>> CallGroup(const std::string& module,
                                                    const std::string& function,
                                                    const std::vector<CallInput>& elements,
                                                    absl::Duration timeout);

  // Has the child import module.function ahead of its first call: sends
  // runner.py's LOAD without waiting for the answer, which the next Call or
  // CallGroup reads. A process started ahead of its first call (PythonPool's
  // Warm) thus imports the module while the worker does other work. Nothing is
  // sent if the function is loaded or a preload is pending. Unavailable if the
  // process is gone: drop it.
  absl::Status Preload(const std::string& module, const std::string& function);

  // The runner has told its pid, which it does once numpy is imported: the
  // interpreter started. False for a process that died starting up (or has not
  // been read from yet).
  bool ready() const { return runner_ != 0; }
  // The runner's pid (the process that runs the functions: its
  // os.getpid()) once it has answered; the guardian's before.
  pid_t pid() const { return runner_ != 0 ? runner_ : guardian_; }
  // False once the process died or was killed (an error said so): drop it.
  bool alive() const { return !reaped_; }
  // The process has ended (it may not be reaped yet): one that died while
  // idle, e.g. the OOM killer's choice, reads true before any call fails.
  bool Ended() const;
  // The process died (or was killed after the import timeout) on its way
  // through an import (Load), not in a call.
  bool died_importing() const { return died_importing_; }

  // The least time an import gets (Load): a module may import a large
  // library (torch takes seconds) on a loaded machine.
  static constexpr absl::Duration kImportTimeout = absl::Minutes(5);
  // How long the guardian gets to stop the runner and what it started (Stop)
  // before it is killed itself.
  static constexpr absl::Duration kStopGrace = absl::Seconds(5);

 private:
  // Imports module.function in the child unless done before, within
  // max(timeout, kImportTimeout). InvalidArgument: it raised (the
  // traceback); Unavailable: the process died or hung while importing (or had
  // died before), and died_importing() is true.
  absl::Status Load(const std::string& module, const std::string& function, absl::Duration timeout);
  // Reads the answer to LOAD module.function, or takes `sent`'s failure (the
  // process is gone) as a death while importing (Load's errors).
  absl::Status ReadLoaded(const std::string& module, const std::string& function,
                          absl::Duration limit, const absl::Status& sent);

  PythonProcess(pid_t guardian, int pidfd, int shm_fd, int socket_fd)
      : guardian_(guardian), pidfd_(pidfd), shm_fd_(shm_fd), socket_fd_(socket_fd) {}

  // Maps at least `size` bytes of the memfd (growing it if needed).
  absl::Status MapShm(size_t size);
  absl::Status Send(const std::string& data);
  // Reads one line (without '\n') or `n` bytes before `deadline`.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);
  absl::StatusOr<std::string> ReadBytes(size_t n, absl::Time deadline);
  absl::Status Fill(absl::Time deadline);
  // Copies `columns` into the shared memory from *end on and appends their
  // layout lines to *request.
  void PutInputs(const std::vector<const Tensor*>& columns, size_t* end, std::string* request);
  // The text of an "ERR <kind> <n>" line's answer as a Status (import and
  // result: InvalidArgument; call: DataLoss).
  absl::Status ReadError(const std::vector<std::string>& head, absl::Time deadline);
  // Reads `n` layout lines and copies the results out of the shared memory.
  absl::StatusOr<std::vector<Tensor>> ReadResults(size_t n, absl::Time deadline);
  // The process is gone (`exiting`) or hung: kill it and say why
  // (Unavailable).
  absl::Status Dead(const std::string& what, bool exiting);

  // Asks the guardian to kill the runner and what it started (SIGCONT first:
  // a function may have stopped it), and waits up to kStopGrace for it to end;
  // SIGKILLs its group if it does not (a process it waits for is stuck in the
  // kernel, or a function keeps stopping it). Call before reaping the guardian.
  void Stop();

  pid_t guardian_;    // the child: waited, signalled, reaped
  pid_t runner_ = 0;  // 0 until its first line
  int pidfd_;         // the guardian's; -1: the kernel has none
  int shm_fd_;
  int socket_fd_;
  bool reaped_ = false;
  uint8_t* shm_ = nullptr;
  size_t shm_size_ = 0;
  size_t last_results_end_ = 0;  // where the last answer's results end in the shared memory
  std::string in_;               // bytes read from the socket, not yet consumed
  bool died_importing_ = false;
  std::string waiting_for_;                  // how long the current wait may take, for its error
  absl::flat_hash_set<std::string> loaded_;  // "module.function" imported in the child
  // The module and function of a LOAD sent by Preload whose answer is unread.
  std::optional<std::pair<std::string, std::string>> preloading_;
};

}  // namespace sluice::data_worker::python

#endif  // SLUICE_DATA_WORKER_PYTHON_PYTHON_PROCESS_H_
