// Starts the real sluice-dispatcher binary (from $SLUICE_BIN_DIR), talks to it,
// stops it.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/base/process.h"
#include "dispatcher/dispatcher_impl.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/dispatcher.grpc.pb.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice::dispatcher {
namespace {

std::string BinDir() {
  const char* dir = std::getenv("SLUICE_BIN_DIR");
  return dir != nullptr ? dir : "build/bin";
}

pid_t Spawn(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to `limit` for the child; returns its wait status, or -1 if it is
// still running.
int WaitFor(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

TEST(DispatcherMain, ServesOnAnyPortAndExitsCleanlyOnSigterm) {
  testing::TempDir dir;
  const std::string address_file = dir.Join("dispatcher.addr");
  const std::string binary = BinDir() + "/sluice-dispatcher";
  ASSERT_TRUE(std::filesystem::exists(binary)) << binary;
  const pid_t pid = Spawn({binary, "--port", "0", "--address-file", address_file, "--work-dir",
                           dir.Join("work"), "--metrics-port", "0", "--log-level", "warn"});
  ASSERT_GT(pid, 0);

  std::string address;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (address.empty() && std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(address_file)) {
      address = std::string(absl::StripAsciiWhitespace(testing::ReadFile(address_file)));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_FALSE(address.empty()) << "no address file";
  std::vector<std::string> parts = absl::StrSplit(address, ':');
  ASSERT_EQ(parts.size(), 2u) << address;
  EXPECT_NE(parts[1], "0");

  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  proto::WorkerRegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_address("127.0.0.1:1");
  proto::WorkerRegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status s = stub->WorkerRegister(&context, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.worker_id(), 1u);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = WaitFor(pid, std::chrono::seconds(8));
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "sluice-dispatcher did not exit within 8 s of SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A work dir whose journal is not one: the dispatcher refuses to start (exit 1, at once) and
// says which file and what to do, instead of starting with an empty state.
TEST(DispatcherMain, ACorruptJournalIsAClearStartupError) {
  testing::TempDir dir;
  const std::string work = dir.Join("work");
  std::filesystem::create_directories(work);
  {
    std::ofstream garbage(work + "/journal.sqlite3", std::ios::binary);
    garbage << std::string(8192, '\x5a');
  }
  const std::string binary = BinDir() + "/sluice-dispatcher";
  auto p = Subprocess::Start({binary, "--port", "0", "--work-dir", work, "--metrics-port", "0"},
                             {.log_file = dir.Join("dispatcher.log")});
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << "the dispatcher did not exit on a corrupt journal";
  EXPECT_EQ(*code, 1);
  const std::string log = testing::ReadFile(dir.Join("dispatcher.log"));
  EXPECT_THAT(log, ::testing::HasSubstr(work + "/journal.sqlite3"));
  EXPECT_THAT(log, ::testing::HasSubstr("--work-dir"));
}

// Flags from the environment (SLUICE_<FLAG>), --metrics-address HOST:PORT, JSON
// logs and the lines on stdout that scripts parse.
TEST(DispatcherMain, TakesFlagsFromTheEnvironmentAndPrintsItsAddresses) {
  testing::TempDir dir;
  absl::StatusOr<int> metrics_port = tools::PickFreePort();
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
  const std::string metrics = "127.0.0.1:" + std::to_string(*metrics_port);
  setenv("SLUICE_METRICS_ADDRESS", metrics.c_str(), 1);
  setenv("SLUICE_LOG_FORMAT", "json", 1);
  setenv("SLUICE_ADDRESS_FILE", dir.Join("addr").c_str(), 1);
  auto process = Subprocess::Start({BinDir() + "/sluice-dispatcher", "--port", "0"},
                                   {.log_file = dir.Join("log")});
  unsetenv("SLUICE_METRICS_ADDRESS");
  unsetenv("SLUICE_LOG_FORMAT");
  unsetenv("SLUICE_ADDRESS_FILE");
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<std::string> address =
      WaitForAddressFile(dir.Join("addr"), **process, absl::Seconds(20));
  ASSERT_TRUE(address.ok()) << address.status();

  absl::StatusOr<std::string> exposition = tools::ScrapeMetrics(*metrics_port);
  EXPECT_TRUE(exposition.ok()) << exposition.status();
  EXPECT_EQ((*process)->Stop(absl::Seconds(8)), 0);
  const std::string log = testing::ReadFile(dir.Join("log"));
  EXPECT_THAT(log, ::testing::HasSubstr("metrics on " + metrics + "\n"));
  EXPECT_THAT(log, ::testing::HasSubstr("listening on " + *address + "\n"));
  EXPECT_THAT(log, ::testing::HasSubstr(R"("level":"info","logger":"dispatcher","thread":)"));
}

// A CPU budget smaller than --min-workers workers is a usage error naming the
// flags; a valid one bounds the pool (the log says by how much).
TEST(DispatcherMain, MaxCpusBoundsThePoolOrIsAClearUsageError) {
  testing::TempDir dir;
  const std::string binary = BinDir() + "/sluice-dispatcher";
  auto bad = Subprocess::Start(
      {binary, "--port", "0", "--metrics-port", "0", "--max-cpus", "1", "--worker-cpus", "2"},
      {.log_file = dir.Join("bad.log")});
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::StatusOr<int> code = (*bad)->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << "the dispatcher did not exit";
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(testing::ReadFile(dir.Join("bad.log")),
              ::testing::HasSubstr("--max-cpus 1 holds 0 workers of "
                                   "--worker-cpus 2, fewer than --min-workers "
                                   "1"));
  // Not a number is not a budget (NaN passed a `< 0` check and was ignored).
  auto nan = Subprocess::Start({binary, "--port", "0", "--metrics-port", "0", "--max-cpus", "nan"},
                               {.log_file = dir.Join("nan.log")});
  ASSERT_TRUE(nan.ok()) << nan.status();
  code = (*nan)->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << "the dispatcher did not exit";
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(testing::ReadFile(dir.Join("nan.log")),
              ::testing::HasSubstr("--max-cpus must be >= 0 and --worker-cpus positive"));
  auto good = Subprocess::Start(
      {binary, "--port", "0", "--metrics-port", "0", "--max-cpus", "7", "--worker-cpus", "2"},
      {.log_file = dir.Join("good.log")});
  ASSERT_TRUE(good.ok()) << good.status();
  const std::string expected =
      "autoscaler: at most 3 workers (--max-cpus 7 / --worker-cpus 2, "
      "--max-workers 64)";
  for (int i = 0; i < 200; ++i) {
    if (testing::ReadFile(dir.Join("good.log")).find(expected) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(testing::ReadFile(dir.Join("good.log")), ::testing::HasSubstr(expected));
  EXPECT_EQ((*good)->Stop(absl::Seconds(10)), 0);
}

}  // namespace
}  // namespace sluice::dispatcher
