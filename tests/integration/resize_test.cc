// Resuming on another number of trainers mid-epoch (issue 20 item 2), with real processes:
// `sluice consume` trainers save their states at the same step and leave; trainers of another
// world size continue from all of them (--restore-state FILE,FILE...). Every record exactly
// once, equal shares (+-1 batch), and in deterministic mode the global order of an
// uninterrupted run (docs/delivery.md); a mismatched set of states is refused; the dispatcher
// restarted right after the re-partition keeps exactly-once.
#include <algorithm>
#include <fstream>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/process.h"
#include "common/record/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "proto/dispatcher.pb.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kRecords = 480;  // 3 shards of 160

using ::sluice::testing::BinDir;

void WriteDataset(const std::string& dir) {
  testing::WriteJpegDataset(dir, {.records = kRecords,
                                  .shard_size_bytes = 332000,
                                  .image =
                                      [](int i) {
                                        return testing::Jpeg(cv::Mat(
                                            8, 8, CV_8UC3, cv::Scalar(i % 256, (i * 7) % 256, 0)));
                                      },
                                  .pad_to = 2000});
}

class ResizeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    WriteDataset(data_->Join("ds"));
  }
  static void TearDownTestSuite() { delete data_; }

  void SetUp() override {
    auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                               .workers = 2,
                                               .data_roots = {data_->path()},
                                               .work_dir = tmp_.Join("cluster"),
                                               .worker_threads = 1,
                                               .log_level = "info",
                                               .heartbeat_interval = absl::Milliseconds(100),
                                               .worker_timeout = absl::Seconds(1)});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    // A shuffling pipeline, batches of 8: a share of 160 records is 20 batches in slots of 40
    // records (5 batches), one of 240 is 30 batches in slots of 56 (7 batches).
    spec_ = tmp_.Join("spec.yaml");
    std::ofstream out(spec_);
    out << "seed: 1\nsource:\n  dataset: {path: " << data_->Join("ds")
        << "}\n  columns: [image, label]\nnodes:\n  - shuffle: {seed: 1}\n  - map:\n"
           "      input_columns: [image]\n      ops:\n        - decode: {}\n  - batch: {size: "
           "8}\n";
  }

  // `sluice consume` as consumer `index` of `world` of job `job`; its exit code (-1: did not
  // run or hung) and, through `log`, its log.
  std::future<int> Consume(const std::string& job, int index, int world, const std::string& ids,
                           std::vector<std::string> extra, std::string* log = nullptr) {
    std::vector<std::string> argv = {BinDir() + "/sluice",
                                     "consume",
                                     "--dispatcher",
                                     cluster_->dispatcher_address(),
                                     "--spec",
                                     spec_,
                                     "--job",
                                     job,
                                     "--deterministic",
                                     "--consumer-index",
                                     absl::StrCat(index),
                                     "--num-consumers",
                                     absl::StrCat(world),
                                     "--ids-out",
                                     tmp_.Join(ids)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const std::string log_file = tmp_.Join(absl::StrCat("consume", ++runs_, ".log"));
    return std::async(std::launch::async, [argv, log_file, log] {
      auto p = Subprocess::Start(argv, {.log_file = log_file});
      if (!p.ok()) return -1;
      auto code = (*p)->Wait(absl::Seconds(120));
      std::ifstream in(log_file);
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      if (log != nullptr) *log = text;
      if (!code.ok() || *code != 0)
        std::cerr << "sluice consume exited " << (code.ok() ? *code : -1) << ":\n" << text;
      return code.ok() ? *code : -1;
    });
  }

  std::vector<uint64_t> Ids(const std::string& name) {
    std::vector<uint64_t> ids;
    std::ifstream in(tmp_.Join(name));
    for (uint64_t id; in >> id;) ids.push_back(id);
    return ids;
  }

  // Every record of the epoch exactly once.
  static void ExpectEveryRecordOnce(std::vector<std::vector<uint64_t>> parts) {
    std::vector<uint64_t> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    std::sort(all.begin(), all.end());
    std::vector<uint64_t> want(kRecords);
    for (int i = 0; i < kRecords; ++i) want[i] = i;
    ASSERT_EQ(all, want);
  }

  static TempDir* data_;
  TempDir tmp_;
  std::unique_ptr<tools::LocalCluster> cluster_;
  std::string spec_;
  int runs_ = 0;
};

TempDir* ResizeTest::data_ = nullptr;

TEST_F(ResizeTest, ThreeTrainersSavedMidEpochContinueAsTwoInTheUninterruptedOrder) {
  // The uninterrupted run: 3 consumers read the epoch (20 batches of 8 each).
  {
    std::vector<std::future<int>> ref;
    for (int k = 0; k < 3; ++k) ref.push_back(Consume("ref", k, 3, absl::StrCat("ref", k), {}));
    for (auto& r : ref) ASSERT_EQ(r.get(), 0);
  }
  // The same job, stopped by all 3 at step 7 (56 records each), states saved.
  {
    std::vector<std::future<int>> old;
    for (int k = 0; k < 3; ++k) {
      old.push_back(
          Consume("r32", k, 3, absl::StrCat("old", k),
                  {"--stop-after-batches", "7", "--save-state", tmp_.Join(absl::StrCat("s", k))}));
    }
    for (auto& r : old) ASSERT_EQ(r.get(), 0);
  }
  std::vector<uint64_t> rest;  // the uninterrupted global order of what is left
  for (int k = 0; k < 3; ++k) {
    const std::vector<uint64_t> ref = Ids(absl::StrCat("ref", k));
    ASSERT_EQ(ref.size(), 160u);
    const std::vector<uint64_t> before(ref.begin(), ref.begin() + 56);
    ASSERT_EQ(Ids(absl::StrCat("old", k)), before) << "consumer " << k;
    rest.insert(rest.end(), ref.begin() + 56, ref.end());
  }
  const std::string states =
      absl::StrJoin({tmp_.Join("s0"), tmp_.Join("s1"), tmp_.Join("s2")}, ",");

  // Two of the three states: refused, naming what is missing.
  std::string log;
  ASSERT_EQ(Consume("r32", 0, 2, "bad",
                    {"--restore-state", absl::StrCat(tmp_.Join("s0"), ",", tmp_.Join("s1"))}, &log)
                .get(),
            1);
  EXPECT_THAT(log, HasSubstr("saved by 3 consumers but 2 were given"));

  // New consumer 0 re-partitions (39 batches left: 20 for it, 19 for consumer 1), reads one
  // batch, saves and leaves; the dispatcher is SIGKILLed and recovers from its journal.
  ASSERT_EQ(Consume("r32", 0, 2, "new0",
                    {"--restore-state", states, "--stop-after-batches", "1", "--save-state",
                     tmp_.Join("n0")})
                .get(),
            0);
  ASSERT_TRUE(cluster_->RestartDispatcher().ok());

  // Consumer 1 with another set (old consumer 2's state one batch earlier): refused.
  proto::ConsumerCheckpoint other;
  {
    std::ifstream in(tmp_.Join("s2"), std::ios::binary);
    ASSERT_TRUE(other.ParseFromIstream(&in));
    ASSERT_GT(other.splits_size(), 0);
    proto::ClientSplitProgress* last = other.mutable_splits(other.splits_size() - 1);
    ASSERT_FALSE(last->complete());
    last->set_delivered_batches(last->delivered_batches() - 1);
    std::ofstream out(tmp_.Join("s2b"), std::ios::binary);
    ASSERT_TRUE(other.SerializeToOstream(&out));
  }
  ASSERT_EQ(Consume("r32", 1, 2, "bad",
                    {"--restore-state",
                     absl::StrJoin({tmp_.Join("s0"), tmp_.Join("s1"), tmp_.Join("s2b")}, ",")},
                    &log)
                .get(),
            1);
  EXPECT_THAT(log, HasSubstr("old consumer 2's state returned 6 batches of epoch 0 here, 7 in "
                             "the states the job was resumed from"));

  // Consumer 1 with the same set, consumer 0 from its own state (saved in the re-partitioned
  // epoch): both finish.
  auto c0 = Consume("r32", 0, 2, "new0", {"--restore-state", tmp_.Join("n0")});
  auto c1 = Consume("r32", 1, 2, "new1", {"--restore-state", states});
  ASSERT_EQ(c0.get(), 0);
  ASSERT_EQ(c1.get(), 0);
  const std::vector<uint64_t> new0 = Ids("new0"), new1 = Ids("new1");
  EXPECT_EQ(new0.size(), 20u * 8);
  EXPECT_EQ(new1.size(), 19u * 8);
  std::vector<uint64_t> both = new0;
  both.insert(both.end(), new1.begin(), new1.end());
  EXPECT_EQ(both, rest);  // the uninterrupted global order
  ExpectEveryRecordOnce({Ids("old0"), Ids("old1"), Ids("old2"), new0, new1});
}

TEST_F(ResizeTest, TwoTrainersSavedMidEpochContinueAsThree) {
  // 2 consumers, 30 batches each, stop at step 11: 38 batches left, 13 + 13 + 12.
  {
    std::vector<std::future<int>> old;
    for (int k = 0; k < 2; ++k) {
      old.push_back(
          Consume("r23", k, 2, absl::StrCat("old", k),
                  {"--stop-after-batches", "11", "--save-state", tmp_.Join(absl::StrCat("s", k))}));
    }
    for (auto& r : old) ASSERT_EQ(r.get(), 0);
  }
  const std::string states = absl::StrCat(tmp_.Join("s1"), ",", tmp_.Join("s0"));  // any order
  std::vector<std::future<int>> now;
  for (int k = 0; k < 3; ++k)
    now.push_back(Consume("r23", k, 3, absl::StrCat("new", k), {"--restore-state", states}));
  for (auto& r : now) ASSERT_EQ(r.get(), 0);
  EXPECT_EQ(Ids("old0").size(), 11u * 8);
  EXPECT_EQ(Ids("old1").size(), 11u * 8);
  EXPECT_EQ(Ids("new0").size(), 13u * 8);
  EXPECT_EQ(Ids("new1").size(), 13u * 8);
  EXPECT_EQ(Ids("new2").size(), 12u * 8);
  ExpectEveryRecordOnce({Ids("old0"), Ids("old1"), Ids("new0"), Ids("new1"), Ids("new2")});
}

}  // namespace
}  // namespace sluice
