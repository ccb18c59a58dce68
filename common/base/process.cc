#include "common/base/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
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

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const Options& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess::Start: empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot run '", argv[0], "': ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.log_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.log_file.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  // The child starts with no blocked signals and default handlers, whatever its
  // parent blocks (a parent may block SIGINT/SIGTERM to sigwait for them).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int err = posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (err != 0) {
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
