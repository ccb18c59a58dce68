// Cache nodes end to end (docs/cache.md): a real dispatcher and workers with --cache-root, a
// worker SIGKILLed while the first epoch writes the cache, later epochs and a second job with
// the same prefix reading the committed files (counted by the workers' metrics), and cached
// output byte-identical to computed output.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/pipeline_spec/cache_key.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"
#include "proto/dispatcher.grpc.pb.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::sluice::testing::TempDir;

constexpr int kRecords = 240;  // 2 shards of 120; 6 splits of 40; batches of 8
constexpr int kSplit = 40;

using ::sluice::testing::BinDir;

void WriteDataset(const std::string& dir) {
  record::Manifest manifest;
  testing::WriteJpegDataset(
      dir,
      {.records = kRecords, .shard_size_bytes = 249000, .image = testing::DiscJpeg, .pad_to = 2000},
      &manifest);
  ASSERT_EQ(manifest.shards.size(), 2u);
  for (const auto& shard : manifest.shards) ASSERT_EQ(shard.records, 120u);
}

// Shuffle, decode + resize (+ a sleep, so that a kill lands mid-epoch), the cache, then
// `after` and a batch of `batch`.
proto::Pipeline MakePipeline(const std::string& dataset, int sleep_micros, const std::string& after,
                             int batch) {
  const std::string yaml =
      absl::StrCat(R"(
seed: 3
source: {dataset: {path: )",
                   dataset, R"(}, columns: [image, label]}
nodes:
  - shuffle: {seed: 3}
  - map:
      input_columns: [image]
      ops: [{decode: {}}, {resize: {height: 16, width: 16}})",
                   sleep_micros > 0 ? absl::StrCat(", {sleep: {micros: ", sleep_micros, "}}") : "",
                   R"(]
  - cache: {name: eval}
)",
                   after, "  - batch: {size: ", batch, "}\n");
  auto pipeline = pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status() << "\n" << yaml;
  return pipeline.value_or(proto::Pipeline());
}

constexpr char kToChw[] = "  - map: {input_columns: [image], ops: [{hwc2chw: {}}]}\n";

// Per epoch: every global index received, and the bytes of each element's image.
struct Received {
  std::map<uint64_t, std::vector<uint64_t>> ids;
  std::map<uint64_t, std::map<uint64_t, std::string>> images;
  absl::Status status;
};

Received Consume(const std::string& address, JobOptions job,
                 const std::function<void(int)>& after_batch = nullptr) {
  Received out;
  auto client = DataServiceClient::Create({.dispatcher_address = address,
                                           .connect_timeout = absl::Seconds(5),
                                           .heartbeat_interval = absl::Milliseconds(100)});
  if (!client.ok()) return {{}, {}, client.status()};
  auto it = (*client)->Open(job);
  if (!it.ok()) return {{}, {}, it.status()};
  for (int batches = 0;;) {
    auto batch = (*it)->GetNext();
    if (!batch.ok()) {
      out.status = batch.status();
      return out;
    }
    if (!batch->has_value()) break;
    const Batch& b = **batch;
    const Column& image = b.columns[0];
    const size_t n = b.global_indices.size();
    const size_t each = image.size / n;
    for (size_t i = 0; i < n; ++i) {
      out.ids[b.epoch].push_back(b.global_indices[i]);
      out.images[b.epoch][b.global_indices[i]] = std::string(image.bytes().substr(i * each, each));
    }
    if (after_batch) after_batch(++batches);
  }
  return out;
}

void ExpectEveryRecordOnce(const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted.size(), static_cast<size_t>(kRecords));
  for (int i = 0; i < kRecords; ++i) ASSERT_EQ(sorted[i], static_cast<uint64_t>(i));
}

// The sum over the cluster's live workers of an unlabelled counter.
double SumOverWorkers(tools::LocalCluster& cluster, const std::string& metric) {
  double sum = 0;
  for (int i = 0; i < cluster.num_workers(); ++i) {
    if (cluster.worker(i).process->Poll().has_value()) continue;  // exited
    absl::StatusOr<std::string> text = tools::ScrapeMetrics(cluster.worker(i).metrics_port);
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) continue;
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(metric + " ", 0) == 0) sum += std::stod(line.substr(metric.size() + 1));
    }
  }
  return sum;
}

// The one cache the dispatcher knows, with its committed files.
proto::CacheStatus OnlyCache(const std::string& dispatcher) {
  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(dispatcher, grpc::InsecureChannelCredentials()));
  proto::GetStatusRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.set_starting_workers(-1);
  request.set_cache_files(true);
  proto::GetStatusResponse status;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status s = stub->GetStatus(&context, request, &status);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(status.caches_size(), 1);
  return status.caches_size() == 1 ? status.caches(0) : proto::CacheStatus();
}

class CacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    WriteDataset(data_->Join("ds"));
  }
  static void TearDownTestSuite() { delete data_; }

  std::unique_ptr<tools::LocalCluster> StartCluster(int workers) {
    auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                               .workers = workers,
                                               .data_roots = {data_->path()},
                                               .work_dir = tmp_.Join("cluster"),
                                               .worker_threads = 1,
                                               .heartbeat_interval = absl::Milliseconds(100),
                                               .worker_timeout = absl::Seconds(1),
                                               .extra_worker_flags = {"--cache-root", root()}});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? *std::move(cluster) : nullptr;
  }
  std::string root() const { return tmp_.Join("cache"); }
  static JobOptions Job(const std::string& name, const proto::Pipeline& pipeline, uint64_t epochs) {
    return {.job_name = name,
            .pipeline = pipeline,
            .seed = 11,
            .num_epochs = epochs,
            .split_size = kSplit};
  }

  static TempDir* data_;
  TempDir tmp_;
};

TempDir* CacheTest::data_ = nullptr;

TEST_F(CacheTest, WorkerKilledWhileWritingTheCacheEveryRecordOnceAndLaterEpochsReadTheCache) {
  // 3 ms per element before the cache: epoch 0 takes ~0.4 s per worker, so the kill lands
  // while splits are being captured.
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), 3000, kToChw, 8);
  const std::string fp = pipeline_spec::CacheKeyOf(pipeline, kSplit)->fingerprint;
  // A file left by a writer killed earlier: never committed, so never read, and deleted when
  // its split is committed.
  fs::create_directories(fs::path(root()) / fp);
  const fs::path stale = fs::path(root()) / fp / "split-0.00000000deadbeef.partial";
  std::ofstream(stale) << "a torn write";

  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  bool killed = false;
  Received r = Consume(cluster->dispatcher_address(), Job("eval", pipeline, 3), [&](int n) {
    if (n == 6 && !killed) {
      cluster->SignalWorker(1, SIGKILL);
      killed = true;
    }
  });
  ASSERT_TRUE(killed);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(cluster->worker(1).process->Poll(), 128 + SIGKILL);
  for (uint64_t epoch : {0, 1, 2}) ExpectEveryRecordOnce(r.ids[epoch]);

  // Every split committed once; the last epoch read all of its elements from the files.
  const proto::CacheStatus cache = OnlyCache(cluster->dispatcher_address());
  EXPECT_EQ(cache.name(), "eval");
  EXPECT_EQ(cache.fingerprint(), fp);
  EXPECT_EQ(cache.splits_total(), 6u);
  EXPECT_EQ(cache.splits_committed(), 6u);
  EXPECT_GE(SumOverWorkers(*cluster, "sluice_worker_cache_read_elements_total"), kRecords);
  EXPECT_FALSE(fs::exists(stale));
  // What is left in the folder is exactly the committed files: nothing partial, nothing a
  // killed or refused writer left behind.
  std::set<std::string> committed, on_disk;
  for (const proto::CacheSplitFile& f : cache.files()) committed.insert(f.path());
  for (const auto& entry : fs::directory_iterator(fs::path(root()) / fp)) {
    on_disk.insert((fs::path(fp) / entry.path().filename()).string());
  }
  EXPECT_EQ(on_disk, committed);

  // Cached epochs are byte-identical to the computed one.
  ASSERT_EQ(r.images[0].size(), static_cast<size_t>(kRecords));
  EXPECT_EQ(r.images[2], r.images[0]);
  EXPECT_EQ(r.images[1], r.images[0]);
}

TEST_F(CacheTest, ASecondJobWithTheSamePrefixReadsTheCommittedCache) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const proto::Pipeline first = MakePipeline(data_->Join("ds"), 0, kToChw, 8);
  Received a = Consume(cluster->dispatcher_address(), Job("first", first, 1));
  ASSERT_TRUE(a.status.ok()) << a.status;
  ExpectEveryRecordOnce(a.ids[0]);
  // The reports reach the dispatcher with the workers' next heartbeats.
  for (absl::Time deadline = absl::Now() + absl::Seconds(10);
       OnlyCache(cluster->dispatcher_address()).splits_committed() < 6 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(OnlyCache(cluster->dispatcher_address()).splits_committed(), 6u);
  const double written = SumOverWorkers(*cluster, "sluice_worker_cache_written_files_total");
  const double read = SumOverWorkers(*cluster, "sluice_worker_cache_read_elements_total");

  // Another job: the same prefix, another tail and batch size. Nothing is computed again.
  const proto::Pipeline second = MakePipeline(data_->Join("ds"), 0, "", 5);
  Received b = Consume(cluster->dispatcher_address(), Job("second", second, 1));
  ASSERT_TRUE(b.status.ok()) << b.status;
  ExpectEveryRecordOnce(b.ids[0]);
  EXPECT_EQ(SumOverWorkers(*cluster, "sluice_worker_cache_read_elements_total") - read, kRecords);
  EXPECT_EQ(SumOverWorkers(*cluster, "sluice_worker_cache_written_files_total"), written);
  // HWC vs CHW of the same pixels: the same bytes per element, reordered; compare sorted.
  for (int g = 0; g < kRecords; ++g) {
    std::string x = a.images[0][g], y = b.images[0][g];
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    ASSERT_EQ(x, y) << "record " << g;
  }
}

// `cache: auto` (docs/cache.md): no cache node in the pipeline. The first epoch measures each
// node's cost; decode + resize + 3 ms per element before a random flip is worth caching, so the
// dispatcher caches after it (the flip comes after the cut); the following epochs write and then
// read the cache. Every record exactly once each epoch, and every epoch byte-identical to the same
// job run without the cache.
TEST_F(CacheTest, CacheAutoCachesTheExpensiveDeterministicPrefixFromTheSecondEpoch) {
  const std::string yaml = absl::StrCat(R"(
seed: 3
source: {dataset: {path: )",
                                        data_->Join("ds"), R"(}, columns: [image, label]}
nodes:
  - shuffle: {seed: 3}
  - map:
      input_columns: [image]
      ops: [{decode: {}}, {resize: {height: 16, width: 16}}, {sleep: {micros: 3000}}]
  - map: {input_columns: [image], ops: [{random_horizontal_flip: {}}, {hwc2chw: {}}]}
  - batch: {size: 8}
)");
  const absl::StatusOr<proto::Pipeline> pipeline = pipeline_spec::ParsePipelineSpec(yaml);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  // The cache it should choose: right after nodes[1], the expensive map.
  proto::Pipeline expected = *pipeline;
  expected.mutable_nodes()->Clear();
  for (int i = 0; i < pipeline->nodes_size(); ++i) {
    *expected.add_nodes() = pipeline->nodes(i);
    if (i == 1) expected.add_nodes()->mutable_cache()->set_name("x");
  }
  const std::string fp = pipeline_spec::CacheKeyOf(expected, kSplit)->fingerprint;

  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  JobOptions job = Job("auto", *pipeline, 3);
  job.cache = "auto";
  Received r = Consume(cluster->dispatcher_address(), job);
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (uint64_t epoch : {0, 1, 2}) ExpectEveryRecordOnce(r.ids[epoch]);

  const proto::CacheStatus cache = OnlyCache(cluster->dispatcher_address());
  EXPECT_EQ(cache.name(), "auto-" + fp);
  EXPECT_EQ(cache.fingerprint(), fp);
  EXPECT_EQ(cache.splits_total(), 6u);
  EXPECT_GT(cache.splits_committed(), 0u);  // written in epoch 1 (the second) at the latest
  EXPECT_GT(SumOverWorkers(*cluster, "sluice_worker_cache_written_files_total"), 0);
  EXPECT_GT(SumOverWorkers(*cluster, "sluice_worker_cache_read_elements_total"), 0);

  // The same job without `cache: auto`: the same bytes, epoch by epoch (the flip's draws follow
  // the epoch, cached prefix or not).
  Received plain = Consume(cluster->dispatcher_address(), Job("plain", *pipeline, 3));
  ASSERT_TRUE(plain.status.ok()) << plain.status;
  for (uint64_t epoch : {0, 1, 2}) {
    ASSERT_EQ(r.images[epoch].size(), static_cast<size_t>(kRecords));
    EXPECT_EQ(r.images[epoch], plain.images[epoch]) << "epoch " << epoch;
  }
  EXPECT_NE(r.images[0], r.images[1]);  // the flip did draw anew each epoch
}

}  // namespace
}  // namespace sluice
