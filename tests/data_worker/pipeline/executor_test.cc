// The executor end to end on small datasets: epochs, order, errors, budgets, autotune and the
// long-lived streams of runs. One file (~610 lines) sharing one fixture of test datasets.
#include "data_worker/pipeline/executor.h"

#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/base/random.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/convert/convert.h"
#include "common/record/sharding.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/data_worker/pipeline/test_data.h"
#include "tests/testing/executor_testing.h"
#include "tests/testing/temp_dir.h"

namespace sluice::data_worker::pipeline {
namespace {

using ::testing::HasSubstr;

// Two maps (so map fusion has something to do), two filters, batch: exercises
// every rewrite.
constexpr char kTrain[] = R"(
seed: 11
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - shuffle: {seed: 5}
  - filter: {predicate: "label != 2"}
  - filter: {predicate: "label in [0, 1, 3]"}
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - map:
      input_columns: [image]
      ops:
        - random_resized_crop: {size: 24}
        - random_horizontal_flip: {}
        - color_jitter: {brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1}
        - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
        - hwc2chw: {}
  - batch: {size: 5}
)";

struct Output {
  std::vector<uint64_t> ids;
  std::string bytes;  // all columns of all outputs, concatenated
  int outputs = 0;
  bool operator==(const Output&) const = default;
};

absl::StatusOr<Output> RunAll(Executor& ex, uint64_t epoch) {
  Output out;
  if (absl::Status s = ex.Start(epoch); !s.ok()) return s;
  while (true) {
    auto e = ex.GetNext();
    if (!e.ok()) return e.status();
    if (!e->has_value()) break;
    // Every output has the dtype and shape validation inferred.
    if (absl::Status s =
            CheckOutputType(ex.logical(), (*e)->columns, ex.logical().batch.has_value());
        !s.ok()) {
      return s;
    }
    ++out.outputs;
    for (uint64_t g : (*e)->global_indices) out.ids.push_back(g);
    for (const Tensor& t : (*e)->columns) {
      out.bytes.append(ShapeToString(t.shape()));
      out.bytes.append(reinterpret_cast<const char*>(t.data()), t.num_bytes());
    }
  }
  return out;
}

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::MakeDataset(dir_.Join("ds"), 37, /*classes=*/4, {}, 0, 40000); }
  proto::Pipeline Spec(const std::string& yaml) const {
    auto p = sluice::pipeline_spec::ParsePipelineSpec(
        absl::StrReplaceAll(yaml, {{"DIR", dir_.Join("ds")}}));
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  }
  Output Run(const std::string& yaml, ExecutorOptions options, uint64_t epoch = 0) {
    auto ex = Executor::Create(Spec(yaml), options);
    EXPECT_TRUE(ex.ok()) << ex.status();
    if (!ex.ok()) return {};
    auto out = RunAll(**ex, epoch);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : Output{};
  }
  sluice::testing::TempDir dir_;
};

ExecutorOptions Fixed(int threads, bool pipeline_parallel, OptimizerOptions opt = {}) {
  ExecutorOptions o;
  o.autotune = false;
  o.cpu_budget = threads;
  o.optimizer = opt;
  o.optimizer.pipeline_parallel = pipeline_parallel;
  return o;
}

TEST_F(ExecutorTest, SameSeedGivesIdenticalBytesAtAnyParallelism) {
  // The optimized graph on one thread is the reference (the unoptimized graph
  // is compared with it in EveryRewriteKeepsTheOutputIdentical).
  const Output ref = Run(kTrain, Fixed(1, false));
  ASSERT_GT(ref.outputs, 0);
  EXPECT_EQ(ref.ids.size(), 37u - 9u);  // label 2 (9 records) filtered
  for (int p : {1, 2, 8}) {
    for (bool pipeline_parallel : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "parallelism " << p << " pipeline " << pipeline_parallel);
      const Output o = Run(kTrain, Fixed(p * 3, pipeline_parallel));
      EXPECT_EQ(o.ids, ref.ids);
      EXPECT_TRUE(o.bytes == ref.bytes);
      OptimizerOptions none = OptimizerOptions::None();
      const Output u = Run(kTrain, Fixed(p * 6, pipeline_parallel, none));
      const Output u1 = Run(kTrain, Fixed(6, false, none));
      EXPECT_EQ(u.ids, ref.ids);
      EXPECT_TRUE(u.bytes == u1.bytes);
    }
  }
  ExecutorOptions tuned;  // autotune on
  tuned.cpu_budget = 4;
  tuned.autotune_interval = absl::Milliseconds(1);
  EXPECT_TRUE(Run(kTrain, tuned) == ref);
}

TEST_F(ExecutorTest, DifferentEpochsDiffer) {
  const Output e0 = Run(kTrain, Fixed(2, false), 0);
  const Output e1 = Run(kTrain, Fixed(2, false), 1);
  EXPECT_NE(e0.ids, e1.ids);
  EXPECT_NE(e0.bytes, e1.bytes);
  // Without shuffle the order is the same, the augmentation is not.
  const std::string plain =
      absl::StrReplaceAll(std::string(kTrain), {{"  - shuffle: {seed: 5}\n", ""}});
  const Output p0 = Run(plain, Fixed(2, false), 0);
  const Output p1 = Run(plain, Fixed(2, false), 1);
  EXPECT_EQ(p0.ids, p1.ids);
  EXPECT_NE(p0.bytes, p1.bytes);
}

// A service job's seed mixes into the spec's (JobPipelineSeed): a job of seed 7 draws as the
// spec would with seed MixSeed({11, 7}), another job seed draws otherwise, and job seed 0 draws
// the spec's own (the in-process run).
TEST_F(ExecutorTest, TheJobsSeedMixesIntoTheSpecsSeed) {
  const std::string plain =
      absl::StrReplaceAll(std::string(kTrain), {{"  - shuffle: {seed: 5}\n", ""}});
  ExecutorOptions job7 = Fixed(2, false);
  job7.job_seed = 7;
  ExecutorOptions job8 = Fixed(2, false);
  job8.job_seed = 8;
  const Output spec = Run(plain, Fixed(2, false));
  const Output seven = Run(plain, job7);
  EXPECT_EQ(seven.ids, spec.ids);
  EXPECT_NE(seven.bytes, spec.bytes);
  EXPECT_NE(Run(plain, job8).bytes, seven.bytes);
  const std::string mixed =
      absl::StrReplaceAll(plain, {{"seed: 11\n", absl::StrCat("seed: ", MixSeed({11, 7}), "\n")}});
  ASSERT_NE(mixed, plain);
  EXPECT_TRUE(Run(mixed, Fixed(2, false)) == seven);
  ExecutorOptions job0 = Fixed(2, false);
  job0.job_seed = 0;
  EXPECT_TRUE(Run(plain, job0) == spec);
}

// Graph rewrites are exact. (Kernel fusion inside BuildOps — ROI/DCT-scaled
// decode — is not byte-exact by design; it is off here and compared in
// data_worker/ops tests.)
TEST_F(ExecutorTest, EveryRewriteKeepsTheOutputIdentical) {
  const Output ref = Run(kTrain, Fixed(3, false, OptimizerOptions::None()));
  struct Case {
    const char* name;
    void (*enable)(OptimizerOptions&);
    const char* rewrite;
  };
  const Case cases[] = {
      {"map fusion", [](OptimizerOptions& o) { o.map_fusion = true; }, "map fusion: map[0]+map[1]"},
      {"filter fusion", [](OptimizerOptions& o) { o.filter_fusion = true; }, "filter fusion"},
      {"filter pushdown", [](OptimizerOptions& o) { o.filter_pushdown = true; }, "filter pushdown"},
      {"source fusion", [](OptimizerOptions& o) { o.source_fusion = true; }, "source fusion"},
      {"map+batch fusion", [](OptimizerOptions& o) { o.map_batch_fusion = true; },
       "map+batch fusion"},
      {"vectorization", [](OptimizerOptions& o) { o.vectorization = true; }, "vectorization"},
      {"all",
       [](OptimizerOptions& o) {
         o = OptimizerOptions();
         o.op_fusion = false;
       },
       "vectorization"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    OptimizerOptions opt = OptimizerOptions::None();
    c.enable(opt);
    auto ex = Executor::Create(Spec(kTrain), Fixed(4, false, opt));
    ASSERT_TRUE(ex.ok());
    if (*c.rewrite) {
      bool found = false;
      for (const auto& r : (*ex)->plan().rewrites) found |= r.find(c.rewrite) != std::string::npos;
      EXPECT_TRUE(found) << (*ex)->plan().Describe();
    }
    auto out = RunAll(**ex, 0);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->ids, ref.ids);
    EXPECT_TRUE(out->bytes == ref.bytes) << (*ex)->plan().Describe();
  }
}

TEST_F(ExecutorTest, VectorizationMovesNormalizeAfterBatch) {
  OptimizerOptions opt;
  opt.batch_write_fusion = false;
  auto ex = Executor::Create(Spec(kTrain), Fixed(2, false, opt));
  ASSERT_TRUE(ex.ok());
  const PhysicalPlan& plan = (*ex)->plan();
  ASSERT_FALSE(plan.stages.empty());
  ASSERT_EQ(plan.stages.back().vectorized.size(), 1u);
  EXPECT_EQ(plan.stages.back().vectorized[0].second.back()->name(), "Normalize+HWC2CHW");
}

// Batch write fusion writes each element through Normalize+HWC2CHW (and a
// flip before it) into its batch slot: the same bytes as the plan that
// copies uint8 elements into the batch and normalizes the batch, on the
// JPEGs of the test dataset, whichever kernel the write takes (AVX2 mirrored
// reads for uint8 to float32; the flip op then the table kernel for float32
// input or float16 output).
TEST_F(ExecutorTest, BatchWriteFusionGivesTheBytesOfTheVectorizedPlan) {
  const std::string train = R"(
seed: 3
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - shuffle: {seed: 4}
  - map:
      input_columns: [image]
      ops:
        - decode: {}
        - random_resized_crop: {size: 40}
        - random_horizontal_flip: {}
        - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
        - hwc2chw: {}
  - batch: {size: 5}
)";
  const std::string eval =
      absl::StrReplaceAll(train, {{"random_resized_crop: {size: 40}", "resize: {size: 45}"},
                                  {"random_horizontal_flip: {}", "center_crop: {size: 37}"}});
  const std::string float16 = absl::StrReplaceAll(
      train, {{"hwc2chw: {}", "hwc2chw: {}\n        - cast: {dtype: float16}"}});
  const std::string float_input = absl::StrReplaceAll(
      train, {{"random_horizontal_flip: {}",
               "cast: {dtype: float32}\n        - random_horizontal_flip: {}"}});
  struct Case {
    const char* name;
    std::string spec;
    const char* write;
  };
  const Case cases[] = {
      {"train", train, "write[0]{RandomHorizontalFlip,Normalize+HWC2CHW}]"},
      {"eval", eval, "write[0]{Normalize+HWC2CHW}]"},
      {"float16 output", float16, "write[0]{RandomHorizontalFlip,Normalize+HWC2CHW+Cast}]"},
      {"float32 input", float_input, "write[0]{RandomHorizontalFlip,Normalize+HWC2CHW}]"},
  };
  OptimizerOptions no_write;
  no_write.batch_write_fusion = false;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto ex = Executor::Create(Spec(c.spec), Fixed(3, false));
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_THAT((*ex)->plan().Describe(), ::testing::EndsWith(c.write));
    for (uint64_t epoch : {0, 1}) {
      auto fused = RunAll(**ex, epoch);
      ASSERT_TRUE(fused.ok()) << fused.status();
      const Output reference = Run(c.spec, Fixed(2, false, no_write), epoch);
      EXPECT_EQ(fused->outputs, 8);
      EXPECT_EQ(fused->ids, reference.ids);
      EXPECT_TRUE(fused->bytes == reference.bytes);
    }
  }
}

TEST_F(ExecutorTest, OrderFollowsThePermutationAndExplicitIndices) {
  const std::string spec = R"(
seed: 1
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - shuffle: {seed: 9}
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 8}}], num_parallel_workers: 4}
)";
  const Output o = Run(spec, Fixed(6, false), 3);
  // Shuffle seed 9, epoch 3 (pinned here: a change reorders existing jobs).
  EXPECT_EQ(o.ids, (std::vector<uint64_t>{2,  18, 28, 22, 23, 27, 12, 8,  35, 29, 31, 26, 11,
                                          19, 13, 10, 6,  4,  7,  21, 25, 36, 15, 20, 32, 0,
                                          30, 5,  33, 16, 17, 3,  24, 1,  14, 9,  34}));
  auto ex = Executor::Create(Spec(spec), Fixed(6, true));
  ASSERT_TRUE(ex.ok());
  const std::vector<uint64_t> split = {30, 2, 2, 17, 5, 36, 0};
  std::vector<uint64_t> seen;
  auto outputs = sluice::testonly::RunSplit(**ex, split, 0);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  for (const Element& e : *outputs) {
    seen.push_back(e.global_indices[0]);
    EXPECT_EQ(e.columns[1].data_as<int64_t>()[0], int64_t(e.global_indices[0] % 4));
  }
  EXPECT_EQ(seen, split);
  EXPECT_EQ(sluice::testonly::RunSplit(**ex, {37}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ExecutorTest, BatchesCarryTheirIdsAndTheLastOneMayBeShort) {
  const std::string spec = R"(
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {center_crop: {size: 16}}]}
  - batch: {size: 8}
)";
  auto ex = Executor::Create(Spec(spec), Fixed(3, false));
  ASSERT_TRUE(ex.ok());
  ASSERT_TRUE((*ex)->Start(0).ok());
  std::vector<size_t> sizes;
  uint64_t next = 0;
  while (true) {
    auto e = (*ex)->GetNext();
    ASSERT_TRUE(e.ok()) << e.status();
    if (!e->has_value()) break;
    sizes.push_back((*e)->global_indices.size());
    EXPECT_EQ((*e)->columns[0].dim(0), int64_t((*e)->global_indices.size()));
    EXPECT_EQ((*e)->columns[0].shape(),
              (std::vector<int64_t>{int64_t((*e)->global_indices.size()), 16, 16, 3}));
    for (uint64_t g : (*e)->global_indices) EXPECT_EQ(g, next++);
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{8, 8, 8, 8, 5}));
  const std::string drop =
      absl::StrReplaceAll(spec, {{"{size: 8}", "{size: 8, drop_remainder: true}"}});
  EXPECT_EQ(Run(drop, Fixed(2, true)).ids.size(), 32u);
}

TEST_F(ExecutorTest, CorruptRecordFailsNamingTheRecordOrIsSkippedAndCounted) {
  sluice::testing::TempDir dir;
  testing::MakeDataset(dir.Join("bad"), 20, 4, {7});
  const std::string spec = absl::StrReplaceAll(R"(
on_error: POLICY
source: {dataset: {path: BAD}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 8}}]}
  - batch: {size: 4}
)",
                                               {{"BAD", dir.Join("bad")}});
  for (bool pipeline_parallel : {false, true}) {
    auto fail =
        sluice::pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(spec, {{"POLICY", "fail"}}));
    ASSERT_TRUE(fail.ok());
    auto ex = Executor::Create(*fail, Fixed(3, pipeline_parallel));
    ASSERT_TRUE(ex.ok());
    ASSERT_TRUE((*ex)->Start(0).ok());
    int batches = 0;
    absl::Status error;
    while (true) {
      auto e = (*ex)->GetNext();
      if (!e.ok()) {
        error = e.status();
        break;
      }
      if (!e->has_value()) break;
      ++batches;
    }
    EXPECT_EQ(batches, 1);  // records 0-3; record 7 is in the second batch
    EXPECT_EQ(error.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(error.message(), HasSubstr("shard-00000.urec: record 7"));
    EXPECT_THAT(error.message(), HasSubstr("Decode"));

    prometheus::Registry registry;
    auto skip =
        sluice::pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(spec, {{"POLICY", "skip"}}));
    ExecutorOptions options = Fixed(3, pipeline_parallel);
    options.registry = &registry;
    auto ex2 = Executor::Create(*skip, options);
    ASSERT_TRUE(ex2.ok());
    auto out = RunAll(**ex2, 0);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->ids.size(), 19u);
    EXPECT_EQ(std::count(out->ids.begin(), out->ids.end(), 7u), 0);
    EXPECT_EQ((*ex2)->stats().skipped, 1u);
    bool counted = false;
    for (const auto& family : registry.Collect()) {
      if (family.name == "sluice_pipeline_skipped_records_total") {
        counted = family.metric[0].counter.value == 1;
      }
    }
    EXPECT_TRUE(counted);
  }
}

// Outputs of the stream's oldest run up to its end.
absl::StatusOr<Output> NextRun(Executor& ex) {
  Output out;
  while (true) {
    auto e = ex.Next();
    if (!e.ok()) return e.status();
    if (!e->has_value()) return out;
    ++out.outputs;
    for (uint64_t g : (*e)->global_indices) out.ids.push_back(g);
    for (const Tensor& t : (*e)->columns) {
      out.bytes.append(ShapeToString(t.shape()));
      out.bytes.append(reinterpret_cast<const char*>(t.data()), t.num_bytes());
    }
  }
}

// Splits fed one after the other into one running pipeline give, run by run,
// exactly what a fresh executor gives for each (batches cut at each run's end,
// short or dropped; the same filters and augmentation bytes), and no thread is
// started after Open.
TEST_F(ExecutorTest, StreamRunsGiveWhatAnEpochPerRunGivesWithoutRestartingThreads) {
  struct Split {
    std::vector<uint64_t> indices;
    uint64_t epoch;
  };
  std::vector<Split> splits;
  for (auto [first, n, epoch] :
       std::vector<std::tuple<int, int, int>>{{0, 12, 0}, {12, 8, 0}, {20, 17, 1}, {3, 9, 2}}) {
    Split s{{}, static_cast<uint64_t>(epoch)};
    for (int i = n - 1; i >= 0; --i) s.indices.push_back(first + i);
    splits.push_back(s);
  }
  for (const bool drop : {false, true}) {
    const std::string spec =
        drop ? absl::StrReplaceAll(kTrain, {{"{size: 5}", "{size: 5, drop_remainder: true}"}})
             : kTrain;
    std::vector<Output> want;
    for (const Split& s : splits) {
      auto ex = Executor::Create(Spec(spec), Fixed(3, true));
      ASSERT_TRUE(ex.ok());
      // Each split alone, on a fresh executor (its own threads, autotuned
      // from scratch): what the stream below must reproduce.
      auto outputs = sluice::testonly::RunSplit(**ex, s.indices, s.epoch);
      ASSERT_TRUE(outputs.ok()) << outputs.status();
      Output out;
      for (const Element& e : *outputs) {
        ++out.outputs;
        for (uint64_t g : e.global_indices) out.ids.push_back(g);
        for (const Tensor& t : e.columns) {
          out.bytes.append(ShapeToString(t.shape()));
          out.bytes.append(reinterpret_cast<const char*>(t.data()), t.num_bytes());
        }
      }
      want.push_back(out);
    }
    auto ex = Executor::Create(Spec(spec), Fixed(3, true));
    ASSERT_TRUE(ex.ok());
    ASSERT_TRUE((*ex)->Open().ok());
    const uint64_t started = (*ex)->thread_starts();
    EXPECT_GT(started, 0u);
    // Two runs ahead of the reader, then one more per run read.
    ASSERT_TRUE((*ex)->Submit(splits[0].indices, splits[0].epoch).ok());
    ASSERT_TRUE((*ex)->Submit(splits[1].indices, splits[1].epoch).ok());
    for (size_t i = 0; i < splits.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "drop " << drop << " run " << i);
      if (i + 2 < splits.size()) {
        ASSERT_TRUE((*ex)->Submit(splits[i + 2].indices, splits[i + 2].epoch).ok());
      }
      auto got = NextRun(**ex);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->ids, want[i].ids);
      EXPECT_EQ(got->outputs, want[i].outputs);
      EXPECT_TRUE(got->bytes == want[i].bytes);
    }
    EXPECT_EQ((*ex)->thread_starts(), started);
    EXPECT_TRUE((*ex)->FeedIdle());
    EXPECT_EQ((*ex)->Next().status().code(),
              absl::StatusCode::kFailedPrecondition);  // no run submitted
  }
}

// A run's error ends that run (after its batches before the error); the next
// run comes out whole.
TEST_F(ExecutorTest, AFailingRunEndsAloneAndTheNextRunGoesOn) {
  sluice::testing::TempDir dir;
  testing::MakeDataset(dir.Join("bad"), 20, 4, {7});
  auto spec =
      sluice::pipeline_spec::ParsePipelineSpec(absl::StrReplaceAll(R"(
on_error: fail
source: {dataset: {path: BAD}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 8}}]}
  - batch: {size: 4}
)",
                                                                   {{"BAD", dir.Join("bad")}}));
  ASSERT_TRUE(spec.ok());
  auto ex = Executor::Create(*spec, Fixed(3, true));
  ASSERT_TRUE(ex.ok());
  ASSERT_TRUE((*ex)->Open().ok());
  std::vector<uint64_t> first, second;
  for (uint64_t g = 0; g < 12; ++g) first.push_back(g);
  for (uint64_t g = 12; g < 20; ++g) second.push_back(g);
  ASSERT_TRUE((*ex)->Submit(first, 0).ok());
  ASSERT_TRUE((*ex)->Submit(second, 0).ok());
  auto b = (*ex)->Next();
  ASSERT_TRUE(b.ok() && b->has_value()) << b.status();
  EXPECT_EQ((*b)->global_indices, (std::vector<uint64_t>{0, 1, 2, 3}));
  auto error = (*ex)->Next();
  EXPECT_EQ(error.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(error.status().message(), HasSubstr("record 7"));
  auto end = (*ex)->Next();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_FALSE(end->has_value());
  auto rest = NextRun(**ex);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(rest->ids, second);
  EXPECT_EQ(rest->outputs, 2);
}

TEST_F(ExecutorTest, StoppedConsumerKeepsMemoryBounded) {
  sluice::testing::TempDir dir;
  testing::MakeDataset(dir.Join("big"), 300, 4, {}, /*fixed=*/64);
  const std::string spec = absl::StrReplaceAll(R"(
source: {dataset: {path: BIG}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {normalize: {mean: [0.5], std: [0.5]}}], num_parallel_workers: 2}
  - map: {input_columns: [image], ops: [{hwc2chw: {}}], num_parallel_workers: 2}
  - prefetch: {buffer_size: 2}
)",
                                               {{"BIG", dir.Join("big")}});
  auto p = sluice::pipeline_spec::ParsePipelineSpec(spec);
  ASSERT_TRUE(p.ok());
  ExecutorOptions options = Fixed(6, false, OptimizerOptions::None());
  auto ex = Executor::Create(*p, options);
  ASSERT_TRUE(ex.ok());
  ASSERT_TRUE((*ex)->Start(0).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*ex)->GetNext().ok());
  // The consumer stops reading: every queue fills to its capacity and the
  // stages wait for room (polled with a generous deadline, not timed).
  auto full = [&] {
    const PipelineStats s = (*ex)->stats();
    for (const StageStats& stage : s.stages) {
      if (stage.peak_queue_items < stage.queue_capacity) return false;
    }
    return true;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!full() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_TRUE(full()) << (*ex)->stats().plan;
  const PipelineStats st = (*ex)->stats();
  const int64_t element = 64 * 64 * 3 * 4;  // float32 image
  // 3 stages × (queue of 2 + 2 workers) elements at most, and nowhere near the
  // 300 records.
  EXPECT_LE(st.stages[0].elements, 3u + 20u);
  EXPECT_LE((*ex)->peak_live_bytes(), 20 * element);
  EXPECT_LE((*ex)->live_bytes(), 20 * element);
  (*ex)->Stop();
  EXPECT_EQ((*ex)->live_bytes(), 0);
}

TEST_F(ExecutorTest, AutotuneStaysWithinThreadAndMemoryBudgets) {
  sluice::testing::TempDir dir;
  testing::MakeDataset(dir.Join("tune"), 120, 4, {}, /*fixed=*/48);
  const std::string spec = absl::StrReplaceAll(R"(
source: {dataset: {path: TUNE}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}, {spin: {cpu_micros: 300}}]}
  - map: {input_columns: [image], ops: [{normalize: {mean: [0.5], std: [0.5]}}, {hwc2chw: {}}]}
)",
                                               {{"TUNE", dir.Join("tune")}});
  auto p = sluice::pipeline_spec::ParsePipelineSpec(spec);
  ASSERT_TRUE(p.ok());
  ExecutorOptions options;
  options.optimizer = OptimizerOptions::None();
  options.cpu_budget = 5;
  const int64_t element = 48 * 48 * 3 * 4;
  options.memory_budget_bytes = 12 * element;
  options.autotune_interval = absl::Milliseconds(2);
  auto ex = Executor::Create(*p, options);
  ASSERT_TRUE(ex.ok());
  auto out = RunAll(**ex, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->ids.size(), 120u);
  const PipelineStats st = (*ex)->stats();
  EXPECT_LE(st.peak_threads, 5);
  EXPECT_GE(st.peak_threads, 3);  // started at one per stage
  EXPECT_LE(st.peak_queued_bytes, options.memory_budget_bytes);
}

TEST_F(ExecutorTest, IndexedFilterIsPushedIntoTheSource) {
  const std::string spec = R"(
source: {dataset: {path: DIR}, columns: [image, label]}
nodes:
  - filter: {predicate: "label == 1"}
  - map: {input_columns: [image], ops: [{decode: {}}, {resize: {height: 8, width: 8}}]}
)";
  auto ex = Executor::Create(Spec(spec), Fixed(2, false));
  ASSERT_TRUE(ex.ok());
  auto out = RunAll(**ex, 0);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->ids, (std::vector<uint64_t>{1, 5, 9, 13, 17, 21, 25, 29, 33}));
  uint64_t read = 0;
  for (const auto& s : (*ex)->stats().stages) read += s.elements;
  EXPECT_EQ(read, 9u);  // filtered records were never read
}

TEST_F(ExecutorTest, ImageFolderAndSyntheticSources) {
  auto p = sluice::pipeline_spec::ParsePipelineSpec(R"(
source: {synthetic: {num_records: 10, height: 40, width: 50}, columns: [image, label]}
nodes:
  - map: {input_columns: [image], ops: [{decode: {}}]}
  - batch: {size: 4}
)");
  ASSERT_TRUE(p.ok());
  auto ex = Executor::Create(*p, Fixed(2, false));
  ASSERT_TRUE(ex.ok()) << ex.status();
  auto out = RunAll(**ex, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->outputs, 3);
}

TEST_F(ExecutorTest, ExportsPerStageAndPerOpMetrics) {
  prometheus::Registry registry;
  ExecutorOptions options = Fixed(2, false);
  options.registry = &registry;
  options.autotune_interval = absl::Milliseconds(1);
  auto ex = Executor::Create(Spec(kTrain), options);
  ASSERT_TRUE(ex.ok());
  ASSERT_TRUE(RunAll(**ex, 0).ok());
  std::map<std::string, double> values;
  for (const auto& family : registry.Collect()) {
    for (const auto& m : family.metric) {
      std::string key = family.name;
      for (const auto& l : m.label) key += "{" + l.name + "=" + l.value + "}";
      values[key] = family.type == prometheus::MetricType::Histogram
                        ? double(m.histogram.sample_count)
                    : family.type == prometheus::MetricType::Gauge ? m.gauge.value
                                                                   : m.counter.value;
    }
  }
  const std::string stage = (*ex)->plan().stages.back().name;
  EXPECT_EQ(values[absl::StrCat("sluice_pipeline_stage_elements_total{stage=", stage, "}")], 28);
  EXPECT_GT(values[absl::StrCat("sluice_pipeline_stage_busy_seconds_total{stage=", stage, "}")], 0);
  EXPECT_TRUE(values.count(absl::StrCat("sluice_pipeline_stage_queue_depth{stage=", stage, "}")));
  EXPECT_EQ(values["sluice_op_seconds{op=RandomHorizontalFlip}"], 28);
}

TEST_F(ExecutorTest, ImageFolderIsNumberedLikeItsConvertedDataset) {
  sluice::testing::TempDir dir;
  for (int i = 0; i < 9; ++i) {
    const std::string cls = dir.Join(absl::StrCat("imgs/class_", i % 3));
    std::filesystem::create_directories(cls + "/sub");
    sluice::testing::WriteFile(absl::StrCat(cls, i == 4 ? "/sub" : "", "/img_", i, ".jpg"),
                               testing::Jpeg(i, 20 + i, 30));
  }
  sluice::testing::WriteFile(dir.Join("imgs/class_0/notes.txt"), "not an image");
  record::ConvertOptions convert;
  convert.input = dir.Join("imgs");
  convert.output = dir.Join("ds");
  ASSERT_TRUE(record::Convert(convert).ok());
  auto read_all = [&](const std::string& source) {
    auto p = sluice::pipeline_spec::ParsePipelineSpec(source);
    EXPECT_TRUE(p.ok()) << p.status();
    std::vector<std::string> rows;
    auto ex = Executor::Create(*p, Fixed(2, false));
    EXPECT_TRUE(ex.ok()) << ex.status();
    auto outputs = sluice::testonly::RunSplit(**ex, {0, 1, 2, 3, 4, 5, 6, 7, 8}, 0);
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) return rows;
    for (const Element& e : *outputs) {
      rows.push_back(absl::StrCat(e.global_indices[0], " ", *e.columns[1].data_as<int64_t>(), " ",
                                  std::string(e.columns[2].bytes()), " ",
                                  e.columns[0].num_bytes()));
    }
    return rows;
  };
  const auto folder =
      read_all(absl::StrCat("source: {image_folder: {path: ", dir.Join("imgs"), "}}"));
  const auto dataset = read_all(absl::StrCat("source: {dataset: {path: ", dir.Join("ds"), "}}"));
  EXPECT_EQ(folder.size(), 9u);
  EXPECT_EQ(folder, dataset);
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
