// tools/local_cluster on its own: LocalCluster with real sluice-dispatcher and
// sluice-worker processes on loopback (started, restarted, killed for real),
// MakeCertificates checked with `openssl verify`, the `sluice status` renderings
// of a fixed GetStatusResponse, and LocalAutoscaler's decisions against a
// dispatcher run with `--scaler local`. No timing is asserted: waits only bound
// a test that would otherwise hang.
#include "tools/local_cluster/local_cluster.h"

#include <signal.h>

#include <filesystem>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/autoscale.h"
#include "tools/local_cluster/certificates.h"

namespace sluice::tools {
namespace {

namespace fs = std::filesystem;
using ::sluice::testing::ReadFile;
using ::sluice::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string TestBinDir() {
  const char* dir = std::getenv("SLUICE_BIN_DIR");
  return dir != nullptr ? dir : BinDir();
}

// Waits up to `timeout` for `done`; false on timeout.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return done();
}

int RegisteredWorkers(const std::string& dispatcher) {
  absl::StatusOr<proto::GetStatusResponse> status = FetchStatus(dispatcher);
  return status.ok() ? status->workers_size() : -1;
}

TEST(LocalCluster, StartWithoutWorkDirIsInvalidArgument) {
  auto cluster = LocalCluster::Start({.bin_dir = TestBinDir()});
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster.status().message(), HasSubstr("work_dir"));
}

TEST(LocalCluster, NegativeWorkerCountIsInvalidArgument) {
  TempDir tmp;
  auto cluster =
      LocalCluster::Start({.bin_dir = TestBinDir(), .workers = -1, .work_dir = tmp.path()});
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalCluster, MissingBinariesAreReportedNotHung) {
  TempDir tmp;
  auto cluster = LocalCluster::Start(
      {.bin_dir = tmp.Join("no-such-folder"), .workers = 1, .work_dir = tmp.Join("work")});
  EXPECT_FALSE(cluster.ok());
  EXPECT_THAT(cluster.status().message(), HasSubstr("sluice-dispatcher"));
}

TEST(LocalCluster, StartsEveryProcessWithAddressFilesAndLogsThenStops) {
  TempDir tmp;
  auto cluster = LocalCluster::Start({.bin_dir = TestBinDir(),
                                      .workers = 2,
                                      .data_roots = {tmp.path()},
                                      .work_dir = tmp.Join("work")});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_EQ(c.num_workers(), 2);

  // Each process reported its port through its own address file in work_dir.
  EXPECT_THAT(c.dispatcher_address(), StartsWith("127.0.0.1:"));
  EXPECT_EQ(absl::StripAsciiWhitespace(ReadFile(tmp.Join("work/dispatcher.address"))),
            c.dispatcher_address());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(
        absl::StripAsciiWhitespace(ReadFile(tmp.Join(absl::StrCat("work/worker-", i, ".address")))),
        c.worker(i).address);
    EXPECT_TRUE(fs::exists(tmp.Join(absl::StrCat("work/worker-", i, ".log"))));
    EXPECT_GT(c.worker(i).metrics_port, 0);
  }
  EXPECT_NE(c.worker(0).address, c.worker(1).address);
  EXPECT_TRUE(fs::exists(tmp.Join("work/dispatcher.log")));
  EXPECT_TRUE(fs::is_directory(tmp.Join("work/dispatcher-state")));

  // The workers found the dispatcher, and the exposers serve /metrics.
  EXPECT_TRUE(Eventually([&] { return RegisteredWorkers(c.dispatcher_address()) == 2; }));
  absl::StatusOr<std::string> metrics = ScrapeMetrics(c.dispatcher_metrics_port());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("sluice_"));
  EXPECT_EQ(c.FindExitedChild(), "");

  // Stop: SIGTERM drains the workers, then the dispatcher; all exit cleanly.
  c.Stop();
  EXPECT_THAT(c.FindExitedChild(),
              AllOf(StartsWith("sluice-dispatcher"), HasSubstr("exited with code 0")));
  EXPECT_FALSE(FetchStatus(c.dispatcher_address(), -1, absl::Seconds(1)).ok());
}

TEST(LocalCluster, RestartedDispatcherKeepsItsAddressAndWorkers) {
  TempDir tmp;
  auto cluster = LocalCluster::Start({.bin_dir = TestBinDir(),
                                      .workers = 1,
                                      .data_roots = {tmp.path()},
                                      .work_dir = tmp.Join("work")});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string address = c.dispatcher_address();
  ASSERT_TRUE(Eventually([&] { return RegisteredWorkers(c.dispatcher_address()) == 1; }));

  ASSERT_TRUE(c.RestartDispatcher().ok());
  EXPECT_EQ(c.dispatcher_address(), address);
  EXPECT_EQ(c.FindExitedChild(), "");
  // The worker re-registers with the new dispatcher process.
  EXPECT_TRUE(Eventually([&] { return RegisteredWorkers(c.dispatcher_address()) == 1; }));
}

TEST(LocalCluster, KilledWorkerIsFoundAndReaped) {
  TempDir tmp;
  auto cluster = LocalCluster::Start({.bin_dir = TestBinDir(),
                                      .workers = 2,
                                      .data_roots = {tmp.path()},
                                      .work_dir = tmp.Join("work")});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string killed = c.worker(0).address;
  const std::string survivor = c.worker(1).address;

  c.SignalWorker(0, SIGKILL);
  std::string exited;
  ASSERT_TRUE(Eventually([&] {
    exited = c.FindExitedChild();
    return !exited.empty();
  }));
  EXPECT_THAT(exited, AllOf(StartsWith("sluice-worker"),
                            HasSubstr(absl::StrCat("exited with code ", 128 + SIGKILL))));

  const std::vector<std::string> reaped = c.ReapExitedWorkers();
  ASSERT_EQ(reaped.size(), 1u);
  EXPECT_THAT(reaped[0], HasSubstr(killed));
  EXPECT_THAT(reaped[0], HasSubstr(absl::StrCat("exited with code ", 128 + SIGKILL)));
  ASSERT_EQ(c.num_workers(), 1);
  EXPECT_EQ(c.worker(0).address, survivor);
  EXPECT_EQ(c.FindExitedChild(), "");

  // A new worker takes the next index's files, not the dead one's.
  absl::StatusOr<int> added = c.AddWorker();
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 1);
  EXPECT_TRUE(fs::exists(tmp.Join("work/worker-2.address")));
}

// Runs `argv` to its end; its exit code and its output.
std::pair<int, std::string> RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  auto process = Subprocess::Start(argv, {.log_file = log});
  if (!process.ok()) return {-1, process.status().ToString()};
  absl::StatusOr<int> code = (*process)->Wait(absl::Seconds(30));
  return {code.value_or(-1), ReadFile(log)};
}

TEST(MakeCertificates, MakesACaAndCertificatesOpensslVerifies) {
  TempDir tmp;
  absl::StatusOr<Certificates> certs = MakeCertificates(tmp.Join("tls"));
  ASSERT_TRUE(certs.ok()) << certs.status();
  for (const std::string& file :
       {certs->ca, certs->server_cert, certs->server_key, certs->client_cert, certs->client_key,
        certs->expired_cert, certs->expired_key, certs->token}) {
    EXPECT_TRUE(fs::exists(file)) << file;
    EXPECT_THAT(file, StartsWith(tmp.Join("tls")));
  }
  EXPECT_GE(absl::StripAsciiWhitespace(ReadFile(certs->token)).size(), 16u);
  // Secrets are the owner's only.
  for (const std::string& secret :
       {certs->server_key, certs->client_key, certs->expired_key, certs->token}) {
    EXPECT_EQ(fs::status(secret).permissions() & (fs::perms::group_all | fs::perms::others_all),
              fs::perms::none)
        << secret;
  }

  // Signed by the CA, and naming 127.0.0.1 and localhost.
  for (const std::string& cert : {certs->server_cert, certs->client_cert}) {
    for (const std::vector<std::string>& name :
         {std::vector<std::string>{"-verify_ip", "127.0.0.1"},
          std::vector<std::string>{"-verify_hostname", "localhost"}}) {
      std::vector<std::string> argv = {"/usr/bin/openssl", "verify", "-CAfile", certs->ca};
      argv.insert(argv.end(), name.begin(), name.end());
      argv.push_back(cert);
      auto [code, output] = RunToEnd(argv, tmp.Join("verify.log"));
      EXPECT_EQ(code, 0) << cert << " " << name[1] << ": " << output;
      fs::remove(tmp.Join("verify.log"));
    }
  }
  // The expired one is signed by the same CA, and refused for its dates only.
  auto [code, output] =
      RunToEnd({"/usr/bin/openssl", "verify", "-CAfile", certs->ca, certs->expired_cert},
               tmp.Join("expired.log"));
  EXPECT_NE(code, 0);
  EXPECT_THAT(output, HasSubstr("expired"));
  auto [signed_code, signed_output] = RunToEnd(
      {"/usr/bin/openssl", "verify", "-CAfile", certs->ca, "-no_check_time", certs->expired_cert},
      tmp.Join("signed.log"));
  EXPECT_EQ(signed_code, 0) << signed_output;
  // Another call makes another CA: the first CA does not sign its certificates.
  absl::StatusOr<Certificates> other = MakeCertificates(tmp.Join("other"));
  ASSERT_TRUE(other.ok()) << other.status();
  auto [other_code, other_output] =
      RunToEnd({"/usr/bin/openssl", "verify", "-CAfile", certs->ca, other->server_cert},
               tmp.Join("other.log"));
  EXPECT_NE(other_code, 0) << other_output;
}

proto::GetStatusResponse FixedStatus() {
  proto::GetStatusResponse s;
  proto::WorkerStatus* w = s.add_workers();
  w->set_worker_id(1);
  w->set_address("127.0.0.1:45659");
  w->set_state("active");
  w->set_splits(1);
  w->set_queue_depth(0);
  w->set_queue_capacity(8);
  w->set_elements_per_second(199.2);
  w->set_elements_per_busy_second(396.71234);
  w->set_age_seconds(42);
  proto::WorkerStatus* d = s.add_workers();
  d->set_worker_id(2);
  d->set_address("127.0.0.1:45660");
  d->set_state("draining");
  d->set_queue_capacity(8);
  d->set_elements_per_second(1234567.0);
  d->set_age_seconds(0.00001);
  s.set_desired_workers(3);
  s.set_current_workers(2);
  s.set_reason("hold 3: \"quoted\" \\ and\na newline");
  s.set_scaler("local");
  s.set_min_workers(1);
  s.set_max_workers(4);
  s.add_drain(2);
  s.add_drain(5);
  proto::JobStatus* j = s.add_jobs();
  j->set_job_id(7);
  j->set_job_name("j1");
  j->set_batch_size(8);
  j->set_num_epochs(30);
  j->set_demand_elements_per_second(821);
  j->set_capacity_elements_per_second(396.8);
  j->set_need_workers(2.0703125);
  proto::ConsumerStatus* c = j->add_consumers();
  c->set_consumer_index(0);
  c->set_epoch(7);
  c->set_splits_done(3);
  c->set_splits(12);
  c->set_batches_per_second(24.99);
  c->set_wait_fraction(0.799);
  c->set_paused(true);
  c->set_silent_seconds(7.25);
  proto::ConsumerStatus* f = j->add_consumers();
  f->set_consumer_index(1);
  f->set_epoch(30);
  f->set_finished(true);
  proto::JobStatus* forever = s.add_jobs();
  forever->set_job_id(8);
  forever->set_job_name("j2 \u00fcn\u00efcode");
  return s;
}

// The stable form docs/autoscaling.md documents and bench/autoscale/plot.py
// reads: keys in this order, numbers with 6 significant digits, one line.
TEST(StatusJson, RendersAFixedStatusExactly) {
  EXPECT_EQ(StatusJson(FixedStatus()),
            R"({"workers":[{"worker_id":1,"address":"127.0.0.1:45659","state":"active",)"
            R"("splits":1,"queue_depth":0,"queue_capacity":8,"elements_per_second":199.2,)"
            R"("elements_per_busy_second":396.712,"age_seconds":42,"assigned_job_id":0},)"
            R"({"worker_id":2,"address":"127.0.0.1:45660","state":"draining",)"
            R"("splits":0,"queue_depth":0,"queue_capacity":8,"elements_per_second":1234570,)"
            R"("elements_per_busy_second":0,"age_seconds":1e-05,"assigned_job_id":0}],)"
            R"("desired_workers":3,"current_workers":2,)"
            R"("reason":"hold 3: \"quoted\" \\ and\na newline","scaler":"local",)"
            R"("min_workers":1,"max_workers":4,"pool_bound":false,"drain":[2,5],)"
            R"("jobs":[{"job_id":7,"job_name":"j1","batch_size":8,"num_epochs":30,)"
            R"("demand_elements_per_second":821,"capacity_elements_per_second":396.8,)"
            R"("need_workers":2.07031,"priority":0,"min_workers":0,)"
            R"("allocated_workers":0,"allocation_reason":"","share_group":0,"shares_with":[],)"
            R"("cache_decision":null,"consumers":[)"
            R"({"consumer_index":0,"epoch":7,"finished":false,"splits_done":3,)"
            R"("splits":12,"batches_per_second":24.99,"wait_fraction":0.799,"paused":true,)"
            R"("silent_seconds":7.25},)"
            R"({"consumer_index":1,"epoch":30,"finished":true,"splits_done":0,)"
            R"("splits":0,"batches_per_second":0,"wait_fraction":0,"paused":false,)"
            R"("silent_seconds":0}]},)"
            R"({"job_id":8,"job_name":"j2 ünïcode","batch_size":0,"num_epochs":0,)"
            R"("demand_elements_per_second":0,"capacity_elements_per_second":0,)"
            R"("need_workers":0,"priority":0,"min_workers":0,)"
            R"("allocated_workers":0,"allocation_reason":"","share_group":0,"shares_with":[],)"
            R"("cache_decision":null,"consumers":[]}]})");
}

// Whatever a client named its job, the line parses, and so does a rate that is
// not a number.
TEST(StatusJson, IsValidJsonWhateverTheNamesAndRates) {
  proto::GetStatusResponse s;
  proto::JobStatus* j = s.add_jobs();
  j->set_job_name("tab\there\x01 \xff\xfe end");
  j->set_need_workers(std::numeric_limits<double>::quiet_NaN());
  j->set_demand_elements_per_second(std::numeric_limits<double>::infinity());
  const std::string line = StatusJson(s);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << line;
  const nlohmann::json& job = parsed["jobs"][0];
  EXPECT_THAT(job["job_name"].get<std::string>(), StartsWith("tab\there\x01 "));
  EXPECT_TRUE(job["need_workers"].is_null());
  EXPECT_TRUE(job["demand_elements_per_second"].is_null());
}

// `cache: auto`: the decision (or why there is none yet) in both renderings.
TEST(StatusJson, RendersTheAutoCacheDecision) {
  proto::GetStatusResponse s = FixedStatus();
  proto::CacheDecision* d = s.mutable_jobs(0)->mutable_cache_decision();
  d->set_decided(true);
  d->set_cache(true);
  d->set_after_node(1);
  d->set_name("auto-5f0c2e7a91b3d4c8");
  d->set_fingerprint("5f0c2e7a91b3d4c8");
  d->set_estimated_bytes(50000000);
  d->set_cpu_seconds_saved_per_epoch(2.05);
  d->set_records_measured(1000);
  d->set_from_epoch(1);
  d->set_reason("cache after nodes[1]: recomputing costs 2.1 CPU s per epoch");
  s.mutable_jobs(1)->mutable_cache_decision()->set_reason("measuring: 312 of 1000 records");
  const std::string json = StatusJson(s);
  EXPECT_THAT(json,
              ::testing::HasSubstr(
                  R"("shares_with":[],"cache_decision":{"decided":true,"cache":true,)"
                  R"("after_node":1,"name":"auto-5f0c2e7a91b3d4c8",)"
                  R"("fingerprint":"5f0c2e7a91b3d4c8","estimated_bytes":50000000,)"
                  R"("cpu_seconds_saved_per_epoch":2.05,"records_measured":1000,)"
                  R"("from_epoch":1,)"
                  R"("reason":"cache after nodes[1]: recomputing costs 2.1 CPU s per epoch"},)"
                  R"("consumers":[)"));
  EXPECT_THAT(json, ::testing::HasSubstr(
                        R"("cache_decision":{"decided":false,"cache":false,"after_node":0,)"
                        R"("name":"","fingerprint":"","estimated_bytes":0,)"
                        R"("cpu_seconds_saved_per_epoch":0,"records_measured":0,"from_epoch":0,)"
                        R"("reason":"measuring: 312 of 1000 records"},"consumers":[]}]})"));
  const std::string text = StatusText(s);
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "need 2.07 workers\n"
                        "  cache auto: from epoch 1, cache after nodes[1]: recomputing costs 2.1 "
                        "CPU s per epoch\n"
                        "  CONSUMER"));
  EXPECT_THAT(text, ::testing::HasSubstr("need 0.00 workers\n"
                                         "  cache auto: measuring: 312 of 1000 records\n"));
}

TEST(StatusJson, EmptyStatusHasEveryKey) {
  EXPECT_EQ(StatusJson(proto::GetStatusResponse()),
            R"({"workers":[],"desired_workers":0,"current_workers":0,)"
            R"("reason":"","scaler":"","min_workers":0,"max_workers":0,)"
            R"("pool_bound":false,"drain":[],"jobs":[]})");
}

TEST(StatusText, RendersAFixedStatusExactly) {
  EXPECT_EQ(StatusText(FixedStatus()),
            "workers: 2 current, 3 desired (scaler local, min 1, max 4)\n"
            "  why: hold 3: \"quoted\" \\ and\na newline\n"
            "\n"
            "ID     ADDRESS                STATE     SPLITS     QUEUE       EL/S  "
            "EL/BUSY-S\n"
            "1      127.0.0.1:45659        active         1    0/8         199.2  "
            "    396.7\n"
            "2      127.0.0.1:45660        draining       0    0/8     1234567.0  "
            "      0.0\n"
            "\n"
            "job 7 'j1' (batch 8, epochs: 30): demand 821.0 el/s, 396.8 el/s per "
            "worker, need 2.07 workers\n"
            "  CONSUMER   EPOCH     PROGRESS  BATCHES/S     WAIT\n"
            "  0              7         3/12      24.99    79.9%  paused (reads nothing: its slot "
            "frees its worker)  silent 7s (no heartbeat: counted as no demand)\n"
            "  1             30     finished       0.00     0.0%\n"
            "\n"
            "job 8 'j2 ünïcode' (batch 0, epochs: forever): demand 0.0 el/s, 0.0 "
            "el/s "
            "per worker, need 0.00 workers\n"
            "  CONSUMER   EPOCH     PROGRESS  BATCHES/S     WAIT\n");
}

// A job name is the client's: its control characters (a terminal escape, a
// newline) are shown escaped, not sent to the terminal.
TEST(StatusText, ShowsControlCharactersInAJobNameEscaped) {
  proto::GetStatusResponse s = FixedStatus();
  s.mutable_jobs(0)->set_job_name("evil\x1b[2J\nworkers: 99\\x1b\x7f");
  EXPECT_THAT(StatusText(s),
              ::testing::HasSubstr("\njob 7 'evil\\x1b[2J\\x0aworkers: 99\\\\x1b\\x7f' (batch 8"));
}

// A bounded pool: each job's allocation and why, and the workers whose
// splits go to it first.
TEST(StatusText, ShowsTheAllocationAndTheWorkersAssignedToEachJob) {
  proto::GetStatusResponse s = FixedStatus();
  s.set_pool_bound(true);
  s.mutable_workers(0)->set_assigned_job_id(7);
  s.mutable_jobs(0)->set_allocated_workers(1);
  s.mutable_jobs(0)->set_allocation_reason("1.00 of its need 2.07: the pool ran out");
  s.mutable_jobs(1)->clear_consumers();
  const std::string text = StatusText(s);
  EXPECT_THAT(text,
              ::testing::HasSubstr("need 2.07 workers\n"
                                   "  allocated 1.00 workers (priority 0, min_workers 0): 1.00 of "
                                   "its need 2.07: the pool ran out\n"
                                   "  served first by worker(s) 1\n"
                                   "  CONSUMER"));
  EXPECT_THAT(text, ::testing::HasSubstr("need 0.00 workers\n"
                                         "  allocated 0.00 workers (priority 0, min_workers 0): \n"
                                         "  CONSUMER"));
}

// A dispatcher run with `--scaler local` and no job wants --min-workers
// workers; the actuator starts what is missing, once, and never more than its
// own maximum.
class LocalAutoscalerTest : public ::testing::Test {
 protected:
  std::unique_ptr<LocalCluster> StartCluster(int min_workers) {
    auto cluster =
        LocalCluster::Start({.bin_dir = TestBinDir(),
                             .workers = 0,
                             .data_roots = {tmp_.path()},
                             .work_dir = tmp_.Join("work"),
                             .extra_dispatcher_flags = {
                                 "--scaler", "local", "--min-workers", std::to_string(min_workers),
                                 "--max-workers", "8", "--scale-period", "100ms"}});
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? std::move(*cluster) : nullptr;
  }

  // Steps until `live` workers run; the workers started on the way.
  int StepUntilLive(LocalAutoscaler& scaler, int live) {
    int started = 0;
    Eventually([&] {
      absl::StatusOr<AutoscaleStep> step = scaler.Step();
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) return true;
      started += step->started;
      return step->live + step->started >= live;
    });
    return started;
  }

  TempDir tmp_;
};

TEST_F(LocalAutoscalerTest, StartsTheWorkersTheDispatcherWantsOnce) {
  std::unique_ptr<LocalCluster> cluster = StartCluster(/*min_workers=*/2);
  ASSERT_NE(cluster, nullptr);
  LocalAutoscaler scaler(cluster.get(), /*max_workers=*/8);
  EXPECT_EQ(StepUntilLive(scaler, 2), 2);
  ASSERT_EQ(cluster->num_workers(), 2);
  // Started workers count as current before and after they register: no
  // second round of starts.
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<AutoscaleStep> step = scaler.Step();
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->desired, 2);
    EXPECT_EQ(step->live, 2);
    EXPECT_EQ(step->started, 0);
    EXPECT_TRUE(step->exited.empty());
  }
  EXPECT_TRUE(Eventually([&] { return RegisteredWorkers(cluster->dispatcher_address()) == 2; }));
}

TEST_F(LocalAutoscalerTest, NeverStartsMoreThanItsMaximum) {
  std::unique_ptr<LocalCluster> cluster = StartCluster(/*min_workers=*/3);
  ASSERT_NE(cluster, nullptr);
  LocalAutoscaler scaler(cluster.get(), /*max_workers=*/1);
  EXPECT_EQ(StepUntilLive(scaler, 1), 1);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<AutoscaleStep> step = scaler.Step();
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->started, 0);
  }
  EXPECT_EQ(cluster->num_workers(), 1);
}

TEST_F(LocalAutoscalerTest, KilledWorkerIsReportedAndReplaced) {
  std::unique_ptr<LocalCluster> cluster = StartCluster(/*min_workers=*/1);
  ASSERT_NE(cluster, nullptr);
  LocalAutoscaler scaler(cluster.get(), /*max_workers=*/8);
  ASSERT_EQ(StepUntilLive(scaler, 1), 1);
  const std::string first = cluster->worker(0).address;
  cluster->SignalWorker(0, SIGKILL);
  ASSERT_TRUE(Eventually([&] { return !cluster->FindExitedChild().empty(); }));

  absl::StatusOr<AutoscaleStep> step = scaler.Step();
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ(step->exited.size(), 1u);
  EXPECT_THAT(step->exited[0], HasSubstr(first));
  EXPECT_EQ(step->live, 0);
  EXPECT_EQ(step->started, 1);
  ASSERT_EQ(cluster->num_workers(), 1);
  EXPECT_NE(cluster->worker(0).address, first);
}

TEST(FetchStatus, UnreachableDispatcherIsUnavailableNamingIt) {
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  auto status = FetchStatus(address, -1, absl::Milliseconds(500));
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.status().message(), HasSubstr(address));
}

TEST(SumByLabel, SumsOneMetricBySomeLabel) {
  const std::string text =
      "# HELP sluice_x_total x\n"
      "sluice_x_total{stage=\"map[0]\",worker=\"a\"} 2.5\n"
      "sluice_x_total{stage=\"map[0]\",worker=\"b\"} 10\n"
      "sluice_x_total{stage=\"batch\"} 1\n"
      "sluice_x_total_other{stage=\"batch\"} 100\n"
      "sluice_y_total{stage=\"batch\"} 100\n";
  EXPECT_EQ(SumByLabel(text, "sluice_x_total", "stage"),
            (std::map<std::string, double>{{"map[0]", 12.5}, {"batch", 1}}));
}

}  // namespace
}  // namespace sluice::tools
