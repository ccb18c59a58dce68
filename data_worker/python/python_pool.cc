#include "data_worker/python/python_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/process.h"
#include "common/metrics/metrics.h"
#include "data_worker/ops/op.h"
#include "data_worker/python/runner_source.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker::python {
namespace {

ABSL_CONST_INIT absl::Mutex g_mu(absl::kConstInit);
std::shared_ptr<PythonPool>* g_pool ABSL_GUARDED_BY(g_mu) = nullptr;

// utime + stime of /proc/<pid>/stat, in seconds (0 if it cannot be read).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) in parentheses: state is
  // field 3, utime 14, stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int k = 3; k <= 15 && rest >> field; ++k) {
    if (k == 14) utime = std::stoull(field);
    if (k == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

PythonOptions WithTimeoutResolved(PythonOptions options) {
  if (options.timeout == absl::ZeroDuration()) options.timeout = absl::InfiniteDuration();
  return options;
}

}  // namespace

constexpr char kProcessesHelp[] =
    "Python processes of the python op's pool, by event: started (replacements included), "
    "replaced (one that died, was killed after --python-op-timeout, or ended while idle).";

PythonPool::PythonPool(PythonOptions options, prometheus::Registry* registry,
                       std::shared_ptr<spdlog::logger> logger)
    : options_(WithTimeoutResolved(std::move(options))),
      started_total_(registry == nullptr
                         ? nullptr
                         : &AddCounter(*registry, "sluice_worker_python_processes_total",
                                       kProcessesHelp, {{"event", "started"}})),
      replaced_total_(registry == nullptr
                          ? nullptr
                          : &AddCounter(*registry, "sluice_worker_python_processes_total",
                                        kProcessesHelp, {{"event", "replaced"}})),
      logger_(std::move(logger)) {
  StartSpares();
  if (options_.spares > 0) refiller_ = std::thread([this] { RefillSpares(); });
}

void PythonPool::RefillSpares() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && absl::Now() < refill_at_) refill_.WaitWithDeadline(&mu_, refill_at_);
      if (stopping_) return;
      refill_at_ = absl::InfiniteFuture();
    }
    StartSpares();
  }
}

void PythonPool::CountReplaced(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    ++replaced_;
  }
  if (replaced_total_ != nullptr) replaced_total_->Increment();
  if (logger_ != nullptr) logger_->warn("python op: {}", why);
}

PythonPool::~PythonPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    refill_.Signal();
  }
  if (refiller_.joinable()) refiller_.join();
}

PythonPool::Owner PythonPool::NewOwner() {
  absl::MutexLock lock(&mu_);
  return ++last_owner_;
}

void PythonPool::Retire(Owner owner) {
  std::vector<Idle> retired;  // stopped unlocked
  {
    absl::MutexLock lock(&mu_);
    auto theirs = std::stable_partition(idle_.begin(), idle_.end(),
                                        [&](const Idle& i) { return i.owner != owner; });
    std::move(theirs, idle_.end(), std::back_inserter(retired));
    idle_.erase(theirs, idle_.end());
    warmed_.erase(owner);
  }
  retired.clear();  // stopped before their spares start
  StartSpares();
}

void PythonPool::StartSpares() {
  absl::MutexLock starting(&start_spares_mu_);  // the refiller and a Retire: not both
  int missing = 0;
  {
    absl::MutexLock lock(&mu_);
    missing = options_.spares - static_cast<int>(spares_.size());
  }
  for (int i = 0; i < missing; ++i) {
    absl::StatusOr<std::unique_ptr<PythonProcess>> p = StartProcess();
    if (!p.ok()) return;  // a call that needs one starts its own, and fails with the reason
    absl::MutexLock lock(&mu_);
    spares_.push_back(*std::move(p));
  }
}

absl::StatusOr<std::unique_ptr<PythonProcess>> PythonPool::TakeSpareOrStart() {
  std::vector<std::unique_ptr<PythonProcess>> dead;  // reaped unlocked
  std::unique_ptr<PythonProcess> spare;
  {
    absl::MutexLock lock(&mu_);
    while (spare == nullptr && !spares_.empty()) {
      std::unique_ptr<PythonProcess> p = std::move(spares_.front());
      spares_.erase(spares_.begin());
      if (p->Ended()) {
        dead.push_back(std::move(p));
      } else {
        spare = std::move(p);
      }
    }
    if (spare != nullptr && refill_at_ == absl::InfiniteFuture()) {
      refill_at_ = absl::Now() + options_.spare_refill_delay;
      refill_.Signal();
    }
  }
  for (const std::unique_ptr<PythonProcess>& p : dead) {
    CountReplaced(absl::StrCat("a spare Python process (pid ", p->pid(),
                               ") ended before any pipeline took it (killed, or out of memory; "
                               "its output, if any, is in this log)"));
  }
  if (spare != nullptr) return spare;
  return StartProcess();
}

absl::StatusOr<std::unique_ptr<PythonProcess>> PythonPool::Acquire(Owner owner) {
  std::vector<std::unique_ptr<PythonProcess>> dead;  // ended while idle: reaped unlocked
  {
    absl::MutexLock lock(&mu_);
    ++requests_;
    for (size_t i = idle_.size(); i-- > 0;) {
      if (idle_[i].owner != owner) continue;
      std::unique_ptr<PythonProcess> p = std::move(idle_[i].process);
      idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
      if (!p->Ended()) return p;
      // Died while idle (the OOM killer takes Python processes first): not a
      // call's attempt, not an import's fault.
      dead.push_back(std::move(p));
    }
  }
  for (const std::unique_ptr<PythonProcess>& p : dead) {
    CountReplaced(absl::StrCat(
        "the Python process (pid ", p->pid(), ") ended while idle (killed, or out of memory",
        p->ready() ? "" : ", or its interpreter could not start: its output is in this log",
        "); a new one starts"));
  }
  return TakeSpareOrStart();
}

absl::StatusOr<std::unique_ptr<PythonProcess>> PythonPool::StartProcess() {
  {
    absl::MutexLock lock(&mu_);
    ++started_;
  }
  if (started_total_ != nullptr) started_total_->Increment();
  ProcessOptions po;
  po.interpreter = options_.interpreter.empty() ? kDefaultInterpreter : options_.interpreter;
  po.max_result_bytes = options_.max_result_bytes;
  po.python_path = options_.python_path;
  return PythonProcess::Start(po);
}

void PythonPool::Warm(Owner owner, const std::string& module, const std::string& function) {
  const int want = std::min(options_.warm, options_.max_idle);
  if (want <= 0) return;
  // Preloaded outside the lock (a process that fails it is gone, and is
  // reaped); meanwhile a call of this owner finds none idle and starts its own.
  std::vector<std::unique_ptr<PythonProcess>> idle;
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    first = warmed_.insert(owner).second;
    for (Idle& i : idle_) {
      if (i.owner == owner) idle.push_back(std::move(i.process));
    }
    std::erase_if(idle_, [](const Idle& i) { return i.process == nullptr; });
  }
  int ready = 0;
  for (std::unique_ptr<PythonProcess>& p : idle) {
    // One that ended while idle is left to Acquire, which says so.
    if (!p->Ended() && p->Preload(module, function).ok()) ++ready;
  }
  // Only the owner's first Warm starts processes: at a later one (its
  // pipeline's next python op) some of its processes may be busy, not idle.
  for (; first && ready < want; ++ready) {
    absl::StatusOr<std::unique_ptr<PythonProcess>> p = TakeSpareOrStart();
    if (!p.ok() || !(*p)->Preload(module, function).ok()) break;
    idle.push_back(*std::move(p));
  }
  for (std::unique_ptr<PythonProcess>& p : idle) Release(owner, std::move(p));
}

void PythonPool::Release(Owner owner, std::unique_ptr<PythonProcess> p) {
  absl::MutexLock lock(&mu_);
  if (p->alive() && static_cast<int>(idle_.size()) < options_.max_idle) {
    idle_.push_back({owner, std::move(p)});
  }
}

absl::StatusOr<std::vector<Tensor>> PythonPool::Call(Owner owner, const std::string& module,
                                                     const std::string& function, uint64_t seed,
                                                     const std::vector<const Tensor*>& columns) {
  absl::Status last;
  int import_deaths = 0;
  int startup_deaths = 0;  // before the interpreter had numpy imported
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    absl::StatusOr<std::unique_ptr<PythonProcess>> p = Acquire(owner);
    if (!p.ok()) return p.status();
    absl::StatusOr<std::vector<Tensor>> out =
        (*p)->Call(module, function, seed, columns, options_.timeout);
    if (out.ok() || absl::IsDataLoss(out.status()) || absl::IsInvalidArgument(out.status())) {
      Release(owner, *std::move(p));  // the process is fine: the user's code failed
      return out;
    }
    if (!absl::IsUnavailable(out.status())) return out;  // drops the process
    last = out.status();
    if ((*p)->died_importing()) ++import_deaths;
    if (!(*p)->ready()) ++startup_deaths;
    CountReplaced(absl::StrCat(module, ".", function, ": ", last.message(),
                               attempt + 1 < options_.max_attempts
                                   ? absl::StrCat("; a new process redoes the element (attempt ",
                                                  attempt + 2, " of ", options_.max_attempts, ")")
                                   : "; the element failed"));
  }
  if (startup_deaths == options_.max_attempts) {
    // No process got as far as numpy: the interpreter, not the module or the
    // element (an image without numpy, where nothing checked it at start-up).
    if (absl::Status python = CheckPythonInterpreter(options_); !python.ok()) return python;
  }
  if (import_deaths == options_.max_attempts) {
    // The module, not this element: it would end any process (a broken C
    // extension, an exit at import), so no record can be computed.
    return absl::InvalidArgumentError(absl::StrCat(
        "the Python process died ", options_.max_attempts,
        " times while importing (last: ", last.message(), "; its output is in this worker's log)"));
  }
  return absl::DataLossError(absl::StrCat("the Python process died ", options_.max_attempts,
                                          " times on this element (last: ", last.message(), ")"));
}

absl::StatusOr<std::vector<CallResult>> PythonPool::CallGroup(
    Owner owner, const std::string& module, const std::string& function,
    const std::vector<CallInput>& elements, bool first_error_ends) {
  std::vector<CallResult> out;
  if (elements.size() > 1) {
    absl::StatusOr<std::unique_ptr<PythonProcess>> p = Acquire(owner);
    if (!p.ok()) return p.status();
    absl::StatusOr<std::vector<CallResult>> group =
        (*p)->CallGroup(module, function, elements, options_.timeout);
    if (group.ok()) {
      Release(owner, *std::move(p));
      if (group->size() == elements.size()) return group;
      // The results reached the size limit before the group's end: the rest
      // are asked again, as a group of their own.
      const std::vector<CallInput> rest(elements.begin() + group->size(), elements.end());
      absl::StatusOr<std::vector<CallResult>> more =
          CallGroup(owner, module, function, rest, first_error_ends);
      if (!more.ok()) return more.status();
      for (CallResult& r : *more) group->push_back(std::move(r));
      return group;
    }
    if (absl::IsInvalidArgument(group.status())) {  // the import failed
      Release(owner, *std::move(p));
      for (size_t i = 0; i < elements.size(); ++i) {
        out.push_back(group.status());
      }
      return out;
    }
    if (!absl::IsUnavailable(group.status())) return group.status();
    CountReplaced(absl::StrCat(module, ".", function, ": ", group.status().message(),
                               "; new processes redo the group's ", elements.size(),
                               " elements one by one"));
  }
  // One element, or the redo of a group whose process died: element by
  // element, each with its own attempts.
  for (const CallInput& e : elements) {
    if (first_error_ends && !out.empty() && !out.back().ok()) {
      out.push_back(NotComputed());
      continue;
    }
    out.push_back(Call(owner, module, function, e.seed, e.columns));
    // Internal or FailedPrecondition (the interpreter cannot start, or cannot
    // import numpy) or InvalidArgument (the import fails, or a result is
    // malformed): the job ends, the rest need not run.
    if (absl::IsInternal(out.back().status()) || absl::IsFailedPrecondition(out.back().status()) ||
        absl::IsInvalidArgument(out.back().status())) {
      return out.back().status();
    }
  }
  return out;
}

int PythonPool::processes_started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

int PythonPool::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

double PythonPool::idle_cpu_seconds() const {
  absl::MutexLock lock(&mu_);
  double total = 0;
  for (const Idle& i : idle_) total += ProcessCpuSeconds(i.process->pid());
  return total;
}

std::vector<pid_t> PythonPool::idle_pids() const {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> pids;
  for (const Idle& i : idle_) pids.push_back(i.process->pid());
  return pids;
}

std::vector<pid_t> PythonPool::spare_pids() const {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> pids;
  for (const std::unique_ptr<PythonProcess>& p : spares_) pids.push_back(p->pid());
  return pids;
}

int PythonPool::processes_replaced() const {
  absl::MutexLock lock(&mu_);
  return replaced_;
}

namespace {
thread_local PipelineOwnerScope* g_owner_scope = nullptr;
}  // namespace

PipelineOwnerScope::PipelineOwnerScope() : outer_(g_owner_scope) { g_owner_scope = this; }

PipelineOwnerScope::~PipelineOwnerScope() { g_owner_scope = outer_; }

PythonPool::Owner PipelineOwnerScope::ForNewOp(PythonPool& pool) {
  if (g_owner_scope == nullptr) return pool.NewOwner();
  if (g_owner_scope->owner_ == 0) g_owner_scope->owner_ = pool.NewOwner();
  return g_owner_scope->owner_;
}

void ConfigurePython(PythonOptions options, prometheus::Registry* registry,
                     std::shared_ptr<spdlog::logger> logger) {
  auto pool = options.allow
                  ? std::make_shared<PythonPool>(std::move(options), registry, std::move(logger))
                  : nullptr;
  absl::MutexLock lock(&g_mu);
  if (g_pool == nullptr) g_pool = new std::shared_ptr<PythonPool>();
  *g_pool = std::move(pool);
}

// `import numpy` with the worker's current directory off the path, as runner.py
// runs: a numpy.py where the worker was started is not what is checked.
constexpr char kImportNumpy[] =
    "import os, sys\n"
    "try:\n"
    "    here = os.path.realpath(os.getcwd())\n"
    "except OSError:\n"
    "    here = None\n"
    "sys.path[:] = [p for p in sys.path\n"
    "               if p not in ('', '.') and (here is None or os.path.realpath(p) != here)]\n"
    "import numpy\n";

absl::Status CheckPythonInterpreter(const PythonOptions& options) {
  if (!options.allow) return absl::OkStatus();
  const std::string interpreter =
      options.interpreter.empty() ? kDefaultInterpreter : options.interpreter;
  const auto refused = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--allow-python-ops: ", interpreter, " cannot run python ops: ", why,
        ". The worker needs the Python sluice was built against, with numpy (Debian 12: "
        "apt-get install python3 python3-numpy; deploy/image/python-ops.Dockerfile builds such a "
        "worker image)"));
  };
  // What the interpreter prints goes to a file, for the message; to the worker's stderr when
  // /tmp takes no file.
  char log[] = "/tmp/sluice-python-check-XXXXXX";
  const int fd = mkstemp(log);
  if (fd >= 0) close(fd);
  const std::string log_file = fd >= 0 ? log : "";
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start({interpreter, "-c", kImportNumpy}, {.log_file = log_file});
  absl::Status result = absl::OkStatus();
  if (!p.ok()) {
    result = refused(std::string(p.status().message()));
  } else {
    // An import of numpy takes well under a second; a minute allows a machine that is
    // busy starting many workers at once.
    absl::StatusOr<int> code = (*p)->Wait(absl::Minutes(1));
    if (!code.ok()) {
      (*p)->Stop(absl::ZeroDuration());
      result = refused("`import numpy` did not end within a minute");
    } else if (*code != 0) {
      result = refused(absl::StrCat("`import numpy` exited with ", *code, ": ",
                                    log_file.empty()
                                        ? "its output is in this log above"
                                        : absl::StripAsciiWhitespace(TailOfFile(log_file, 600))));
    }
  }
  if (!log_file.empty()) unlink(log_file.c_str());
  return result;
}

std::shared_ptr<PythonPool> ConfiguredPythonPool() {
  absl::MutexLock lock(&g_mu);
  return g_pool != nullptr ? *g_pool : nullptr;
}

bool ModuleAllowed(const PythonOptions& options, const std::string& module) {
  if (options.modules.empty()) return true;
  for (const std::string& allowed : options.modules) {
    if (module == allowed || absl::StartsWith(module, absl::StrCat(allowed, "."))) return true;
  }
  return false;
}

}  // namespace sluice::data_worker::python
