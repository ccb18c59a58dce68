#include "data_worker/python/python_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/process.h"
#include "common/base/status_macros.h"
#include "data_worker/python/runner_source.h"

extern char** environ;

namespace sluice::data_worker::python {
namespace {

constexpr size_t kInitialShm = size_t{1} << 20;
// A shared memory grown past this (an element with large results) shrinks
// back when a request's inputs and the last answer's results both take less
// than a quarter of it.
constexpr size_t kShrinkAbove = size_t{64} << 20;
constexpr size_t kAlign = 64;

size_t Align(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// The child's environment: ours, with the numeric libraries held to one
// thread each (the pool owns the parallelism). --python-path goes on the
// command line: runner.py puts it on sys.path after its own imports.
std::vector<std::string> ChildEnv() {
  // name → the value a Python process gets unless the worker's environment sets one:
  // one thread per process for numpy's BLAS and OpenMP (the pool is the parallelism); one
  // str/bytes hash seed for every process (a function that iterates a set of strings then
  // computes the same result on any process: the output depends on the record, never on which
  // process ran it); print() written through (its output reaches the worker's log even when
  // the process is killed); glibc's heap kept rather than given back after every element.
  // glibc starts with a 128 KiB mmap threshold and returns free memory at the heap's top above
  // twice the threshold it adapted to, so a function that frees a few images' worth (PIL does,
  // per call) gives the pages back and faults them in again on the next element: a third of a
  // PIL augmentation's time (bench/python_ops.sh). Fixed at the ceiling glibc's adaptation
  // reaches (32 MiB, trim at twice that), a process keeps up to 64 MiB free at its heap's top.
  std::vector<std::pair<std::string, std::string>> defaults = {
      {"OMP_NUM_THREADS", "1"},
      {"OPENBLAS_NUM_THREADS", "1"},
      {"PYTHONHASHSEED", "0"},
      {"PYTHONUNBUFFERED", "1"},
      {"MALLOC_MMAP_THRESHOLD_", "33554432"},
      {"MALLOC_TRIM_THRESHOLD_", "67108864"}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v(*e);
    std::erase_if(defaults, [&](const auto& d) { return v.rfind(d.first + "=", 0) == 0; });
    env.emplace_back(v);
  }
  for (const auto& [name, value] : defaults) env.push_back(name + "=" + value);
  return env;
}

std::string DescribeWait(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  if (WIFEXITED(status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  return "ended";
}

// "uint8 0 150528 3 224 224 3" → dtype, offset, nbytes, shape.
struct Layout {
  DType dtype;
  size_t offset = 0;
  size_t nbytes = 0;
  std::vector<int64_t> shape;
};

absl::StatusOr<Layout> ParseLayout(const std::string& line) {
  std::vector<std::string> f = absl::StrSplit(line, ' ');
  Layout l;
  int64_t ndim = -1;
  auto dtype = f.empty() ? absl::InvalidArgumentError("empty") : record::ParseDType(f[0]);
  if (!dtype.ok() || f.size() < 4 || !absl::SimpleAtoi(f[1], &l.offset) ||
      !absl::SimpleAtoi(f[2], &l.nbytes) || !absl::SimpleAtoi(f[3], &ndim) || ndim < 0 ||
      f.size() != 4 + static_cast<size_t>(ndim)) {
    return absl::InternalError(
        absl::StrCat("bad result line from the Python process: '", line, "'"));
  }
  l.dtype = *dtype;
  for (int64_t d = 0; d < ndim; ++d) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(f[4 + d], &v) || v < 0) {
      return absl::InternalError(
          absl::StrCat("bad result line from the Python process: '", line, "'"));
    }
    l.shape.push_back(v);
  }
  return l;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PythonProcess>> PythonProcess::Start(const ProcessOptions& options) {
  KeepChildrenWaitable();  // the guardian is waited for (and inherits the default)
  int shm = memfd_create("sluice-python", MFD_CLOEXEC);
  if (shm < 0) return Errno("memfd_create");
  if (ftruncate(shm, kInitialShm) != 0) {
    close(shm);
    return Errno("ftruncate(memfd)");
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    close(shm);
    return Errno("socketpair");
  }
  // Above the child's target numbers, so that each dup2 below copies.
  const int shm_hi = fcntl(shm, F_DUPFD_CLOEXEC, 10);
  const int child_hi = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
  close(sv[1]);
  auto cleanup = [&] {
    if (shm_hi >= 0) close(shm_hi);
    if (child_hi >= 0) close(child_hi);
  };
  if (shm_hi < 0 || child_hi < 0) {
    cleanup();
    close(shm);
    close(sv[0]);
    return Errno("fcntl(F_DUPFD_CLOEXEC)");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, shm_hi, 3);
  posix_spawn_file_actions_adddup2(&actions, child_hi, 4);
  posix_spawn_file_actions_adddup2(&actions, 2, 1);
  // A function that reads its standard input gets end of file, not the
  // worker's terminal.
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> env = ChildEnv();
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The child starts with no signal blocked (the worker blocks its shutdown
  // signals) and in its own process group (a terminal's Ctrl-C goes to the
  // worker, which stops its children).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  std::string interpreter = options.interpreter;
  std::string dash_c = "-c";
  std::string source = kRunnerSource;
  std::string limit = absl::StrCat(options.max_result_bytes);
  std::vector<std::string> folders = options.python_path;
  std::vector<char*> argv = {interpreter.data(), dash_c.data(), source.data(), limit.data()};
  for (std::string& f : folders) argv.push_back(f.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, interpreter.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  cleanup();
  if (rc != 0) {
    close(shm);
    close(sv[0]);
    return absl::InternalError(
        absl::StrCat("cannot start the Python interpreter ", interpreter, ": ", std::strerror(rc)));
  }
  // Readable once the child has ended, even while a process it forked keeps
  // the socket open (no end of file then). -1 where the kernel has no pidfd
  // (before Linux 5.3): the socket's end of file alone says so.
  // (glibc 2.36 declares pidfd_open without C linkage: the system call.)
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  auto p = std::unique_ptr<PythonProcess>(new PythonProcess(pid, pidfd, shm, sv[0]));
  if (absl::Status s = p->MapShm(kInitialShm); !s.ok()) return s;
  return p;
}

PythonProcess::~PythonProcess() {
  if (shm_ != nullptr) munmap(shm_, shm_size_);
  close(socket_fd_);
  close(shm_fd_);
  if (pidfd_ >= 0) close(pidfd_);
  if (!reaped_) {
    Stop();
    int status = 0;
    while (waitpid(guardian_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void PythonProcess::Stop() {
  if (!Ended()) {
    kill(guardian_, SIGCONT);  // a function may have stopped its parent
    kill(guardian_, SIGTERM);
    const absl::Time deadline = absl::Now() + kStopGrace;
    while (!Ended() && absl::Now() < deadline) {
      if (pidfd_ >= 0) {
        pollfd p = {pidfd_, POLLIN, 0};
        // Never negative: poll would wait forever.
        const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
        poll(&p, 1, static_cast<int>(ms) + 1);
      } else {
        usleep(1000);
      }
    }
  }
  // What is left: a guardian that did not end (the runner ends with it, by
  // PR_SET_PDEATHSIG). Its group is its own, and its pid is not reaped yet, so
  // neither names another process.
  kill(-guardian_, SIGKILL);
  kill(guardian_, SIGKILL);
}

absl::Status PythonProcess::MapShm(size_t size) {
  struct stat st;
  if (fstat(shm_fd_, &st) != 0) return Errno("fstat(memfd)");
  size_t have = static_cast<size_t>(st.st_size);
  // Results as large as the last answer's would grow it again at once: a function whose
  // results are steadily large keeps its memory (no shrink and refault per request).
  if (have > kShrinkAbove && std::max(size, last_results_end_) < have / 4) {
    // The child re-reads the size before each request and maps it again.
    const size_t smaller = std::max(size, kInitialShm);
    if (ftruncate(shm_fd_, smaller) != 0) return Errno("ftruncate(memfd)");
    have = smaller;
  } else if (size > have) {
    if (ftruncate(shm_fd_, size) != 0) return Errno("ftruncate(memfd)");
    have = size;
  }
  if (shm_ != nullptr && have == shm_size_) return absl::OkStatus();
  if (shm_ != nullptr) munmap(shm_, shm_size_);
  void* p = mmap(nullptr, have, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd_, 0);
  if (p == MAP_FAILED) {
    shm_ = nullptr;
    shm_size_ = 0;
    return Errno("mmap(memfd)");
  }
  shm_ = static_cast<uint8_t*>(p);
  shm_size_ = have;
  return absl::OkStatus();
}

bool PythonProcess::Ended() const {
  // Without reaping it: until it is reaped its pid, and so its process
  // group's id, cannot be reused.
  siginfo_t info{};
  return reaped_ || (waitid(P_PID, guardian_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                     info.si_pid == guardian_);
}

absl::Status PythonProcess::Dead(const std::string& what, bool exiting) {
  bool gone = Ended();
  // A process that closed its socket is normally on its way out (its guardian
  // ending what it started): give it a moment to end, so that the message says
  // how (signal, exit status).
  for (int i = 0; exiting && !gone && i < 500; ++i) {
    usleep(2000);
    gone = Ended();
  }
  Stop();  // it, and what it started, if it still runs
  int status = 0;
  while (waitpid(guardian_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  const std::string how = gone ? DescribeWait(status) : absl::StrCat(what, "; killed it");
  return absl::UnavailableError(absl::StrCat("the Python process (pid ", pid(), ") ", how));
}

absl::Status PythonProcess::Send(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(socket_fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Dead("stopped reading", /*exiting=*/true);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PythonProcess::Fill(absl::Time deadline) {
  while (true) {
    int ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return Dead(absl::StrCat("did not answer within ", waiting_for_), /*exiting=*/false);
      }
      ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    }
    pollfd p[2] = {{socket_fd_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    const int r = poll(p, pidfd_ >= 0 ? 2 : 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) continue;  // the deadline check above decides
    // What it wrote before it ended is read first.
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) return Dead("ended", /*exiting=*/true);
    char buf[1 << 16];
    const ssize_t n = read(socket_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Dead("closed its socket", /*exiting=*/true);
    in_.append(buf, static_cast<size_t>(n));
    return absl::OkStatus();
  }
}

absl::StatusOr<std::string> PythonProcess::ReadLine(absl::Time deadline) {
  while (true) {
    const size_t nl = in_.find('\n');
    if (nl != std::string::npos) {
      std::string line = in_.substr(0, nl);
      in_.erase(0, nl + 1);
      // The runner's first line, before any answer (runner.py).
      if (runner_ == 0 && absl::StartsWith(line, "PID ") &&
          absl::SimpleAtoi(line.substr(4), &runner_)) {
        continue;
      }
      return line;
    }
    if (absl::Status s = Fill(deadline); !s.ok()) return s;
  }
}

absl::StatusOr<std::string> PythonProcess::ReadBytes(size_t n, absl::Time deadline) {
  while (in_.size() < n) {
    if (absl::Status s = Fill(deadline); !s.ok()) return s;
  }
  std::string out = in_.substr(0, n);
  in_.erase(0, n);
  return out;
}

void PythonProcess::PutInputs(const std::vector<const Tensor*>& columns, size_t* end,
                              std::string* request) {
  for (const Tensor* c : columns) {
    const Tensor& t = *c;
    const size_t offset = *end;
    if (t.num_bytes() > 0) std::memcpy(shm_ + offset, t.data(), t.num_bytes());
    *end = Align(offset + t.num_bytes());
    const bool bytes = !record::IsNumeric(t.dtype());
    std::vector<int64_t> shape =
        bytes ? std::vector<int64_t>{static_cast<int64_t>(t.num_bytes())} : t.shape();
    absl::StrAppend(request, bytes ? "uint8" : record::DTypeName(t.dtype()), " ", offset, " ",
                    t.num_bytes(), " ", shape.size());
    for (int64_t d : shape) absl::StrAppend(request, " ", d);
    absl::StrAppend(request, "\n");
  }
}

absl::Status PythonProcess::ReadError(const std::vector<std::string>& head, absl::Time deadline) {
  size_t n = 0;
  if (head.size() != 3 || !absl::SimpleAtoi(head[2], &n)) {
    return absl::InternalError(
        absl::StrCat("bad error line from the Python process: '", absl::StrJoin(head, " "), "'"));
  }
  absl::StatusOr<std::string> text = ReadBytes(n, deadline);
  if (!text.ok()) return text.status();
  if (head[1] == "import" || head[1] == "result") {
    return absl::InvalidArgumentError(*text);
  }
  return absl::DataLossError(*text);
}

absl::StatusOr<std::vector<Tensor>> PythonProcess::ReadResults(size_t n, absl::Time deadline) {
  std::vector<Layout> layouts;
  for (size_t k = 0; k < n; ++k) {
    absl::StatusOr<std::string> line = ReadLine(deadline);
    if (!line.ok()) return line.status();
    absl::StatusOr<Layout> l = ParseLayout(*line);
    if (!l.ok()) return l.status();
    layouts.push_back(*std::move(l));
  }
  std::vector<Tensor> out;
  for (const Layout& l : layouts) {
    Tensor t = Tensor::Allocate(l.dtype, l.shape);
    if (t.num_bytes() != l.nbytes || l.offset + l.nbytes > shm_size_) {
      return absl::InternalError("a result's layout does not fit its shape");
    }
    if (l.nbytes > 0) std::memcpy(t.data(), shm_ + l.offset, l.nbytes);
    last_results_end_ = std::max(last_results_end_, l.offset + l.nbytes);
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// Bytes the inputs take in the shared memory, 64-byte aligned from 0.
size_t InputBytes(const std::vector<const Tensor*>& columns, size_t end) {
  for (const Tensor* t : columns) end = Align(end + t->num_bytes());
  return end;
}

// The element's generator as runner.py receives it: its seed, in decimal.
std::string Generator(uint64_t seed) { return absl::StrCat(seed); }

absl::Time DeadlineAfter(absl::Duration timeout, size_t calls) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                             : absl::Now() + timeout * static_cast<int64_t>(calls);
}

}  // namespace

absl::Status PythonProcess::Preload(const std::string& module, const std::string& function) {
  if (preloading_.has_value() || loaded_.contains(absl::StrCat(module, ".", function))) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Send(absl::StrCat("LOAD ", module, " ", function, "\n")));
  preloading_.emplace(module, function);
  return absl::OkStatus();
}

absl::Status PythonProcess::Load(const std::string& module, const std::string& function,
                                 absl::Duration timeout) {
  const absl::Duration limit = std::max(timeout, kImportTimeout);
  if (preloading_.has_value()) {
    const auto [m, f] = *std::exchange(preloading_, std::nullopt);
    absl::Status preloaded = ReadLoaded(m, f, limit, absl::OkStatus());
    if (m == module && f == function) return preloaded;
    // Another function's import: its failure is told when it is called.
    if (!alive()) return preloaded;
  }
  if (loaded_.contains(absl::StrCat(module, ".", function))) return absl::OkStatus();
  return ReadLoaded(module, function, limit,
                    Send(absl::StrCat("LOAD ", module, " ", function, "\n")));
}

absl::Status PythonProcess::ReadLoaded(const std::string& module, const std::string& function,
                                       absl::Duration limit, const absl::Status& sent) {
  const std::string name = absl::StrCat(module, ".", function);
  waiting_for_ = absl::FormatDuration(limit);
  absl::StatusOr<std::string> head =
      sent.ok() ? ReadLine(DeadlineAfter(limit, 1)) : absl::StatusOr<std::string>(sent);
  if (!head.ok()) {
    // The process is dead (or was killed): by the import, or before it (an
    // idle process the OOM killer chose). Unavailable: the pool tries a fresh
    // process, and names the import once every attempt died in it.
    died_importing_ = true;
    return absl::UnavailableError(
        absl::StrCat(head.status().message(), " while importing ", module, " for ", name));
  }
  std::vector<std::string> f = absl::StrSplit(*head, ' ');
  if (!f.empty() && f[0] == "ERR") return ReadError(f, DeadlineAfter(limit, 1));
  if (*head != "LOADED") {
    return Dead(absl::StrCat("answered '", *head, "' to LOAD"), /*exiting=*/false);
  }
  loaded_.insert(name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> PythonProcess::Call(const std::string& module,
                                                        const std::string& function, uint64_t seed,
                                                        const std::vector<const Tensor*>& columns,
                                                        absl::Duration timeout) {
  if (absl::Status s = Load(module, function, timeout); !s.ok()) return s;
  waiting_for_ = absl::FormatDuration(timeout);
  const size_t need = InputBytes(columns, 0);
  if (absl::Status s = MapShm(need); !s.ok()) return s;
  last_results_end_ = 0;
  std::string request =
      absl::StrCat("CALL ", module, " ", function, " ", Generator(seed), " ", columns.size(), "\n");
  size_t end = 0;
  PutInputs(columns, &end, &request);
  const absl::Time deadline = DeadlineAfter(timeout, 1);
  if (absl::Status s = Send(request); !s.ok()) return s;
  absl::StatusOr<std::string> head = ReadLine(deadline);
  if (!head.ok()) return head.status();
  std::vector<std::string> f = absl::StrSplit(*head, ' ');
  if (!f.empty() && f[0] == "ERR") return ReadError(f, deadline);
  size_t nouts = 0, size = 0;
  if (f.size() != 3 || f[0] != "OK" || !absl::SimpleAtoi(f[1], &nouts) ||
      !absl::SimpleAtoi(f[2], &size)) {
    return absl::InternalError(
        absl::StrCat("bad answer line from the Python process: '", *head, "'"));
  }
  if (absl::Status s = MapShm(size); !s.ok()) return s;
  return ReadResults(nouts, deadline);
}

absl::StatusOr<std::vector<CallResult>> PythonProcess::CallGroup(
    const std::string& module, const std::string& function, const std::vector<CallInput>& elements,
    absl::Duration timeout) {
  if (absl::Status s = Load(module, function, timeout); !s.ok()) return s;
  waiting_for_ = elements.size() == 1
                     ? absl::FormatDuration(timeout)
                     : absl::StrCat(absl::FormatDuration(timeout), " (call 1 of a group of ",
                                    elements.size(), ")");
  size_t need = 0;
  for (const CallInput& e : elements) need = InputBytes(e.columns, need);
  if (absl::Status s = MapShm(need); !s.ok()) return s;
  last_results_end_ = 0;
  std::string request = absl::StrCat("GROUP ", module, " ", function, " ", elements.size(), "\n");
  size_t end = 0;
  for (const CallInput& e : elements) {
    absl::StrAppend(&request, Generator(e.seed), " ", e.columns.size(), "\n");
    PutInputs(e.columns, &end, &request);
  }
  absl::Time deadline = DeadlineAfter(timeout, 1);
  if (absl::Status s = Send(request); !s.ok()) return s;
  absl::StatusOr<std::string> head = ReadLine(deadline);
  // Progress (runner.py): each call must end within `timeout` of the last report.
  size_t done = 0;
  while (head.ok() && absl::StartsWith(*head, "P ") && absl::SimpleAtoi(head->substr(2), &done)) {
    deadline = DeadlineAfter(timeout, 1);
    waiting_for_ = absl::StrCat(absl::FormatDuration(timeout), " (call ", done + 1,
                                " of a group of ", elements.size(), ")");
    head = ReadLine(deadline);
  }
  if (!head.ok()) return head.status();
  std::vector<std::string> f = absl::StrSplit(*head, ' ');
  if (!f.empty() && f[0] == "ERR") return ReadError(f, deadline);
  size_t n = 0, size = 0;
  if (f.size() != 3 || f[0] != "GROUP" || !absl::SimpleAtoi(f[1], &n) || n == 0 ||
      n > elements.size() || !absl::SimpleAtoi(f[2], &size)) {
    return absl::InternalError(
        absl::StrCat("bad group answer line from the Python process: '", *head, "'"));
  }
  if (absl::Status s = MapShm(size); !s.ok()) return s;
  std::vector<CallResult> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<std::string> line = ReadLine(deadline);
    if (!line.ok()) return line.status();
    std::vector<std::string> g = absl::StrSplit(*line, ' ');
    if (!g.empty() && g[0] == "ERR") {
      absl::Status err = ReadError(g, deadline);
      if (absl::IsUnavailable(err) || absl::IsInternal(err)) return err;
      out.push_back(std::move(err));
      continue;
    }
    size_t nouts = 0;
    if (g.size() != 2 || g[0] != "OK" || !absl::SimpleAtoi(g[1], &nouts)) {
      return absl::InternalError(
          absl::StrCat("bad answer line from the Python process: '", *line, "'"));
    }
    absl::StatusOr<std::vector<Tensor>> r = ReadResults(nouts, deadline);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

}  // namespace sluice::data_worker::python
