// The python op end to end through the executor, with real Python processes
// running tests/data_worker/python/sluice_test_fns.py: exact bytes, the same
// random draws at any parallelism, user exceptions, and processes that exit,
// segfault or hang being replaced with their element redone once.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "common/base/random.h"
#include "common/pipeline_spec/parse.h"
#include "data_worker/pipeline/element_cache.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/python/python_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/testing/executor_testing.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

namespace pl = pipeline;

constexpr int kRecords = 8;
constexpr char kInt32[] = ", output_dtypes: [int32]";
// One element per request, as before groups; and groups of 8 (all the
// records).
constexpr char kOne[] = ", group: 1";
constexpr char kEight[] = ", group: 8";
// The owner of the processes the tests call directly (no python op's:
// NewOwner never returns 0).
constexpr python::PythonPool::Owner kTestOwner = 0;

// source → decode → python (module sluice_test_fns, function `fn`) on
// [image, label], label = record index.
std::string Spec(const std::string& fn, int threads, const std::string& on_error = "fail",
                 const std::string& extra = "") {
  return absl::StrReplaceAll(
      R"(
seed: 11
on_error: ON_ERROR
source: {synthetic: {num_records: 8, height: 6, width: 5, num_classes: 1000}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map:
      input_columns: [image, label]
      ops: [{python: {module: sluice_test_fns, function: FNEXTRA}}]
      num_parallel_workers: THREADS
)",
      {{"FNEXTRA", fn + extra}, {"THREADS", absl::StrCat(threads)}, {"ON_ERROR", on_error}});
}

python::PythonOptions Options() {
  python::PythonOptions o;
  o.allow = true;
  o.python_path = {SLUICE_TEST_PYTHON_DIR};
  o.interpreter = SLUICE_PYTHON_EXECUTABLE;
  return o;
}

struct Out {
  std::map<uint64_t, std::string> images;  // global index → image bytes
  std::map<uint64_t, int64_t> labels;
  int deliveries = 0;
  absl::Status status;
  pl::PipelineStats stats;
};

// Runs `yaml`'s epoch 0 as one split; `each` sees every delivered element; `stats` gets the
// executor's stats if it was built.
absl::Status RunEpoch(const std::string& yaml, const std::function<void(const pl::Element&)>& each,
                      pl::PipelineStats* stats) {
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  pl::ExecutorOptions eo;
  eo.cpu_budget = 4;
  eo.autotune = false;
  auto ex = pl::Executor::Create(*spec, eo);
  if (!ex.ok()) return ex.status();
  auto outputs = testonly::RunSplit(**ex, (*ex)->EpochOrder(0), 0);
  if (outputs.ok()) {
    for (const pl::Element& e : *outputs) each(e);
  }
  *stats = (*ex)->stats();
  return outputs.status();
}

Out RunSpec(const std::string& yaml) {
  Out out;
  out.status = RunEpoch(
      yaml,
      [&](const pl::Element& e) {
        ++out.deliveries;
        out.images[e.global_indices[0]] = std::string(e.columns[0].bytes());
        out.labels[e.global_indices[0]] = *e.columns[1].data_as<int64_t>();
      },
      &out.stats);
  return out;
}

// The decoded images, without any python op.
std::map<uint64_t, std::string> Decoded() {
  python::ConfigurePython(Options());
  std::string yaml = Spec("invert", 1);
  yaml = yaml.substr(0, yaml.find("  - map:\n      input_columns: [image, label]"));
  return RunSpec(yaml).images;
}

std::string Inverted(std::string s) {
  for (char& c : s) c = static_cast<char>(255 - static_cast<uint8_t>(c));
  return s;
}

// `pid` ends within 10 s (`what` says who outlived whom if it does not): it no
// longer exists, or it is an orphan of this test process (PR_SET_CHILD_SUBREAPER)
// that has ended and is reaped here. What a Python process started is reaped by
// its guardian, so how it ended is not seen here.
void ExpectGoneSoon(pid_t pid, const std::string& what) {
  for (int i = 0; i < 1000; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    if (kill(pid, 0) != 0 && errno == ESRCH) return;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, WNOHANG);
  FAIL() << what;
}

// A forked child standing for a worker: it starts a Python process and calls
// sluice_test_fns.`function` on a 1x2x3 image and `label`, then exits 0 if the call succeeded
// (3 if not, 2 if the process did not start) without running destructors, so the Python
// process sees only its socket close. Returns the child's pid.
pid_t ForkAWorkerCalling(const std::string& function, int64_t label, absl::Duration timeout) {
  const pid_t worker = fork();
  if (worker != 0) return worker;
  auto p = python::PythonProcess::Start(
      {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
  if (!p.ok()) _exit(2);
  Tensor image = Tensor::Allocate(DType::kUint8, {1, 2, 3});
  Tensor labels = Tensor::Allocate(DType::kInt64, {});
  *labels.data_as<int64_t>() = label;
  auto out = (*p)->Call("sluice_test_fns", function, 1, {&image, &labels}, timeout);
  _exit(out.ok() ? 0 : 3);
}

// kRecords elements for a pool's group call: record g's image is 1x2x3
// bytes 10g..10g+5, its label g, its seed 100 + g.
struct SmallRecords {
  SmallRecords() {
    for (int g = 0; g < kRecords; ++g) {
      Tensor image = Tensor::Allocate(DType::kUint8, {1, 2, 3});
      for (int i = 0; i < 6; ++i) image.data()[i] = static_cast<uint8_t>(10 * g + i);
      images.push_back(std::move(image));
      Tensor label = Tensor::Allocate(DType::kInt64, {});
      *label.data_as<int64_t>() = g;
      labels.push_back(std::move(label));
    }
    for (int g = 0; g < kRecords; ++g) {
      group.push_back(python::CallInput{uint64_t(100 + g), {&images[g], &labels[g]}});
    }
  }
  // Record g's image bytes through sluice_test_fns.invert: 255 - (10g..10g+5).
  static std::string InvertedImage(int g) {
    std::string bytes;
    for (int i = 0; i < 6; ++i) bytes.push_back(static_cast<char>(255 - (10 * g + i)));
    return bytes;
  }
  SmallRecords(const SmallRecords&) = delete;
  SmallRecords& operator=(const SmallRecords&) = delete;

  std::vector<Tensor> images, labels;
  std::vector<python::CallInput> group;
};

class PythonOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SLUICE_TEST_MARKERS", markers_.path().c_str(), 1);
    python::ConfigurePython(Options());
    decoded_ = Decoded();
    ASSERT_EQ(decoded_.size(), static_cast<size_t>(kRecords));
  }
  void TearDown() override { python::ConfigurePython({}); }

  // Every record once, inverted, labels intact.
  void ExpectAllInverted(const Out& out) {
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.deliveries, kRecords);
    for (int g = 0; g < kRecords; ++g) {
      ASSERT_EQ(out.images.count(g), 1u) << g;
      EXPECT_EQ(out.images.at(g), Inverted(decoded_.at(g))) << g;
      EXPECT_EQ(out.labels.at(g), g);
    }
  }

  // A group of 8 elements of `function` (label, rng) -> 8 int64: each element's
  // bytes are those of the function given numpy's fresh Generator(PCG64(seed)).
  void ExpectNumpysFreshStreams(const std::string& function);

  testing::TempDir markers_;
  std::map<uint64_t, std::string> decoded_;
};

TEST_F(PythonOpTest, ReturnsTheFunctionsExactBytes) {
  ExpectAllInverted(RunSpec(Spec("invert", 1)));
}

TEST_F(PythonOpTest, OutputIsByteIdenticalAtAnyParallelism) {
  const Out one = RunSpec(Spec("draws", 1, "fail", kInt32));
  const Out three = RunSpec(Spec("draws", 3, "fail", kInt32));
  ASSERT_TRUE(one.status.ok()) << one.status;
  ASSERT_TRUE(three.status.ok()) << three.status;
  EXPECT_EQ(one.images, three.images);
  EXPECT_EQ(one.images.size(), static_cast<size_t>(kRecords));
}

// The generator is numpy's PCG64 seeded with MixSeed({seed, epoch, record,
// op position}): checked against numpy itself, outside sluice.
TEST_F(PythonOpTest, TheGeneratorIsSeededFromSeedEpochAndRecord) {
  const Out out = RunSpec(Spec("draws", 2, "fail", kInt32));
  ASSERT_TRUE(out.status.ok()) << out.status;
  for (uint64_t g : {0, 5}) {
    const uint64_t seed = MixSeed({11, 0, g, 1});
    const std::string cmd =
        absl::StrCat(SLUICE_PYTHON_EXECUTABLE,
                     " -c 'import numpy as np, sys; sys.stdout.buffer.write("
                     "np.random.Generator(np.random.PCG64(",
                     seed, ")).integers(0, 1 << 30, size=4).astype(np.int32).tobytes())'");
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[16];
    ASSERT_EQ(fread(buf, 1, sizeof(buf), p), sizeof(buf));
    pclose(p);
    EXPECT_EQ(out.images.at(g), std::string(buf, sizeof(buf))) << g;
  }
}

TEST_F(PythonOpTest, DeclaredOutputDtypesAreChecked) {
  const std::string yaml = Spec("to_float", 1, "fail", ", output_dtypes: [float32]");
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto lp = pl::Validate(*spec);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_EQ(lp->column_types[0].ToString(), "float32[-1,-1,-1]");
  EXPECT_EQ(lp->column_types[1].ToString(), "int64[]");
  // Undeclared, float32 is not the input's uint8.
  const Out out = RunSpec(Spec("to_float", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(),
              HasSubstr("map[1].ops[0] (Python): sluice_test_fns.to_float returned "
                        "float32[6,5,3] for column 0, expected uint8 of rank 3"));
  // More dtypes than the map has columns is a mistake in the spec.
  auto three = sluice::pipeline_spec::ParsePipelineSpec(
      Spec("to_float", 1, "fail", ", output_dtypes: [float32, int64, int64]"));
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_THAT(pl::Validate(*three).status().message(),
              HasSubstr("output_dtypes has 3 entries for the map's 2 columns: one per column, in "
                        "order"));
}

TEST_F(PythonOpTest, UnsupportedResultDtypeNamesIt) {
  const Out out = RunSpec(Spec("wrong_dtype", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("result 0 is float64[6, 5, 3]; return one of uint8, "
                                              "int32, int64, float16, float32"));
  // A supported type in the other byte order is not copied as is: named too.
  const Out swapped = RunSpec(Spec("big_endian", 1, "fail", kInt32));
  EXPECT_EQ(swapped.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(swapped.status.message(), HasSubstr("result 0 is >i4[6, 5, 3]; return one of"));
}

TEST_F(PythonOpTest, WrongNumberOfResultsIsAnError) {
  const Out out = RunSpec(Spec("one_result", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("returned 1 arrays for 2 columns"));
}

TEST_F(PythonOpTest, AnExceptionEndsTheRunWithTheTraceback) {
  const Out out = RunSpec(Spec("raises_on_3", 2));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out.status.message(), HasSubstr("record 3: map[1].ops[0] (Python)"));
  EXPECT_THAT(out.status.message(), HasSubstr("Traceback (most recent call last)"));
  EXPECT_THAT(out.status.message(), HasSubstr("ValueError: bad record 3"));
}

TEST_F(PythonOpTest, OnErrorSkipDropsAndCountsTheRecord) {
  const Out out = RunSpec(Spec("raises_on_3", 2, "skip"));
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.deliveries, kRecords - 1);
  EXPECT_EQ(out.images.count(3), 0u);
  EXPECT_EQ(out.stats.skipped, 1u);
  for (uint64_t g : {0, 2, 4, 7}) {
    EXPECT_EQ(out.images.at(g), Inverted(decoded_.at(g)));
  }
}

TEST_F(PythonOpTest, AProcessThatExitsIsReplacedAndItsElementRedoneOnce) {
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("exits_once_on_3", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
}

// An operator sees each replacement: a warning in the worker's log naming the function, the
// process and what is redone, and sluice_worker_python_processes_total{event}.
TEST_F(PythonOpTest, AReplacedProcessIsLoggedAndCounted) {
  prometheus::Registry registry;
  std::ostringstream log;
  python::ConfigurePython(Options(), &registry,
                          std::make_shared<spdlog::logger>(
                              "worker", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  ExpectAllInverted(RunSpec(Spec("exits_once_on_3", 2)));
  std::map<std::string, double> processes;
  for (const auto& family : registry.Collect()) {
    if (family.name != "sluice_worker_python_processes_total") continue;
    for (const auto& metric : family.metric) {
      ASSERT_EQ(metric.label.size(), 1u);
      processes[metric.label[0].value] = metric.counter.value;
    }
  }
  EXPECT_EQ(processes["replaced"], 1);
  EXPECT_EQ(processes["started"], python::ConfiguredPythonPool()->processes_started());
  EXPECT_GE(processes["started"], 2);
  EXPECT_THAT(log.str(),
              ::testing::HasSubstr("[warning] python op: sluice_test_fns.exits_once_on_3: "
                                   "the Python process (pid "));
  // Record 3 died in a group, or alone when it was the only element ready (two threads
  // share the eight records).
  EXPECT_THAT(log.str(),
              ::testing::ContainsRegex("\\) exited with status 7; (new processes redo the group's "
                                       "[0-9]+ elements one by one|a new process redoes the "
                                       "element \\(attempt 2 of 3\\))"));
}

// A worker started with SIGCHLD ignored (a shell's `trap '' CHLD`, a Python parent's
// signal.signal(SIGCHLD, SIG_IGN): both survive exec) would have the kernel reap its
// Python processes, and their guardians their runners, unseen: how a process ended would be
// lost ("ended; killed it") and every stop would wait out its grace. The worker restores the
// default before it starts one.
TEST_F(PythonOpTest, AWorkerStartedIgnoringSigchldStillSeesHowItsProcessesEnd) {
  std::ostringstream log;
  python::ConfigurePython(Options(), nullptr,
                          std::make_shared<spdlog::logger>(
                              "worker", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  signal(SIGCHLD, SIG_IGN);
  const Out out = RunSpec(Spec("exits_once_on_3", 2));
  struct sigaction action {};
  sigaction(SIGCHLD, nullptr, &action);
  signal(SIGCHLD, SIG_DFL);
  ExpectAllInverted(out);
  EXPECT_EQ(action.sa_handler, SIG_DFL);
  EXPECT_THAT(log.str(), HasSubstr(") exited with status 7; "));
}

TEST_F(PythonOpTest, AProcessThatSegfaultsIsReplacedAndItsElementRedoneOnce) {
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("segfaults_once_on_5", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
}

// The process's death is seen even while a child it forked keeps its end of
// the socket open (no end of file); the child goes with it. No timeout: without
// that, the run would wait for the child forever.
TEST_F(PythonOpTest, AProcessThatExitsLeavingAForkedChildIsReplacedAndTheChildKilled) {
  python::PythonOptions o = Options();
  o.timeout = absl::InfiniteDuration();
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("forks_then_exits_once_on_3", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  std::ifstream in(markers_.path() + "/grandchild-3");
  pid_t child = 0;
  ASSERT_TRUE(in >> child);
  ExpectGoneSoon(child, "the forked child outlived its Python process");
}

// A helper that leaves the process group on purpose (a daemon's double fork
// into a session of its own) is still the Python process's: its guardian, a
// child subreaper, adopts it and kills it once the process has ended, whether
// it died (os._exit), was killed after the timeout, or its worker went away.
TEST_F(PythonOpTest, ADaemonTheFunctionStartedEndsWhenItsProcessDies) {
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("starts_a_daemon_then_exits_once_on_3", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  pid_t daemon = 0;
  ASSERT_TRUE(std::ifstream(markers_.path() + "/daemon-3") >> daemon);
  ExpectGoneSoon(daemon, "the daemon outlived its Python process");
}

TEST_F(PythonOpTest, ADaemonTheFunctionStartedEndsWhenItsProcessIsKilledAfterTheTimeout) {
  python::PythonOptions o = Options();
  o.timeout = absl::Seconds(1);
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("starts_a_daemon_then_hangs_once_on_2", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  pid_t daemon = 0;
  ASSERT_TRUE(std::ifstream(markers_.path() + "/daemon-2") >> daemon);
  ExpectGoneSoon(daemon, "the daemon outlived its Python process");
}

// Out of memory, the kernel's OOM killer takes a Python process (replaced, its
// element redone) before the worker that serves every job.
TEST_F(PythonOpTest, TheOomKillerTakesAPythonProcessBeforeItsWorker) {
  auto p = python::PythonProcess::Start(
      {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
  ASSERT_TRUE(p.ok()) << p.status();
  Tensor label = Tensor::Allocate(DType::kInt64, {});
  *label.data_as<int64_t>() = 1;
  auto out = (*p)->Call("sluice_test_fns", "label_draw", 1, {&label}, absl::Seconds(60));
  ASSERT_TRUE(out.ok()) << out.status();
  int adj = 0;
  ASSERT_TRUE(std::ifstream(absl::StrCat("/proc/", (*p)->pid(), "/oom_score_adj")) >> adj);
  EXPECT_EQ(adj, 1000);
}

TEST_F(PythonOpTest, AHangPastTheTimeoutIsKilledAndItsElementRedoneOnce) {
  python::PythonOptions o = Options();
  o.timeout = absl::Seconds(1);
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("hangs_once_on_2", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
}

TEST_F(PythonOpTest, AnElementThatAlwaysKillsItsProcessFailsAfterThreeTries) {
  auto pool = python::ConfiguredPythonPool();
  const Out out = RunSpec(Spec("always_exits_on_4", 1, "fail", kOne));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out.status.message(),
              HasSubstr("record 4: map[1].ops[0] (Python): "
                        "sluice_test_fns.always_exits_on_4: the Python process "
                        "died 3 times on this element (last: the Python "
                        "process (pid "));
  EXPECT_THAT(out.status.message(), HasSubstr("exited with status 9)"));
  EXPECT_EQ(pool->processes_replaced(), 3);
  // Under skip it is one skipped record.
  const Out skipped = RunSpec(Spec("always_exits_on_4", 1, "skip", kOne));
  ASSERT_TRUE(skipped.status.ok()) << skipped.status;
  EXPECT_EQ(skipped.deliveries, kRecords - 1);
  EXPECT_EQ(skipped.stats.skipped, 1u);
}

// A function that returns more than the worker's memory budget fails its
// element (a bad record: skipped under skip), where it would have filled the
// worker's memory.
TEST_F(PythonOpTest, ResultsLargerThanTheMemoryBudgetFailTheirElement) {
  python::PythonOptions o = Options();
  o.max_result_bytes = 1 << 20;
  python::ConfigurePython(o);
  const Out out = RunSpec(Spec("grows_on_5", 2));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out.status.message(),
              HasSubstr("record 5: map[1].ops[0] (Python): sluice_test_fns.grows_on_5: "
                        "results of 3000008 bytes for one element, more than this worker's limit "
                        "of 1048576 bytes (its memory budget, --memory-mb)"));
  const Out skipped = RunSpec(Spec("grows_on_5", 2, "skip"));
  ASSERT_TRUE(skipped.status.ok()) << skipped.status;
  EXPECT_EQ(skipped.deliveries, kRecords - 1);
  EXPECT_EQ(skipped.images.count(5), 0u);
  EXPECT_EQ(skipped.stats.skipped, 1u);
}

// A group's answer stops once its results pass the limit; the rest are asked
// again: 14 bytes per element and a limit of 30 make requests of 3, 3 and 2.
TEST_F(PythonOpTest, AGroupWhoseResultsPassTheLimitIsAnsweredInParts) {
  python::PythonOptions o = Options();
  o.max_result_bytes = 30;
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  auto out = pool->CallGroup(kTestOwner, "sluice_test_fns", "invert", records.group);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(pool->requests(), 3);
  EXPECT_EQ(pool->processes_started(), 1);
  ASSERT_EQ(out->size(), static_cast<size_t>(kRecords));
  for (int g = 0; g < kRecords; ++g) {
    const auto& r = (*out)[g];
    ASSERT_TRUE(r.ok()) << g << ": " << r.status();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ(std::string((*r)[0].bytes()), SmallRecords::InvertedImage(g)) << g;
    EXPECT_EQ(*(*r)[1].data_as<int64_t>(), g);
  }
}

// A function that returns the same array at every call, refilled: each element
// of a group gets its own bytes (its results are copied out before the next
// call), as it would one call at a time.
TEST_F(PythonOpTest, AFunctionThatReusesItsOutputArrayGivesEachElementOfAGroupItsOwnBytes) {
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  auto out =
      pool->CallGroup(kTestOwner, "sluice_test_fns", "inverts_into_one_buffer", records.group);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(pool->requests(), 1);
  ASSERT_EQ(out->size(), static_cast<size_t>(kRecords));
  for (int g = 0; g < kRecords; ++g) {
    const auto& r = (*out)[g];
    ASSERT_TRUE(r.ok()) << g << ": " << r.status();
    EXPECT_EQ(std::string((*r)[0].bytes()), SmallRecords::InvertedImage(g)) << g;
    EXPECT_EQ(*(*r)[1].data_as<int64_t>(), g);
  }
}

TEST_F(PythonOpTest, AMissingModuleIsInvalidArgumentWithTheImportError) {
  std::string yaml =
      absl::StrReplaceAll(Spec("invert", 1), {{"module: sluice_test_fns", "module: no_such_mod"}});
  const Out out = RunSpec(yaml);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(),
              HasSubstr("ModuleNotFoundError: No module named 'no_such_mod'"));
  // on_error: skip does not hide it.
  yaml = absl::StrReplaceAll(yaml, {{"on_error: fail", "on_error: skip"}});
  EXPECT_EQ(RunSpec(yaml).status.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PythonOpTest, ANonCallableIsInvalidArgument) {
  const Out out = RunSpec(Spec("not_callable", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("sluice_test_fns.not_callable is not callable"));
}

// A function that cannot take the rng keyword would raise on every record (and, under
// on_error: skip, drop them all with the run "successful"): refused when it is loaded.
TEST_F(PythonOpTest, AFunctionWithoutTheRngParameterIsInvalidArgumentEvenUnderSkip) {
  for (const char* on_error : {"fail", "skip"}) {
    const Out out = RunSpec(Spec("takes_no_rng", 1, on_error));
    EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument) << on_error;
    EXPECT_THAT(out.status.message(),
                HasSubstr("sluice_test_fns.takes_no_rng(image, label) cannot take the keyword "
                          "argument rng that every call passes"))
        << on_error;
  }
}

// A callable whose signature Python cannot read (a numpy ufunc) cannot be checked for the rng
// keyword either: refused when loaded, not a TypeError per record that skip would hide.
TEST_F(PythonOpTest, AFunctionWithoutASignatureIsInvalidArgumentEvenUnderSkip) {
  for (const char* on_error : {"fail", "skip"}) {
    const Out out = RunSpec(Spec("no_signature", 1, on_error));
    EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument) << on_error;
    EXPECT_THAT(out.status.message(),
                HasSubstr("sluice_test_fns.no_signature has no signature Python can read"))
        << on_error;
  }
}

// A function that closes fds 3 and 4 (the numbers the worker hands the runner its shared
// memory and socket on) and opens a file in their place: the runner moved both away before
// any user code ran, so every result is still exact (it used to map the file as its shared
// memory and read 0xAB bytes as the results).
TEST_F(PythonOpTest, AFunctionThatClosesFd3AndOpensAFileKeepsItsResultsExact) {
  for (const char* group : {kOne, kEight}) {
    ExpectAllInverted(RunSpec(Spec("closes_fd3_and_opens_a_file", 2, "fail", group)));
  }
  EXPECT_EQ(python::ConfiguredPythonPool()->processes_replaced(), 0);
}

// A process the user function forks that comes back from the call, rather
// than exiting, would answer too: its zeros, read as the next request's
// answer, would land in another record (of this job or a later one). Only the
// process sluice started answers.
TEST_F(PythonOpTest, AForkedChildThatReturnsFromTheCallNeverAnswers) {
  for (const char* group : {kOne, kEight}) {
    ExpectAllInverted(RunSpec(Spec("fork_comes_back", 2, "fail", group)));
    // The same processes then serve another function: no stale answer.
    ExpectAllInverted(RunSpec(Spec("invert", 2, "fail", group)));
  }
}

// A module whose import ends the process (a broken C extension) fails the
// job with the import named, under on_error: skip too (any process would die
// the same way), rather than dropping every record as a bad one.
TEST_F(PythonOpTest, AnImportThatKillsItsProcessEndsTheRunEvenUnderSkip) {
  for (const char* on_error : {"fail", "skip"}) {
    const std::string yaml =
        absl::StrReplaceAll(Spec("invert", 1, on_error),
                            {{"module: sluice_test_fns", "module: sluice_test_exits_at_import"}});
    const Out out = RunSpec(yaml);
    EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument) << on_error;
    EXPECT_THAT(out.status.message(),
                HasSubstr("sluice_test_exits_at_import.invert: the Python process died 3 times "
                          "while importing (last: the Python process (pid "))
        << on_error;
    EXPECT_THAT(out.status.message(),
                HasSubstr("exited with status 5 while importing sluice_test_exits_at_import for "
                          "sluice_test_exits_at_import.invert; its output is in this worker's "
                          "log)"))
        << on_error;
    EXPECT_EQ(out.deliveries, 0);
  }
}

// The import's time is not a call's: a module that takes 2 s to import runs
// under a 1 s --python-op-timeout without a process being killed.
TEST_F(PythonOpTest, AnImportSlowerThanTheCallTimeoutIsNotATimeout) {
  python::PythonOptions o = Options();
  o.timeout = absl::Seconds(1);
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  for (const char* group : {kOne, kEight}) {
    const std::string yaml =
        absl::StrReplaceAll(Spec("invert", 2, "fail", group),
                            {{"module: sluice_test_fns", "module: sluice_test_slow_import"}});
    ExpectAllInverted(RunSpec(yaml));
  }
  EXPECT_EQ(pool->processes_replaced(), 0);
}

// A team folder on --python-path holding its own numpy.py and traceback.py
// does not replace the modules the Python process's runner imports.
TEST_F(PythonOpTest, ModulesOnThePythonPathDoNotShadowTheRunners) {
  python::PythonOptions o = Options();
  o.python_path = {SLUICE_TEST_PYTHON_DIR "/shadow", SLUICE_TEST_PYTHON_DIR};
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  ExpectAllInverted(RunSpec(Spec("invert", 2)));
  EXPECT_EQ(pool->processes_replaced(), 0);
}

// Nor does a numpy.py in the worker's current directory, also when an empty
// PYTHONPATH entry (PYTHONPATH=":/x", as `ENV PYTHONPATH=$PYTHONPATH:/x` makes)
// puts that directory on the path: neither the start-up check nor the runner
// imports it.
TEST_F(PythonOpTest, ANumpyPyInTheWorkersDirectoryIsNotImported) {
  const std::filesystem::path before = std::filesystem::current_path();
  const char* pythonpath = getenv("PYTHONPATH");
  const std::string saved = pythonpath != nullptr ? pythonpath : "";
  std::filesystem::current_path(SLUICE_TEST_PYTHON_DIR "/shadow");
  setenv("PYTHONPATH", ":/nonexistent", 1);
  python::PythonOptions o = Options();
  const absl::Status check = python::CheckPythonInterpreter(o);
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  const Out out = RunSpec(Spec("invert", 2));
  std::filesystem::current_path(before);
  if (pythonpath != nullptr) {
    setenv("PYTHONPATH", saved.c_str(), 1);
  } else {
    unsetenv("PYTHONPATH");
  }
  EXPECT_TRUE(check.ok()) << check;
  ExpectAllInverted(out);
  EXPECT_EQ(pool->processes_replaced(), 0);
}

// A helper the user function forked (and left running) ends with its Python
// process when the worker ends without stopping it (an orderly exit that does
// not run destructors, or a crash between calls).
TEST_F(PythonOpTest, AForkedHelperEndsWhenItsWorkerExits) {
  // The orphans become ours, so that we can see how they end.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const pid_t worker = ForkAWorkerCalling("forks_a_helper", 6, absl::Seconds(60));
  int status = 0;
  ASSERT_EQ(waitpid(worker, &status, 0), worker);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(markers_.path() + "/helper-6");
  pid_t helper = 0;
  ASSERT_TRUE(in >> helper);
  ExpectGoneSoon(helper, "the forked helper outlived its worker");
  // The Python process, an orphan of ours too, is reaped as well.
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_F(PythonOpTest, AHelperInASessionOfItsOwnEndsWhenItsWorkerExits) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // the worker's orphans become ours
  const pid_t worker = ForkAWorkerCalling("starts_a_session_helper", 6, absl::Seconds(60));
  int status = 0;
  ASSERT_EQ(waitpid(worker, &status, 0), worker);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  pid_t helper = 0;
  ASSERT_TRUE(std::ifstream(markers_.path() + "/session-6") >> helper);
  ExpectGoneSoon(helper, "the helper in a session of its own outlived its worker");
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// Where the worker is PID 1 (a container) every orphan in it becomes the
// worker's child, and one that ends stays a zombie unless the worker reaps it.
// Nothing a Python process leaves behind may come to the worker: this test
// process stands for PID 1 (a subreaper), runs processes that crash leaving a
// forked child or a daemon, hang leaving a daemon, and leave helpers running,
// stops the pool, and then has no child at all.
TEST_F(PythonOpTest, NothingAPythonProcessLeavesBehindIsLeftForItsWorkerToReap) {
  // Run in one process with the tests before it, a guardian one of them left to this
  // process may end just after that test: none may be left when this one starts.
  for (int i = 0; i < 1000 && waitpid(-1, nullptr, WNOHANG) >= 0; ++i) usleep(10000);
  ASSERT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "a child of an earlier test still runs";
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  python::PythonOptions o = Options();
  o.timeout = absl::Seconds(1);
  python::ConfigurePython(o);
  ExpectAllInverted(RunSpec(Spec("forks_then_exits_once_on_3", 2)));
  ExpectAllInverted(RunSpec(Spec("starts_a_daemon_then_exits_once_on_3", 2)));
  ExpectAllInverted(RunSpec(Spec("starts_a_daemon_then_hangs_once_on_2", 2)));
  ExpectAllInverted(RunSpec(Spec("forks_a_helper", 2)));
  python::ConfigurePython(Options());  // the pool with its processes goes
  usleep(1'000'000);  // time for a process that noticed late to end and be orphaned
  siginfo_t info{};
  const int r = waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT);
  const int err = errno;
  EXPECT_TRUE(r == -1 && err == ECHILD)
      << "a child was left to this process: pid " << info.si_pid << " ("
      << (r == 0 && info.si_pid != 0 ? "ended, unreaped" : "running") << ")";
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// A function stuck in C code that holds the GIL cannot stop a thread of its process from
// running, so the process's watch for its worker is a process of its own: the worker killed
// mid-call, the Python process ends within a second or so all the same.
TEST_F(PythonOpTest, AFunctionHoldingTheGilEndsWhenItsWorkerIsKilled) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const pid_t worker = ForkAWorkerCalling("holds_the_gil", 4, absl::InfiniteDuration());
  const std::string marker = markers_.path() + "/gil-4";
  pid_t python = 0;
  for (int i = 0; i < 3000 && !(std::ifstream(marker) >> python); ++i) usleep(10000);
  ASSERT_GT(python, 0) << "the function never started";
  usleep(300'000);  // inside the regular expression
  kill(worker, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(worker, &status, 0), worker);
  ExpectGoneSoon(python, "the Python process outlived its worker");
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// One element's 100 MB of results do not stay in the process's shared memory
// for every later request: once an answer's results are small again, it
// shrinks back to 1 MiB.
TEST_F(PythonOpTest, TheSharedMemoryShrinksBackAfterALargeResult) {
  auto p = python::PythonProcess::Start(
      {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
  ASSERT_TRUE(p.ok()) << p.status();
  // The runner's memfd ("/memfd:sluice-python (deleted)"), at whatever fd it moved it to.
  auto shm_bytes = [&]() -> int64_t {
    const std::string fds = absl::StrCat("/proc/", (*p)->pid(), "/fd");
    for (const auto& fd : std::filesystem::directory_iterator(fds)) {
      std::error_code error;
      const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
      if (target.rfind("/memfd:sluice-python", 0) != 0) continue;
      struct stat st {};
      EXPECT_EQ(stat(fd.path().c_str(), &st), 0);
      return st.st_size;
    }
    ADD_FAILURE() << "no sluice-python memfd in " << fds;
    return -1;
  };
  Tensor image = Tensor::Allocate(DType::kUint8, {1, 2, 3});
  for (int i = 0; i < 6; ++i) image.data()[i] = static_cast<uint8_t>(i);
  Tensor label = Tensor::Allocate(DType::kInt64, {});
  int call = 0;
  for (int64_t g : {1, 2, 2}) {
    ++call;
    *label.data_as<int64_t>() = g;
    auto out =
        (*p)->Call("sluice_test_fns", "big_then_small", 1, {&image, &label}, absl::Seconds(60));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 2u);
    EXPECT_EQ((*out)[0].num_bytes(), g == 1 ? 100'000'000u : 6u);
    if (call < 3) {
      // The second request follows an answer of 100 MB: it keeps the memory.
      EXPECT_GE(shm_bytes(), 100'000'000) << "call " << call;
    } else {
      EXPECT_EQ(shm_bytes(), 1 << 20);
      EXPECT_EQ(std::string((*out)[0].bytes()), std::string("\xff\xfe\xfd\xfc\xfb\xfa"));
    }
  }
}

// Results that are large on every request keep the shared memory they need: the
// request after one is not shrunk to its small inputs' size (and faulted in again
// by the answer), which made a function of 8 x 12 MB per group 8 times slower.
TEST_F(PythonOpTest, SteadilyLargeResultsKeepTheirSharedMemory) {
  auto p = python::PythonProcess::Start(
      {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
  ASSERT_TRUE(p.ok()) << p.status();
  Tensor image = Tensor::Allocate(DType::kUint8, {1, 2, 3});
  Tensor label = Tensor::Allocate(DType::kInt64, {});
  for (int call = 1; call <= 3; ++call) {
    auto out =
        (*p)->Call("sluice_test_fns", "shm_seen_then_big", 1, {&image, &label}, absl::Seconds(60));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 2u);
    ASSERT_EQ((*out)[1].num_bytes(), 70'000'000u);
    const int64_t seen = *(*out)[0].data_as<int64_t>();
    if (call == 1) {
      EXPECT_EQ(seen, 1 << 20);
    } else {
      EXPECT_GE(seen, 70'000'000) << "call " << call << " ran on a shrunk shared memory";
    }
  }
}

// The result's own code raises after the call (a tuple subclass whose __iter__
// fails): the function's error, with the traceback, not a process that died
// 3 times.
TEST_F(PythonOpTest, AResultThatRaisesWhenReadIsTheFunctionsError) {
  auto pool = python::ConfiguredPythonPool();
  Out out = RunSpec(Spec("returns_unreadable_tuple", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument) << out.status;
  EXPECT_THAT(out.status.message(),
              HasSubstr("sluice_test_fns.returns_unreadable_tuple: the result could not be read:"));
  EXPECT_THAT(out.status.message(), HasSubstr("RuntimeError: this tuple cannot be iterated"));
  EXPECT_EQ(pool->processes_replaced(), 0);
}

TEST_F(PythonOpTest, AResultThatIsNotAnArraySaysWhatItIs) {
  Out out = RunSpec(Spec("returns_none", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(),
              HasSubstr("sluice_test_fns.returns_none: result 0 is None, not an array; return a "
                        "numpy array (or a tuple of arrays, one per output column)"));
  out = RunSpec(Spec("returns_dict", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("result 0 is a dict, not an array"));
  // An array-like (a tensor, a PIL image) numpy reads as a dtype sluice does not take: the
  // dtype is named.
  out = RunSpec(Spec("returns_float64_array_like", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(),
              HasSubstr("sluice_test_fns.returns_float64_array_like: result 0 is float64[2, 3]; "
                        "return one of uint8, int32, int64, float16, float32 (cast with .astype)"));
  // numpy cannot make one array of it: the function's error, not a dead process retried 3
  // times (nor, under skip, every record skipped).
  for (const char* on_error : {"fail", "skip"}) {
    out = RunSpec(Spec("returns_ragged_list", 1, on_error));
    EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument) << on_error;
    EXPECT_THAT(out.status.message(),
                HasSubstr("sluice_test_fns.returns_ragged_list: result 0 (a list) cannot be made "
                          "a numpy array: ValueError: setting an array element with a sequence."))
        << on_error;
  }
  EXPECT_EQ(python::ConfiguredPythonPool()->processes_replaced(), 0);
}

// Every Python process hashes strings alike (PYTHONHASHSEED), so a function that iterates a
// set of strings gives the same result on any process; and print() is written through, so
// what a function printed before its process was killed is in the worker's log.
TEST_F(PythonOpTest, EveryProcessHashesStringsAlikeAndWritesPrintsThrough) {
  unsetenv("PYTHONUNBUFFERED");  // as on a worker started without it
  Tensor image = Tensor::Allocate(DType::kUint8, {1, 2, 3});
  Tensor label = Tensor::Allocate(DType::kInt64, {});
  std::set<int64_t> hashes;
  for (int i = 0; i < 3; ++i) {
    auto p = python::PythonProcess::Start(
        {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
    ASSERT_TRUE(p.ok()) << p.status();
    auto out =
        (*p)->Call("sluice_test_fns", "hash_of_a_string", 1, {&image, &label}, absl::Seconds(60));
    ASSERT_TRUE(out.ok()) << out.status();
    hashes.insert(*(*out)[1].data_as<int64_t>());
    out =
        (*p)->Call("sluice_test_fns", "stdout_unbuffered", 1, {&image, &label}, absl::Seconds(60));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*(*out)[1].data_as<int64_t>(), 1);
  }
  EXPECT_EQ(hashes.size(), 1u);
}

// An interpreter whose Python has no numpy on its path (-S: no site-packages).
std::string PythonWithoutNumpy() {
  const std::string path = ::testing::TempDir() + "/python3-without-numpy";
  {
    std::ofstream f(path);
    f << "#!/bin/sh\nexec " << SLUICE_PYTHON_EXECUTABLE << " -S \"$@\"\n";
  }
  EXPECT_EQ(chmod(path.c_str(), 0755), 0);
  return path;
}

// A worker started with --allow-python-ops checks its interpreter first: an image without
// Python, or without numpy, is refused at start-up, naming the interpreter and what it printed.
TEST_F(PythonOpTest, AWorkerWhosePythonCannotImportNumpyIsRefusedAtStartUp) {
  python::PythonOptions o;
  o.interpreter = "/nonexistent/python3";
  EXPECT_TRUE(python::CheckPythonInterpreter(o).ok());  // python ops not allowed: not checked
  o.allow = true;
  absl::Status missing = python::CheckPythonInterpreter(o);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.message(),
              HasSubstr("--allow-python-ops: /nonexistent/python3 cannot run python ops: "));
  EXPECT_THAT(missing.message(), HasSubstr("apt-get install python3 python3-numpy"));
  const std::string no_numpy = PythonWithoutNumpy();
  o.interpreter = no_numpy;
  absl::Status without = python::CheckPythonInterpreter(o);
  EXPECT_EQ(without.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(without.message(), HasSubstr("`import numpy` exited with 1: "));
  EXPECT_THAT(without.message(), HasSubstr("No module named 'numpy'"));
  o.interpreter = SLUICE_PYTHON_EXECUTABLE;
  EXPECT_TRUE(python::CheckPythonInterpreter(o).ok()) << python::CheckPythonInterpreter(o);
}

// The pids that imported sluice_test_import_log, in order.
std::vector<std::string> Imports(const testing::TempDir& markers) {
  std::ifstream f(markers.path() + "/imports");
  std::vector<std::string> pids;
  for (std::string line; std::getline(f, line);) pids.push_back(line);
  return pids;
}

// A python op's processes start when the op is built, as many as the
// pipeline may have threads, and import its module before any call: the first
// elements do not wait for one interpreter after another.
TEST_F(PythonOpTest, WarmProcessesImportTheModuleBeforeTheFirstCall) {
  python::PythonOptions o = Options();
  o.warm = 2;
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  pool->Warm(kTestOwner, "sluice_test_import_log", "invert");
  EXPECT_EQ(pool->processes_started(), 2);
  // Both import it with no call made (a generous wait for the event, not a timing).
  for (int i = 0; i < 6000 && Imports(markers_).size() < 2; ++i) usleep(10000);
  EXPECT_EQ(Imports(markers_).size(), 2u);
  EXPECT_EQ(pool->requests(), 0);
  const SmallRecords records;
  for (int g = 0; g < 2; ++g) {
    auto out =
        pool->Call(kTestOwner, "sluice_test_import_log", "invert", 7, records.group[g].columns);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(std::string((*out)[0].bytes()), SmallRecords::InvertedImage(g));
  }
  // Warming again starts nothing and imports nothing more.
  pool->Warm(kTestOwner, "sluice_test_import_log", "invert");
  EXPECT_EQ(pool->processes_started(), 2);
  EXPECT_EQ(Imports(markers_).size(), 2u);
  // A pipeline: building its op starts two processes of its own, which import the module;
  // its two threads use them and no other.
  ExpectAllInverted(RunSpec(absl::StrReplaceAll(
      Spec("invert", 2), {{"module: sluice_test_fns", "module: sluice_test_import_log"}})));
  EXPECT_EQ(pool->processes_started(), 4);
}

// A pipeline built and never run (a worker builds each job's once to check
// its spec) starts no Python process; one that runs starts `warm` at its
// first call.
TEST_F(PythonOpTest, APipelineBuiltButNeverRunStartsNoProcess) {
  python::PythonOptions o = Options();
  o.warm = 2;
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(Spec("invert", 2));
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (int i = 0; i < 3; ++i) {
    auto ex = pl::Executor::Create(*spec, pl::ExecutorOptions{});
    ASSERT_TRUE(ex.ok()) << ex.status();
  }
  EXPECT_EQ(pool->processes_started(), 0);
  ExpectAllInverted(RunSpec(Spec("invert", 2)));
  EXPECT_EQ(pool->processes_started(), 2);
}

// Spare processes (numpy imported, no module loaded) wait for the next
// pipeline: building its op takes them instead of starting processes, each
// spare goes to one owner only, and they are started again when an owner
// retires.
TEST_F(PythonOpTest, SparesServeTheNextPipelineAndNoOther) {
  python::PythonOptions o = Options();
  o.warm = 2;
  o.spares = 2;
  o.spare_refill_delay = absl::InfiniteDuration();  // only when an owner retires
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  EXPECT_EQ(pool->processes_started(), 2);
  EXPECT_EQ(pool->spare_pids().size(), 2u);
  const SmallRecords records;
  const python::PythonPool::Owner a = pool->NewOwner();
  pool->Warm(a, "sluice_test_fns", "calls_so_far");
  EXPECT_EQ(pool->processes_started(), 2);  // the spares, not new processes
  EXPECT_TRUE(pool->spare_pids().empty());
  auto calls = [&](python::PythonPool::Owner owner) {
    auto out = pool->Call(owner, "sluice_test_fns", "calls_so_far", 7, records.group[0].columns);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *(*out)[0].data_as<int64_t>() : int64_t{-1};
  };
  EXPECT_EQ(calls(a), 1);
  EXPECT_EQ(calls(a), 2);
  EXPECT_EQ(pool->processes_started(), 2);
  // No spare is left for another owner before `a` retires: b starts its own.
  const python::PythonPool::Owner b = pool->NewOwner();
  EXPECT_EQ(calls(b), 1);
  EXPECT_EQ(pool->processes_started(), 3);
  // a retires: its processes stop and two new spares start, for c.
  pool->Retire(a);
  EXPECT_EQ(pool->processes_started(), 5);
  EXPECT_EQ(pool->spare_pids().size(), 2u);
  const python::PythonPool::Owner c = pool->NewOwner();
  EXPECT_EQ(calls(c), 1);
  EXPECT_EQ(pool->processes_started(), 5);
  EXPECT_EQ(pool->spare_pids().size(), 1u);
  // A spare that dies before it is taken is dropped (and counted replaced).
  const pid_t spare = pool->spare_pids()[0];
  ASSERT_EQ(kill(spare, SIGKILL), 0);
  siginfo_t ended{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(spare), &ended, WEXITED | WNOWAIT), 0);  // not reaped
  const python::PythonPool::Owner d = pool->NewOwner();
  EXPECT_EQ(calls(d), 1);
  EXPECT_EQ(pool->processes_started(), 6);
  EXPECT_EQ(pool->processes_replaced(), 1);
}

// Spares taken are started again after spare_refill_delay, whether or not
// the pipeline that took them makes calls.
TEST_F(PythonOpTest, SparesTakenStartAgainAfterTheDelay) {
  python::PythonOptions o = Options();
  o.warm = 2;
  o.spares = 2;
  o.spare_refill_delay = absl::ZeroDuration();
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  const std::vector<pid_t> first = pool->spare_pids();
  ASSERT_EQ(first.size(), 2u);
  pool->Warm(pool->NewOwner(), "sluice_test_fns", "calls_so_far");
  // A generous wait for the event, not a timing.
  for (int i = 0; i < 6000 && pool->spare_pids().size() < 2; ++i) usleep(10000);
  const std::vector<pid_t> again = pool->spare_pids();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(pool->processes_started(), 4);
  for (pid_t p : again) EXPECT_THAT(first, Not(Contains(p)));
}

// A process serves one owner (one python op: one pipeline of one job), so
// what a function leaves in its process (module globals, numpy's error
// settings, ...) never reaches another pipeline's calls; a pipeline's
// processes stop when it is gone.
TEST_F(PythonOpTest, WhatAFunctionLeavesInItsProcessReachesNoOtherPipeline) {
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  const python::PythonPool::Owner a = pool->NewOwner();
  const python::PythonPool::Owner b = pool->NewOwner();
  auto calls = [&](python::PythonPool::Owner owner, const std::string& function) {
    auto out = pool->Call(owner, "sluice_test_fns", function, 7, records.group[0].columns);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *(*out)[0].data_as<int64_t>() : int64_t{-1};
  };
  EXPECT_EQ(calls(a, "calls_so_far"), 1);
  EXPECT_EQ(calls(a, "calls_so_far"), 2);
  EXPECT_EQ(calls(b, "calls_so_far"), 1);  // not 3: another process
  // numpy set to raise on a division by zero by one owner's function.
  EXPECT_EQ(calls(a, "numpy_raises_from_now_on"), 0);
  auto raised = pool->Call(a, "sluice_test_fns", "divides_by_zero", 7, records.group[0].columns);
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(raised.status().message(), HasSubstr("FloatingPointError: divide by zero"));
  EXPECT_EQ(calls(b, "divides_by_zero"), 1);
  EXPECT_EQ(pool->processes_started(), 2);
  const std::vector<pid_t> before = pool->idle_pids();
  ASSERT_EQ(before.size(), 2u);
  pool->Retire(a);
  const std::vector<pid_t> after = pool->idle_pids();
  ASSERT_EQ(after.size(), 1u);
  const pid_t retired = after[0] == before[0] ? before[1] : before[0];
  EXPECT_EQ(calls(b, "calls_so_far"), 2);  // b's process, still there
  EXPECT_EQ(pool->processes_started(), 2);
  ExpectGoneSoon(retired, "a retired owner's process still runs");
  // Two runs of one pipeline spec are two owners: the second starts afresh.
  for (int run = 0; run < 2; ++run) {
    const Out out = RunSpec(Spec("calls_so_far_as_label", 1));
    ASSERT_TRUE(out.status.ok()) << out.status;
    for (int g = 0; g < kRecords; ++g) EXPECT_EQ(out.labels.at(g), g + 1) << run << " " << g;
  }
}

// The python ops of one pipeline share its processes: two ops, two threads,
// two processes (not two per op).
TEST_F(PythonOpTest, ThePythonOpsOfOnePipelineShareItsProcesses) {
  python::PythonOptions o = Options();
  o.warm = 2;
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  const std::string yaml = absl::StrReplaceAll(
      Spec("invert", 2), {{"ops: [{python: {module: sluice_test_fns, function: invert}}]",
                           "ops: [{python: {module: sluice_test_fns, function: invert}}, "
                           "{python: {module: sluice_test_fns, function: invert}}]"}});
  ASSERT_NE(yaml, Spec("invert", 2));
  const Out out = RunSpec(yaml);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.deliveries, kRecords);
  for (int g = 0; g < kRecords; ++g) EXPECT_EQ(out.images.at(g), decoded_.at(g)) << g;
  EXPECT_EQ(pool->processes_started(), 2);
}

// A process warmed for one function serves a call of another: the preload's
// answer is read first, and a preload whose import fails costs nothing until
// that function is called, which then fails with the import error.
TEST_F(PythonOpTest, AProcessWarmedForAnotherFunctionServesThisOne) {
  python::PythonOptions o = Options();
  o.warm = 1;
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  pool->Warm(kTestOwner, "no_such_mod", "f");
  auto out = pool->Call(kTestOwner, "sluice_test_fns", "invert", 7, records.group[3].columns);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::string((*out)[0].bytes()), SmallRecords::InvertedImage(3));
  pool->Warm(kTestOwner, "sluice_test_fns", "raises_on_3");
  auto raised =
      pool->Call(kTestOwner, "sluice_test_fns", "raises_on_3", 7, records.group[3].columns);
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(raised.status().message(), HasSubstr("ValueError: bad record 3"));
  auto missing = pool->Call(kTestOwner, "no_such_mod", "f", 7, records.group[3].columns);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("ModuleNotFoundError: No module named 'no_such_mod'"));
  EXPECT_EQ(pool->processes_started(), 1);
  EXPECT_EQ(pool->processes_replaced(), 0);
}

// Where nothing checked the interpreter at start-up (sluice pipeline run), a
// python op whose processes cannot import numpy ends the run with the
// start-up check's message, not as an element's or a module's failure.
TEST_F(PythonOpTest, APipelineWhosePythonCannotImportNumpySaysSo) {
  const std::string no_numpy = PythonWithoutNumpy();
  python::PythonOptions o = Options();
  o.interpreter = no_numpy;
  o.warm = 2;
  python::ConfigurePython(o);
  for (const std::string on_error : {"fail", "skip"}) {
    const Out out = RunSpec(Spec("invert", 2, on_error, kEight));
    EXPECT_EQ(out.status.code(), absl::StatusCode::kFailedPrecondition) << on_error;
    EXPECT_THAT(out.status.message(),
                HasSubstr(absl::StrCat("--allow-python-ops: ", no_numpy,
                                       " cannot run python ops: `import numpy` exited with 1: ")));
    EXPECT_THAT(out.status.message(), HasSubstr("No module named 'numpy'"));
    EXPECT_EQ(out.deliveries, 0) << on_error;
  }
}

// A Python process keeps its heap (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_) instead of
// giving freed images back to the kernel and faulting them in again on the next element; a
// worker started with its own glibc settings passes them on.
TEST_F(PythonOpTest, AProcessKeepsItsHeapUnlessTheWorkerSaysOtherwise) {
  Tensor image = Tensor::Allocate(DType::kUint8, {1, 2, 3});
  Tensor label = Tensor::Allocate(DType::kInt64, {});
  auto faults = [&] {
    auto p = python::PythonProcess::Start(
        {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return int64_t{-1};
    auto out = (*p)->Call("sluice_test_fns", "heap_faults", 1, {&image, &label}, absl::Seconds(60));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *(*out)[1].data_as<int64_t>() : int64_t{-1};
  };
  EXPECT_LE(faults(), 10);
  // glibc's own trim threshold, as a worker's environment may set it: every round faults.
  setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
  EXPECT_GE(faults(), 1000);
  unsetenv("MALLOC_TRIM_THRESHOLD_");
}

// A python op's output has unknown dimensions until it runs: an op that
// needs three channels (color_jitter) may follow it, checked per element.
TEST_F(PythonOpTest, AnOpThatNeedsThreeChannelsMayFollowAPythonOp) {
  const std::string yaml = R"(
seed: 11
source: {synthetic: {num_records: 8, height: 6, width: 5, num_classes: 1000}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map:
      input_columns: [image, label]
      ops: [{python: {module: sluice_test_fns, function: invert}}]
  - map: {input_columns: [image], ops: [{color_jitter: {brightness: 0.5}}]}
)";
  const Out out = RunSpec(yaml);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.deliveries, kRecords);
}

TEST_F(PythonOpTest, WorkersRefusePythonOpsUnlessAllowed) {
  python::ConfigurePython({});
  const Out out = RunSpec(Spec("invert", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status.message(),
              HasSubstr("map[1].ops[0] (Python): python ops are disabled on "
                        "this worker; start sluice-worker (or sluice pipeline "
                        "run) with --allow-python-ops"));
  // The spec itself is sound: a consumer (sluice consume) validates it without Python.
  auto spec = pipeline_spec::ParsePipelineSpec(Spec("invert", 1));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(pl::Validate(*spec).ok()) << pl::Validate(*spec).status();
  // ... and its fields are still checked there.
  spec->mutable_nodes(1)->mutable_map()->mutable_ops(0)->mutable_python()->set_group(-1);
  EXPECT_THAT(pl::Validate(*spec).status().message(), HasSubstr("group must be in [0, 1024]"));
}

TEST_F(PythonOpTest, OnlyModulesOnTheWorkersListMayBeNamed) {
  python::PythonOptions o = Options();
  // A prefix of the module's name is not the module.
  o.modules = {"os", "sluice_test"};
  python::ConfigurePython(o);
  Out out = RunSpec(Spec("invert", 1));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status.message(),
              HasSubstr("map[1].ops[0] (Python): module 'sluice_test_fns' is not one this worker "
                        "runs python ops from (--python-modules os,sluice_test)"));
  o.modules = {"os", "sluice_test_fns"};
  python::ConfigurePython(o);
  ExpectAllInverted(RunSpec(Spec("invert", 1)));
  // A listed module allows its submodules, and only those.
  o.modules = {"team"};
  EXPECT_TRUE(python::ModuleAllowed(o, "team"));
  EXPECT_TRUE(python::ModuleAllowed(o, "team.color.jitter"));
  EXPECT_FALSE(python::ModuleAllowed(o, "teams"));
  EXPECT_FALSE(python::ModuleAllowed(o, "tea"));
  EXPECT_FALSE(python::ModuleAllowed(o, "os"));
  EXPECT_TRUE(python::ModuleAllowed(Options(), "os"));  // no list: any module
}

TEST_F(PythonOpTest, NamesThatAreNotPythonIdentifiersAreRefused) {
  std::string yaml = absl::StrReplaceAll(Spec("invert", 1),
                                         {{"module: sluice_test_fns", "module: \"os; import x\""}});
  Out out = RunSpec(yaml);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("module must be a dotted Python module name, got "
                                              "'os; import x'"));
  yaml = absl::StrReplaceAll(Spec("invert", 1), {{"function: invert", "function: \"a.b\""}});
  out = RunSpec(yaml);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("function must be a Python identifier, got 'a.b'"));
}

// Groups (`group: N`): several elements per request, the same bytes, errors
// and recovery per element as one element per request. These pipelines read
// only the label, so they run as one stage fed straight from the record
// order: with one thread, a group is exactly the next N records.

// source [label] → python `fn` on [label], group `group`, `threads` threads.
std::string LabelSpec(const std::string& fn, int group, int threads = 1,
                      const std::string& on_error = "fail") {
  return absl::StrCat(R"(
seed: 11
on_error: )",
                      on_error, R"(
source: {synthetic: {num_records: 8, height: 6, width: 5, num_classes: 1000}, columns: [label]}
nodes:
  - map:
      input_columns: [label]
      ops: [{python: {module: sluice_test_fns, function: )",
                      fn, ", group: ", group, R"(}}]
      num_parallel_workers: )",
                      threads, "\n");
}

struct LabelOut {
  std::map<uint64_t, int64_t> values;  // global index → the function's value
  int deliveries = 0;
  absl::Status status;
  pl::PipelineStats stats;
};

LabelOut RunLabels(const std::string& yaml) {
  LabelOut out;
  out.status = RunEpoch(
      yaml,
      [&](const pl::Element& e) {
        ++out.deliveries;
        out.values[e.global_indices[0]] = *e.columns[0].data_as<int64_t>();
      },
      &out.stats);
  return out;
}

// Every record except `missing` once, as label + 1000.
void ExpectPlus1000(const LabelOut& out, int missing = -1) {
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.deliveries, missing < 0 ? kRecords : kRecords - 1);
  for (int g = 0; g < kRecords; ++g) {
    if (g == missing) {
      EXPECT_EQ(out.values.count(g), 0u);
      continue;
    }
    ASSERT_EQ(out.values.count(g), 1u) << g;
    EXPECT_EQ(out.values.at(g), g + 1000) << g;
  }
}

TEST_F(PythonOpTest, AGroupedRunIsByteIdenticalToThePerElementRun) {
  auto pool = python::ConfiguredPythonPool();
  const LabelOut alone = RunLabels(LabelSpec("label_draw", 1));
  ASSERT_TRUE(alone.status.ok()) << alone.status;
  EXPECT_EQ(pool->requests(), kRecords);
  // Each value is the element's own generator's first draw (seeded as
  // TheGeneratorIsSeededFromSeedEpochAndRecord checks): all different.
  std::set<int64_t> distinct;
  for (const auto& [g, v] : alone.values) distinct.insert(v);
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kRecords));
  const LabelOut grouped = RunLabels(LabelSpec("label_draw", 8));
  ASSERT_TRUE(grouped.status.ok()) << grouped.status;
  EXPECT_EQ(pool->requests(), kRecords + 1);  // the eight in one request
  EXPECT_EQ(grouped.values, alone.values);
  for (int threads : {2, 3}) {
    const LabelOut more = RunLabels(LabelSpec("label_draw", 3, threads));
    EXPECT_EQ(more.values, alone.values) << threads;
  }
  // Images through a grouped two-stage pipeline: the same exact bytes.
  const Out one = RunSpec(Spec("draws", 1, "fail", absl::StrCat(kInt32, kOne)));
  const Out eight = RunSpec(Spec("draws", 2, "fail", absl::StrCat(kInt32, kEight)));
  ASSERT_TRUE(one.status.ok()) << one.status;
  ASSERT_TRUE(eight.status.ok()) << eight.status;
  EXPECT_EQ(eight.images, one.images);
  EXPECT_EQ(eight.images.size(), static_cast<size_t>(kRecords));
  ExpectAllInverted(RunSpec(Spec("invert", 2, "fail", kEight)));
}

// One request for the eight elements; the exception of element 3 is its own.
TEST_F(PythonOpTest, APoolGroupCallsTheFunctionOncePerElementInOneRequest) {
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  auto out = pool->CallGroup(kTestOwner, "sluice_test_fns", "raises_on_3", records.group);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(pool->requests(), 1);
  ASSERT_EQ(out->size(), static_cast<size_t>(kRecords));
  for (int g = 0; g < kRecords; ++g) {
    const auto& r = (*out)[g];
    if (g == 3) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(r.status().message(), HasSubstr("ValueError: bad record 3"));
      continue;
    }
    ASSERT_TRUE(r.ok()) << g << ": " << r.status();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ(std::string((*r)[0].bytes()), SmallRecords::InvertedImage(g)) << g;
    EXPECT_EQ(*(*r)[1].data_as<int64_t>(), g);
  }
}

// One process runs the eight elements of a group: each element's draws are
// those of numpy's own fresh Generator(PCG64(seed)) (computed here by numpy
// outside sluice), whatever the element before it drew or left buffered, and so
// are the draws of child generators spawned from its SeedSequence (a reused
// bit generator re-seeded per element carried another seed sequence, whose
// children depended on what the process ran before).
TEST_F(PythonOpTest, EachElementOfAGroupDrawsNumpysFreshGeneratorsStream) {
  for (const char* function : {"mixed_draws", "spawned_draws"}) {
    SCOPED_TRACE(function);
    ExpectNumpysFreshStreams(function);
  }
}

void PythonOpTest::ExpectNumpysFreshStreams(const std::string& function) {
  auto pool = python::ConfiguredPythonPool();
  std::vector<Tensor> labels;
  for (int g = 0; g < kRecords; ++g) {
    labels.push_back(Tensor::Allocate(DType::kInt64, {}));
    *labels.back().data_as<int64_t>() = g;
  }
  std::vector<python::CallInput> group;
  const std::vector<uint64_t> seeds = {0, 1, 7, 4294967296, 12345678901234567, 99, 100, ~0ull};
  for (int g = 0; g < kRecords; ++g) group.push_back({seeds[g], {&labels[g]}});
  const auto before = pool->requests();
  auto out = pool->CallGroup(kTestOwner, "sluice_test_fns", function, group);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(pool->requests(), before + 1);  // one group
  ASSERT_EQ(out->size(), static_cast<size_t>(kRecords));
  for (int g = 0; g < kRecords; ++g) {
    const std::string cmd = absl::StrCat(
        SLUICE_PYTHON_EXECUTABLE, " -c 'import sys; sys.path.insert(0, \"", SLUICE_TEST_PYTHON_DIR,
        "\"); import numpy as np, sluice_test_fns as f; sys.stdout.buffer.write(f.", function,
        "(0, np.random.Generator(np.random.PCG64(", seeds[g], "))).tobytes())'");
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[64];
    ASSERT_EQ(fread(buf, 1, sizeof(buf), p), sizeof(buf));
    pclose(p);
    ASSERT_TRUE((*out)[g].ok()) << g << ": " << (*out)[g].status();
    EXPECT_EQ(std::string((*(*out)[g])[0].bytes()), std::string(buf, sizeof(buf))) << g;
  }
}

TEST_F(PythonOpTest, AnExceptionInAGroupFailsOnlyItsElement) {
  auto pool = python::ConfiguredPythonPool();
  const LabelOut out = RunLabels(LabelSpec("label_raises_on_3", 8));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out.status.message(), HasSubstr("record 3: map[0].ops[0] (Python)"));
  EXPECT_THAT(out.status.message(), HasSubstr("ValueError: bad record 3"));
  const LabelOut skipped = RunLabels(LabelSpec("label_raises_on_3", 8, 1, "skip"));
  ExpectPlus1000(skipped, /*missing=*/3);
  EXPECT_EQ(skipped.stats.skipped, 1u);
  EXPECT_EQ(pool->requests(), 2);  // one group per run
}

// The process dies in the middle of the group: a fresh process redoes the
// eight elements one by one (record 3 succeeds the second time).
TEST_F(PythonOpTest, AProcessThatExitsDuringAGroupIsReplacedAndTheGroupRedone) {
  auto pool = python::ConfiguredPythonPool();
  ExpectPlus1000(RunLabels(LabelSpec("label_exits_once_on_3", 8)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  EXPECT_EQ(pool->requests(), 1 + kRecords);
}

TEST_F(PythonOpTest, AProcessThatSegfaultsDuringAGroupIsReplacedAndTheGroupRedone) {
  auto pool = python::ConfiguredPythonPool();
  ExpectPlus1000(RunLabels(LabelSpec("label_segfaults_once_on_5", 8)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  EXPECT_EQ(pool->requests(), 1 + kRecords);
  // With images, two stages and two threads: every record once, exact bytes.
  ExpectAllInverted(RunSpec(Spec("segfaults_once_on_5", 2, "fail", kEight)));
}

// SIGKILL from outside (what the OOM killer sends) in the middle of a group of
// eight: the process is replaced and each element of the group is redone
// exactly once, element by element. The function logs every call: records
// 0-3 ran in the group (3 killed it) and once more in the redo, 4-7 only in
// the redo; each record is delivered once.
TEST_F(PythonOpTest, ASigkillDuringAGroupRedoesEachOfItsElementsExactlyOnce) {
  auto pool = python::ConfiguredPythonPool();
  ExpectPlus1000(RunLabels(LabelSpec("label_sigkills_once_on_3_logged", 8)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  EXPECT_EQ(pool->requests(), 1 + kRecords);
  for (int g = 0; g < kRecords; ++g) {
    std::ifstream calls(markers_.Join(absl::StrCat("calls-", g)));
    std::string text((std::istreambuf_iterator<char>(calls)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, g <= 3 ? "call\ncall\n" : "call\n") << g;
  }
}

// The group's deadline is the timeout times its elements (2 x 1 s here).
TEST_F(PythonOpTest, AHangDuringAGroupIsKilledAndTheGroupRedone) {
  python::PythonOptions o = Options();
  o.timeout = absl::Seconds(1);
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  ExpectPlus1000(RunLabels(LabelSpec("label_hangs_once_on_2", 2)));
  EXPECT_EQ(pool->processes_replaced(), 1);
  // Groups {0,1} {2,3} {4,5} {6,7}, the second redone as two requests.
  EXPECT_EQ(pool->requests(), 4 + 2);
}

// The group dies once; element by element, record 4 kills three more
// processes and is skipped alone.
TEST_F(PythonOpTest, AnElementThatAlwaysKillsItsProcessInAGroupFailsAlone) {
  auto pool = python::ConfiguredPythonPool();
  const LabelOut out = RunLabels(LabelSpec("label_always_exits_on_4", 8, 1, "skip"));
  ExpectPlus1000(out, /*missing=*/4);
  EXPECT_EQ(out.stats.skipped, 1u);
  EXPECT_EQ(pool->processes_replaced(), 4);
}

// When a group's process dies, its elements are redone one by one. Under on_error: fail the
// first failed element ends the run, so the redo stops there: record 4 (which kills every
// process) is tried three times and records 5..7 are not computed. Without first_error_ends
// (on_error: skip) every element is computed.
TEST_F(PythonOpTest, UnderFailTheRedoOfAGroupStopsAtItsFirstFailedElement) {
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  auto out = pool->CallGroup(kTestOwner, "sluice_test_fns", "always_exits_on_4", records.group,
                             /*first_error_ends=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), static_cast<size_t>(kRecords));
  for (int g = 0; g < 4; ++g) {
    ASSERT_TRUE((*out)[g].ok()) << g << ": " << (*out)[g].status();
    EXPECT_EQ(std::string((*(*out)[g])[0].bytes()), SmallRecords::InvertedImage(g)) << g;
  }
  EXPECT_EQ((*out)[4].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT((*out)[4].status().message(), HasSubstr("died 3 times on this element"));
  for (int g = 5; g < kRecords; ++g) {
    EXPECT_EQ((*out)[g].status().code(), absl::StatusCode::kAborted) << g;
    EXPECT_THAT((*out)[g].status().message(),
                HasSubstr("not computed: an element before it in its group failed"))
        << g;
  }
  // The group (1 request), records 0..3 (4), record 4 three times (3).
  EXPECT_EQ(pool->requests(), 1 + 4 + 3);
  EXPECT_EQ(pool->processes_replaced(), 1 + 3);

  auto all = pool->CallGroup(kTestOwner, "sluice_test_fns", "always_exits_on_4", records.group);
  ASSERT_TRUE(all.ok()) << all.status();
  for (int g = 5; g < kRecords; ++g) {
    ASSERT_TRUE((*all)[g].ok()) << g << ": " << (*all)[g].status();
    EXPECT_EQ(std::string((*(*all)[g])[0].bytes()), SmallRecords::InvertedImage(g)) << g;
  }
  // Then the group, records 0..3 and 5..7 (7), record 4 three times.
  EXPECT_EQ(pool->requests(), 8 + 1 + 7 + 3);
}

// The run under on_error: fail ends with the failed element's own error (not the "not
// computed" of the elements after it), after one element's attempts.
TEST_F(PythonOpTest, UnderFailARunEndsWithTheFirstFailedElementOfItsGroup) {
  auto pool = python::ConfiguredPythonPool();
  const LabelOut out = RunLabels(LabelSpec("label_always_exits_on_4", 8));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss) << out.status;
  EXPECT_THAT(out.status.message(), HasSubstr("record 4: "));
  EXPECT_THAT(out.status.message(), HasSubstr("died 3 times on this element"));
  EXPECT_EQ(pool->requests(), 1 + 4 + 3);
}

TEST_F(PythonOpTest, AGroupOutOfRangeIsRefused) {
  const Out out = RunSpec(Spec("invert", 1, "fail", ", group: -1"));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("group must be in [0, 1024] (0: 8), got -1"));
}

// A grouped python op after a cache node (docs/cache.md). The cache is an
// in-memory ElementCache: what the cache step offered (the capture of epoch
// 1) and what a lookup answers (a later epoch). Before a cache node a python op
// is refused: it draws new randomness each epoch.

std::vector<Tensor> CloneAll(const std::vector<Tensor>& columns) {
  std::vector<Tensor> v;
  for (const Tensor& t : columns) v.push_back(t.Clone());
  return v;
}

// Thread-safe: the executor's stage threads call it.
class MemoryCache : public pl::ElementCache {
 public:
  // Lookups of `global` answer kHit with `columns` from now on.
  void Put(uint64_t global, std::vector<Tensor> columns) {
    absl::MutexLock lock(&mu_);
    stored_[global] = std::move(columns);
  }
  void SetAbsent(uint64_t global) {
    absl::MutexLock lock(&mu_);
    absent_.insert(global);
  }
  absl::StatusOr<Found> Lookup(uint64_t global, std::vector<Tensor>* columns) override {
    absl::MutexLock lock(&mu_);
    if (absent_.count(global) > 0) return Found::kAbsent;
    auto it = stored_.find(global);
    if (it == stored_.end()) return Found::kMiss;
    ++hits_;
    *columns = CloneAll(it->second);
    return Found::kHit;
  }
  void Offer(uint64_t global, const std::vector<Tensor>& columns) override {
    absl::MutexLock lock(&mu_);
    offered_[global] = CloneAll(columns);
  }
  // What the cache step offered, by global index.
  std::map<uint64_t, std::vector<Tensor>> offered() const {
    absl::MutexLock lock(&mu_);
    std::map<uint64_t, std::vector<Tensor>> v;
    for (const auto& [g, columns] : offered_) v[g] = CloneAll(columns);
    return v;
  }
  int hits() const {
    absl::MutexLock lock(&mu_);
    return hits_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::vector<Tensor>> stored_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> absent_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<Tensor>> offered_ ABSL_GUARDED_BY(mu_);
  int hits_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs `epoch` of `yaml` with `cache`; the first column as bytes and the
// second as an int64, by global index.
struct CachedOut {
  std::map<uint64_t, std::string> first;
  std::map<uint64_t, int64_t> second;
  absl::Status status;
  std::string plan;
};

CachedOut RunCached(const std::string& yaml, std::shared_ptr<MemoryCache> cache, uint64_t epoch) {
  CachedOut out;
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  pl::ExecutorOptions eo;
  eo.cpu_budget = 4;
  eo.autotune = false;
  eo.cache = std::move(cache);
  auto ex = pl::Executor::Create(*spec, eo);
  if (!ex.ok()) {
    out.status = ex.status();
    return out;
  }
  auto outputs = testonly::RunSplit(**ex, (*ex)->EpochOrder(epoch), epoch);
  out.status = outputs.status();
  if (outputs.ok()) {
    for (const pl::Element& e : *outputs) {
      const uint64_t g = e.global_indices[0];
      EXPECT_EQ(out.first.count(g), 0u) << "twice: " << g;
      out.first[g] = std::string(e.columns[0].bytes());
      if (e.columns.size() > 1) out.second[g] = *e.columns[1].data_as<int64_t>();
    }
  }
  out.plan = (*ex)->stats().plan;
  return out;
}

// decode → cache → python `fn` on [image, label], group `group`, 2 threads:
// two stages, the python op's groups mix nothing but computed-or-cached
// elements of the stage before.
std::string ImageCacheSpec(int group) {
  return absl::StrCat(R"(
seed: 11
source: {synthetic: {num_records: 8, height: 6, width: 5, num_classes: 1000}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - cache: {name: eval}
  - map:
      input_columns: [image, label]
      ops: [{python: {module: sluice_test_fns, function: invert_and_draw, group: )",
                      group, R"(}}]
      num_parallel_workers: 2
)");
}

TEST_F(PythonOpTest, AGroupedOpAfterACacheIsByteIdenticalInTheCaptureAndFromTheCache) {
  auto run = [](int group, const std::shared_ptr<MemoryCache>& cache, uint64_t epoch) {
    CachedOut out = RunCached(ImageCacheSpec(group), cache, epoch);
    EXPECT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.first.size(), static_cast<size_t>(kRecords)) << group << " " << epoch;
    return out;
  };
  // Epoch 1 (index 0) writes the cache: the decoded images, each offered once.
  auto capture_one = std::make_shared<MemoryCache>();
  auto capture_eight = std::make_shared<MemoryCache>();
  const CachedOut one = run(1, capture_one, 0);
  const CachedOut eight = run(8, capture_eight, 0);
  EXPECT_EQ(eight.first, one.first);
  EXPECT_EQ(eight.second, one.second);
  for (int g = 0; g < kRecords; ++g) {
    EXPECT_EQ(eight.first.at(g), Inverted(decoded_.at(g))) << g;
  }
  for (const auto* cache : {capture_one.get(), capture_eight.get()}) {
    const auto offered = cache->offered();
    ASSERT_EQ(offered.size(), static_cast<size_t>(kRecords));
    for (const auto& [g, cols] : offered) {
      EXPECT_EQ(cols[0].bytes(), decoded_.at(g)) << g;
      EXPECT_EQ(*cols[1].data_as<int64_t>(), static_cast<int64_t>(g)) << g;
    }
  }
  // Epoch 2 (index 1) reads it: every element a hit, nothing offered again;
  // the python op draws epoch 2's numbers.
  auto replay = [&](const std::shared_ptr<MemoryCache>& from) {
    auto cache = std::make_shared<MemoryCache>();
    for (auto& [g, cols] : from->offered()) cache->Put(g, std::move(cols));
    return cache;
  };
  auto read_one = replay(capture_eight);
  auto read_eight = replay(capture_eight);
  const CachedOut one2 = run(1, read_one, 1);
  const CachedOut eight2 = run(8, read_eight, 1);
  EXPECT_EQ(read_one->hits(), kRecords);
  EXPECT_EQ(read_eight->hits(), kRecords);
  EXPECT_TRUE(read_eight->offered().empty());
  EXPECT_EQ(eight2.first, one2.first);
  EXPECT_EQ(eight2.second, one2.second);
  EXPECT_EQ(eight2.first, eight.first);  // the same images
  for (int g = 0; g < kRecords; ++g) {
    EXPECT_NE(eight2.second.at(g), eight.second.at(g)) << g;  // new draws
  }
}

// source [label] → cache → python (label + 1000), group `group`, 1 thread: one
// stage, whose groups (the next `group` records) mix elements read from the
// cache and elements computed.
std::string LabelCacheSpec(int group) {
  return absl::StrCat(R"(
seed: 11
source: {synthetic: {num_records: 8, height: 6, width: 5, num_classes: 1000}, columns: [label]}
nodes:
  - cache: {name: eval}
  - map:
      input_columns: [label]
      ops: [{python: {module: sluice_test_fns, function: label_plus_1000, group: )",
                      group, "}}]\n      num_parallel_workers: 1\n");
}

TEST_F(PythonOpTest, AGroupMixingCachedAndComputedElementsTreatsEachAsAlone) {
  for (int group : {1, 8}) {
    // Records 0, 2, 4 cached with label 100 + record; record 6 absent from
    // its cached split; the others computed (and offered).
    auto cache = std::make_shared<MemoryCache>();
    for (int g : {0, 2, 4}) {
      std::vector<Tensor> cols;
      cols.push_back(Tensor::Scalar<int64_t>(100 + g));
      cache->Put(g, std::move(cols));
    }
    cache->SetAbsent(6);
    const CachedOut out = RunCached(LabelCacheSpec(group), cache, 0);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.plan, "source+map[0][Read cache(eval) map[0]{Python}]") << group;
    std::map<uint64_t, int64_t> values;
    for (const auto& [g, bytes] : out.first) {
      int64_t v = 0;
      ASSERT_EQ(bytes.size(), sizeof(v));
      memcpy(&v, bytes.data(), sizeof(v));
      values[g] = v;
    }
    const std::map<uint64_t, int64_t> expected = {{0, 1100}, {1, 1001}, {2, 1102}, {3, 1003},
                                                  {4, 1104}, {5, 1005}, {7, 1007}};
    EXPECT_EQ(values, expected) << group;
    const auto offered = cache->offered();
    std::map<uint64_t, int64_t> offered_labels;
    for (const auto& [g, cols] : offered) offered_labels[g] = *cols[0].data_as<int64_t>();
    const std::map<uint64_t, int64_t> computed = {{1, 1}, {3, 3}, {5, 5}, {7, 7}};
    EXPECT_EQ(offered_labels, computed) << group;
    EXPECT_EQ(cache->hits(), 3) << group;
  }
}

TEST_F(PythonOpTest, APythonOpBeforeACacheIsRefused) {
  const CachedOut out = RunCached(R"(
seed: 11
source: {synthetic: {num_records: 8, height: 6, width: 5, num_classes: 1000}, columns: [label]}
nodes:
  - map:
      input_columns: [label]
      ops: [{python: {module: sluice_test_fns, function: label_plus_1000, group: 8}}]
  - cache: {name: eval}
)",
                                  std::make_shared<MemoryCache>(), 0);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status.message(), HasSubstr("cache 'eval' comes after map[0].ops[0] (Python)"));
}

// A process that died while idle (the OOM killer picks Python processes
// first) is replaced when next used, even for a function it has not imported
// yet: its death is not the import's fault.
TEST_F(PythonOpTest, AProcessThatDiedIdleIsReplacedNotBlamedOnTheNextImport) {
  // One attempt per element: a dead idle process handed out would fail it.
  python::PythonOptions o = Options();
  o.max_attempts = 1;
  python::ConfigurePython(o);
  auto pool = python::ConfiguredPythonPool();
  const SmallRecords records;
  auto inverted = pool->Call(kTestOwner, "sluice_test_fns", "invert", 7, records.group[2].columns);
  ASSERT_TRUE(inverted.ok()) << inverted.status();
  EXPECT_EQ(std::string((*inverted)[0].bytes()), SmallRecords::InvertedImage(2));
  std::vector<pid_t> idle = pool->idle_pids();
  ASSERT_EQ(idle.size(), 1u);
  for (pid_t pid : idle) {
    // The runner's guardian, our child, ends once it has.
    pid_t guardian = 0;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    ASSERT_TRUE(std::istringstream(text.substr(text.rfind(')') + 4)) >> guardian) << text;
    kill(pid, SIGKILL);
    siginfo_t info{};
    ASSERT_EQ(waitid(P_PID, guardian, &info, WEXITED | WNOWAIT), 0);
  }
  auto counted =
      pool->Call(kTestOwner, "sluice_test_fns", "calls_so_far", 7, records.group[2].columns);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(*(*counted)[0].data_as<int64_t>(), 1);  // on a fresh process
  EXPECT_EQ(pool->processes_replaced(), 1);
  EXPECT_EQ(pool->processes_started(), 2);
}

// Within a group each call has the timeout from the end of the one before
// (the runner's progress reports), not the timeout times the group's size: a
// hang in call 4 of 8 is seen 1 s after call 3 ended, and the error says where.
TEST_F(PythonOpTest, AHangInAGroupIsSeenAfterOneTimeoutNotOnePerElement) {
  auto p = python::PythonProcess::Start(
      {.interpreter = SLUICE_PYTHON_EXECUTABLE, .python_path = {SLUICE_TEST_PYTHON_DIR}});
  ASSERT_TRUE(p.ok()) << p.status();
  const SmallRecords records;
  auto out =
      (*p)->CallGroup("sluice_test_fns", "slow_then_hangs_on_3", records.group, absl::Seconds(1));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(out.status().message(),
              HasSubstr("did not answer within 1s (call 4 of a group of 8); killed it"));
  EXPECT_FALSE((*p)->alive());
}

}  // namespace
}  // namespace sluice::data_worker
