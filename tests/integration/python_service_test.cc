// The python op through the service: a real dispatcher and sluice-worker
// processes started with --allow-python-ops and --python-path, a consumer
// through the client library. The user module is
// tests/data_worker/python/sluice_test_fns.py.
//   - Every record arrives once per epoch with exactly the bytes the in-process
//     executor computes (the generator depends on seed, epoch and record only),
//     also when a Python process exits in the middle of the job, is killed
//     with SIGKILL in the middle of a group, or hangs past
//     --python-op-timeout.
//   - An exception ends the job with the Python traceback in the consumer's
//     error.
//   - A worker without --allow-python-ops refuses the job, saying so.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/pipeline_spec/parse.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/python/python_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/executor_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRecords = 32;
constexpr int kEpochs = 2;
constexpr uint64_t kJobSeed = 13;

using ::sluice::testing::BinDir;

// Decode, then `fn` on [image, label] (label = record; `extra` adds fields to
// the python op), then a random flip in C++ after it, batches of 4.
proto::Pipeline MakePipeline(const std::string& fn, const std::string& extra = "") {
  auto p = pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(R"(
seed: 3
source: {synthetic: {num_records: 32, height: 12, width: 10, num_classes: 1000}, columns: [image, label]}
nodes:
  - shuffle: {seed: 4}
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map: {input_columns: [image, label], ops: [{python: {module: sluice_test_fns, function: FN EXTRA}}]}
  - map: {input_columns: [image], ops: [{random_horizontal_flip: {}}]}
  - batch: {size: 4}
)",
                                                                {{"FN", fn}, {" EXTRA", extra}}));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.value_or(proto::Pipeline());
}

struct Batch {
  uint64_t epoch = 0;
  std::vector<uint64_t> indices;
  std::string image;
};

class PythonServiceTest : public ::testing::Test {
 protected:
  void StartCluster(bool allow, const std::string& timeout = "20s") {
    setenv("SLUICE_TEST_MARKERS", markers_.path().c_str(), 1);
    std::vector<std::string> flags = {"--python-path", SLUICE_TEST_PYTHON_DIR,
                                      "--python-op-timeout", timeout};
    if (allow) flags.push_back("--allow-python-ops");
    auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                               .workers = 2,
                                               .data_roots = {data_.path()},
                                               .work_dir = data_.Join("cluster"),
                                               .worker_threads = 2,
                                               .log_level = "info",
                                               .heartbeat_interval = absl::Milliseconds(100),
                                               .worker_timeout = absl::Seconds(5),
                                               .extra_worker_flags = flags});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    auto client = DataServiceClient::Create({.dispatcher_address = cluster_->dispatcher_address(),
                                             .connect_timeout = absl::Seconds(5),
                                             .heartbeat_interval = absl::Milliseconds(100)});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // Reads the whole job; the first error, if any.
  absl::Status Read(const proto::Pipeline& pipeline, std::vector<Batch>* out) {
    auto it = client_->Open({.job_name = "python",
                             .pipeline = pipeline,
                             .seed = kJobSeed,
                             .num_epochs = kEpochs,
                             .num_consumers = 1,
                             .consumer_index = 0,
                             .split_size = 8});
    if (!it.ok()) return it.status();
    while (true) {
      auto batch = (*it)->GetNext();
      if (!batch.ok()) return batch.status();
      if (!batch->has_value()) return absl::OkStatus();
      Batch b{.epoch = (*batch)->epoch, .indices = (*batch)->global_indices};
      for (const Column& c : (*batch)->columns) {
        if (c.name == "image") b.image = std::string(c.bytes());
      }
      out->push_back(std::move(b));
    }
  }

  TempDir data_;
  TempDir markers_;
  std::unique_ptr<tools::LocalCluster> cluster_;
  std::unique_ptr<DataServiceClient> client_;
};

// Every record of every epoch once in `got`, each batch with the bytes the
// in-process executor computes for its records.
void ExpectEveryRecordOnceWithTheExecutorsBytes(const proto::Pipeline& pipeline,
                                                const std::vector<Batch>& got) {
  std::map<uint64_t, std::vector<int>> counts;
  for (const Batch& b : got) {
    auto& c = counts[b.epoch];
    c.resize(kRecords);
    for (uint64_t i : b.indices) ++c.at(i);
  }
  ASSERT_EQ(counts.size(), static_cast<size_t>(kEpochs));
  for (const auto& [epoch, c] : counts) {
    for (int i = 0; i < kRecords; ++i) {
      EXPECT_EQ(c[i], 1) << "epoch " << epoch << " record " << i;
    }
  }
  data_worker::python::PythonOptions o;
  o.allow = true;
  o.python_path = {SLUICE_TEST_PYTHON_DIR};
  data_worker::python::ConfigurePython(o);
  auto ex =
      data_worker::pipeline::Executor::Create(pipeline, {.cpu_budget = 1, .job_seed = kJobSeed});
  ASSERT_TRUE(ex.ok()) << ex.status();
  for (const Batch& b : got) {
    auto want = testonly::RunSplit(**ex, b.indices, b.epoch);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_FALSE(want->empty());
    const data_worker::Tensor& image = want->front().columns[0];
    EXPECT_EQ(b.image, std::string(image.bytes().data(), image.num_bytes()))
        << "epoch " << b.epoch << " first record " << b.indices[0];
  }
}

TEST_F(PythonServiceTest, EveryRecordOnceWithTheExecutorsBytesDespiteACrash) {
  StartCluster(/*allow=*/true);
  const proto::Pipeline pipeline = MakePipeline("exits_once_on_3");
  std::vector<Batch> got;
  ASSERT_TRUE(Read(pipeline, &got).ok());
  // The process that exited on record 3 left its marker: it did happen.
  EXPECT_TRUE(std::ifstream(markers_.Join("exit-3")).good());
  ExpectEveryRecordOnceWithTheExecutorsBytes(pipeline, got);
}

// The OOM killer's way: SIGKILL from outside, in the middle of a group of 8 in
// a real worker. The group is redone on a fresh process; nothing is lost or
// delivered twice.
TEST_F(PythonServiceTest, ASigkillInTheMiddleOfAGroupLosesAndDuplicatesNothing) {
  StartCluster(/*allow=*/true);
  const proto::Pipeline pipeline = MakePipeline("sigkills_once_on_3", ", group: 8");
  std::vector<Batch> got;
  const absl::Status s = Read(pipeline, &got);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(std::ifstream(markers_.Join("sigkill-3")).good());
  ExpectEveryRecordOnceWithTheExecutorsBytes(pipeline, got);
}

// A function that hangs past the worker's --python-op-timeout (1 s; a group
// of 2 waits 2 s) is killed and its group redone.
TEST_F(PythonServiceTest, AHangPastThePythonOpTimeoutIsKilledAndRedone) {
  StartCluster(/*allow=*/true, /*timeout=*/"1s");
  const proto::Pipeline pipeline = MakePipeline("hangs_once_on_2", ", group: 2");
  std::vector<Batch> got;
  const absl::Status s = Read(pipeline, &got);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(std::ifstream(markers_.Join("hang-2")).good());
  ExpectEveryRecordOnceWithTheExecutorsBytes(pipeline, got);
}

TEST_F(PythonServiceTest, AnExceptionReachesTheConsumerWithItsTraceback) {
  StartCluster(/*allow=*/true);
  std::vector<Batch> got;
  const absl::Status s = Read(MakePipeline("raises_on_3"), &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("record 3"));
  EXPECT_THAT(s.message(), HasSubstr("Traceback (most recent call last)"));
  EXPECT_THAT(s.message(), HasSubstr("ValueError: bad record 3"));
}

// A traceback of 100 KB (a long message, 50 frames deep) still reaches the
// consumer, shortened in the middle: its start and its last lines.
TEST_F(PythonServiceTest, AHugeTracebackReachesTheConsumerShortened) {
  StartCluster(/*allow=*/true);
  std::vector<Batch> got;
  const absl::Status s = Read(MakePipeline("raises_long_on_3"), &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s.code();
  EXPECT_THAT(s.message(), HasSubstr("record 3"));
  EXPECT_THAT(s.message(), HasSubstr("Traceback (most recent call last)"));
  EXPECT_THAT(s.message(), HasSubstr("x end of record 3"));
  EXPECT_LT(s.message().size(), 8000u);
}

TEST_F(PythonServiceTest, WorkersWithoutAllowPythonOpsRefuseTheJob) {
  StartCluster(/*allow=*/false);
  std::vector<Batch> got;
  const absl::Status s = Read(MakePipeline("invert"), &got);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("--allow-python-ops")) << s;
  EXPECT_TRUE(got.empty());
}

}  // namespace
}  // namespace sluice
