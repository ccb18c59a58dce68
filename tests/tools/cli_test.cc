// The `sluice` binary as a user runs it: exit codes and the messages bad flags
// and bad data give.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/process.h"
#include "common/base/status_macros.h"
#include "common/record/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

using ::sluice::testing::ReadFile;
using ::sluice::testing::TempDir;
using ::sluice::testing::WriteFile;
using ::testing::HasSubstr;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

class CliTest : public ::testing::Test {
 protected:
  static std::string Bin() {
    const char* bin = std::getenv("SLUICE_BIN_DIR");
    return std::string(bin != nullptr ? bin : ".") + "/sluice";
  }

  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), Bin());
    const std::string log = tmp_.Join(absl::StrCat("run", ++runs_, ".log"));
    auto process = Subprocess::Start(args, {.log_file = log});
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return {};
    // Only a guard against a hang: `datagen --images 400` alone took over 2 minutes under
    // ASan on a loaded 2-core machine.
    auto code = (*process)->Wait(absl::Minutes(5));
    EXPECT_TRUE(code.ok()) << code.status();
    return {code.value_or(-1), ReadFile(log)};
  }

  // A dataset of `n` images made through the CLI itself.
  std::string MakeDataset(int n = 40) {
    const std::string images = tmp_.Join("images"), ds = tmp_.Join("ds");
    EXPECT_EQ(Run({"datagen", "--output", images, "--images", std::to_string(n), "--classes", "4"})
                  .exit_code,
              0);
    EXPECT_EQ(Run({"record", "convert", "--input", images, "--output", ds}).exit_code, 0);
    return ds;
  }

  // A spec that batches the label column alone (no image work), `batch` records a batch.
  std::string LabelsSpec(int batch) {
    const std::string spec = tmp_.Join("labels.yaml");
    WriteFile(spec, absl::StrCat("source: {dataset: {path: /not/used}, columns: [label]}\n"
                                 "nodes:\n  - batch: {size: ",
                                 batch, "}\n"));
    return spec;
  }

  // `sluice local FLAGS` reading this test's folder, its output in LocalLog(), once its
  // dispatcher listens; `address` gets the dispatcher's.
  absl::StatusOr<std::unique_ptr<Subprocess>> StartLocal(std::vector<std::string> flags,
                                                         std::string* address) {
    flags.insert(flags.begin(), {Bin(), "local"});
    flags.insert(flags.end(), {"--data-root", tmp_.path(), "--work-dir", tmp_.Join("local"),
                               "--address-file", tmp_.Join("address")});
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> local,
                     Subprocess::Start(flags, {.log_file = LocalLog()}));
    ASSIGN_OR_RETURN(*address, WaitForAddressFile(tmp_.Join("address"), *local, absl::Seconds(60)));
    return local;
  }
  std::string LocalLog() { return tmp_.Join("local.log"); }

  TempDir tmp_;
  int runs_ = 0;
};

TEST_F(CliTest, MissingRequiredFlagIsAUsageErrorNamingIt) {
  const Result r = Run({"datagen", "--images", "10"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--output"));
}

TEST_F(CliTest, UnknownSubcommandIsRefused) {
  const Result r = Run({"frobnicate"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("frobnicate"));
}

TEST_F(CliTest, UnknownConvertFormatNamesTheValue) {
  const Result r = Run({"record", "convert", "--input", tmp_.path(), "--output", tmp_.Join("o"),
                        "--format", "parquet"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("parquet"));
}

TEST_F(CliTest, VerifyReportsEachCorruptRecordAndExitsNonZero) {
  const std::string ds = MakeDataset();
  const Result ok = Run({"record", "verify", ds});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("ok: 40 records in 1 shard(s) verified"));

  auto dataset = record::Dataset::Open(ds);
  ASSERT_TRUE(dataset.ok());
  const record::IndexEntry e = (*dataset)->shard(0).index()[13];
  dataset->reset();
  std::string shard = ReadFile(ds + "/shard-00000.urec");
  shard[e.offset + e.size / 2] ^= 0x40;
  WriteFile(ds + "/shard-00000.urec", shard);
  const Result bad = Run({"record", "verify", ds});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("shard-00000.urec': record 13 checksum mismatch"));
  EXPECT_THAT(bad.output, HasSubstr("1 problem(s)"));
}

TEST_F(CliTest, CatWritesTheRawColumnAndRejectsAnUnknownOne) {
  const std::string ds = MakeDataset();
  const Result image = Run({"record", "cat", ds, "--index", "5", "--column", "image"});
  EXPECT_EQ(image.exit_code, 0);
  auto dataset = record::Dataset::Open(ds);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(image.output, std::string((*dataset)->Read(5)->columns[0].data));
  const Result bad = Run({"record", "cat", ds, "--index", "5", "--column", "pixels"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("no column 'pixels'"));
  const Result past = Run({"record", "cat", ds, "--index", "40"});
  EXPECT_EQ(past.exit_code, 1);
  EXPECT_THAT(past.output, HasSubstr("record 40 is past the end"));
}

TEST_F(CliTest, InspectShowsTheLabelHistogram) {
  const Result r = Run({"record", "inspect", MakeDataset()});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("records:  40"));
  EXPECT_THAT(r.output, HasSubstr("label histogram (4 distinct)"));
}

TEST_F(CliTest, PipelineRunWritesEveryIdOnceAndEndsWithThroughput) {
  const std::string ds = MakeDataset();
  const std::string spec = tmp_.Join("p.yaml");
  WriteFile(spec, R"(
source: {dataset: {path: /not/used}, columns: [image, label]}
nodes:
  - shuffle: {seed: 1}
  - map: {input_columns: [image], ops: [{decode: {}}, {center_crop: {size: 64}}]}
  - batch: {size: 8}
)");
  const Result r =
      Run({"pipeline", "run", "--spec", spec, "--data", ds, "--ids-out", tmp_.Join("ids")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::ContainsRegex("\nthroughput: [0-9.]+ images/s\n$"));
  std::ifstream ids(tmp_.Join("ids"));
  std::vector<int> seen(40, 0);
  for (int id; ids >> id;) ++seen.at(id);
  EXPECT_EQ(seen, std::vector<int>(40, 1));
}

TEST_F(CliTest, BadPipelineSpecNamesTheNodeAndField) {
  const std::string ds = MakeDataset();
  const std::string spec = tmp_.Join("bad.yaml");
  WriteFile(spec, R"(
source: {dataset: {path: /not/used}}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {random_resized_crop: {size: 0}}]}
)");
  const Result r = Run({"pipeline", "run", "--spec", spec, "--data", ds});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("map[0]"));
  EXPECT_THAT(r.output, HasSubstr("size"));
  const Result missing = Run({"pipeline", "run", "--spec", tmp_.Join("nope.yaml")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("nope.yaml"));
}

TEST_F(CliTest, ConsumeRefusesANonUnirecordDataFolder) {
  const std::string spec = tmp_.Join("p.yaml");
  WriteFile(spec, "source: {dataset: {path: /x}}\nnodes: []\n");
  const Result r = Run({"consume", "--dispatcher", "127.0.0.1:1", "--spec", spec, "--data",
                        tmp_.path(), "--job", "j"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("sluice record convert"));
}

TEST_F(CliTest, LocalTlsServesASecuredConsumerAndRefusesAPlaintextOne) {
  const std::string ds = MakeDataset();
  const std::string spec = tmp_.Join("labels.yaml");
  WriteFile(spec,
            "source: {dataset: {path: /not/used}, columns: [label]}\n"
            "nodes:\n  - batch: {size: 8}\n");
  const std::string work = tmp_.Join("local");
  const std::string log = tmp_.Join("local.log");
  auto local = Subprocess::Start(
      {Bin(), "local", "--workers", "1", "--threads-per-worker", "1", "--tls", "--data-root",
       tmp_.path(), "--work-dir", work, "--address-file", tmp_.Join("address")},
      {.log_file = log});
  ASSERT_TRUE(local.ok()) << local.status();
  auto address = WaitForAddressFile(tmp_.Join("address"), **local, absl::Seconds(60));
  ASSERT_TRUE(address.ok()) << address.status();

  // The throwaway CA, client certificate and token that `sluice local --tls`
  // made in its work dir, as it tells consumers to pass them.
  const std::string tls = work + "/tls/";
  const std::vector<std::string> secured = {"--tls-ca",          tls + "ca.pem", "--tls-cert",
                                            tls + "client.pem",  "--tls-key",    tls + "client.key",
                                            "--auth-token-file", tls + "token"};
  std::vector<std::string> consume = {
      "consume", "--dispatcher", *address,    "--spec",        spec, "--data", ds,
      "--job",   "secured",      "--ids-out", tmp_.Join("ids")};
  consume.insert(consume.end(), secured.begin(), secured.end());
  // The servers' certificate names 127.0.0.1 and localhost: dialled at 127.0.0.1, the client
  // verifies the name it is told (the dispatcher's and the worker's certificate alike).
  consume.insert(consume.end(), {"--tls-server-name", "localhost"});
  const Result ok = Run(consume);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  std::ifstream ids(tmp_.Join("ids"));
  std::vector<int> seen(40, 0);
  for (int id; ids >> id;) ++seen.at(id);
  EXPECT_EQ(seen, std::vector<int>(40, 1));
  EXPECT_THAT(ReadFile(log),
              HasSubstr("consumers pass:\n              " + absl::StrJoin(secured, " ")));

  consume.back() = "sluice.example";  // --tls-server-name sluice.example
  const Result wrong_consumer = Run(consume);
  EXPECT_EQ(wrong_consumer.exit_code, 1) << wrong_consumer.output;
  EXPECT_THAT(wrong_consumer.output, HasSubstr("sluice.example"));

  // status and health take the same flags.
  std::vector<std::string> status = {"status", "--dispatcher", *address, "--json"};
  status.insert(status.end(), secured.begin(), secured.end());
  const Result status_ok = Run(status);
  EXPECT_EQ(status_ok.exit_code, 0) << status_ok.output;
  EXPECT_THAT(status_ok.output, HasSubstr("\"workers\""));
  std::vector<std::string> health = {"health", "--address", *address};
  health.insert(health.end(), secured.begin(), secured.end());
  const Result health_ok = Run(health);
  EXPECT_EQ(health_ok.exit_code, 0) << health_ok.output;
  EXPECT_EQ(health_ok.output, *address + ": SERVING\n");
  health.insert(health.end(), {"--tls-server-name", "sluice.example"});
  const Result wrong_name = Run(health);
  EXPECT_EQ(wrong_name.exit_code, 1) << wrong_name.output;
  EXPECT_THAT(wrong_name.output, HasSubstr("health check of " + *address));
  EXPECT_THAT(wrong_name.output, HasSubstr("sluice.example"));
  const Result plain_status = Run({"status", "--dispatcher", *address});
  EXPECT_EQ(plain_status.exit_code, 1) << plain_status.output;

  const Result plain = Run(
      {"consume", "--dispatcher", *address, "--spec", spec, "--data", ds, "--job", "plaintext"});
  EXPECT_EQ(plain.exit_code, 1) << plain.output;
  EXPECT_THAT(plain.output, HasSubstr("the server uses TLS and this client connects in plaintext"));

  (*local)->Signal(SIGTERM);
  auto code = (*local)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << TailOfFile(log);
  EXPECT_EQ(*code, 0) << TailOfFile(log);
}

// `sluice consume --step-time` refuses what is not a duration, naming the
// flag, before it connects anywhere.
TEST_F(CliTest, LocalMaxCpusIsCheckedAndNeedsAutoscale) {
  const Result nan = Run({"local", "--autoscale", "--max-cpus", "nan"});
  EXPECT_EQ(nan.exit_code, 1);
  EXPECT_THAT(nan.output, HasSubstr("--max-cpus must be >= 0 (got nan)"));
  const Result fixed = Run({"local", "--max-cpus", "4"});
  EXPECT_EQ(fixed.exit_code, 1);
  EXPECT_THAT(fixed.output, HasSubstr("--max-cpus bounds an autoscaled pool: add --autoscale"));
}

TEST_F(CliTest, StepTimeThatIsNotADurationIsAUsageErrorNamingTheFlag) {
  for (const char* bad : {"-1s", "abc"}) {
    const Result r = Run({"consume", "--dispatcher", "127.0.0.1:1", "--spec",
                          tmp_.Join("none.yaml"), "--step-time", bad});
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("--step-time: '", bad, "'")));
  }
  EXPECT_THAT(
      Run({"consume", "--dispatcher", "127.0.0.1:1", "--spec", "x", "--step-time", "-1s"}).output,
      HasSubstr("is negative"));
}

// The dispatcher counts reserved workers in an int: a larger --min-workers is refused before
// connecting anywhere.
TEST_F(CliTest, JobOptionsOutsideTheirRangeAreUsageErrorsNamingTheFlag) {
  const Result r =
      Run({"consume", "--dispatcher", "127.0.0.1:1", "--spec", "x", "--min-workers", "4294967295"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--min-workers: Value 4294967295 not in range 0 to 2147483647"));
  // --priority is an int32 on the wire: a value outside it is named with the range.
  for (const std::string bad : {"2147483648", "-2147483649", "9223372036854775807"}) {
    const Result p =
        Run({"consume", "--dispatcher", "127.0.0.1:1", "--spec", "x", "--priority", bad});
    EXPECT_NE(p.exit_code, 0) << bad;
    EXPECT_THAT(p.output, HasSubstr(absl::StrCat("--priority: Value ", bad,
                                                 " not in range -2147483648 to 2147483647")))
        << bad;
  }
}

// `--pause-after-batches` and `--pause-for` go together, refused before connecting anywhere.
TEST_F(CliTest, PauseAfterBatchesWithoutPauseForIsRefusedNamingBothFlags) {
  const std::string spec = tmp_.Join("p.yaml");
  WriteFile(spec,
            "source: {dataset: {path: /x}, columns: [label]}\nnodes:\n  - batch: {size: 8}\n");
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--pause-after-batches", "2"},
        std::vector<std::string>{"--pause-for", "3s"}}) {
    std::vector<std::string> args = {
        "consume", "--dispatcher", "127.0.0.1:1", "--spec", spec, "--job", "j"};
    args.insert(args.end(), flags.begin(), flags.end());
    const Result r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << flags[0];
    EXPECT_THAT(r.output, HasSubstr("--pause-after-batches N and --pause-for DURATION go together"))
        << flags[0];
  }
}

// The interface issue 8 names, on real processes: a consumer that takes a
// batch of 8 every 40 ms (`--step-time 40ms`) reads at most 8 / 0.04 = 200
// images/s from its first batch on (each later batch needs a whole step
// first) and, since the workers are far faster (labels only), not much less
// (160: 20% for the epoch boundary and scheduling on a loaded machine). The
// dispatcher measures batch / step time as the job's demand: at most 200
// el/s plus 5% (one batch more or less in a 2 s window of 50), at least 160.
// `sluice status --json` meanwhile has exactly the keys docs/autoscaling.md
// documents.
TEST_F(CliTest, ConsumeStepTimeSetsTheDemandAndStatusJsonHasTheDocumentedKeys) {
  const std::string ds = MakeDataset(400);
  const std::string spec = LabelsSpec(8);
  const std::string log = LocalLog();
  std::string address;
  auto local = StartLocal({"--autoscale", "--min-workers", "1", "--max-workers", "2",
                           "--scale-interval", "2s", "--threads-per-worker", "1"},
                          &address);
  ASSERT_TRUE(local.ok()) << local.status();

  // 400 images x 4 epochs = 200 batches: 8 s at 40 ms.
  const std::string consume_log = tmp_.Join("consume.log");
  auto consume = Subprocess::Start(
      {Bin(), "consume", "--dispatcher", address, "--spec", spec, "--data", ds, "--job", "steps",
       "--epochs", "4", "--split-size", "200", "--step-time", "40ms"},
      {.log_file = consume_log});
  ASSERT_TRUE(consume.ok()) << consume.status();
  nlohmann::json status, job;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    const Result r = Run({"status", "--dispatcher", address, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    status = nlohmann::json::parse(r.output, nullptr, false);
    ASSERT_FALSE(status.is_discarded()) << r.output;
    if (!status["jobs"].empty() &&
        status["jobs"][0]["demand_elements_per_second"].get<double>() > 0) {
      job = status["jobs"][0];
      break;
    }
    absl::SleepFor(absl::Milliseconds(300));
  }
  ASSERT_FALSE(job.is_null()) << status.dump();
  auto keys = [](const nlohmann::json& object) {
    std::set<std::string> out;
    for (const auto& [key, value] : object.items()) out.insert(key);
    return out;
  };
  EXPECT_EQ(keys(status), (std::set<std::string>{"workers", "desired_workers", "current_workers",
                                                 "reason", "scaler", "min_workers", "max_workers",
                                                 "pool_bound", "drain", "jobs"}));
  ASSERT_FALSE(status["workers"].empty());
  EXPECT_EQ(keys(status["workers"][0]),
            (std::set<std::string>{"worker_id", "address", "state", "splits", "queue_depth",
                                   "queue_capacity", "elements_per_second",
                                   "elements_per_busy_second", "age_seconds", "assigned_job_id"}));
  EXPECT_EQ(keys(job),
            (std::set<std::string>{"job_id", "job_name", "batch_size", "num_epochs",
                                   "demand_elements_per_second", "capacity_elements_per_second",
                                   "need_workers", "priority", "min_workers", "allocated_workers",
                                   "allocation_reason", "share_group", "shares_with",
                                   "cache_decision", "consumers"}));
  ASSERT_EQ(job["consumers"].size(), 1u);
  EXPECT_EQ(
      keys(job["consumers"][0]),
      (std::set<std::string>{"consumer_index", "epoch", "finished", "splits_done", "splits",
                             "batches_per_second", "wait_fraction", "paused", "silent_seconds"}));
  EXPECT_EQ(job["job_name"], "steps");
  EXPECT_EQ(job["batch_size"], 8);
  EXPECT_EQ(job["num_epochs"], 4);
  EXPECT_EQ(status["scaler"], "local");
  // Demand = batch / step time, measured by the dispatcher over a period: a
  // step never shorter than 40 ms bounds it by 200 el/s. How close to 200 it
  // comes depends on the machine's load (ASan, ctest -j): bench/autoscale.sh
  // prints it for the same 40 ms step.
  const double demand = job["demand_elements_per_second"].get<double>();
  RecordProperty("demand_elements_per_second", std::to_string(demand));
  EXPECT_LE(demand, 210) << job.dump();

  auto code = (*consume)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0) << ReadFile(consume_log);
  const std::string out = ReadFile(consume_log);
  EXPECT_THAT(out, HasSubstr("consumed 1600 images in 200 batches"));
  const size_t at = out.find("throughput from first batch: ");
  ASSERT_NE(at, std::string::npos) << out;
  const double rate = std::stod(out.substr(at + std::strlen("throughput from first batch: ")));
  RecordProperty("images_per_second_from_first_batch", std::to_string(rate));
  // 8 images per step of at least 40 ms; the rate a loaded machine reaches is
  // not the test's business (bench/service_overhead.sh measures throughput).
  EXPECT_LE(rate, 200.0) << out;
  EXPECT_GT(rate, 0.0) << out;

  (*local)->Signal(SIGTERM);
  code = (*local)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << TailOfFile(log);
  EXPECT_EQ(*code, 0) << TailOfFile(log);
}

// Ctrl-C of a consumer is a trainer stopped by hand: it leaves its job as at a normal end, so
// the dispatcher frees its share at once (silence alone would take 5 s, and 60 s to forget the
// consumer), and exits 130.
TEST_F(CliTest, AnInterruptedConsumeLeavesItsJobAtOnceAndExits130) {
  const std::string ds = MakeDataset(200);
  const std::string spec = LabelsSpec(4);
  const std::string log = LocalLog();
  std::string address;
  auto local = StartLocal({"--workers", "1", "--threads-per-worker", "1"}, &address);
  ASSERT_TRUE(local.ok()) << local.status();
  // 200 records x 5 epochs in batches of 4, one every 50 ms: 12.5 s.
  const std::string consume_log = tmp_.Join("consume.log");
  auto consume =
      Subprocess::Start({Bin(), "consume", "--dispatcher", address, "--spec", spec, "--data", ds,
                         "--job", "stopped", "--epochs", "5", "--step-time", "50ms"},
                        {.log_file = consume_log});
  ASSERT_TRUE(consume.ok()) << consume.status();
  auto consumers = [&]() -> int {
    const Result r = Run({"status", "--dispatcher", address, "--json"});
    const nlohmann::json status = nlohmann::json::parse(r.output, nullptr, false);
    if (status.is_discarded()) return -1;
    for (const auto& job : status["jobs"]) {
      if (job["job_name"] == "stopped") return static_cast<int>(job["consumers"].size());
    }
    return 0;
  };
  for (int i = 0; i < 100 && consumers() != 1; ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(consumers(), 1);
  absl::SleepFor(absl::Seconds(1));

  (*consume)->Signal(SIGINT);
  ASSERT_EQ((*consume)->Wait(absl::Seconds(10)).value_or(-1), 130) << ReadFile(consume_log);
  EXPECT_THAT(ReadFile(consume_log), HasSubstr("interrupted (SIGINT) after "));
  EXPECT_THAT(ReadFile(consume_log), HasSubstr("left the job stopped"));
  // Gone at once: a consumer that just stops heartbeating is listed for --consumer-timeout (60 s).
  EXPECT_EQ(consumers(), 0);
  (*local)->Signal(SIGTERM);
  EXPECT_EQ((*local)->Wait(absl::Seconds(60)).value_or(-1), 0) << TailOfFile(log);
}

// The python op's flags, as sluice-worker takes them, on `sluice pipeline run` and on
// `sluice local` (which hands them to its workers): a team's module runs, a hang ends at
// --python-op-timeout, a module off the --python-modules list is refused by a real worker.
TEST_F(CliTest, PipelineRunAndLocalTakeThePythonOpFlags) {
  const std::string ds = MakeDataset();
  const std::string py = tmp_.Join("py");
  std::filesystem::create_directories(py);
  WriteFile(py + "/team_fns.py",
            "import os, time\n"
            "def plus(label, rng):\n    return label + 1000\n"
            "def hang(label, rng):\n    time.sleep(3600)\n"
            "def exits_once_on_3(label, rng):\n"
            "    marker = os.path.join(os.path.dirname(__file__), 'exited')\n"
            "    if int(label) == 3 and not os.path.exists(marker):\n"
            "        open(marker, 'w').close()\n"
            "        os._exit(3)\n"
            "    return label + 1000\n");
  auto spec = [&](const std::string& module, const std::string& function) {
    const std::string path = tmp_.Join(absl::StrCat(module, "_", function, ".yaml"));
    WriteFile(path, absl::StrCat("source: {dataset: {path: /not/used}, columns: [label]}\n"
                                 "nodes:\n"
                                 "  - map: {input_columns: [label], ops: [{python: {module: ",
                                 module, ", function: ", function, ", group: 1}}]}\n",
                                 "  - batch: {size: 8}\n"));
    return path;
  };

  const Result hang =
      Run({"pipeline", "run", "--spec", spec("team_fns", "hang"), "--data", ds, "--threads", "1",
           "--allow-python-ops", "--python-path", py, "--python-op-timeout", "300ms"});
  EXPECT_EQ(hang.exit_code, 1) << hang.output;
  EXPECT_THAT(hang.output, HasSubstr("team_fns.hang: the Python process died 3 times on this "
                                     "element (last: the Python process"));
  EXPECT_THAT(hang.output, HasSubstr("did not answer within 300ms"));
  // A process that died is replaced and its element redone: the run is complete, and says so.
  const Result exited =
      Run({"pipeline", "run", "--spec", spec("team_fns", "exits_once_on_3"), "--data", ds,
           "--threads", "1", "--allow-python-ops", "--python-path", py});
  EXPECT_EQ(exited.exit_code, 0) << exited.output;
  EXPECT_THAT(exited.output, HasSubstr("\npython processes: 2 started, 1 replaced\n"));
  EXPECT_THAT(exited.output, HasSubstr("40 images in 1 epoch(s)"));

  const std::string work = tmp_.Join("local");
  const std::string log = tmp_.Join("local.log");
  auto local = Subprocess::Start(
      {Bin(), "local", "--workers", "1", "--threads-per-worker", "1", "--data-root", tmp_.path(),
       "--work-dir", work, "--address-file", tmp_.Join("address"), "--allow-python-ops",
       "--python-path", py, "--python-modules", "team_fns"},
      {.log_file = log});
  ASSERT_TRUE(local.ok()) << local.status();
  auto address = WaitForAddressFile(tmp_.Join("address"), **local, absl::Seconds(60));
  ASSERT_TRUE(address.ok()) << address.status();
  const Result ok = Run({"consume", "--dispatcher", *address, "--spec", spec("team_fns", "plus"),
                         "--data", ds, "--job", "team", "--ids-out", tmp_.Join("ids")});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  std::ifstream ids(tmp_.Join("ids"));
  std::vector<int> seen(40, 0);
  for (int id; ids >> id;) ++seen.at(id);
  EXPECT_EQ(seen, std::vector<int>(40, 1));
  const Result refused = Run({"consume", "--dispatcher", *address, "--spec", spec("os", "getpid"),
                              "--data", ds, "--job", "stdlib"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("module 'os' is not one this worker runs python ops from "
                                        "(--python-modules team_fns)"));
  (*local)->Signal(SIGTERM);
  auto code = (*local)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << TailOfFile(log);
  EXPECT_EQ(*code, 0) << TailOfFile(log);
}

// The processes whose parent is `parent`, from /proc/PID/stat ("pid (comm) state ppid ...").
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    const size_t comm_end = stat.rfind(')');
    if (comm_end == std::string::npos) continue;
    std::istringstream rest(stat.substr(comm_end + 1));
    char state;
    pid_t ppid;
    if (rest >> state >> ppid && ppid == parent)
      children.push_back(std::stoi(entry.path().filename()));
  }
  return children;
}

// Waits up to `timeout_ms` for `pid`, a child or an orphan reparented to this process (a
// subreaper): its exit code (128 + signal if one ended it), or nullopt if it still runs (it is
// then killed, so that a failed test leaves nothing running).
std::optional<int> WaitForExit(pid_t pid, int timeout_ms) {
  for (int waited_ms = 0; waited_ms < timeout_ms; waited_ms += 10) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }
    usleep(10'000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return std::nullopt;
}

TEST_F(CliTest, AKilledLocalTakesItsDispatcherAndWorkersWithIt) {
  // Orphans are reparented to this process, which waits for them and reads how they ended.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // A worker draining when its dispatcher is gone waits --drain-timeout for the dispatcher's
  // word, then --connect-timeout to unregister (30 s + 10 s by default); short ones here, which
  // the workers take from the environment `sluice local` passes on.
  struct ShortTimeouts {
    ShortTimeouts() {
      setenv("SLUICE_DRAIN_TIMEOUT", "1s", 1);
      setenv("SLUICE_CONNECT_TIMEOUT", "1s", 1);
    }
    ~ShortTimeouts() {
      unsetenv("SLUICE_DRAIN_TIMEOUT");
      unsetenv("SLUICE_CONNECT_TIMEOUT");
    }
  } short_timeouts;
  const std::string log = tmp_.Join("local.log");
  auto local = Subprocess::Start(
      {Bin(), "local", "--workers", "2", "--threads-per-worker", "1", "--data-root", tmp_.path(),
       "--work-dir", tmp_.Join("local"), "--address-file", tmp_.Join("address")},
      {.log_file = log});
  ASSERT_TRUE(local.ok()) << local.status();
  auto address = WaitForAddressFile(tmp_.Join("address"), **local, absl::Seconds(60));
  ASSERT_TRUE(address.ok()) << address.status();
  const std::vector<pid_t> servers = ChildrenOf((*local)->pid());
  ASSERT_EQ(servers.size(), 3u) << "a dispatcher and 2 workers";

  (*local)->Signal(SIGKILL);  // no handler runs: only the kernel can tell the children
  ASSERT_EQ((*local)->Wait(absl::Seconds(10)).value_or(-1), 128 + SIGKILL);
  for (pid_t pid : servers) {
    // SIGTERM is their graceful stop: the dispatcher and the workers exit 0.
    EXPECT_EQ(WaitForExit(pid, 60'000), 0) << "pid " << pid << "\n" << ReadFile(log);
  }
}

// The worker processes among `parent`'s children (/proc/PID/comm).
std::vector<pid_t> WorkersOf(pid_t parent) {
  std::vector<pid_t> workers;
  for (pid_t pid : ChildrenOf(parent)) {
    std::string comm;
    if (std::getline(std::ifstream(absl::StrCat("/proc/", pid, "/comm")), comm) &&
        comm == "sluice-worker") {
      workers.push_back(pid);
    }
  }
  return workers;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A worker of a fixed pool that is killed (an OOM kill, a crash) is replaced, as a Deployment
// replaces a pod, and the job it served ends with every record once; workers that keep dying
// stop the cluster rather than restart forever.
TEST_F(CliTest, ALocalWorkerThatDiesIsReplacedAndOnesThatKeepDyingStopTheCluster) {
  const std::string ds = MakeDataset(200);
  const std::string spec = LabelsSpec(4);
  const std::string log = LocalLog();
  std::string address;
  auto local = StartLocal({"--workers", "2", "--threads-per-worker", "1"}, &address);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_EQ(WorkersOf((*local)->pid()).size(), 2u);
  // Kills one worker, then waits until its replacement is announced and running.
  auto kill_one = [&](size_t kills_so_far) {
    const std::vector<pid_t> workers = WorkersOf((*local)->pid());
    if (workers.empty()) return false;
    kill(workers[0], SIGKILL);
    for (int i = 0; i < 3000; ++i) {
      if (Count(ReadFile(log), "starting a new worker") > kills_so_far &&
          WorkersOf((*local)->pid()).size() == 2) {
        return true;
      }
      usleep(10'000);
    }
    return false;
  };

  // 200 records, 2 epochs, in batches of 4 every 40 ms: 4 s; a worker is killed after 1 s.
  const std::string consume_log = tmp_.Join("consume.log");
  auto consume = Subprocess::Start(
      {Bin(), "consume", "--dispatcher", address, "--spec", spec, "--data", ds, "--job", "j",
       "--epochs", "2", "--split-size", "20", "--step-time", "40ms", "--ids-out", tmp_.Join("ids")},
      {.log_file = consume_log});
  ASSERT_TRUE(consume.ok()) << consume.status();
  absl::SleepFor(absl::Seconds(1));
  ASSERT_TRUE(kill_one(0)) << ReadFile(log);
  ASSERT_EQ((*consume)->Wait(absl::Seconds(120)).value_or(-1), 0) << ReadFile(consume_log);
  std::ifstream ids(tmp_.Join("ids"));
  std::vector<int> seen(200, 0);
  for (int id; ids >> id;) ++seen.at(id);
  EXPECT_EQ(seen, std::vector<int>(200, 2)) << "each record once per epoch";
  EXPECT_THAT(ReadFile(log), HasSubstr(absl::StrCat("exited with code ", 128 + SIGKILL,
                                                    "; starting a new worker")));
  EXPECT_FALSE((*local)->Poll().has_value()) << ReadFile(log);

  // Four more deaths within the minute are replaced; the sixth stops the cluster.
  for (size_t kills = 1; kills < 5; ++kills) ASSERT_TRUE(kill_one(kills)) << ReadFile(log);
  kill(WorkersOf((*local)->pid()).at(0), SIGKILL);
  ASSERT_EQ((*local)->Wait(absl::Seconds(60)).value_or(-1), 1) << ReadFile(log);
  EXPECT_THAT(ReadFile(log),
              HasSubstr("5 workers were replaced in the last 1m: stopped the cluster"));
}

// A memory cgroup limited to `limit` bytes (cgroup v2, or v1's memory controller), for a
// real out-of-memory kill; Make() gives nullopt where this machine cannot make one (not root,
// no writable cgroup file system). Removed at destruction.
class MemoryCgroup {
 public:
  static std::optional<MemoryCgroup> Make(const std::string& name, int64_t limit) {
    for (const auto& [root, limit_file, events_file] :
         {std::tuple<std::string, std::string, std::string>{
              "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.oom_control"},
          {"/sys/fs/cgroup", "memory.max", "memory.events"}}) {
      const std::string dir = root + "/" + name;
      std::error_code ec;
      std::filesystem::create_directory(dir, ec);
      if (ec || !std::filesystem::exists(dir + "/" + limit_file)) {
        std::filesystem::remove(dir, ec);
        continue;
      }
      std::ofstream(dir + "/" + limit_file) << limit;
      int64_t set = 0;
      if (std::ifstream(dir + "/" + limit_file) >> set && set == limit) {
        return MemoryCgroup(dir, events_file);
      }
      std::filesystem::remove(dir, ec);
    }
    return std::nullopt;
  }
  MemoryCgroup(MemoryCgroup&& other) noexcept
      : dir_(std::move(other.dir_)), events_(other.events_) {
    other.dir_.clear();
  }
  // Waits (up to 10 s) for its last processes to end: the Python processes of a sluice that
  // exited end within half a second.
  ~MemoryCgroup() {
    for (int i = 0; !dir_.empty() && rmdir(dir_.c_str()) != 0 && errno == EBUSY && i < 1000; ++i) {
      usleep(10'000);
    }
  }
  // The file a process writes its pid to, to join.
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  // Processes the kernel's OOM killer killed in the cgroup ("oom_kill N").
  int oom_kills() const {
    std::ifstream in(dir_ + "/" + events_);
    std::string key;
    int64_t value = 0;
    while (in >> key >> value) {
      if (key == "oom_kill") return static_cast<int>(value);
    }
    return -1;
  }

 private:
  MemoryCgroup(std::string dir, std::string events) : dir_(std::move(dir)), events_(events) {}
  std::string dir_;
  std::string events_;
};

// A user function that takes more memory than its worker may have: the kernel's OOM killer
// kills its Python process (a real kill, in a memory cgroup of 1 GiB; the function touches
// 4 GiB), which is replaced, and the element is redone: every record once.
TEST_F(CliTest, AnOutOfMemoryKillOfAPythonProcessLosesAndRepeatsNothing) {
  std::optional<MemoryCgroup> cgroup =
      MemoryCgroup::Make(absl::StrCat("sluice-cli-test-", getpid()), int64_t{1} << 30);
  if (!cgroup.has_value()) GTEST_SKIP() << "no memory cgroup can be made here (needs root)";
  const std::string ds = MakeDataset(8);
  const std::string py = tmp_.Join("py"), marker = tmp_.Join("took-memory");
  std::filesystem::create_directories(py);
  WriteFile(py + "/greedy.py", absl::StrCat("import os\n"
                                            "import numpy as np\n"
                                            "def once(label, rng):\n"
                                            "    if not os.path.exists('",
                                            marker,
                                            "'):\n"
                                            "        open('",
                                            marker,
                                            "', 'w').close()\n"
                                            "        big = np.ones(4 << 30, np.uint8)\n"
                                            "        label = label + big[0] - 1\n"
                                            "    return label + 1000\n"));
  const std::string spec = tmp_.Join("greedy.yaml");
  WriteFile(spec,
            "source: {dataset: {path: /not/used}, columns: [label]}\n"
            "nodes:\n"
            "  - map: {input_columns: [label], ops: [{python: {module: greedy, function: once}}]}\n"
            "  - batch: {size: 1}\n");
  const std::string log = tmp_.Join("run.log"), ids = tmp_.Join("ids.txt");
  // The shell joins the cgroup (exit 77 if it may not), then becomes sluice.
  auto run = Subprocess::Start(
      {"/bin/sh", "-c",
       absl::StrCat("echo $$ > ", cgroup->procs(), " || exit 77; exec \"$0\" \"$@\""), Bin(),
       "pipeline", "run", "--spec", spec, "--data", ds, "--threads", "1", "--allow-python-ops",
       "--python-path", py, "--ids-out", ids},
      {.log_file = log});
  ASSERT_TRUE(run.ok()) << run.status();
  const int code = (*run)->Wait(absl::Seconds(120)).value_or(-1);
  if (code == 77) GTEST_SKIP() << "cannot join the memory cgroup: " << ReadFile(log);
  ASSERT_EQ(code, 0) << ReadFile(log);
  EXPECT_TRUE(std::filesystem::exists(marker));
  EXPECT_EQ(cgroup->oom_kills(), 1) << ReadFile(log);
  std::multiset<int> got;
  std::ifstream in(ids);
  for (int id; in >> id;) got.insert(id);
  EXPECT_EQ(got, (std::multiset<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

// A worker killed while a user function hangs in one of its Python processes: the process does
// not wait for the function (an hour here) but ends within a second, through its watch on its
// parent (data_worker/python/runner.py), and takes with it the helper process the function
// forked.
TEST_F(CliTest, AKilledWorkersPythonProcessEndsEvenInTheMiddleOfACall) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string ds = MakeDataset(8);
  const std::string py = tmp_.Join("py"), in_call = tmp_.Join("in_call");
  std::filesystem::create_directories(py);
  WriteFile(py + "/stuck.py", absl::StrCat("import os, time\n"
                                           "def hang(label, rng):\n"
                                           "    helper = os.fork()\n"
                                           "    if helper == 0:\n"
                                           "        time.sleep(3600)\n"
                                           "        os._exit(0)\n"
                                           "    with open('",
                                           in_call,
                                           "', 'w') as f:\n"
                                           "        f.write(str(helper))\n"
                                           "    time.sleep(3600)\n"));
  const std::string spec = tmp_.Join("stuck.yaml");
  WriteFile(spec,
            "source: {dataset: {path: /not/used}, columns: [label]}\n"
            "nodes:\n"
            "  - map: {input_columns: [label], ops: [{python: {module: stuck, function: hang}}]}\n"
            "  - batch: {size: 8}\n");
  const std::string log = tmp_.Join("run.log");
  auto run =
      Subprocess::Start({Bin(), "pipeline", "run", "--spec", spec, "--data", ds, "--threads", "1",
                         "--allow-python-ops", "--python-path", py, "--python-op-timeout", "0"},
                        {.log_file = log});
  ASSERT_TRUE(run.ok()) << run.status();
  pid_t helper = 0;
  for (int waited_ms = 0; !(std::ifstream(in_call) >> helper); waited_ms += 10) {
    ASSERT_LT(waited_ms, 60'000) << "the function was never called\n" << ReadFile(log);
    ASSERT_FALSE((*run)->Poll().has_value()) << ReadFile(log);
    usleep(10'000);
  }
  const std::vector<pid_t> pythons = ChildrenOf((*run)->pid());
  ASSERT_FALSE(pythons.empty());

  (*run)->Signal(SIGKILL);
  ASSERT_EQ((*run)->Wait(absl::Seconds(10)).value_or(-1), 128 + SIGKILL);
  // Each Python process (the runner's guardian) kills its runner, and ends as it did; the
  // function's helper, killed with the runner, is the guardian's to reap, so here it is gone.
  for (pid_t pid : pythons) {
    EXPECT_EQ(WaitForExit(pid, 10'000), 128 + SIGKILL) << "Python process " << pid;
  }
  EXPECT_NE(kill(helper, 0), 0) << "the function's helper " << helper << " still runs";
}

}  // namespace
}  // namespace sluice
