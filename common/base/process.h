// Child processes: start, signal, wait, and learn the address a server child
// listens on.
//
// sluice's servers take `--port 0 --address-file F`: they bind any free port
// and write "host:port" to F once listening. WaitForAddressFile() is the other
// half:
//
//   ASSIGN_OR_RETURN(
//       auto dispatcher,
//       Subprocess::Start({bin + "/sluice-dispatcher", "--port", "0",
//                          "--address-file", file},
//                         {.log_file = log}));
//   ASSIGN_OR_RETURN(std::string address,
//                    WaitForAddressFile(file, *dispatcher, absl::Seconds(10)));
//
// A Subprocess that is destroyed while its child runs kills it (SIGKILL) and
// reaps it, so no child outlives its owner by accident; with
// Options::exit_with_parent it also ends when its owner is killed. Not
// thread-safe: one owner thread.
#ifndef SLUICE_COMMON_BASE_PROCESS_H_
#define SLUICE_COMMON_BASE_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice {

class Subprocess {
 public:
  struct Options {
    // stdout and stderr of the child go here (appended); empty: inherited.
    std::string log_file;
    // The child gets SIGTERM when the thread that started it ends, however it ends (the
    // parent SIGKILLed or crashed included; Linux's PR_SET_PDEATHSIG). For servers that must
    // not outlive the tool that runs them; start them from a thread that lives as long.
    bool exit_with_parent = false;
  };

  // argv[0] is the program path. InvalidArgument for an empty argv, NotFound if
  // it cannot run.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const Options& options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::string& log_file() const { return log_file_; }

  // Sends `signal` if the child still runs.
  void Signal(int signal);
  // The exit code (128 + signal number if a signal ended it) once the child has
  // exited; nullopt if it still runs. Reaps it.
  std::optional<int> Poll();
  // Waits up to `timeout` for the child to exit; DeadlineExceeded if it still
  // runs.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL after `grace`; returns the exit code.
  int Stop(absl::Duration grace);

 private:
  Subprocess(pid_t pid, std::string name, std::string log_file)
      : pid_(pid), name_(std::move(name)), log_file_(std::move(log_file)) {}

  const pid_t pid_;
  const std::string name_;
  const std::string log_file_;
  std::optional<int> exit_code_;
};

// Makes sure this process's children stay its to wait for: a SIGCHLD that was
// ignored when this program started (dispositions survive exec: `trap '' CHLD` in
// a shell, signal.signal(SIGCHLD, SIG_IGN) in a Python parent) has the kernel reap
// children unseen, so every wait for one would fail or hang. Resets it to the
// default; Subprocess::Start and the python op's processes call it before they
// start a child.
void KeepChildrenWaitable();

// Waits until `path` holds a line "host:port" written by `process`, and returns
// it. FailedPrecondition (with the tail of the child's log) if the child exits
// first; DeadlineExceeded after `timeout`.
absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, Subprocess& process,
                                               absl::Duration timeout);

// Writes `content` to `path` atomically (temp file + rename), for
// --address-file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content);

// The last `max_bytes` of a file, for error messages about a child that died.
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_PROCESS_H_
