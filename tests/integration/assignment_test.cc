// The assignment channel with real processes: a worker learns of a new job's splits when they
// exist, not at its next heartbeat (WatchAssignment, dispatcher/dispatcher_impl.h), and a trainer
// that closes its iterator frees the workers at once (ClientHeartbeatRequest.leaving), and one
// that stops reading without leaving frees them after --pause-unread-after (its split pauses). The
// cluster's heartbeat interval is a minute, so a run that needed an interval heartbeat could not
// finish without one: the workers' own count of interval heartbeats proves it did not.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/autoscale.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;

constexpr int kRecords = 240;

using ::sluice::testing::BinDir;

void WriteDataset(const std::string& dir, int records) {
  testing::WriteJpegDataset(
      dir, {.records = records, .shard_size_bytes = 40000, .image = [](int i) {
              return testing::Jpeg(cv::Mat(16, 16, CV_8UC3, cv::Scalar(i % 256, (i * 7) % 256, 9)));
            }});
}

// `more_ops`: YAML list items run after decode.
proto::Pipeline MakePipeline(const std::string& dataset, const std::string& more_ops = "") {
  absl::StatusOr<proto::Pipeline> pipeline = pipeline_spec::ParsePipelineSpec(
      absl::StrCat("seed: 3\nsource:\n  dataset: {path: ", dataset,
                   "}\n  columns: [image, label]\nnodes:\n  - map:\n"
                   "      input_columns: [image]\n      ops:\n"
                   "        - decode: {}\n",
                   more_ops, "  - batch: {size: 8}\n"));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.ok() ? *pipeline : proto::Pipeline();
}

// One metric's samples summed by label, from the process whose metrics are on `port`.
std::map<std::string, double> Scrape(int port, const std::string& metric,
                                     const std::string& label) {
  absl::StatusOr<std::string> text = tools::ScrapeMetrics(port);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? tools::SumByLabel(*text, metric, label) : std::map<std::string, double>();
}

// The value of an unlabelled metric from the process whose metrics are on `port` (-1: none).
double ScrapeValue(int port, const std::string& metric) {
  absl::StatusOr<std::string> text = tools::ScrapeMetrics(port);
  EXPECT_TRUE(text.ok()) << text.status();
  const std::string key = absl::StrCat("\n", metric, " ");
  const size_t at = text.ok() ? text->find(key) : std::string::npos;
  if (at == std::string::npos) return -1;
  return std::stod(text->substr(at + key.size()));
}

JobOptions Job(const std::string& name, const proto::Pipeline& pipeline) {
  return {.job_name = name, .pipeline = pipeline, .seed = 5, .split_size = 40};
}

absl::StatusOr<std::unique_ptr<DataServiceClient>> Client(const std::string& address,
                                                          int prefetch_batches = 16) {
  return DataServiceClient::Create({.dispatcher_address = address,
                                    .connect_timeout = absl::Seconds(5),
                                    .heartbeat_interval = absl::Milliseconds(100),
                                    .prefetch_batches = prefetch_batches});
}

// Every record of the job's one epoch (what is left of it after `job.restore_state`), in
// delivery order.
absl::StatusOr<std::vector<uint64_t>> ConsumeAll(const std::string& address,
                                                 const JobOptions& job) {
  auto client = Client(address);
  if (!client.ok()) return client.status();
  auto it = (*client)->Open(job);
  if (!it.ok()) return it.status();
  std::vector<uint64_t> ids;
  while (true) {
    absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) return ids;
    ids.insert(ids.end(), (*batch)->global_indices.begin(), (*batch)->global_indices.end());
  }
}

std::vector<uint64_t> Range(uint64_t n) {
  std::vector<uint64_t> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

class AssignmentTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteDataset(data_.Join("ds"), kRecords); }

  // Heartbeats every minute: a test that finishes sooner got its work through the channel.
  std::unique_ptr<tools::LocalCluster> StartCluster(int workers,
                                                    std::vector<std::string> dispatcher_flags = {},
                                                    std::vector<std::string> worker_flags = {}) {
    auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                               .workers = workers,
                                               .data_roots = {data_.path()},
                                               .work_dir = tmp_.Join("cluster"),
                                               .worker_threads = 1,
                                               .heartbeat_interval = absl::Seconds(60),
                                               .worker_timeout = absl::Seconds(300),
                                               .extra_worker_flags = worker_flags,
                                               .extra_dispatcher_flags = dispatcher_flags});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? *std::move(cluster) : nullptr;
  }

  TempDir data_;
  TempDir tmp_;
};

TEST_F(AssignmentTest, NewJobsRunToTheEndWithoutAnIntervalHeartbeat) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const proto::Pipeline pipeline = MakePipeline(data_.Join("ds"));
  // Three jobs one after another on the warm cluster: each is created after every worker's
  // first heartbeat, and has 6 slots for 2 workers of capacity 2.
  for (const char* job : {"first", "second", "third"}) {
    absl::StatusOr<std::vector<uint64_t>> ids =
        ConsumeAll(cluster->dispatcher_address(), Job(job, pipeline));
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::sort(ids->begin(), ids->end());
    EXPECT_EQ(*ids, Range(kRecords)) << job;
  }
  // No worker waited for its 60 s heartbeat: the work came through the channel.
  for (int i = 0; i < cluster->num_workers(); ++i) {
    std::map<std::string, double> heartbeats =
        Scrape(cluster->worker(i).metrics_port, "sluice_worker_heartbeats_total", "trigger");
    EXPECT_EQ(heartbeats["interval"], 0) << "worker " << i;
    EXPECT_EQ(heartbeats["start"], 1) << "worker " << i;
  }
  EXPECT_GE(
      ScrapeValue(cluster->dispatcher_metrics_port(), "sluice_dispatcher_assignment_wakeups_total"),
      3);
}

TEST_F(AssignmentTest, ATrainerThatSavesAndLeavesHoldsNoCapacityAndResumesOnce) {
  // One worker producing one split at a time, leases of 10 minutes: job "left" holds the
  // worker's only producer (a split of 40 records, its queue full) when its trainer saves after
  // one batch and closes the iterator. Job "next" must get the worker at once, not after the
  // lease; "left" restored later returns each record it had not returned exactly once.
  auto cluster =
      StartCluster(1, {"--consumer-timeout", "600s"}, {"--capacity", "1", "--queue-batches", "2"});
  ASSERT_NE(cluster, nullptr);
  const proto::Pipeline pipeline = MakePipeline(data_.Join("ds"));
  std::vector<uint64_t> left_ids;
  std::string state;
  {
    auto client = Client(cluster->dispatcher_address());
    ASSERT_TRUE(client.ok()) << client.status();
    auto it = (*client)->Open(Job("left", pipeline));
    ASSERT_TRUE(it.ok()) << it.status();
    absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(batch->has_value());
    left_ids = (*batch)->global_indices;
    absl::StatusOr<std::string> saved = (*it)->SaveState();
    ASSERT_TRUE(saved.ok()) << saved.status();
    state = *saved;
  }  // closed: the trainer leaves
  ASSERT_EQ(left_ids.size(), 8u);

  // A hang guard only (the lease is 600 s): the job normally ends in a second or two.
  std::future<absl::StatusOr<std::vector<uint64_t>>> next = std::async(std::launch::async, [&] {
    return ConsumeAll(cluster->dispatcher_address(), Job("next", pipeline));
  });
  ASSERT_EQ(next.wait_for(std::chrono::seconds(120)), std::future_status::ready)
      << "the next job waited for the left job's lease";
  absl::StatusOr<std::vector<uint64_t>> next_ids = next.get();
  ASSERT_TRUE(next_ids.ok()) << next_ids.status();
  std::sort(next_ids->begin(), next_ids->end());
  EXPECT_EQ(*next_ids, Range(kRecords));

  JobOptions restored = Job("left", pipeline);
  restored.restore_state = state;
  absl::StatusOr<std::vector<uint64_t>> rest = ConsumeAll(cluster->dispatcher_address(), restored);
  ASSERT_TRUE(rest.ok()) << rest.status();
  std::vector<uint64_t> all = left_ids;
  all.insert(all.end(), rest->begin(), rest->end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, Range(kRecords));
  // The worker never needed its one-minute heartbeat.
  EXPECT_EQ(Scrape(cluster->worker(0).metrics_port, "sluice_worker_heartbeats_total",
                   "trigger")["interval"],
            0);
}

TEST_F(AssignmentTest, AWorkerStopsALeftJobsProductionWithoutAHeartbeat) {
  // One worker, one split at a time, queues of 2 batches, heartbeats every minute: job "left"
  // has its split producing into a full queue when its trainer leaves after one batch. The
  // worker must drop that production at once (WatchAssignmentResponse.jobs_over), not at its
  // next heartbeat a minute later, even though no other job comes to wake it.
  auto cluster =
      StartCluster(1, {"--consumer-timeout", "600s"}, {"--capacity", "1", "--queue-batches", "2"});
  ASSERT_NE(cluster, nullptr);
  const int metrics = cluster->worker(0).metrics_port;
  // One split of 300 batches of 1.2 MB: more than the client's prefetch, the queue and gRPC's
  // windows hold, so the producer waits on a full queue when the trainer leaves.
  WriteDataset(data_.Join("big"), 2400);
  JobOptions job =
      Job("left", MakePipeline(data_.Join("big"), "        - random_resized_crop: {size: 224}\n"));
  job.split_size = 2400;
  {
    auto client = Client(cluster->dispatcher_address());
    ASSERT_TRUE(client.ok()) << client.status();
    auto it = (*client)->Open(job);
    ASSERT_TRUE(it.ok()) << it.status();
    absl::StatusOr<std::optional<Batch>> batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(batch->has_value());
  }  // closed: the trainer leaves while its split is still being produced
  // Polled until the production is gone; the bound is a hang guard only (the heartbeat that
  // would otherwise drop it comes after 60 s).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ScrapeValue(metrics, "sluice_worker_queue_depth") != 0 ||
         ScrapeValue(metrics, "sluice_worker_blocked_producers") != 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the worker still produces the left job: queue depth "
        << ScrapeValue(metrics, "sluice_worker_queue_depth");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::map<std::string, double> heartbeats =
      Scrape(metrics, "sluice_worker_heartbeats_total", "trigger");
  EXPECT_EQ(heartbeats["interval"], 0);
  EXPECT_EQ(heartbeats["start"], 1);
}

TEST_F(AssignmentTest, ATrainerThatStopsReadingHoldsNoCapacityAndGetsItsEpochOnceWhenItReads) {
  // One worker producing one split at a time, leases of 10 minutes: job "paused" holds the
  // worker's only producer (its queue full) when its trainer stops reading but stays (its
  // iterator open, heartbeating). Job "other" must get the worker after --pause-unread-after,
  // not after the lease (which the heartbeats renew: without the pause, never). When "paused"
  // reads again it gets every record of its epoch exactly once.
  auto cluster =
      StartCluster(1, {"--consumer-timeout", "600s"},
                   {"--capacity", "1", "--queue-batches", "2", "--pause-unread-after", "500ms"});
  ASSERT_NE(cluster, nullptr);
  const int metrics = cluster->worker(0).metrics_port;
  // 2 slots of 50 batches of 1.2 MB: more than the client's prefetch, the queue and gRPC's
  // windows hold, so the producer waits on a full queue when the trainer stops.
  WriteDataset(data_.Join("big"), 800);
  JobOptions paused_job = Job(
      "paused", MakePipeline(data_.Join("big"), "        - random_resized_crop: {size: 224}\n"));
  paused_job.split_size = 400;
  auto paused_client = Client(cluster->dispatcher_address(), /*prefetch_batches=*/2);
  ASSERT_TRUE(paused_client.ok()) << paused_client.status();
  auto paused_it = (*paused_client)->Open(paused_job);
  ASSERT_TRUE(paused_it.ok()) << paused_it.status();
  std::vector<uint64_t> paused_ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<Batch>> batch = (*paused_it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(batch->has_value());
    paused_ids.insert(paused_ids.end(), (*batch)->global_indices.begin(),
                      (*batch)->global_indices.end());
  }
  // The trainer stops reading here. A hang guard only: the other job normally ends in a few
  // seconds.
  std::future<absl::StatusOr<std::vector<uint64_t>>> other = std::async(std::launch::async, [&] {
    return ConsumeAll(cluster->dispatcher_address(), Job("other", MakePipeline(data_.Join("ds"))));
  });
  if (other.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    // Leaving frees the worker: the other job ends, and the test fails instead of hanging.
    paused_it->reset();
    FAIL() << "the other job waited for the paused trainer";
  }
  absl::StatusOr<std::vector<uint64_t>> other_ids = other.get();
  ASSERT_TRUE(other_ids.ok()) << other_ids.status();
  std::sort(other_ids->begin(), other_ids->end());
  EXPECT_EQ(*other_ids, Range(kRecords));

  // The dispatcher shows the trainer paused (`sluice status`).
  absl::StatusOr<proto::GetStatusResponse> status =
      tools::FetchStatus(cluster->dispatcher_address());
  ASSERT_TRUE(status.ok()) << status.status();
  bool shown = false;
  for (const proto::JobStatus& j : status->jobs()) {
    if (j.job_name() != "paused") continue;
    ASSERT_EQ(j.consumers_size(), 1);
    EXPECT_TRUE(j.consumers(0).paused());
    shown = true;
  }
  EXPECT_TRUE(shown);
  EXPECT_GE(Scrape(metrics, "sluice_worker_paused_splits_total", "event")["paused"], 1);

  // It reads again: the rest of its epoch, each record once.
  while (true) {
    absl::StatusOr<std::optional<Batch>> batch = (*paused_it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    paused_ids.insert(paused_ids.end(), (*batch)->global_indices.begin(),
                      (*batch)->global_indices.end());
  }
  std::sort(paused_ids.begin(), paused_ids.end());
  EXPECT_EQ(paused_ids, Range(800));
  std::map<std::string, double> pauses =
      Scrape(metrics, "sluice_worker_paused_splits_total", "event");
  EXPECT_EQ(pauses["resumed"], pauses["paused"]);
  // The worker never needed its one-minute heartbeat.
  EXPECT_EQ(Scrape(metrics, "sluice_worker_heartbeats_total", "trigger")["interval"], 0);
}

}  // namespace
}  // namespace sluice
