// The control plane's promises under failure, with real processes: every split ends (also the
// ones that yield no batch), every record exactly once through worker kills with filters, reset
// connections, killed consumers, dispatcher restarts, stopped workers; errors that no retry
// fixes reach GetNext; a consumer saved, killed and restored continues exactly once. One file
// (~650 lines): every case uses the same real-process cluster fixture and exactly-once checks.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/process.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "data_worker/pipeline/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"
#include "prometheus/registry.h"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/fake_dns.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRecords = 480;  // "ds": 3 shards of 160; label = index % 10

using ::sluice::testing::BinDir;
using ::sluice::testing::Received;

std::string Jpeg(int i) {
  return testing::Jpeg(
      cv::Mat(24, 32, CV_8UC3, cv::Scalar(i % 256, (i * 7) % 256, (i * 13) % 256)));
}

// `records` records of 2035 bytes (3 shards of 160 for 480); records in [bad_begin, bad_end)
// are not images.
void WriteDataset(const std::string& dir, int records, int bad_begin = 0, int bad_end = 0) {
  testing::WriteJpegDataset(
      dir,
      {.records = records,
       .shard_size_bytes = 332000,
       .image =
           [&](int i) { return i >= bad_begin && i < bad_end ? std::string(600, 'x') : Jpeg(i); },
       .pad_to = 2000});
}

struct PipelineOptions {
  int batch = 8;
  bool drop_remainder = false;
  int sleep_micros = 0;
  int size = 16;
  std::string filter;
  std::string on_error = "fail";
};

proto::Pipeline MakePipeline(const std::string& dataset, const PipelineOptions& o) {
  std::string yaml =
      absl::StrCat("seed: 3\non_error: ", o.on_error, "\nsource:\n  dataset: {path: ", dataset,
                   "}\n  columns: [image, label]\nnodes:\n", "  - shuffle: {seed: 3}\n");
  if (!o.filter.empty()) absl::StrAppend(&yaml, "  - filter: {predicate: \"", o.filter, "\"}\n");
  absl::StrAppend(&yaml, "  - map:\n      input_columns: [image]\n      ops:\n",
                  "        - decode: {}\n        - resize: {height: ", o.size, ", width: ", o.size,
                  "}\n");
  if (o.sleep_micros > 0)
    absl::StrAppend(&yaml, "        - sleep: {micros: ", o.sleep_micros, "}\n");
  absl::StrAppend(&yaml, "  - batch: {size: ", o.batch,
                  ", drop_remainder: ", o.drop_remainder ? "true" : "false", "}\n");
  auto pipeline = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(pipeline.ok()) << pipeline.status() << "\n" << yaml;
  return pipeline.value_or(proto::Pipeline());
}

class ControlPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    WriteDataset(data_->Join("ds"), kRecords);
    WriteDataset(data_->Join("bad"), 80, /*bad_begin=*/0, /*bad_end=*/40);
  }
  static void TearDownTestSuite() { delete data_; }

  std::unique_ptr<tools::LocalCluster> StartCluster(int workers,
                                                    std::vector<std::string> dispatcher_flags = {},
                                                    std::vector<std::string> worker_flags = {}) {
    auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                               .workers = workers,
                                               .data_roots = {data_->path()},
                                               .work_dir = tmp_.Join(absl::StrCat("c", ++n_)),
                                               .worker_threads = 1,
                                               .log_level = "info",
                                               .heartbeat_interval = absl::Milliseconds(100),
                                               .worker_timeout = absl::Seconds(1),
                                               .extra_worker_flags = worker_flags,
                                               .extra_dispatcher_flags = dispatcher_flags});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? *std::move(cluster) : nullptr;
  }

  static JobOptions Job(const std::string& name, const proto::Pipeline& pipeline,
                        uint64_t epochs = 1) {
    return {
        .job_name = name, .pipeline = pipeline, .seed = 11, .num_epochs = epochs, .split_size = 40};
  }

  static Received Consume(const std::string& address, const JobOptions& job,
                          const std::function<void(int)>& after_batch = nullptr) {
    return testing::ConsumeJob({.dispatcher_address = address,
                                .connect_timeout = absl::Seconds(5),
                                .heartbeat_interval = absl::Milliseconds(100),
                                .prefetch_batches = 4,
                                .dispatcher_lost_timeout = absl::Seconds(60)},
                               job, after_batch);
  }

  // Exactly `want`, each once.
  static void ExpectExactly(std::vector<uint64_t> got, const std::vector<uint64_t>& want) {
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, want);
  }
  static std::vector<uint64_t> Range(uint64_t n) {
    std::vector<uint64_t> out(n);
    for (uint64_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }

  // `sluice consume ARGS` as a process; its exit code (-1 if it could not run or hung).
  int RunConsume(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {BinDir() + "/sluice", "consume"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p =
        Subprocess::Start(argv, {.log_file = tmp_.Join(absl::StrCat("consume", ++runs_, ".log"))});
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return -1;
    auto code = (*p)->Wait(absl::Seconds(120));
    if (!code.ok() || *code != 0) {
      std::ifstream log((*p)->log_file());
      std::cerr << "sluice consume exited " << (code.ok() ? *code : -1) << "; its log:\n"
                << log.rdbuf();
    }
    return code.ok() ? *code : -1;
  }

  static std::vector<uint64_t> ReadIds(const std::string& path) {
    std::vector<uint64_t> ids;
    std::ifstream in(path);
    for (uint64_t id; in >> id;) ids.push_back(id);
    return ids;
  }

  // A shuffling pipeline of 8x8 images in batches of 8, as a spec file for `sluice consume`.
  std::string WriteResizeSpec() {
    const std::string spec = tmp_.Join("spec.yaml");
    std::ofstream out(spec);
    out << "seed: 1\nsource:\n  dataset: {path: " << data_->Join("ds")
        << "}\n  columns: [image, label]\nnodes:\n  - shuffle: {seed: 1}\n  - "
           "map:\n"
           "      input_columns: [image]\n      ops:\n        - decode: {}\n"
           "        - resize: {height: 8, width: 8}\n  - batch: {size: 8}\n";
    return spec;
  }

  static TempDir* data_;
  TempDir tmp_;
  int n_ = 0;
  std::atomic<int> runs_{0};
};

TempDir* ControlPlaneTest::data_ = nullptr;

TEST_F(ControlPlaneTest, SlotsShorterThanABatchEndWithDropRemainder) {
  // 3 consumers share 480 records: 160 each, in slots of 48, 48, 48 and 16. Under
  // drop_remainder the 16-record slot yields no batch of 48; every epoch must still end, with
  // 3 batches for every consumer (equal step counts), no record twice.
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  std::vector<Received> got(3);
  std::vector<std::thread> consumers;
  for (uint32_t c = 0; c < 3; ++c) {
    consumers.emplace_back([&, c] {
      JobOptions job =
          Job("short-tail", MakePipeline(data_->Join("ds"), {.batch = 48, .drop_remainder = true}));
      job.split_size = 48;
      job.num_consumers = 3;
      job.consumer_index = c;
      got[c] = Consume(cluster->dispatcher_address(), job);
    });
  }
  for (std::thread& t : consumers) t.join();
  std::set<uint64_t> unique;
  for (uint32_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(got[c].status.ok()) << got[c].status;
    EXPECT_EQ(got[c].ids[0].size(), 3u * 48) << "consumer " << c;
    unique.insert(got[c].ids[0].begin(), got[c].ids[0].end());
  }
  EXPECT_EQ(unique.size(), 9u * 48);
}

TEST_F(ControlPlaneTest, EveryConsumerGetsTheSameNumberOfRecordsAndBatches) {
  // 480 records over 7 consumers, batches of 8, slots of 40. PAD: 69 records each (slots of
  // 40 and 29: 5 + 4 batches), 3 records read twice; DROP: 68 each (5 + 4 batches), 4 records
  // left out. Whatever the shard sizes (160), split size and consumer count.
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  for (bool drop : {false, true}) {
    SCOPED_TRACE(drop ? "drop" : "pad");
    std::vector<Received> got(7);
    std::vector<std::thread> consumers;
    for (uint32_t c = 0; c < 7; ++c) {
      consumers.emplace_back([&, c] {
        JobOptions job =
            Job(drop ? "seven-drop" : "seven-pad", MakePipeline(data_->Join("ds"), {.batch = 8}));
        job.num_consumers = 7;
        job.consumer_index = c;
        job.drop_remainder = drop;
        got[c] = Consume(cluster->dispatcher_address(), job);
      });
    }
    for (std::thread& t : consumers) t.join();
    std::map<uint64_t, int> times;
    for (uint32_t c = 0; c < 7; ++c) {
      ASSERT_TRUE(got[c].status.ok()) << got[c].status;
      EXPECT_EQ(got[c].ids[0].size(), drop ? 68u : 69u) << "consumer " << c;
      EXPECT_EQ(got[c].shapes.size(), 9u) << "consumer " << c;
      for (uint64_t id : got[c].ids[0]) ++times[id];
    }
    int twice = 0;
    for (const auto& [id, n] : times) {
      ASSERT_LT(id, static_cast<uint64_t>(kRecords));
      ASSERT_LE(n, 2) << id;
      if (n == 2) ++twice;
    }
    EXPECT_EQ(twice, drop ? 0 : 3);
    EXPECT_EQ(times.size(), drop ? 476u : 480u);
  }
}

TEST_F(ControlPlaneTest, SplitsWhoseRecordsAreAllFilteredOutEnd) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  Received r =
      Consume(cluster->dispatcher_address(),
              Job("all-filtered", MakePipeline(data_->Join("ds"), {.filter = "label == 99"}),
                  /*epochs=*/2));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.ids.empty());
}

TEST_F(ControlPlaneTest, ASplitOfOnlyBadRecordsEndsUnderSkip) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  Received r = Consume(cluster->dispatcher_address(),
                       Job("skip-bad", MakePipeline(data_->Join("bad"), {.on_error = "skip"})));
  ASSERT_TRUE(r.status.ok()) << r.status;
  std::vector<uint64_t> want;
  for (uint64_t i = 40; i < 80; ++i) want.push_back(i);
  ExpectExactly(r.ids[0], want);
}

TEST_F(ControlPlaneTest, ABadRecordUnderFailReachesGetNextWithSplitRecordAndCause) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  Received r =
      Consume(cluster->dispatcher_address(), Job("fail-bad", MakePipeline(data_->Join("bad"), {})));
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
  EXPECT_THAT(r.status.message(), HasSubstr("sluice worker at"));
  EXPECT_THAT(r.status.message(), HasSubstr("split"));
  EXPECT_THAT(r.status.message(), HasSubstr("record"));
}

TEST_F(ControlPlaneTest, FilterAndAWorkerKillStillDeliverEveryKeptRecordOnce) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  bool killed = false;
  Received r = Consume(
      cluster->dispatcher_address(),
      Job("filter-kill", MakePipeline(data_->Join("ds"),
                                      {.sleep_micros = 4000, .filter = "label in [1, 3, 4, 8]"})),
      [&](int batches) {
        if (batches == 4 && !killed) {
          cluster->SignalWorker(1, SIGKILL);
          killed = true;
        }
      });
  ASSERT_TRUE(killed);
  ASSERT_TRUE(r.status.ok()) << r.status;
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < kRecords; ++i) {
    if (i % 10 == 1 || i % 10 == 3 || i % 10 == 4 || i % 10 == 8) want.push_back(i);
  }
  ExpectExactly(r.ids[0], want);
}

// Workers killed just before an epoch ends, while they may hold slots of the next epoch (opened
// early): 60 batches per epoch; worker 1 dies at the 58th batch of epoch 0, worker 2 at the 58th
// of epoch 1. Every epoch still delivers every record exactly once.
TEST_F(ControlPlaneTest, WorkersKilledAtEpochEndsLoseNothingOfEitherEpoch) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  int kills = 0;
  Received r = Consume(cluster->dispatcher_address(),
                       Job("epoch-ends", MakePipeline(data_->Join("ds"), {.sleep_micros = 2000}),
                           /*epochs=*/3),
                       [&](int batches) {
                         if (batches == 58 || batches == 118) {
                           cluster->SignalWorker(batches == 58 ? 1 : 2, SIGKILL);
                           ++kills;
                         }
                       });
  ASSERT_EQ(kills, 2);
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (int epoch = 0; epoch < 3; ++epoch) ExpectExactly(r.ids[epoch], Range(kRecords));
}

// True iff nothing accepts a TCP connection on 127.0.0.1:`port`.
bool Refuses(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool refused = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0;
  close(fd);
  return refused;
}

TEST_F(ControlPlaneTest, AResetConnectionToALiveWorkerLosesNothing) {
  auto port = tools::PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string relay_address = absl::StrCat("127.0.0.1:", *port);
  // The worker tells the dispatcher (and so the client) the relay's address.
  auto cluster = StartCluster(1, {}, {"--advertise-address", relay_address});
  ASSERT_NE(cluster, nullptr);
  auto start_relay = [&] {
    auto relay = Subprocess::Start({BinDir() + "/tcp_relay", "--listen", std::to_string(*port),
                                    "--to", cluster->worker(0).address},
                                   {.log_file = tmp_.Join("relay.log")});
    EXPECT_TRUE(relay.ok()) << relay.status();
    return relay.ok() ? *std::move(relay) : nullptr;
  };
  std::unique_ptr<Subprocess> relay = start_relay();
  ASSERT_NE(relay, nullptr);
  int resets = 0;
  Received r = Consume(
      cluster->dispatcher_address(),
      Job("reset", MakePipeline(data_->Join("ds"), {.sleep_micros = 1500, .size = 32})),
      [&](int batches) {
        if (batches % 15 == 0 && resets < 3) {
          relay->Signal(SIGKILL);  // every connection through it is cut, bytes in flight lost
          (void)relay->Wait(absl::Seconds(5));
          // Down for real (its connections are gone) before it comes back.
          EXPECT_TRUE(Refuses(*port));
          relay = start_relay();
          ++resets;
        }
      });
  EXPECT_EQ(resets, 3);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectExactly(r.ids[0], Range(kRecords));
  relay->Stop(absl::Seconds(1));
}

TEST_F(ControlPlaneTest, AKilledConsumerFreesTheWorkersForTheNextJob) {
  auto cluster = StartCluster(1, {"--consumer-timeout", "2s"}, {"--capacity", "1"});
  ASSERT_NE(cluster, nullptr);
  const std::string spec = tmp_.Join("spec.yaml");
  {
    std::ofstream out(spec);
    out << "seed: 1\nsource:\n  dataset: {path: " << data_->Join("ds")
        << "}\n  columns: [image, label]\nnodes:\n  - map:\n      "
           "input_columns: [image]\n"
           "      ops:\n        - decode: {}\n        - sleep: {micros: "
           "20000}\n"
           "  - batch: {size: 8}\n";
  }
  const std::string ids = tmp_.Join("dead.ids");
  auto consumer = Subprocess::Start(
      {BinDir() + "/sluice", "consume", "--dispatcher", cluster->dispatcher_address(), "--spec",
       spec, "--job", "dies", "--ids-out", ids},
      {.log_file = tmp_.Join("dead.log")});
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  // Let it start, then kill it mid-epoch: its split stays held on the only worker.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::error_code ec;
  while ((std::filesystem::file_size(ids, ec) == 0 || ec) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  (*consumer)->Signal(SIGKILL);
  (void)(*consumer)->Wait(absl::Seconds(5));
  // A new job on the same worker gets its capacity once the dead consumer's lease expires.
  Received r =
      Consume(cluster->dispatcher_address(), Job("after", MakePipeline(data_->Join("ds"), {})));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectExactly(r.ids[0], Range(kRecords));
}

TEST_F(ControlPlaneTest, ADispatcherKilledMidEpochContinuesEveryJobAndServesNewPipelines) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  absl::Status restarted = absl::UnknownError("not restarted");
  Received r = Consume(cluster->dispatcher_address(),
                       Job("survives", MakePipeline(data_->Join("ds"), {.sleep_micros = 3000}),
                           /*epochs=*/2),
                       [&](int batches) {
                         if (batches == 20) restarted = cluster->RestartDispatcher();
                       });
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectExactly(r.ids[0], Range(kRecords));
  ExpectExactly(r.ids[1], Range(kRecords));
  // A new job with another pipeline gets that pipeline, not a cached one of an old job id.
  Received other = Consume(cluster->dispatcher_address(),
                           Job("other", MakePipeline(data_->Join("ds"), {.size = 8})));
  ASSERT_TRUE(other.status.ok()) << other.status;
  ASSERT_FALSE(other.shapes.empty());
  for (const auto& shape : other.shapes) EXPECT_THAT(shape, ::testing::ElementsAre(8, 8, 8, 3));
}

// A dispatcher that comes back at another address under the same DNS name (a restarted pod
// behind a headless Service gets a new IP) is found again by the workers and the trainer, which
// dial the name; every record still comes exactly once.
TEST_F(ControlPlaneTest, ADispatcherBackAtAnotherAddressUnderItsNameIsFoundByName) {
  testing::FakeDns dns("127.0.0.2");
  ASSERT_NE(dns.port(), 0);
  absl::StatusOr<int> port = tools::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string name =
      absl::StrCat("dns://127.0.0.1:", dns.port(), "/dispatcher.sluice.test:", *port);
  auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                             .workers = 2,
                                             .dispatcher_port = *port,
                                             .data_roots = {data_->path()},
                                             .work_dir = tmp_.Join("moved"),
                                             .worker_threads = 1,
                                             .heartbeat_interval = absl::Milliseconds(100),
                                             .worker_timeout = absl::Seconds(1),
                                             .dispatcher_host = "127.0.0.2",
                                             .dispatcher_target = name});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_EQ((*cluster)->dispatcher_address(), absl::StrCat("127.0.0.2:", *port));
  absl::Status moved = absl::UnknownError("not moved");
  Received r = Consume(name,
                       Job("moves", MakePipeline(data_->Join("ds"), {.sleep_micros = 3000}),
                           /*epochs=*/2),
                       [&](int batches) {
                         if (batches != 20) return;
                         dns.Point("127.0.0.3");
                         moved = (*cluster)->RestartDispatcher("127.0.0.3");
                       });
  ASSERT_TRUE(moved.ok()) << moved;
  EXPECT_EQ((*cluster)->dispatcher_address(), absl::StrCat("127.0.0.3:", *port));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectExactly(r.ids[0], Range(kRecords));
  ExpectExactly(r.ids[1], Range(kRecords));
}

TEST_F(ControlPlaneTest, ANewDispatcherWithoutItsStateNeverServesAnOldJobsPipeline) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  Received first = Consume(cluster->dispatcher_address(),
                           Job("first", MakePipeline(data_->Join("ds"), {.size = 16})));
  ASSERT_TRUE(first.status.ok()) << first.status;
  // The dispatcher loses its journal (a new machine): the worker keeps its caches.
  std::filesystem::remove_all(tmp_.Join(absl::StrCat("c", n_, "/dispatcher-state")));
  ASSERT_TRUE(cluster->RestartDispatcher().ok());
  Received second = Consume(cluster->dispatcher_address(),
                            Job("second", MakePipeline(data_->Join("ds"), {.size = 8})));
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_FALSE(second.shapes.empty());
  for (const auto& shape : second.shapes) EXPECT_THAT(shape, ::testing::ElementsAre(8, 8, 8, 3));
  ExpectExactly(second.ids[0], Range(kRecords));
}

TEST_F(ControlPlaneTest, DeterministicModeWithAStoppedWorkerIsBoundedAndUnchanged) {
  const proto::Pipeline pipeline = MakePipeline(data_->Join("ds"), {.sleep_micros = 2000});
  std::vector<uint64_t> reference;
  {
    auto cluster = StartCluster(1);
    ASSERT_NE(cluster, nullptr);
    JobOptions job = Job("det", pipeline);
    job.deterministic = true;
    Received r = Consume(cluster->dispatcher_address(), job);
    ASSERT_TRUE(r.status.ok()) << r.status;
    reference = r.ids[0];
  }
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  JobOptions job = Job("det", pipeline);
  job.deterministic = true;
  bool stopped = false;
  Received r = Consume(cluster->dispatcher_address(), job, [&](int batches) {
    if (batches == 6 && !stopped) {
      cluster->SignalWorker(0,
                            SIGSTOP);  // past --worker-timeout: declared lost
      stopped = true;
    }
  });
  cluster->SignalWorker(0, SIGCONT);
  ASSERT_TRUE(stopped);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.ids[0], reference);
  // The deterministic bound (prefetch 4): a cap of 4 x 4 + 4 other batches, plus the cursor's
  // own batch, which is accepted even at the cap (client/internal/iterator_state.h).
  EXPECT_LE(r.max_buffered, 4 * 4 + 4 + 1);
}

TEST_F(ControlPlaneTest, ParallelEpochsEnd) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  JobOptions job = Job("parallel", MakePipeline(data_->Join("ds"), {}), /*epochs=*/2);
  job.parallel_epochs = true;
  Received r = Consume(cluster->dispatcher_address(), job);
  ASSERT_TRUE(r.status.ok()) << r.status;
  // Each of the 2 workers walks the dataset twice.
  size_t total = 0;
  for (const auto& [epoch, ids] : r.ids) total += ids.size();
  EXPECT_EQ(total, 2u * 2 * kRecords);
}

TEST_F(ControlPlaneTest, SaveKillRestoreContinuesExactlyOnceAndDeterministically) {
  const std::string spec = WriteResizeSpec();
  auto run = [&](const std::string& address, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--dispatcher", address, "--spec",
                                     spec,           "--job", "resume",
                                     "--epochs",     "2",     "--deterministic"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunConsume(args);
  };
  std::vector<uint64_t> uninterrupted;
  {
    auto cluster = StartCluster(1);
    ASSERT_NE(cluster, nullptr);
    ASSERT_EQ(run(cluster->dispatcher_address(), {"--ids-out", tmp_.Join("all.ids")}), 0);
    uninterrupted = ReadIds(tmp_.Join("all.ids"));
    ASSERT_EQ(uninterrupted.size(), 2u * kRecords);
  }
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  // Stop after 37 of 60 batches of epoch 0 with a checkpoint; continue in a new process with
  // three workers.
  ASSERT_EQ(run(cluster->dispatcher_address(),
                {"--ids-out", tmp_.Join("resumed.ids"), "--stop-after-batches", "37",
                 "--save-state", tmp_.Join("state")}),
            0);
  EXPECT_EQ(ReadIds(tmp_.Join("resumed.ids")).size(), 37u * 8);
  ASSERT_TRUE(cluster->AddWorker().ok());
  ASSERT_TRUE(cluster->AddWorker().ok());
  ASSERT_EQ(run(cluster->dispatcher_address(),
                {"--ids-out", tmp_.Join("resumed.ids"), "--restore-state", tmp_.Join("state")}),
            0);
  const std::vector<uint64_t> resumed = ReadIds(tmp_.Join("resumed.ids"));
  EXPECT_EQ(resumed,
            uninterrupted);  // the exact tail, so every record once per epoch
}

TEST_F(ControlPlaneTest, TheNumberOfConsumersChangesAtAnEpochBoundary) {
  // Two trainers read epoch 0 (240 records, 30 batches each) and save their state at its end;
  // three trainers continue from those states: epoch 1 is read by 3 consumers, 160 records
  // each, every record exactly once in both epochs.
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::string spec = WriteResizeSpec();
  std::string job = "resize";
  auto consumer = [&](int index, int world, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--dispatcher",
                                     cluster->dispatcher_address(),
                                     "--spec",
                                     spec,
                                     "--job",
                                     job,
                                     "--epochs",
                                     "2",
                                     "--consumer-index",
                                     absl::StrCat(index),
                                     "--num-consumers",
                                     absl::StrCat(world),
                                     "--ids-out",
                                     tmp_.Join(absl::StrCat("w", world, "c", index, ".ids"))};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::async(std::launch::async, [this, args] { return RunConsume(args); });
  };
  {
    auto c0 = consumer(0, 2, {"--stop-after-batches", "30", "--save-state", tmp_.Join("s0")});
    auto c1 = consumer(1, 2, {"--stop-after-batches", "30", "--save-state", tmp_.Join("s1")});
    ASSERT_EQ(c0.get(), 0);
    ASSERT_EQ(c1.get(), 0);
  }
  std::vector<uint64_t> epoch0 = ReadIds(tmp_.Join("w2c0.ids"));
  const std::vector<uint64_t> more = ReadIds(tmp_.Join("w2c1.ids"));
  epoch0.insert(epoch0.end(), more.begin(), more.end());
  ExpectExactly(epoch0, Range(kRecords));
  {
    auto c0 = consumer(0, 3, {"--restore-state", tmp_.Join("s0")});
    auto c1 = consumer(1, 3, {"--restore-state", tmp_.Join("s1")});
    auto c2 = consumer(2, 3, {"--restore-state", tmp_.Join("s1")});
    ASSERT_EQ(c0.get(), 0);
    ASSERT_EQ(c1.get(), 0);
    ASSERT_EQ(c2.get(), 0);
  }
  std::vector<uint64_t> epoch1;
  for (int c = 0; c < 3; ++c) {
    const std::vector<uint64_t> ids = ReadIds(tmp_.Join(absl::StrCat("w3c", c, ".ids")));
    EXPECT_EQ(ids.size(), 160u) << "consumer " << c;
    epoch1.insert(epoch1.end(), ids.begin(), ids.end());
  }
  ExpectExactly(epoch1, Range(kRecords));
  // Mid-epoch one state cannot change the world size: a clear error, exit code 1 (the states
  // of all old consumers can: resize_test.cc).
  job = "resize-mid";
  ASSERT_EQ(consumer(0, 2, {"--stop-after-batches", "3", "--save-state", tmp_.Join("mid")}).get(),
            0);
  ASSERT_EQ(consumer(0, 3, {"--restore-state", tmp_.Join("mid")}).get(), 1);
  std::ifstream log(tmp_.Join(absl::StrCat("consume", runs_.load(), ".log")));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("pass the states of all 2 old consumers"));
}

// Waits (on the dispatcher's own report, up to 60 s) until it declared `lost` workers lost
// for want of heartbeats.
bool AwaitWorkersLost(tools::LocalCluster& cluster, double lost) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = tools::ScrapeMetrics(cluster.dispatcher_metrics_port());
    if (text.ok() && tools::SumByLabel(*text, "sluice_dispatcher_workers_lost_total",
                                       "reason")["timeout"] >= lost)
      return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Waits (up to 60 s) until the worker whose metrics are on `port` has `depth` batches queued.
bool AwaitQueueDepth(int port, double depth) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = tools::ScrapeMetrics(port);
    if (text.ok() &&
        text->find(absl::StrCat("\nsluice_worker_queue_depth ", depth, "\n")) != std::string::npos)
      return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST_F(ControlPlaneTest, AReplacementWorkerStartedAfterALossUnderASlowTrainerDeliversEverything) {
  // The only worker is SIGKILLed while the trainer is in a slow step (4 batches in its
  // prefetch buffer), and a replacement starts once the dispatcher declared the loss. It gets
  // the split from the trainer's returned counts and fills its 2-batch queue with batches the
  // trainer holds already; only then can the trainer's stream attach (through a relay started
  // late), and those batches are discarded. The producer waiting for queue space must wake up
  // (it used to sleep forever: a hang).
  auto port = tools::PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string relay_address = absl::StrCat("127.0.0.1:", *port);
  auto cluster =
      StartCluster(1, {}, {"--queue-batches", "2", "--advertise-address", relay_address});
  ASSERT_NE(cluster, nullptr);
  auto start_relay = [&](const std::string& to) {
    auto relay =
        Subprocess::Start({BinDir() + "/tcp_relay", "--listen", std::to_string(*port), "--to", to},
                          {.log_file = tmp_.Join("relay.log")});
    EXPECT_TRUE(relay.ok()) << relay.status();
    return relay.ok() ? *std::move(relay) : nullptr;
  };
  std::unique_ptr<Subprocess> relay = start_relay(cluster->worker(0).address);
  ASSERT_NE(relay, nullptr);
  JobOptions job = Job("replaced", MakePipeline(data_->Join("ds"), {}));
  job.split_size = kRecords;  // one split: every queued batch is of the split the trainer holds
  bool replaced = false;
  Received r = Consume(cluster->dispatcher_address(), job, [&](int batches) {
    if (batches == 6) {
      cluster->SignalWorker(0, SIGKILL);
      relay->Signal(SIGKILL);
      (void)relay->Wait(absl::Seconds(5));
      ASSERT_TRUE(AwaitWorkersLost(*cluster, 1));
      absl::StatusOr<int> added = cluster->AddWorker();
      ASSERT_TRUE(added.ok()) << added.status();
      ASSERT_TRUE(AwaitQueueDepth(cluster->worker(*added).metrics_port, 2));
      relay = start_relay(cluster->worker(*added).address);
      replaced = true;
    }
    absl::SleepFor(absl::Milliseconds(30));  // the slow trainer's step
  });
  ASSERT_TRUE(replaced);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectExactly(r.ids[0], Range(kRecords));
  relay->Stop(absl::Seconds(1));
}

TEST_F(ControlPlaneTest, RestoringAStateOlderThanASplitsReassignmentFinishesExactlyOnce) {
  // A state saved after 5 batches; the trainer reads on to batch 15, its only worker dies and a
  // replacement takes the two splits over from the returned counts the dispatcher knew (more
  // than the state's). A new iterator restores the older state: the replacement must produce
  // from what the restored iterator holds (every stream used to be rejected at the same
  // position, a livelock).
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  JobOptions job = Job("older", MakePipeline(data_->Join("ds"), {.sleep_micros = 1000}));
  job.split_size = 240;  // 2 splits of 30 batches
  auto client = DataServiceClient::Create({.dispatcher_address = cluster->dispatcher_address(),
                                           .heartbeat_interval = absl::Milliseconds(100),
                                           .prefetch_batches = 4});
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<uint64_t> ids;
  std::string state;
  {
    auto it = (*client)->Open(job);
    ASSERT_TRUE(it.ok()) << it.status();
    auto read = [&](int n, bool keep) {
      for (int i = 0; i < n; ++i) {
        auto batch = (*it)->GetNext();
        ASSERT_TRUE(batch.ok()) << batch.status();
        ASSERT_TRUE(batch->has_value());
        if (keep)
          ids.insert(ids.end(), (*batch)->global_indices.begin(), (*batch)->global_indices.end());
      }
    };
    read(5, /*keep=*/true);
    auto saved = (*it)->SaveState();
    ASSERT_TRUE(saved.ok()) << saved.status();
    state = *saved;
    read(10, /*keep=*/false);
    cluster->SignalWorker(0, SIGKILL);
    ASSERT_TRUE(AwaitWorkersLost(*cluster, 1));
    absl::StatusOr<int> added = cluster->AddWorker();
    ASSERT_TRUE(added.ok()) << added.status();
    read(5, /*keep=*/false);
  }
  job.restore_state = state;
  prometheus::Registry registry;
  auto restored = DataServiceClient::Create({.dispatcher_address = cluster->dispatcher_address(),
                                             .heartbeat_interval = absl::Milliseconds(100),
                                             .prefetch_batches = 4,
                                             .registry = &registry});
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto it = (*restored)->Open(job);
  ASSERT_TRUE(it.ok()) << it.status();
  for (;;) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    ids.insert(ids.end(), (*batch)->global_indices.begin(), (*batch)->global_indices.end());
  }
  ExpectExactly(ids, Range(kRecords));
  // Each restart of a stream makes progress: the replacement produces from what the restored
  // iterator holds at once (it used to be reopened hundreds of times at the same position).
  double reopens = -1;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name == "sluice_client_stream_reopens_total")
      reopens = family.metric.at(0).counter.value;
  }
  EXPECT_GE(reopens, 0);
  EXPECT_LE(reopens, 2);
}

TEST_F(ControlPlaneTest, AStateRestoresOnlyIntoTheJobAndSpecItWasSavedFrom) {
  // A state saved mid-epoch by job "foreign" over 480 records is refused by a job of the same
  // name over a 240-record dataset (it used to end "successfully" without the records it
  // never delivered), and taken by the job it came from.
  WriteDataset(data_->Join("ds240"), 240);
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  const std::string spec = WriteResizeSpec();
  const std::vector<std::string> common = {
      "--dispatcher", cluster->dispatcher_address(), "--spec", spec, "--job", "foreign"};
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> out = common;
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  };
  ASSERT_EQ(RunConsume(args({"--stop-after-batches", "3", "--save-state", tmp_.Join("state")})), 0);
  ASSERT_EQ(
      RunConsume(args({"--data", data_->Join("ds240"), "--restore-state", tmp_.Join("state")})), 1);
  std::ifstream log(tmp_.Join(absl::StrCat("consume", runs_.load(), ".log")));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("restore a state only into the job and spec it "
                              "was saved from"));
  ASSERT_EQ(
      RunConsume(args({"--restore-state", tmp_.Join("state"), "--ids-out", tmp_.Join("rest.ids")})),
      0);
  EXPECT_EQ(ReadIds(tmp_.Join("rest.ids")).size(), kRecords - 3u * 8);
}

TEST_F(ControlPlaneTest, ASecondProcessWithTheSameConsumerIndexFencesTheFirst) {
  // Two trainers started with --consumer-index 0: the second claims the index, and the first
  // fails loudly (exit 1, naming the cause) instead of both ending "successfully" with part
  // of one share each (the first reads epochs without end: nothing else stops it).
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::string spec = WriteResizeSpec();
  auto args = [&](const std::string& ids) {
    return std::vector<std::string>{BinDir() + "/sluice",
                                    "consume",
                                    "--dispatcher",
                                    cluster->dispatcher_address(),
                                    "--spec",
                                    spec,
                                    "--job",
                                    "dup",
                                    "--consumer-index",
                                    "0",
                                    "--num-consumers",
                                    "2",
                                    "--epochs",
                                    "0",  // until stopped: only fencing ends the first
                                    "--step-time",
                                    "40ms",
                                    "--ids-out",
                                    ids};
  };
  const std::string first_ids = tmp_.Join("first.ids");
  auto first = Subprocess::Start(args(first_ids), {.log_file = tmp_.Join("first.log")});
  ASSERT_TRUE(first.ok()) << first.status();
  // The second starts once the first returned a batch, and stops after 5 batches.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::error_code ec;
  while ((std::filesystem::file_size(first_ids, ec) == 0 || ec) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::vector<std::string> second = args(tmp_.Join("second.ids"));
  second.erase(second.begin(), second.begin() + 2);
  second.insert(second.end(),
                {"--stop-after-batches", "5", "--save-state", tmp_.Join("second.state")});
  EXPECT_EQ(RunConsume(second), 0);
  auto code = (*first)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1);
  std::ifstream log(tmp_.Join("first.log"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("was claimed by another process"));
  // The job has no end: workers would drain until their grace runs out.
  for (int i = 0; i < cluster->num_workers(); ++i) cluster->SignalWorker(i, SIGKILL);
}

TEST_F(ControlPlaneTest, ADispatcherPausedLongerThanEveryLeaseCollectsNothing) {
  // SIGSTOP for 4 s mid-epoch: longer than --consumer-timeout (2 s) and --worker-timeout (1 s).
  // The consumer and the workers kept trying; on resuming the dispatcher restarts their leases
  // instead of collecting the job ("its consumers are gone": the trainer used to fail with
  // "job not found").
  auto cluster = StartCluster(2, {"--consumer-timeout", "2s"});
  ASSERT_NE(cluster, nullptr);
  bool paused = false;
  Received r = Consume(cluster->dispatcher_address(),
                       Job("paused", MakePipeline(data_->Join("ds"), {.sleep_micros = 3000})),
                       [&](int batches) {
                         if (batches == 10) {
                           cluster->SignalDispatcher(SIGSTOP);
                           absl::SleepFor(absl::Seconds(4));  // the pause itself
                           cluster->SignalDispatcher(SIGCONT);
                           paused = true;
                         }
                       });
  ASSERT_TRUE(paused);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectExactly(r.ids[0], Range(kRecords));
}

TEST_F(ControlPlaneTest, AJobOfAMillionOneRecordSlotsStarts) {
  // 1,000,000 slots of one record each (a legal split size): every answer stays bounded (the
  // split sequence as a count, done positions as ranges, progress without acknowledged
  // slots). 200,000 such slots used to make the first ClientHeartbeat answer 6.1 MB, over
  // gRPC's 4 MB limit, and the job could not start.
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto pipeline = sluice::pipeline_spec::ParsePipelineSpec(
      "source: {synthetic: {num_records: 1000000, height: 4, width: 4}, "
      "columns: [label]}\nnodes:\n  - batch: {size: 1}\n");
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  JobOptions job = Job("million", *pipeline);
  job.split_size = 1;
  auto client = DataServiceClient::Create({.dispatcher_address = cluster->dispatcher_address(),
                                           .rpc_timeout = absl::Seconds(60),
                                           .connect_timeout = absl::Seconds(30),
                                           .heartbeat_interval = absl::Milliseconds(100)});
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open(job);
  ASSERT_TRUE(it.ok()) << it.status();
  std::set<uint64_t> ids;
  for (int i = 0; i < 50; ++i) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(batch->has_value());
    ASSERT_EQ((*batch)->global_indices.size(), 1u);
    ids.insert((*batch)->global_indices[0]);
  }
  EXPECT_EQ(ids.size(), 50u);
  auto state = (*it)->SaveState();
  ASSERT_TRUE(state.ok()) << state.status();
}

}  // namespace
}  // namespace sluice
