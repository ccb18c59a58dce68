// The service end to end: a dispatcher and workers as real processes
// (LocalCluster), consumers through the client library, exact record ids
// checked per epoch.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/pipeline/spec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"
#include "proto/dispatcher.grpc.pb.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/executor_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRecords = 480;  // 3 shards; 12 splits of 40 records; batches of 8
constexpr int kBatch = 8;
constexpr int kSplit = 40;
constexpr uint64_t kJobSeed = 11;

using ::sluice::testing::BinDir;
using ::sluice::testing::Received;

// Small JPEGs; label = index % 10. The key column pads every record to the same
// 2035 encoded bytes, so the shard limit cuts exactly 160 records per shard: 3
// shards of 4 whole splits.
void WriteDataset(const std::string& dir) {
  record::Manifest manifest;
  testing::WriteJpegDataset(
      dir,
      {.records = kRecords, .shard_size_bytes = 332000, .image = testing::DiscJpeg, .pad_to = 2000},
      &manifest);
  ASSERT_EQ(manifest.shards.size(), 3u);
  for (const auto& shard : manifest.shards) ASSERT_EQ(shard.records, 160u);
}

// Decode → Resize 16 → (optional sleep per element) → HWC2CHW, batches of 8.
proto::Pipeline MakePipeline(const std::string& dataset, int sleep_micros = 0,
                             const std::string& extra_op = "") {
  std::string yaml = absl::StrCat(
      R"(
seed: 3
source:
  dataset: {path: )",
      dataset, R"(}
  columns: [image, label]
nodes:
  - shuffle: {seed: 3}
  - map:
      input_columns: [image]
      ops:
        - decode: {}
        - resize: {height: 16, width: 16}
)",
      sleep_micros > 0 ? absl::StrCat("        - sleep: {micros: ", sleep_micros, "}\n") : "",
      extra_op, R"(        - hwc2chw: {}
  - batch: {size: )",
      kBatch, R"(, drop_remainder: false}
)");
  auto pipeline = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status() << "\n" << yaml;
  return pipeline.value_or(proto::Pipeline());
}

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    WriteDataset(data_->Join("ds"));
  }
  static void TearDownTestSuite() { delete data_; }

  std::unique_ptr<tools::LocalCluster> StartCluster(int workers,
                                                    std::vector<std::string> worker_flags = {}) {
    auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                               .workers = workers,
                                               .data_roots = {data_->path()},
                                               .work_dir = tmp_.Join(absl::StrCat("c", ++n_)),
                                               .worker_threads = 1,
                                               .log_level = "info",
                                               .heartbeat_interval = absl::Milliseconds(100),
                                               .worker_timeout = absl::Seconds(1),
                                               .extra_worker_flags = worker_flags});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? *std::move(cluster) : nullptr;
  }

  static std::unique_ptr<DataServiceClient> Connect(const std::string& address,
                                                    int prefetch_batches = 16) {
    auto client = DataServiceClient::Create({.dispatcher_address = address,
                                             .connect_timeout = absl::Seconds(5),
                                             .heartbeat_interval = absl::Milliseconds(100),
                                             .prefetch_batches = prefetch_batches});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static Received Consume(const std::string& address, JobOptions job,
                          const std::function<void(int batches)>& after_batch = nullptr) {
    return testing::ConsumeJob({.dispatcher_address = address,
                                .connect_timeout = absl::Seconds(5),
                                .heartbeat_interval = absl::Milliseconds(100)},
                               job, after_batch);
  }

  static JobOptions Job(const std::string& name, const proto::Pipeline& pipeline,
                        uint32_t consumers = 1, uint32_t index = 0) {
    return {.job_name = name,
            .pipeline = pipeline,
            .seed = kJobSeed,
            .num_epochs = 2,
            .num_consumers = consumers,
            .consumer_index = index,
            .split_size = kSplit};
  }

  static void ExpectEveryRecordOnce(const std::vector<uint64_t>& ids) {
    std::vector<uint64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted.size(), static_cast<size_t>(kRecords));
    for (int i = 0; i < kRecords; ++i) ASSERT_EQ(sorted[i], static_cast<uint64_t>(i));
  }

  static TempDir* data_;
  TempDir tmp_;
  int n_ = 0;
};

TempDir* ServiceTest::data_ = nullptr;

proto::GetJobStateResponse JobState(const std::string& dispatcher, uint64_t job_id) {
  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(dispatcher, grpc::InsecureChannelCredentials()));
  proto::GetJobStateRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_job_id(job_id);
  proto::GetJobStateResponse state;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status status = stub->GetJobState(&context, request, &state);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return state;
}

TEST_F(ServiceTest, EveryRecordExactlyOncePerEpochAcrossConsumersAndWorkers) {
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"));
  for (int workers : {1, 3}) {
    for (uint32_t consumers : {1u, 2u}) {
      SCOPED_TRACE(absl::StrCat(workers, " worker(s), ", consumers, " consumer(s)"));
      auto cluster = StartCluster(workers);
      ASSERT_NE(cluster, nullptr);
      std::vector<Received> received(consumers);
      std::vector<std::thread> threads;
      for (uint32_t c = 0; c < consumers; ++c) {
        threads.emplace_back([&, c] {
          received[c] =
              Consume(cluster->dispatcher_address(),
                      Job(absl::StrCat("exact-", workers, "-", consumers), pipeline, consumers, c));
        });
      }
      for (auto& t : threads) t.join();
      for (uint64_t epoch : {0, 1}) {
        std::vector<uint64_t> all;
        for (uint32_t c = 0; c < consumers; ++c) {
          ASSERT_TRUE(received[c].status.ok()) << received[c].status;
          const auto& ids = received[c].ids[epoch];
          // Equal shares (12 splits divide evenly), disjoint across consumers.
          EXPECT_EQ(ids.size(), static_cast<size_t>(kRecords / consumers)) << "consumer " << c;
          all.insert(all.end(), ids.begin(), ids.end());
        }
        ExpectEveryRecordOnce(all);
      }
      EXPECT_NE(received[0].ids[0], received[0].ids[1]) << "epochs must be shuffled differently";
    }
  }
}

// ImageNet-style: a random flip, then the tail finishing may move to the
// client (normalize + hwc2chw: uint8 -> float32).
proto::Pipeline FinishPipeline(const std::string& dataset, const std::string& finish) {
  auto pipeline = sluice::pipeline_spec::ParsePipelineSpec(
      absl::StrCat("seed: 5\nfinish: ", finish, "\nsource: {dataset: {path: ", dataset,
                   R"(}, columns: [image, label]}
nodes:
  - shuffle: {seed: 3}
  - map:
      input_columns: [image]
      ops:
        - decode: {}
        - resize: {height: 16, width: 20}
        - random_horizontal_flip: {}
        - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
        - hwc2chw: {}
  - batch: {size: 8}
)"));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.value_or(proto::Pipeline());
}

TEST_F(ServiceTest, BatchesFinishedByClientOrWorkerAreByteIdenticalToInProcess) {
  // In-process (the Executor, as `sluice pipeline run`, given the job's seed):
  // each record's image bytes and label per epoch. The random flip depends
  // only on (pipeline and job seed, epoch, record), so the order does not
  // matter.
  std::map<std::pair<uint64_t, uint64_t>, std::string> want;
  {
    auto ex = data_worker::pipeline::Executor::Create(FinishPipeline(data_->Join("ds"), "worker"),
                                                      {.job_seed = kJobSeed});
    ASSERT_TRUE(ex.ok()) << ex.status();
    for (uint64_t epoch : {0, 1}) {
      std::vector<uint64_t> order(kRecords);
      for (int i = 0; i < kRecords; ++i) order[i] = i;
      auto outputs = sluice::testonly::RunSplit(**ex, order, epoch);
      ASSERT_TRUE(outputs.ok()) << outputs.status();
      for (const auto& e : *outputs) {
        const data_worker::Tensor& image = e.columns[0];
        ASSERT_EQ(image.dtype(), record::DType::kFloat32);
        const size_t each = image.num_bytes() / e.global_indices.size();
        for (size_t k = 0; k < e.global_indices.size(); ++k) {
          want[{epoch, e.global_indices[k]}] =
              std::string(reinterpret_cast<const char*>(image.data()) + k * each, each);
        }
      }
    }
  }
  ASSERT_EQ(want.size(), 2u * kRecords);
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  for (const std::string finish : {"client", "worker", "auto"}) {
    SCOPED_TRACE("finish: " + finish);
    auto client = Connect(cluster->dispatcher_address());
    ASSERT_NE(client, nullptr);
    auto it = client->Open(Job("finish-" + finish, FinishPipeline(data_->Join("ds"), finish)));
    ASSERT_TRUE(it.ok()) << it.status();
    size_t checked = 0;
    while (true) {
      auto batch = (*it)->GetNext();
      ASSERT_TRUE(batch.ok()) << batch.status();
      if (!batch->has_value()) break;
      const Column& image = (*batch)->columns[0];
      ASSERT_EQ(image.dtype, DType::kFloat32);
      const size_t n = (*batch)->global_indices.size();
      ASSERT_THAT(image.shape, ::testing::ElementsAre(n, 3, 16, 20));
      ASSERT_EQ(image.size, n * 3 * 16 * 20 * 4);
      const size_t each = image.size / n;
      for (size_t k = 0; k < n; ++k) {
        const auto expected = want.find({(*batch)->epoch, (*batch)->global_indices[k]});
        ASSERT_NE(expected, want.end());
        ASSERT_EQ(image.bytes().substr(k * each, each), expected->second)
            << "epoch " << (*batch)->epoch << " record " << (*batch)->global_indices[k];
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2u * kRecords);
  }
}

TEST_F(ServiceTest, ABadFinishValueIsInvalidArgumentNamingTheField) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto client = Connect(cluster->dispatcher_address());
  ASSERT_NE(client, nullptr);
  auto it = client->Open(Job("bad-finish", FinishPipeline(data_->Join("ds"), "gpu")));
  ASSERT_FALSE(it.ok());
  EXPECT_EQ(it.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(it.status().message(), HasSubstr("finish: 'gpu' is not one of auto, worker, client"));
}

TEST_F(ServiceTest, DeterministicModeGivesTheSameSequenceWithOneAndThreeWorkers) {
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"));
  std::vector<std::vector<uint64_t>> sequences;
  for (int workers : {1, 3}) {
    auto cluster = StartCluster(workers);
    ASSERT_NE(cluster, nullptr);
    JobOptions job = Job("deterministic", pipeline);
    job.deterministic = true;
    Received r = Consume(cluster->dispatcher_address(), job);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectEveryRecordOnce(r.ids[0]);
    sequences.push_back(r.ids[0]);
    sequences.back().insert(sequences.back().end(), r.ids[1].begin(), r.ids[1].end());
  }
  EXPECT_EQ(sequences[0], sequences[1]);
}

TEST_F(ServiceTest, KilledWorkerMidEpochStillDeliversEveryRecordOnce) {
  // 2 ms per element: an epoch takes ~1 s over 3 workers, so the kill lands
  // mid-epoch.
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), /*sleep_micros=*/2000);
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  bool killed = false;
  Received r = Consume(cluster->dispatcher_address(), Job("kill", pipeline), [&](int batches) {
    if (batches == 12 && !killed) {
      cluster->SignalWorker(1, SIGKILL);
      killed = true;
    }
  });
  ASSERT_TRUE(killed);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(cluster->worker(1).process->Poll(), 128 + SIGKILL);
  ExpectEveryRecordOnce(r.ids[0]);
  ExpectEveryRecordOnce(r.ids[1]);
}

TEST_F(ServiceTest, WorkerAddedMidEpochReceivesSplits) {
  // 25 ms a record: the one worker needs 12 s for the epoch, far longer than a new worker takes
  // to register even under a sanitizer on a loaded machine. (At 3 ms it produced the whole epoch
  // into the stream's buffers before a slow new worker registered, and the test failed.)
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), /*sleep_micros=*/25000);
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  std::set<uint64_t> workers_seen;
  uint64_t job_id = 0;
  auto client = Connect(cluster->dispatcher_address());
  ASSERT_NE(client, nullptr);
  JobOptions job = Job("grow", pipeline);
  job.num_epochs = 1;
  auto it = client->Open(job);
  ASSERT_TRUE(it.ok()) << it.status();
  job_id = (*it)->job_id();
  std::vector<uint64_t> ids;
  for (int batches = 0;; ++batches) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    ids.insert(ids.end(), (*batch)->global_indices.begin(), (*batch)->global_indices.end());
    auto see_workers = [&] {
      const proto::GetJobStateResponse state = JobState(cluster->dispatcher_address(), job_id);
      for (const auto& consumer : state.consumers()) {
        for (const auto& split : consumer.splits()) {
          if (split.worker_id() != 0) workers_seen.insert(split.worker_id());
        }
      }
    };
    see_workers();
    if (batches == 4) {
      ASSERT_TRUE(cluster->AddWorker().ok());
      // Stop reading until the new worker holds a split (or the deadline passes).
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (workers_seen.size() < 2 && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(50));
        see_workers();
      }
    }
  }
  ExpectEveryRecordOnce(ids);
  EXPECT_EQ(workers_seen.size(), 2u) << "the added worker was never given a split";
}

// Resident memory of a process, from /proc.
int64_t RssBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// The value of an unlabelled metric in Prometheus text, or -1 if absent.
double MetricValue(const std::string& exposition, const std::string& metric) {
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(metric + " ", 0) == 0) {
      return std::stod(line.substr(metric.size() + 1));
    }
  }
  return -1;
}

// Back-pressure end to end. Waits on events, never on time: the worker's
// producers blocked on its full queue (its sluice_worker_blocked_producers
// gauge). Whether resident memory grows while a client stalls is measured by
// bench/stalled_client.sh (RSS is the allocator's business: it moved +61 MB
// once here with production stopped).
TEST_F(ServiceTest, ClientThatStopsReadingKeepsWorkerMemoryBounded) {
  // 8 x 3 x 512 x 512 float32 = 25 MB per batch; the epoch is 60 batches = 1.5
  // GB if unbounded.
  const proto::Pipeline pipeline =
      MakePipeline(data_->Join("ds"), 0,
                   "        - resize: {height: 512, width: 512}\n        - "
                   "cast: {dtype: float32}\n");
  // Producers that wait (no --pause-unread-after: a paused split would free them).
  auto cluster =
      StartCluster(1, {"--memory-mb", "64", "--queue-batches", "4", "--pause-unread-after", "0"});
  ASSERT_NE(cluster, nullptr);
  auto client = Connect(cluster->dispatcher_address(), /*prefetch_batches=*/2);
  ASSERT_NE(client, nullptr);
  auto it = client->Open(Job("stall", pipeline));
  ASSERT_TRUE(it.ok()) << it.status();
  auto first = (*it)->GetNext();
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
  // The client reads nothing more: its buffer and the stream fill, then the
  // worker's queue, and its producers wait for room.
  const int metrics_port = cluster->worker(0).metrics_port;
  std::string metrics;
  auto blocked = [&] {
    absl::StatusOr<std::string> m = tools::ScrapeMetrics(metrics_port);
    if (!m.ok()) return false;
    metrics = *m;
    return MetricValue(metrics, "sluice_worker_blocked_producers") >= 1;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!blocked() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(MetricValue(metrics, "sluice_worker_blocked_producers"), 1)
      << "the worker's producers never waited for room:\n"
      << metrics;
  // Production stopped far short of the 60-batch epoch...
  const double produced = MetricValue(metrics, "sluice_worker_batches_total");
  EXPECT_GE(produced, 1);
  EXPECT_LT(produced, 30);
  // ... and unbounded, the worker would hold the 1.5 GB epoch.
  const int64_t rss = RssBytes(cluster->worker(0).process->pid());
  EXPECT_LT(rss, 1200LL << 20) << "worker RSS " << rss;
  // Reading resumes and completes the epoch.
  int batches = 1;
  while (true) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value() || (*batch)->epoch > 0) break;
    ++batches;
  }
  EXPECT_EQ(batches, kRecords / kBatch);
}

TEST_F(ServiceTest, PipelineFailingValidationIsInvalidArgumentNamingTheOp) {
  proto::Pipeline pipeline = MakePipeline(data_->Join("ds"));
  pipeline.mutable_nodes(1)->mutable_map()->mutable_ops(1)->mutable_resize()->set_height(-4);
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  Received r = Consume(cluster->dispatcher_address(), Job("invalid", pipeline));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_THAT(r.status.message(), HasSubstr("Resize"));
}

TEST_F(ServiceTest, PipelineOutsideDataRootIsPermissionDenied) {
  TempDir elsewhere;
  WriteDataset(elsewhere.Join("ds"));
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  Received r =
      Consume(cluster->dispatcher_address(), Job("outside", MakePipeline(elsewhere.Join("ds"))));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kPermissionDenied) << r.status;
  EXPECT_THAT(r.status.message(), HasSubstr("--data-root"));
}

TEST_F(ServiceTest, UnknownJobIsNotFound) {
  auto cluster = StartCluster(0);
  ASSERT_NE(cluster, nullptr);
  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(cluster->dispatcher_address(), grpc::InsecureChannelCredentials()));
  proto::ClientHeartbeatRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_job_id(987654);
  proto::ClientHeartbeatResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status s = stub->ClientHeartbeat(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("987654"));
}

TEST_F(ServiceTest, WrongDispatcherAddressFailsFastWithUnavailable) {
  auto port = tools::PickFreePort();
  ASSERT_TRUE(port.ok());
  const absl::Time start = absl::Now();
  auto client = DataServiceClient::Create({.dispatcher_address = absl::StrCat("127.0.0.1:", *port),
                                           .connect_timeout = absl::Seconds(2)});
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("cannot reach the sluice dispatcher"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(ServiceTest, WorkerPointedAtSomethingElseExitsWithAClearError) {
  // A TCP listener that is not a gRPC server.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string log = tmp_.Join("worker.log");
  auto worker = Subprocess::Start({BinDir() + "/sluice-worker", "--dispatcher",
                                   absl::StrCat("127.0.0.1:", ntohs(addr.sin_port)), "--port", "0",
                                   "--data-root", data_->path(), "--connect-timeout", "3s"},
                                  {.log_file = log});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto code = (*worker)->Wait(absl::Seconds(30));
  close(fd);
  ASSERT_TRUE(code.ok()) << "the worker hangs instead of giving up";
  EXPECT_NE(*code, 0);
  EXPECT_THAT(TailOfFile(log), HasSubstr("dispatcher"));
}

TEST_F(ServiceTest, WorkerLimitsReachTheConsumerNamingTheirFlags) {
  // MakePipeline: shuffle, map (decode, resize, hwc2chw), batch = 6 nodes and
  // ops; a batch is 8 images of 3x16x16 bytes plus 8 labels.
  auto cluster = StartCluster(1, {"--max-batch-bytes", "4096", "--max-pipeline-nodes", "6"});
  ASSERT_NE(cluster, nullptr);
  const absl::Time start = absl::Now();
  Received big =
      Consume(cluster->dispatcher_address(), Job("big-batches", MakePipeline(data_->Join("ds"))));
  EXPECT_EQ(big.status.code(), absl::StatusCode::kResourceExhausted) << big.status;
  EXPECT_THAT(big.status.message(),
              HasSubstr(absl::StrCat("a batch of ", kBatch * (3 * 16 * 16 + 8),
                                     " bytes is more than --max-batch-bytes "
                                     "4096: use a smaller batch size")));

  Received nodes = Consume(
      cluster->dispatcher_address(),
      Job("seven-nodes", MakePipeline(data_->Join("ds"), 0, "        - cast: {dtype: float32}\n")));
  EXPECT_EQ(nodes.status.code(), absl::StatusCode::kInvalidArgument) << nodes.status;
  EXPECT_THAT(nodes.status.message(), HasSubstr("pipeline spec has 7 nodes, more than "
                                                "--max-pipeline-nodes 6"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));  // told, not left waiting
}

}  // namespace
}  // namespace sluice
