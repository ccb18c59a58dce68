// The `sluice` binary as a user runs it: exit codes and the messages bad flags
// and bad data give.
#include <csignal>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/process.h"
#include "common/record/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
    auto code = (*process)->Wait(absl::Seconds(120));
    EXPECT_TRUE(code.ok()) << code.status();
    return {code.value_or(-1), ReadFile(log)};
  }

  // A 40-image dataset made through the CLI itself.
  std::string MakeDataset() {
    const std::string images = tmp_.Join("images"), ds = tmp_.Join("ds");
    EXPECT_EQ(
        Run({"datagen", "--output", images, "--images", "40", "--classes", "4"})
            .exit_code,
        0);
    EXPECT_EQ(
        Run({"record", "convert", "--input", images, "--output", ds}).exit_code,
        0);
    return ds;
  }

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
  const Result r = Run({"record", "convert", "--input", tmp_.path(), "--output",
                        tmp_.Join("o"), "--format", "parquet"});
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
  EXPECT_THAT(bad.output,
              HasSubstr("shard-00000.urec': record 13 checksum mismatch"));
  EXPECT_THAT(bad.output, HasSubstr("1 problem(s)"));
}

TEST_F(CliTest, CatWritesTheRawColumnAndRejectsAnUnknownOne) {
  const std::string ds = MakeDataset();
  const Result image =
      Run({"record", "cat", ds, "--index", "5", "--column", "image"});
  EXPECT_EQ(image.exit_code, 0);
  auto dataset = record::Dataset::Open(ds);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(image.output, std::string((*dataset)->Read(5)->columns[0].data));
  const Result bad =
      Run({"record", "cat", ds, "--index", "5", "--column", "pixels"});
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
  const Result r = Run({"pipeline", "run", "--spec", spec, "--data", ds,
                        "--ids-out", tmp_.Join("ids")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex("\nthroughput: [0-9.]+ images/s\n$"));
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
  const Result missing =
      Run({"pipeline", "run", "--spec", tmp_.Join("nope.yaml")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("nope.yaml"));
}

TEST_F(CliTest, ConsumeRefusesANonUnirecordDataFolder) {
  const std::string spec = tmp_.Join("p.yaml");
  WriteFile(spec, "source: {dataset: {path: /x}}\nnodes: []\n");
  const Result r = Run({"consume", "--dispatcher", "127.0.0.1:1", "--spec",
                        spec, "--data", tmp_.path(), "--job", "j"});
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
      {Bin(), "local", "--workers", "1", "--threads-per-worker", "1", "--tls",
       "--data-root", tmp_.path(), "--work-dir", work, "--address-file",
       tmp_.Join("address")},
      {.log_file = log});
  ASSERT_TRUE(local.ok()) << local.status();
  auto address =
      WaitForAddressFile(tmp_.Join("address"), **local, absl::Seconds(60));
  ASSERT_TRUE(address.ok()) << address.status();

  // The throwaway CA, client certificate and token that `sluice local --tls`
  // made in its work dir, as it tells consumers to pass them.
  const std::string tls = work + "/tls/";
  const std::vector<std::string> secured = {
      "--tls-ca",  tls + "ca.pem",     "--tls-cert",        tls + "client.pem",
      "--tls-key", tls + "client.key", "--auth-token-file", tls + "token"};
  std::vector<std::string> consume = {"consume",
                                      "--dispatcher",
                                      *address,
                                      "--spec",
                                      spec,
                                      "--data",
                                      ds,
                                      "--job",
                                      "secured",
                                      "--ids-out",
                                      tmp_.Join("ids")};
  consume.insert(consume.end(), secured.begin(), secured.end());
  const Result ok = Run(consume);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  std::ifstream ids(tmp_.Join("ids"));
  std::vector<int> seen(40, 0);
  for (int id; ids >> id;) ++seen.at(id);
  EXPECT_EQ(seen, std::vector<int>(40, 1));
  EXPECT_THAT(ReadFile(log), HasSubstr("consumers pass:\n              " +
                                       absl::StrJoin(secured, " ")));

  const Result plain = Run({"consume", "--dispatcher", *address, "--spec", spec,
                            "--data", ds, "--job", "plaintext"});
  EXPECT_EQ(plain.exit_code, 1) << plain.output;
  EXPECT_THAT(
      plain.output,
      HasSubstr("the server uses TLS and this client connects in plaintext"));

  (*local)->Signal(SIGTERM);
  auto code = (*local)->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << TailOfFile(log);
  EXPECT_EQ(*code, 0) << TailOfFile(log);
}

}  // namespace
}  // namespace sluice
