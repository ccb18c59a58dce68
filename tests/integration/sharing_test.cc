// Shared production (docs/sharing.md) with real processes: jobs with `sharing: auto` over the
// same dataset, pipeline, seed and layout are served from one production stream. Each job gets
// every record exactly once, byte-identical to the same job run alone; the workers' own
// counters (sluice_worker_splits_total, sluice_worker_shared_splits_total) show how many
// productions ran. A job that stops reading is detached and gets its batches later; a late job
// joins; a worker SIGKILL and a dispatcher restart while jobs share lose nothing.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/checksum.h"
#include "common/record/dataset.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "proto/dispatcher.grpc.pb.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;

constexpr int kRecords = 480;
constexpr uint64_t kSplitSize = 40;  // 12 slots of 5 batches per job and epoch

using ::sluice::testing::BinDir;

void WriteDataset(const std::string& dir, int records) {
  testing::WriteJpegDataset(
      dir, {.records = records, .shard_size_bytes = 60000, .image = [](int i) {
              return testing::Jpeg(cv::Mat(16, 16, CV_8UC3, cv::Scalar(i % 256, (i * 7) % 256, 9)));
            }});
}

// Seeded augmentation (random crop and flip), so that a batch's bytes depend on the seed, the
// epoch and the records: two productions of a slot agree only if they are the same.
proto::Pipeline MakePipeline(const std::string& dataset, int size, int sleep_micros = 0) {
  std::string yaml = absl::StrCat(
      "seed: 3\nsource:\n  dataset: {path: ", dataset,
      "}\n  columns: [image, label]\nnodes:\n  - shuffle: {seed: 3}\n  - map:\n"
      "      input_columns: [image]\n      ops:\n        - decode: {}\n"
      "        - random_crop: {height: 12, width: 12}\n        - random_horizontal_flip: {}\n"
      "        - resize: {height: ",
      size, ", width: ", size, "}\n");
  if (sleep_micros > 0) absl::StrAppend(&yaml, "        - sleep: {micros: ", sleep_micros, "}\n");
  absl::StrAppend(&yaml, "  - batch: {size: 8}\n");
  absl::StatusOr<proto::Pipeline> pipeline = pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status() << "\n" << yaml;
  return pipeline.value_or(proto::Pipeline());
}

JobOptions Job(const std::string& name, const proto::Pipeline& pipeline, bool sharing = true) {
  return {.job_name = name,
          .pipeline = pipeline,
          .seed = 5,
          .num_epochs = 1,
          .split_size = kSplitSize,
          .sharing = sharing ? "auto" : "off"};
}

// What a job received: (epoch, position, batch index) -> checksum of the batch's indices and
// columns; and every record index, in delivery order.
struct Received {
  absl::Status status;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, uint64_t> batches;
  std::vector<uint64_t> ids;
};

void Add(const Batch& batch, Received* r) {
  std::string bytes(reinterpret_cast<const char*>(batch.global_indices.data()),
                    batch.global_indices.size() * sizeof(uint64_t));
  for (const Column& c : batch.columns) bytes.append(c.name).append(c.bytes());
  const auto key = std::make_tuple(batch.epoch, batch.position, batch.batch_index);
  EXPECT_FALSE(r->batches.contains(key)) << "a batch came twice";
  r->batches[key] = record::Checksum(bytes);
  r->ids.insert(r->ids.end(), batch.global_indices.begin(), batch.global_indices.end());
}

// Creates the jobs as DataServiceClient::Open would (the same dataset registration and
// config), before any worker runs, so that the first worker's first heartbeat finds all of
// them: their slots go out together from the start, whatever the order the trainers open in.
void CreateJobs(const std::string& dispatcher, const std::string& dataset,
                const std::vector<JobOptions>& jobs) {
  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(dispatcher, grpc::InsecureChannelCredentials()));
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(5); };
  absl::StatusOr<std::unique_ptr<record::Dataset>> ds = record::Dataset::Open(dataset);
  ASSERT_TRUE(ds.ok()) << ds.status();
  for (const JobOptions& job : jobs) {
    proto::RegisterDatasetRequest reg;
    reg.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    {
      google::protobuf::io::StringOutputStream stream(reg.mutable_pipeline());
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      job.pipeline.SerializeToCodedStream(&coded);
    }
    for (size_t i = 0; i < (*ds)->num_shards(); ++i)
      reg.add_shard_record_counts((*ds)->shard(i).record_count());
    reg.set_batch_size(8);
    proto::RegisterDatasetResponse registered;
    grpc::ClientContext c1;
    c1.set_deadline(deadline());
    ASSERT_TRUE(stub->RegisterDataset(&c1, reg, &registered).ok());
    proto::GetOrCreateJobRequest request;
    request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    request.set_job_name(job.job_name);
    request.set_dataset_id(registered.dataset_id());
    proto::JobConfig* config = request.mutable_config();
    config->set_mode(proto::PROCESSING_MODE_DISTRIBUTED_EPOCH);
    config->set_seed(job.seed);
    config->set_num_epochs(job.num_epochs);
    config->set_num_consumers(1);
    config->set_remainder(proto::REMAINDER_MODE_PAD);
    config->set_split_size(job.split_size);
    config->set_sharing(proto::SHARING_MODE_AUTO);
    proto::GetOrCreateJobResponse created;
    grpc::ClientContext c2;
    c2.set_deadline(deadline());
    const grpc::Status status = stub->GetOrCreateJob(&c2, request, &created);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_TRUE(created.created());
  }
}

proto::GetStatusResponse Status(const std::string& dispatcher) {
  auto stub = proto::DispatcherService::NewStub(
      grpc::CreateChannel(dispatcher, grpc::InsecureChannelCredentials()));
  proto::GetStatusRequest request;
  request.set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  proto::GetStatusResponse status;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status s = stub->GetStatus(&context, request, &status);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return status;
}

// A small shared-memory ring (1 MiB, a couple of the larger batches): a trainer that stops
// reading stops its workers after a few batches, as through a socket, and batches that do not fit
// take the stream.
absl::StatusOr<std::unique_ptr<DataServiceClient>> Client(const std::string& address) {
  return DataServiceClient::Create({.dispatcher_address = address,
                                    .connect_timeout = absl::Seconds(5),
                                    .heartbeat_interval = absl::Milliseconds(100),
                                    .prefetch_batches = 2,
                                    .shared_memory_bytes = 1 << 20});
}

// Reads the iterator to its end; `after(n)` runs after the n-th batch (from 1).
Received Drain(BatchIterator& it, const std::function<void(int)>& after = nullptr) {
  Received r;
  for (int n = 1;; ++n) {
    absl::StatusOr<std::optional<Batch>> batch = it.GetNext();
    if (!batch.ok()) {
      r.status = batch.status();
      return r;
    }
    if (!batch->has_value()) return r;
    Add(**batch, &r);
    if (after) after(n);
  }
}

void ExpectEveryRecordOnce(std::vector<uint64_t> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<uint64_t> want(kRecords);
  for (int i = 0; i < kRecords; ++i) want[i] = i;
  EXPECT_EQ(ids, want);
}

class SharingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    WriteDataset(data_->Join("ds"), kRecords);
  }
  static void TearDownTestSuite() { delete data_; }

  std::unique_ptr<tools::LocalCluster> StartCluster(int workers,
                                                    std::vector<std::string> worker_flags = {}) {
    auto cluster =
        tools::LocalCluster::Start({.bin_dir = BinDir(),
                                    .workers = workers,
                                    .data_roots = {data_->path()},
                                    .work_dir = tmp_.Join(absl::StrCat("c", ++n_)),
                                    .worker_threads = 1,
                                    .heartbeat_interval = absl::Milliseconds(200),
                                    .worker_timeout = absl::Seconds(2),
                                    .extra_worker_flags = std::move(worker_flags),
                                    // CreateJobs registers the datasets before any
                                    // worker runs, so no worker could read their
                                    // manifests; it gives the counts the dataset has.
                                    .extra_dispatcher_flags = {"--verify-shard-counts", "false"}});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? *std::move(cluster) : nullptr;
  }

  // The sum over every worker of `metric`{event=`event`}.
  static double WorkerCount(tools::LocalCluster& cluster, const std::string& metric,
                            const std::string& event) {
    double total = 0;
    for (int i = 0; i < cluster.num_workers(); ++i) {
      absl::StatusOr<std::string> text = tools::ScrapeMetrics(cluster.worker(i).metrics_port);
      if (!text.ok()) continue;  // a killed worker
      const std::map<std::string, double> by = tools::SumByLabel(*text, metric, "event");
      auto it = by.find(event);
      if (it != by.end()) total += it->second;
    }
    return total;
  }

  // The job run alone (sharing off) on a cluster of its own: the reference bytes. A sleep op
  // changes no byte, so one run per image size serves every test of the suite.
  const Received& Solo(int size) {
    static std::map<int, Received>* solo = new std::map<int, Received>();
    auto it = solo->find(size);
    if (it == solo->end()) {
      it = solo->emplace(size, RunSolo(MakePipeline(data_->Join("ds"), size))).first;
    }
    return it->second;
  }
  Received RunSolo(const proto::Pipeline& pipeline) {
    auto cluster = StartCluster(1);
    EXPECT_NE(cluster, nullptr);
    if (cluster == nullptr) return {};
    auto client = Client(cluster->dispatcher_address());
    EXPECT_TRUE(client.ok()) << client.status();
    auto it = (*client)->Open(Job("solo", pipeline, /*sharing=*/false));
    EXPECT_TRUE(it.ok()) << it.status();
    Received r = Drain(**it);
    EXPECT_TRUE(r.status.ok()) << r.status;
    return r;
  }

  // The jobs `names`, created before the cluster's `workers` workers start, opened by trainers.
  void OpenTogether(tools::LocalCluster& cluster, const proto::Pipeline& pipeline,
                    const std::vector<std::string>& names, int workers,
                    std::vector<std::unique_ptr<BatchIterator>>* its) {
    std::vector<JobOptions> jobs;
    for (const std::string& name : names) jobs.push_back(Job(name, pipeline));
    CreateJobs(cluster.dispatcher_address(), data_->Join("ds"), jobs);
    for (int i = 0; i < workers; ++i) ASSERT_TRUE(cluster.AddWorker().ok());
    client_ = *Client(cluster.dispatcher_address());
    for (const JobOptions& job : jobs) {
      auto it = client_->Open(job);
      ASSERT_TRUE(it.ok()) << it.status();
      its->push_back(*std::move(it));
    }
  }

  static TempDir* data_;
  std::unique_ptr<DataServiceClient> client_;
  TempDir tmp_;
  int n_ = 0;
};
TempDir* SharingTest::data_ = nullptr;

TEST_F(SharingTest, ThreeJobsStartedTogetherGetSoloBytesFromOneProduction) {
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), 16);
  const Received& solo = Solo(16);
  ASSERT_EQ(solo.batches.size(), kRecords / 8u);
  auto cluster = StartCluster(0);
  ASSERT_NE(cluster, nullptr);
  std::vector<std::unique_ptr<BatchIterator>> its;
  OpenTogether(*cluster, pipeline, {"trial-a", "trial-b", "trial-c"}, /*workers=*/2, &its);
  std::vector<std::future<Received>> runs;
  for (auto& it : its) {
    runs.push_back(std::async(std::launch::async, [&it] { return Drain(*it); }));
  }
  for (auto& run : runs) {
    Received r = run.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectEveryRecordOnce(r.ids);
    EXPECT_EQ(r.batches, solo.batches);  // every batch, byte for byte
  }
  // 12 slots, each produced once and streamed to the other two jobs.
  EXPECT_EQ(WorkerCount(*cluster, "sluice_worker_splits_total", "started"), 12);
  EXPECT_EQ(WorkerCount(*cluster, "sluice_worker_shared_splits_total", "joined"), 24);
}

TEST_F(SharingTest, AJobThatStopsReadingDoesNotStallTheOthersAndLaterGetsEverything) {
  // Batches of 256x256 images (1.5 MiB, 92 MiB a job): what a trainer that stopped reading can
  // hold (its prefetch, the worker's queue, the HTTP/2 stream window gRPC grows on loopback and
  // the socket buffers: up to about 23 MiB seen, all of a job of 128x128 images) is well under a
  // job, so the group meets its full queue whatever the timing.
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), 256);
  const Received& solo = Solo(256);
  auto cluster = StartCluster(0, {"--queue-batches", "1", "--share-detach-after", "200ms"});
  ASSERT_NE(cluster, nullptr);
  std::vector<std::unique_ptr<BatchIterator>> its;
  OpenTogether(*cluster, pipeline, {"fast-a", "fast-b", "slow"}, /*workers=*/1, &its);
  // The slow trainer takes one batch, then stops reading until the others are done.
  absl::Notification others_done;
  auto slow = std::async(std::launch::async, [&] {
    return Drain(*its[2], [&](int n) {
      if (n == 1) others_done.WaitForNotification();
    });
  });
  std::vector<std::future<Received>> fast;
  for (int i = 0; i < 2; ++i) {
    fast.push_back(std::async(std::launch::async, [&, i] { return Drain(*its[i]); }));
  }
  for (auto& run : fast) {
    Received r = run.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectEveryRecordOnce(r.ids);
    EXPECT_EQ(r.batches, solo.batches);
  }
  // The others finished while it read nothing: it was detached from their production.
  EXPECT_GE(WorkerCount(*cluster, "sluice_worker_shared_splits_total", "detached"), 1);
  others_done.Notify();
  Received r = slow.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectEveryRecordOnce(r.ids);
  EXPECT_EQ(r.batches, solo.batches);
}

TEST_F(SharingTest, ALateJobJoinsTheStreamAndWrapsAround) {
  // 4 ms a record: the first job is mid-epoch when the second opens.
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), 16, /*sleep_micros=*/4000);
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto client = Client(cluster->dispatcher_address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto first = (*client)->Open(Job("early", pipeline));
  ASSERT_TRUE(first.ok()) << first.status();
  std::future<Received> late_run;
  std::unique_ptr<BatchIterator> late;
  Received early = Drain(**first, [&](int n) {
    if (n != 10) return;
    auto it = (*client)->Open(Job("late", pipeline));
    ASSERT_TRUE(it.ok()) << it.status();
    late = *std::move(it);
    late_run = std::async(std::launch::async, [&] { return Drain(*late); });
  });
  ASSERT_TRUE(early.status.ok()) << early.status;
  ASSERT_TRUE(late_run.valid());
  Received r = late_run.get();
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectEveryRecordOnce(early.ids);
  ExpectEveryRecordOnce(r.ids);
  EXPECT_EQ(r.batches, early.batches);  // the same bytes, in another order
  // The late job read part of the epoch from the early one's production: fewer than the
  // 2 x 12 productions two jobs alone would take.
  const double started = WorkerCount(*cluster, "sluice_worker_splits_total", "started");
  EXPECT_GE(WorkerCount(*cluster, "sluice_worker_shared_splits_total", "joined"), 1);
  EXPECT_LT(started, 24);
}

TEST_F(SharingTest, AWorkerKilledWhileThreeJobsShareLosesNothing) {
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), 16, /*sleep_micros=*/2000);
  const Received& solo = Solo(16);
  auto cluster = StartCluster(0);
  ASSERT_NE(cluster, nullptr);
  std::vector<std::unique_ptr<BatchIterator>> its;
  OpenTogether(*cluster, pipeline, {"k-a", "k-b", "k-c"}, /*workers=*/3, &its);
  std::atomic<bool> killed = false;
  std::vector<std::future<Received>> runs;
  for (size_t j = 0; j < its.size(); ++j) {
    runs.push_back(std::async(std::launch::async, [&, j] {
      return Drain(*its[j], [&](int n) {
        if (j == 0 && n == 12 && !killed.exchange(true)) cluster->SignalWorker(1, SIGKILL);
      });
    }));
  }
  for (auto& run : runs) {
    Received r = run.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectEveryRecordOnce(r.ids);
    EXPECT_EQ(r.batches, solo.batches);
  }
  ASSERT_TRUE(killed);
  EXPECT_EQ(cluster->worker(1).process->Poll(), 128 + SIGKILL);
}

TEST_F(SharingTest, ADispatcherRestartWhileJobsShareLosesNothing) {
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), 16, /*sleep_micros=*/2000);
  const Received& solo = Solo(16);
  auto cluster = StartCluster(0);
  ASSERT_NE(cluster, nullptr);
  std::vector<std::unique_ptr<BatchIterator>> its;
  OpenTogether(*cluster, pipeline, {"r-a", "r-b", "r-c"}, /*workers=*/2, &its);
  absl::Status restarted = absl::UnknownError("not restarted");
  proto::GetStatusResponse status;  // right after the restart
  std::atomic<bool> once = false;
  std::vector<std::future<Received>> runs;
  for (size_t j = 0; j < its.size(); ++j) {
    runs.push_back(std::async(std::launch::async, [&, j] {
      return Drain(*its[j], [&](int n) {
        if (j != 0 || n != 15 || once.exchange(true)) return;
        restarted = cluster->RestartDispatcher();
        status = Status(cluster->dispatcher_address());
      });
    }));
  }
  for (auto& run : runs) {
    Received r = run.get();
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectEveryRecordOnce(r.ids);
    EXPECT_EQ(r.batches, solo.batches);
  }
  ASSERT_TRUE(restarted.ok()) << restarted;
  // The restarted dispatcher found the same group: the jobs went on sharing. (A stream that a
  // client reopened across the restart may have had its split produced again for it alone;
  // three jobs that stopped sharing at the restart, about slot 3 of 12, would need over 30.)
  EXPECT_LT(WorkerCount(*cluster, "sluice_worker_splits_total", "started"), 18);
  ASSERT_EQ(status.jobs_size(), 3);
  for (const proto::JobStatus& j : status.jobs()) {
    EXPECT_NE(j.share_group(), 0u) << j.job_name();
    EXPECT_EQ(j.shares_with_size(), 2) << j.job_name();
  }
}

}  // namespace
}  // namespace sluice
