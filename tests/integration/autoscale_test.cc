// `sluice local --autoscale` on real processes: a dispatcher with
// `--scaler local`, workers started by tools::LocalAutoscaler, consumers
// through the client library; exact record ids checked per epoch. The
// pipeline's cost is latency (the sleep op), so it fits on 2 cores. No timing
// is asserted: waits are generous and only bound a test that would hang.
#include "tools/local_cluster/autoscale.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/process.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "data_worker/pipeline/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;

constexpr int kRecords = 480;  // 12 splits of 40, batches of 8
constexpr int kSplit = 40;
// For timing: an epoch long enough (~5 s at 470 el/s) that the first
// decisions see no epoch start.
constexpr int kBigRecords = 2400;

using ::sluice::testing::BinDir;

void WriteDataset(const std::string& dir, int records = kRecords) {
  testing::WriteLabelDataset(dir, records, "x");
}

// label -> sleep per element -> batches of 8: latency, not CPU.
proto::Pipeline SleepPipeline(const std::string& dataset, int micros) {
  auto pipeline = sluice::pipeline_spec::ParsePipelineSpec(
      absl::StrCat("seed: 3\nsource:\n  dataset: {path: ", dataset,
                   "}\n  columns: [label]\nnodes:\n  - shuffle: {seed: 3}\n  - map:\n"
                   "      input_columns: [label]\n      num_parallel_workers: 2\n"
                   "      ops:\n        - sleep: {micros: ",
                   micros, "}\n  - batch: {size: 8, drop_remainder: false}\n"));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.value_or(proto::Pipeline());
}

// The cluster and its actuator loop (one Step per `interval`), guarded: the
// test thread signals workers while the loop starts them.
class AutoscaledCluster {
 public:
  AutoscaledCluster(std::unique_ptr<tools::LocalCluster> cluster, int max)
      : cluster_(std::move(cluster)), scaler_(cluster_.get(), max) {
    loop_ = std::thread([this] {
      while (!stop_.load()) {
        {
          absl::MutexLock lock(&mu_);
          absl::StatusOr<tools::AutoscaleStep> step = scaler_.Step();
          if (step.ok()) {
            live_ = step->live;
            max_live_ = std::max(max_live_, step->live);
            exited_ += static_cast<int>(step->exited.size());
          }
        }
        absl::SleepFor(absl::Milliseconds(500));
      }
    });
  }
  ~AutoscaledCluster() {
    stop_ = true;
    loop_.join();
    cluster_->Stop();
  }
  const std::string& address() const { return cluster_->dispatcher_address(); }
  int live() {
    absl::MutexLock lock(&mu_);
    return live_;
  }
  int max_live() {
    absl::MutexLock lock(&mu_);
    return max_live_;
  }
  int exited() {
    absl::MutexLock lock(&mu_);
    return exited_;
  }
  // SIGKILLs the worker process serving `address`; false if none does.
  bool Kill(const std::string& address) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < cluster_->num_workers(); ++i) {
      if (cluster_->worker(i).address != address) continue;
      cluster_->SignalWorker(i, SIGKILL);
      return true;
    }
    return false;
  }
  // The address of worker `worker` ("" if there is none).
  std::string worker_address(int worker) {
    absl::MutexLock lock(&mu_);
    return worker < cluster_->num_workers() ? cluster_->worker(worker).address : "";
  }
  void Signal(int worker, int signal) {
    absl::MutexLock lock(&mu_);
    if (worker < cluster_->num_workers()) cluster_->SignalWorker(worker, signal);
  }
  // Waits up to `timeout` for `done`; false on timeout.
  bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(90)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return done();
  }

 private:
  std::unique_ptr<tools::LocalCluster> cluster_;
  absl::Mutex mu_;
  tools::LocalAutoscaler scaler_ ABSL_GUARDED_BY(mu_);
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  int max_live_ ABSL_GUARDED_BY(mu_) = 0;
  int exited_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> stop_{false};
  std::thread loop_;
};

// The state the dispatcher reports for the worker at `address` ("" if none).
std::string WorkerState(const std::string& dispatcher, const std::string& address) {
  absl::StatusOr<proto::GetStatusResponse> status = tools::FetchStatus(dispatcher);
  if (!status.ok()) return "";
  for (const proto::WorkerStatus& w : status->workers()) {
    if (w.address() == address) return w.state();
  }
  return "";
}

class AutoscaleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    WriteDataset(data_->Join("ds"));
    WriteDataset(data_->Join("big"), kBigRecords);
  }
  static void TearDownTestSuite() { delete data_; }

  std::unique_ptr<AutoscaledCluster> Start(int min, int max,
                                           absl::Duration period = absl::Seconds(1)) {
    auto cluster = tools::LocalCluster::Start(
        {.bin_dir = BinDir(),
         .workers = min,
         .data_roots = {data_->path()},
         .work_dir = tmp_.Join(absl::StrCat("c", ++n_)),
         .worker_threads = 2,
         .heartbeat_interval = absl::Milliseconds(200),
         .worker_timeout = absl::Seconds(3),
         .extra_dispatcher_flags = {"--scaler", "local", "--min-workers", std::to_string(min),
                                    "--max-workers", std::to_string(max), "--scale-period",
                                    absl::FormatDuration(period), "--scale-down-window", "4s"}});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return nullptr;
    return std::make_unique<AutoscaledCluster>(std::move(*cluster), max);
  }

  // Every id of each epoch, in delivery order; `after_batch` runs after each.
  static std::map<uint64_t, std::vector<uint64_t>> Consume(
      const std::string& address, const std::string& job, uint64_t epochs, int sleep_micros,
      const std::function<void(int)>& after_batch = {}, int priority = 0) {
    std::map<uint64_t, std::vector<uint64_t>> ids;
    auto client = DataServiceClient::Create({.dispatcher_address = address,
                                             .connect_timeout = absl::Seconds(10),
                                             .heartbeat_interval = absl::Milliseconds(200)});
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return ids;
    auto it = (*client)->Open({.job_name = job,
                               .pipeline = SleepPipeline(data_->Join("ds"), sleep_micros),
                               .seed = 5,
                               .num_epochs = epochs,
                               .split_size = kSplit,
                               .priority = priority});
    EXPECT_TRUE(it.ok()) << it.status();
    if (!it.ok()) return ids;
    for (int n = 0;;) {
      auto batch = (*it)->GetNext();
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok() || !batch->has_value()) break;
      auto& out = ids[(*batch)->epoch];
      out.insert(out.end(), (*batch)->global_indices.begin(), (*batch)->global_indices.end());
      if (after_batch) after_batch(++n);
    }
    return ids;
  }

  static void ExpectEveryRecordOncePerEpoch(const std::map<uint64_t, std::vector<uint64_t>>& ids,
                                            uint64_t epochs) {
    ASSERT_EQ(ids.size(), epochs);
    for (const auto& [epoch, got] : ids) {
      std::vector<uint64_t> sorted = got;
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(sorted.size(), static_cast<size_t>(kRecords)) << "epoch " << epoch;
      for (int i = 0; i < kRecords; ++i)
        ASSERT_EQ(sorted[i], static_cast<uint64_t>(i)) << "epoch " << epoch;
    }
  }

  static TempDir* data_;
  TempDir tmp_;
  int n_ = 0;
};

TempDir* AutoscaleTest::data_ = nullptr;

// One worker produces 2 splits x 2 threads / 20 ms = 200 el/s; a consumer
// that never sleeps waits, so the dispatcher asks for more, and when the job is
// over it drains back to the minimum (the drained workers exit 0).
TEST_F(AutoscaleTest, ScalesUpFromOneUnderDemandAndDownToTheMinimumAfter) {
  auto cluster = Start(/*min=*/1, /*max=*/3);
  ASSERT_NE(cluster, nullptr);
  const auto ids = Consume(cluster->address(), "up", /*epochs=*/6,
                           /*sleep_micros=*/20000);
  ExpectEveryRecordOncePerEpoch(ids, 6);
  EXPECT_GE(cluster->max_live(), 2);
  // The job is over: no live consumer, back to one worker.
  EXPECT_TRUE(cluster->Eventually([&] { return cluster->live() == 1; }))
      << "live workers " << cluster->live();
  EXPECT_GE(cluster->exited(), cluster->max_live() - 1);
}

// "short" (a consumer that never sleeps) pulls the pool up to 4 workers;
// "long" (a 40 ms step: 200 el/s, 1-2 workers' worth) reads on after "short"
// ends. Short's demand leaves at once, the dispatcher drains workers that hold
// long's splits in the middle of an epoch, and both consumers still get every
// record exactly once.
TEST_F(AutoscaleTest, AScaleDownMidEpochLosesAndRepeatsNothing) {
  auto cluster = Start(/*min=*/1, /*max=*/4);
  ASSERT_NE(cluster, nullptr);
  std::map<uint64_t, std::vector<uint64_t>> long_ids, short_ids;
  std::thread short_job([&] {
    short_ids = Consume(cluster->address(), "short", /*epochs=*/6,
                        /*sleep_micros=*/20000);
  });
  int exited_while_reading = 0;  // drained workers gone before "long" ended
  long_ids = Consume(cluster->address(), "long", /*epochs=*/10,
                     /*sleep_micros=*/20000, [&](int) {
                       absl::SleepFor(absl::Milliseconds(40));  // a step
                       exited_while_reading = cluster->exited();
                     });
  short_job.join();
  ExpectEveryRecordOncePerEpoch(short_ids, 6);
  ExpectEveryRecordOncePerEpoch(long_ids, 10);
  EXPECT_GE(cluster->max_live(), 2);
  EXPECT_GE(exited_while_reading, 1) << "no scale-down while 'long' read";
  EXPECT_TRUE(cluster->Eventually([&] { return cluster->live() == 1; }));
}

// A worker SIGKILLed while it drains: the dispatcher times it out and hands its
// splits over with the consumer's prefix; nothing is lost or repeated.
TEST_F(AutoscaleTest, AWorkerKilledDuringItsDrainLosesNothing) {
  auto cluster = Start(/*min=*/2, /*max=*/2);
  ASSERT_NE(cluster, nullptr);
  const auto ids = Consume(cluster->address(), "kill", /*epochs=*/2,
                           /*sleep_micros=*/20000, [&](int n) {
                             if (n != 20) return;
                             const std::string address = cluster->worker_address(0);
                             cluster->Signal(0, SIGTERM);  // drains
                             // Dies mid-drain: once the dispatcher has seen
                             // it draining (it holds splits this consumer has
                             // not read, so it cannot finish meanwhile).
                             EXPECT_TRUE(cluster->Eventually([&] {
                               return WorkerState(cluster->address(), address) == "draining";
                             }));
                             cluster->Signal(0, SIGKILL);
                           });
  ExpectEveryRecordOncePerEpoch(ids, 2);
}

// The dispatcher, not the worker, starts the drain: "short" (never sleeps) pulls the pool up,
// and when it ends the dispatcher drains the surplus while "long" (a 100 ms step: workers run
// ahead of it, so each holds splits it produced and "long" has not read yet) is mid-epoch. So that
// the drain comes while "long" still holds its splits in every run, "long" stops reading after
// its first batch until a worker was killed (at most 60 s): with nothing read, the pool is
// surplus once "short" ends, and the dispatcher drains it. (Stopping later, at batch 90, missed
// the drain when "short" ended first: the drained workers held no split and exited at once.) The first worker seen draining while it still holds splits
// is SIGKILLed (one seen draining for 1 s without any is killed instead: the policy drains the
// worker holding the fewest splits first): its queued batches are gone, the dispatcher times it
// out and hands its splits over with the consumer's prefix skipped, and both consumers still get
// every record of every epoch exactly once.
TEST_F(AutoscaleTest, AWorkerKilledDuringADispatcherDrainLosesNothing) {
  auto cluster = Start(/*min=*/1, /*max=*/3);
  ASSERT_NE(cluster, nullptr);
  std::atomic<bool> reading{true};
  absl::Notification killed_one;
  std::string killed;  // written by the watcher before killed_one, read after it
  std::string killed_reason;
  bool killed_held_splits = false;
  int live_at_pause = 0;
  std::thread watcher([&] {
    std::map<std::string, absl::Time> draining_since;  // by address
    while (reading && !killed_one.HasBeenNotified()) {
      absl::StatusOr<proto::GetStatusResponse> status = tools::FetchStatus(cluster->address());
      if (status.ok()) {
        for (const proto::WorkerStatus& w : status->workers()) {
          if (w.state() != "draining") continue;
          const absl::Time since =
              draining_since.try_emplace(w.address(), absl::Now()).first->second;
          if (w.splits() == 0 && absl::Now() - since < absl::Seconds(1)) continue;
          if (cluster->Kill(w.address())) {
            killed = w.address();
            killed_reason = status->reason();
            killed_held_splits = w.splits() > 0;
            killed_one.Notify();
          }
          break;
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  std::map<uint64_t, std::vector<uint64_t>> long_ids, short_ids;
  std::thread short_job([&] {
    short_ids = Consume(cluster->address(), "short", /*epochs=*/6,
                        /*sleep_micros=*/20000);
  });
  long_ids = Consume(cluster->address(), "long", /*epochs=*/4,
                     /*sleep_micros=*/20000, [&](int batches) {
                       absl::SleepFor(absl::Milliseconds(100));  // a step
                       if (batches != 1) return;
                       live_at_pause = cluster->max_live();
                       killed_one.WaitForNotificationWithTimeout(absl::Seconds(60));
                     });
  reading = false;
  short_job.join();
  watcher.join();
  ExpectEveryRecordOncePerEpoch(short_ids, 6);
  ExpectEveryRecordOncePerEpoch(long_ids, 4);
  if (killed.empty() && live_at_pause < 2) {
    GTEST_SKIP() << "the pool never grew past one worker before \"long\" paused: there was "
                    "nothing to drain";
  }
  ASSERT_FALSE(killed.empty()) << "no worker was seen draining in 60 s while \"long\" held "
                                  "its splits without reading (max live "
                               << cluster->max_live() << ")";
  std::printf("killed %s while draining, %s splits\n", killed.c_str(),
              killed_held_splits ? "holding" : "without");
  EXPECT_THAT(killed_reason, ::testing::StartsWith("down "));
}

// The step response on real processes (a load step answered with the right
// worker count within 2 scale periods: issue 8's done-when) depends on the
// machine's load, so it is measured by bench/autoscale.sh (per-step
// convergence), not asserted here; the decision itself is tested with fake
// time in tests/dispatcher/autoscaler_test.cc.

// Issue 22's real-process check: a pool of at most 4 workers and three jobs
// of different cost (sleep 10, 20 and 40 ms per element) and step time (none,
// 10 ms, 20 ms per batch); each wants more than the pool, so it is divided.
// While the jobs read (within 6 periods of the third job's start) there is a
// decision in which every job's demand is measured and has its allocation
// (and a reason) in `sluice status`, and "high" (priority 1)
// is served first: its share is the largest of the three (before its demand
// is read, a new job has only the one worker it is given to read it); every
// record of every epoch arrives exactly once. The epochs keep every job
// reading well past the first periods.
TEST_F(AutoscaleTest, ThreeJobsShareABoundedPoolHigherPriorityFirst) {
  constexpr absl::Duration kPeriod = absl::Seconds(2);
  auto cluster = Start(/*min=*/1, /*max=*/4, kPeriod);
  ASSERT_NE(cluster, nullptr);
  std::map<uint64_t, std::vector<uint64_t>> low_ids, mid_ids, high_ids;
  auto step = [](int millis) {
    return [millis](int) { absl::SleepFor(absl::Milliseconds(millis)); };
  };
  std::thread low([&] {
    low_ids = Consume(cluster->address(), "low", /*epochs=*/3,
                      /*sleep_micros=*/40000, step(20));
  });
  std::thread mid([&] {
    mid_ids = Consume(cluster->address(), "mid", /*epochs=*/6,
                      /*sleep_micros=*/20000, step(10));
  });
  const absl::Time started = absl::Now();
  std::thread high([&] {
    high_ids = Consume(cluster->address(), "high", /*epochs=*/10,
                       /*sleep_micros=*/10000, {}, /*priority=*/1);
  });
  absl::Duration allocated_at = absl::InfiniteDuration();
  std::map<std::string, double> shares;
  std::string last;
  std::vector<std::string> trace;  // each new decision, with its time
  while (absl::Now() - started < 6 * kPeriod) {
    absl::StatusOr<proto::GetStatusResponse> status = tools::FetchStatus(cluster->address());
    if (status.ok() && (trace.empty() || status->reason() != last)) {
      last = status->reason();
      std::string jobs;
      for (const proto::JobStatus& j : status->jobs()) {
        absl::StrAppend(&jobs, " ", j.job_name(), "=", j.allocated_workers(), "/",
                        j.need_workers());
      }
      trace.push_back(absl::StrCat(absl::FormatDuration(absl::Now() - started), jobs, " ", last));
    }
    if (status.ok() && status->pool_bound() && status->jobs_size() == 3) {
      std::map<std::string, double> now;
      bool all = true;
      for (const proto::JobStatus& j : status->jobs()) {
        now[j.job_name()] = j.allocated_workers();
        all &= !j.allocation_reason().empty() && j.demand_elements_per_second() > 0;
      }
      if (all && now["high"] >= now["mid"] && now["high"] >= now["low"]) {
        allocated_at = absl::Now() - started;
        shares = now;
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  high.join();
  mid.join();
  low.join();
  // How soon the allocation comes (about two decisions after a job's first report) depends on
  // the machine's load: bench/autoscale.sh measures it; here it only has to come while the jobs
  // read.
  const std::string decisions = absl::StrJoin(trace, "\n");
  EXPECT_LT(allocated_at, absl::InfiniteDuration()) << decisions;
  EXPECT_EQ(shares.size(), 3u) << decisions;
  EXPECT_GT(shares["high"], 0) << decisions;
  EXPECT_NEAR(shares["high"] + shares["mid"] + shares["low"], 4, 1e-9) << decisions;
  ExpectEveryRecordOncePerEpoch(high_ids, 10);
  ExpectEveryRecordOncePerEpoch(mid_ids, 6);
  ExpectEveryRecordOncePerEpoch(low_ids, 3);
}

// A trainer SIGKILLed mid-epoch sends no `leaving`: its job keeps its lease (60 s) for a restart,
// but its share of the bounded pool goes to the job still reading as soon as the dispatcher finds
// it silent (5 s), not when the lease runs out. "doomed" is a real `sluice consume` process of
// priority 1 (a step of 200 ms: 40 el/s, less than a worker); "steady" reads 15 epochs as fast
// as it can (it needs more than the pool). Seen in the status while doomed's job is still
// there: its consumer silent, its allocation 0, steady's the whole pool; steady reads every
// record once per epoch.
TEST_F(AutoscaleTest, AKilledTrainersShareGoesToTheJobStillReading) {
  auto cluster = Start(/*min=*/1, /*max=*/2);
  ASSERT_NE(cluster, nullptr);
  const std::string spec = tmp_.Join("doomed.yaml");
  ASSERT_TRUE(WriteFileAtomically(
                  spec, absl::StrCat("seed: 3\nsource:\n  dataset: {path: ", data_->Join("ds"),
                                     "}\n  columns: [label]\nnodes:\n  - map:\n"
                                     "      input_columns: [label]\n"
                                     "      ops:\n        - sleep: {micros: 20000}\n"
                                     "  - batch: {size: 8, drop_remainder: false}\n"))
                  .ok());
  auto doomed = Subprocess::Start(
      {BinDir() + "/sluice", "consume", "--dispatcher", cluster->address(), "--spec", spec, "--job",
       "doomed", "--epochs", "1000", "--priority", "1", "--step-time", "200ms"},
      {.log_file = tmp_.Join("doomed.log")});
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  std::map<uint64_t, std::vector<uint64_t>> steady_ids;
  std::thread steady([&] {
    steady_ids = Consume(cluster->address(), "steady", /*epochs=*/15, /*sleep_micros=*/20000);
  });
  auto job = [](const proto::GetStatusResponse& status,
                const std::string& name) -> const proto::JobStatus* {
    for (const proto::JobStatus& j : status.jobs()) {
      if (j.job_name() == name) return &j;
    }
    return nullptr;
  };
  std::string seen;  // the last status, for a failure's message
  auto shares = [&](bool doomed_alive) {
    absl::StatusOr<proto::GetStatusResponse> status = tools::FetchStatus(cluster->address());
    if (!status.ok()) return false;
    seen = tools::StatusText(*status);
    const proto::JobStatus* d = job(*status, "doomed");
    const proto::JobStatus* s = job(*status, "steady");
    if (!status->pool_bound() || d == nullptr || s == nullptr || d->consumers_size() != 1) {
      return false;
    }
    if (doomed_alive) return d->allocated_workers() > 0 && s->allocated_workers() > 0;
    return d->consumers(0).silent_seconds() > 0 && d->allocated_workers() == 0 &&
           s->allocated_workers() == 2;
  };
  EXPECT_TRUE(cluster->Eventually([&] { return shares(/*doomed_alive=*/true); })) << seen;
  (*doomed)->Signal(SIGKILL);
  ASSERT_TRUE((*doomed)->Wait(absl::Seconds(10)).ok());
  // Well inside the 60 s lease: the job must still be listed.
  EXPECT_TRUE(
      cluster->Eventually([&] { return shares(/*doomed_alive=*/false); }, absl::Seconds(40)))
      << seen;
  steady.join();
  ExpectEveryRecordOncePerEpoch(steady_ids, 15);
}

}  // namespace
}  // namespace sluice
