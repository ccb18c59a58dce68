#include "common/base/process.h"

#include <signal.h>

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

}  // namespace
}  // namespace sluice
