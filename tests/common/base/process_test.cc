#include "common/base/process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

TEST(Subprocess, WaitsForTheAddressAndStopsWithSigterm) {
  TempDir tmp;
  const std::string file = tmp.Join("addr");
  auto child = Subprocess::Start(
      {"/bin/sh", "-c", "sleep 0.1; echo 127.0.0.1:4567 > " + file + "; exec sleep 30"}, {});
  ASSERT_TRUE(child.ok()) << child.status();
  auto address = WaitForAddressFile(file, **child, absl::Seconds(10));
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1:4567");
  EXPECT_FALSE((*child)->Poll().has_value());
  EXPECT_EQ((*child)->Stop(absl::Seconds(5)), 128 + SIGTERM);
}

TEST(Subprocess, ChildDyingBeforeListeningIsFailedPreconditionWithItsLog) {
  TempDir tmp;
  auto child = Subprocess::Start({"/bin/sh", "-c", "echo cannot bind port; exit 3"},
                                 {.log_file = tmp.Join("log")});
  ASSERT_TRUE(child.ok());
  auto address = WaitForAddressFile(tmp.Join("addr"), **child, absl::Seconds(10));
  EXPECT_EQ(address.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(address.status().message(), HasSubstr("exited with code 3"));
  EXPECT_THAT(address.status().message(), HasSubstr("cannot bind port"));
}

TEST(Subprocess, SilentChildTimesOut) {
  TempDir tmp;
  auto child = Subprocess::Start({"/bin/sleep", "30"}, {});
  ASSERT_TRUE(child.ok());
  auto address = WaitForAddressFile(tmp.Join("addr"), **child, absl::Milliseconds(200));
  EXPECT_EQ(address.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Subprocess, MissingProgramIsNotFound) {
  auto child = Subprocess::Start({"/nonexistent/sluice-worker"}, {});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(child.status().message(), HasSubstr("/nonexistent/sluice-worker"));
}

TEST(Subprocess, DestructorKillsARunningChild) {
  pid_t pid;
  {
    auto child = Subprocess::Start({"/bin/sleep", "30"}, {});
    ASSERT_TRUE(child.ok());
    pid = (*child)->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);  // reaped: no such process
}

// SIGCHLD ignored when this program started (dispositions survive exec) would have the kernel
// reap the child unseen: its exit code lost, Wait() waiting out its timeout.
TEST(Subprocess, AChildIsWaitedForEvenWhenThisProgramStartedIgnoringSigchld) {
  signal(SIGCHLD, SIG_IGN);
  auto child = Subprocess::Start({"/bin/sh", "-c", "exit 7"}, {});
  struct sigaction action {};
  sigaction(SIGCHLD, nullptr, &action);
  signal(SIGCHLD, SIG_DFL);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(action.sa_handler, SIG_DFL);
  EXPECT_EQ((*child)->Wait(absl::Seconds(30)).value_or(-1), 7);
}

TEST(Subprocess, AProgramTheKernelCannotRunIsAnErrorNamingIt) {
  TempDir tmp;
  const std::string program = tmp.Join("not-a-program");
  std::ofstream(program) << "\x01\x02 neither ELF nor a script\n";
  chmod(program.c_str(), 0755);
  auto child = Subprocess::Start({program}, {});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(child.status().message(), "cannot start '" + program + "': " + std::strerror(ENOEXEC));
}

// Starts `sleep 30` from a forked owner process, SIGKILLs the owner, and returns how the sleep
// ended (its exit code, 128 + signal) or -1 if it still runs `wait_ms` later (then kills it). This
// process is made a subreaper so that the orphaned sleep is reparented to it and can be waited.
int SleepsEndWhenItsOwnerIsKilled(bool exit_with_parent, int wait_ms) {
  EXPECT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const pid_t owner = fork();
  if (owner == 0) {
    auto child = Subprocess::Start({"/bin/sleep", "30"}, {.exit_with_parent = exit_with_parent});
    const pid_t pid = child.ok() ? (*child)->pid() : -1;
    (void)!write(pipe_fds[1], &pid, sizeof(pid));
    pause();  // until SIGKILLed: the Subprocess's destructor never runs
    _exit(0);
  }
  pid_t sleeper = -1;
  EXPECT_EQ(read(pipe_fds[0], &sleeper, sizeof(sleeper)), static_cast<ssize_t>(sizeof(sleeper)));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_GT(sleeper, 0);
  kill(owner, SIGKILL);
  int status;
  EXPECT_EQ(waitpid(owner, &status, 0), owner);
  for (int waited_ms = 0; waited_ms < wait_ms; waited_ms += 10) {
    if (waitpid(sleeper, &status, WNOHANG) == sleeper) {
      return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }
    usleep(10'000);
  }
  kill(sleeper, SIGKILL);
  waitpid(sleeper, &status, 0);
  return -1;
}

TEST(Subprocess, AChildStartedToExitWithItsParentGetsSigtermWhenItsOwnerIsKilled) {
  EXPECT_EQ(SleepsEndWhenItsOwnerIsKilled(/*exit_with_parent=*/true, 10'000), 128 + SIGTERM);
}

TEST(Subprocess, OtherwiseAChildOutlivesAKilledOwner) {
  // (Half a second: the owner's death is long done; nothing would signal it later.)
  EXPECT_EQ(SleepsEndWhenItsOwnerIsKilled(/*exit_with_parent=*/false, 500), -1);
}

}  // namespace
}  // namespace sluice
