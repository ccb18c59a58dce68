#include "common/base/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace sluice {
namespace {

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

}  // namespace

void KeepChildrenWaitable() {
  struct sigaction action {};
  if (sigaction(SIGCHLD, nullptr, &action) == 0 &&
      (action.sa_handler == SIG_IGN || (action.sa_flags & SA_NOCLDWAIT) != 0)) {
    signal(SIGCHLD, SIG_DFL);
  }
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const Options& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess::Start: empty argv");
  KeepChildrenWaitable();
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot run '", argv[0], "': ", std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork(): between fork() and exec the child of
  // a threaded parent may only make async-signal-safe calls (no allocation, no locks).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const char* log_file = options.log_file.empty() ? nullptr : options.log_file.c_str();
  const pid_t parent = getpid();
  // The child reports a failed exec (its errno) on this pipe; exec closes it on success.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot start '", argv[0], "': pipe2: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(report[0]);
    close(report[1]);
    return absl::InternalError(
        absl::StrCat("cannot start '", argv[0], "': fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    close(report[0]);
    auto fail = [&](int err) {
      (void)!write(report[1], &err, sizeof(err));
      _exit(127);
    };
    if (options.exit_with_parent) {
      if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) fail(errno);
      if (getppid() != parent) _exit(128 + SIGTERM);  // the parent died before prctl
    }
    if (log_file != nullptr) {
      const int fd = open(log_file, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0) fail(errno);
      if (dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) fail(errno);
      if (fd != STDOUT_FILENO && fd != STDERR_FILENO) close(fd);
    }
    // The child starts with no blocked signals and default handlers, whatever its parent
    // blocks (a parent may block SIGINT/SIGTERM to sigwait for them).
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(args[0], args.data(), environ);
    fail(errno);
  }
  close(report[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(report[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == sizeof(err)) {
    int status;
    waitpid(pid, &status, 0);
    return absl::InternalError(absl::StrCat("cannot start '", argv[0], "': ", std::strerror(err)));
  }
  return std::unique_ptr<Subprocess>(
      new Subprocess(pid, std::filesystem::path(argv[0]).filename().string(), options.log_file));
}

Subprocess::~Subprocess() {
  if (!Poll().has_value()) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

void Subprocess::Signal(int signal) {
  if (!Poll().has_value()) kill(pid_, signal);
}

std::optional<int> Subprocess::Poll() {
  if (exit_code_.has_value()) return exit_code_;
  int status;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_code_ = ExitCodeOf(status);
  return exit_code_;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<int> code = Poll(); code.has_value()) return *code;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " (pid ", pid_, ") still runs after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int Subprocess::Stop(absl::Duration grace) {
  Signal(SIGTERM);
  if (auto code = Wait(grace); code.ok()) return *code;
  Signal(SIGKILL);
  return Wait(absl::InfiniteDuration()).value_or(-1);
}

absl::StatusOr<std::string> WaitForAddressFile(const std::string& path, Subprocess& process,
                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && line.find(':') != std::string::npos) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
    if (std::optional<int> code = process.Poll(); code.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(process.name(), " exited with code ", *code, " before listening",
                       process.log_file().empty() ? "" : "; its log ends with:\n",
                       TailOfFile(process.log_file())));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(process.name(), " wrote no address to '",
                                                      path, "' within ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  const std::string all = s.str();
  return all.size() <= max_bytes ? all : all.substr(all.size() - max_bytes);
}

}  // namespace sluice
