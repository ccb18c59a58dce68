// The payload through the service end to end: a dispatcher and workers as
// real processes (LocalCluster), a consumer through the client library. Every
// batch must carry the right labels and exactly the pixel bytes the in-process
// executor (data_worker/pipeline/executor.h) produces for the same pipeline,
// epoch and records: batches are matched by their global record indices, and
// the executor is run on exactly those indices, in that order, for that epoch.
// The pipeline draws random crops and flips, so a worker that used another
// seed (the pipeline's mixed with the job's), epoch or record would show in the
// pixels. Both transports: the workers on this host write the batches into the
// consumer's shared-memory ring (the default), or the stream carries them
// (ClientOptions::shared_memory_bytes = 0).
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/pipeline/spec.h"
#include "gtest/gtest.h"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"
#include "sluice/client.h"
#include "tests/testing/cluster_testing.h"
#include "tests/testing/executor_testing.h"
#include "tests/testing/temp_dir.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice {
namespace {

using ::sluice::testing::TempDir;

constexpr int kRecords = 96;
constexpr int kBatch = 8;
constexpr int kSplit = 24;
constexpr int kEpochs = 2;
constexpr uint64_t kJobSeed = 13;

using ::sluice::testing::BinDir;

int64_t LabelOf(uint64_t record) { return static_cast<int64_t>(record % 7); }

// JPEGs that differ per record (colour and a dot), label = record % 7.
void WriteDataset(const std::string& dir) {
  auto writer = record::DatasetWriter::Create(dir, record::ImageClassificationSchema(),
                                              {.shard_size_bytes = 20000});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < kRecords; ++i) {
    cv::Mat image(28, 36, CV_8UC3, cv::Scalar((i * 5) % 256, (i * 11) % 256, (i * 17) % 256));
    cv::circle(image, {i % 36, (i * 3) % 28}, 4, cv::Scalar(255, 255, 255), -1);
    std::vector<uchar> jpeg;
    cv::imencode(".jpg", image, jpeg);
    ASSERT_TRUE(
        (*writer)
            ->Add({record::Tensor::Bytes(std::string(jpeg.begin(), jpeg.end())),
                   record::Tensor::Int64(LabelOf(i)), record::Tensor::Bytes(absl::StrCat("k", i))})
            .ok());
  }
  auto manifest = (*writer)->Finish();
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_GT(manifest->shards.size(), 1u);
}

proto::Pipeline MakePipeline(const std::string& dataset) {
  auto pipeline = sluice::pipeline_spec::ParsePipelineSpec(absl::StrCat(R"(
seed: 5
source:
  dataset: {path: )",
                                                                        dataset,
                                                                        R"(}
  columns: [image, label]
nodes:
  - shuffle: {seed: 9}
  - map:
      input_columns: [image]
      ops:
        - decode: {}
        - random_resized_crop: {size: 16}
        - random_horizontal_flip: {}
        - hwc2chw: {}
  - batch: {size: )",
                                                                        kBatch, R"(}
)"));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.value_or(proto::Pipeline());
}

struct Received {
  uint64_t epoch = 0;
  std::vector<uint64_t> indices;
  std::string image;  // bytes of column "image"
  std::string label;  // bytes of column "label"
  std::vector<int64_t> image_shape;
};

class PayloadTest : public ::testing::TestWithParam<uint64_t> {};

INSTANTIATE_TEST_SUITE_P(Transports, PayloadTest,
                         ::testing::Values(ClientOptions().shared_memory_bytes, 0),
                         [](const ::testing::TestParamInfo<uint64_t>& info) {
                           return info.param > 0 ? std::string("SharedMemory")
                                                 : std::string("StreamOnly");
                         });

TEST_P(PayloadTest, ServiceBatchesCarryTheExecutorsPixelsAndTheRightLabels) {
  TempDir data;
  WriteDataset(data.Join("ds"));
  const proto::Pipeline pipeline = MakePipeline(data.Join("ds"));

  auto cluster = tools::LocalCluster::Start({.bin_dir = BinDir(),
                                             .workers = 2,
                                             .data_roots = {data.path()},
                                             .work_dir = data.Join("cluster"),
                                             .worker_threads = 1,
                                             .log_level = "info",
                                             .heartbeat_interval = absl::Milliseconds(100),
                                             .worker_timeout = absl::Seconds(5)});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = DataServiceClient::Create({.dispatcher_address = (*cluster)->dispatcher_address(),
                                           .connect_timeout = absl::Seconds(5),
                                           .heartbeat_interval = absl::Milliseconds(100),
                                           .shared_memory_bytes = GetParam()});
  ASSERT_TRUE(client.ok()) << client.status();
  auto it = (*client)->Open({.job_name = "payload",
                             .pipeline = pipeline,
                             .seed = kJobSeed,
                             .num_epochs = kEpochs,
                             .num_consumers = 1,
                             .consumer_index = 0,
                             .split_size = kSplit});
  ASSERT_TRUE(it.ok()) << it.status();
  std::vector<Received> received;
  while (true) {
    auto batch = (*it)->GetNext();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    Received r{.epoch = (*batch)->epoch, .indices = (*batch)->global_indices};
    for (const Column& c : (*batch)->columns) {
      if (c.name == "image") {
        r.image = std::string(c.bytes());
        r.image_shape = c.shape;
      } else if (c.name == "label") {
        r.label = std::string(c.bytes());
      }
    }
    received.push_back(std::move(r));
  }
  // Through shared memory: every column byte (nothing falls back to the stream with a ring
  // this much larger than a batch); otherwise none.
  uint64_t column_bytes = 0;
  for (const Received& r : received) column_bytes += r.image.size() + r.label.size();
  EXPECT_EQ((*it)->shared_memory_bytes(), GetParam() > 0 ? column_bytes : 0);
  // Every record once per epoch (splits end at shard boundaries, so some
  // batches are short).
  ASSERT_GE(received.size(), static_cast<size_t>(kEpochs * kRecords / kBatch));
  std::map<uint64_t, std::vector<int>> seen;  // epoch → count per record
  for (const Received& r : received) {
    auto& counts = seen[r.epoch];
    counts.resize(kRecords);
    for (uint64_t i : r.indices) {
      ASSERT_LT(i, static_cast<uint64_t>(kRecords));
      ++counts[i];
    }
  }
  ASSERT_EQ(seen.size(), static_cast<size_t>(kEpochs));
  for (const auto& [epoch, counts] : seen) {
    for (int i = 0; i < kRecords; ++i)
      ASSERT_EQ(counts[i], 1) << "epoch " << epoch << " record " << i;
  }

  // Given the job's seed, which the workers mix into the pipeline's.
  auto executor =
      data_worker::pipeline::Executor::Create(pipeline, {.cpu_budget = 1, .job_seed = kJobSeed});
  ASSERT_TRUE(executor.ok()) << executor.status();
  for (const Received& r : received) {
    SCOPED_TRACE(absl::StrCat("epoch ", r.epoch, " first record ", r.indices.front()));
    // Labels: one int64 per element, the record's label.
    ASSERT_EQ(r.label.size(), r.indices.size() * sizeof(int64_t));
    for (size_t k = 0; k < r.indices.size(); ++k) {
      int64_t label;
      std::memcpy(&label, r.label.data() + k * sizeof(int64_t), sizeof(label));
      EXPECT_EQ(label, LabelOf(r.indices[k])) << "element " << k;
    }
    // Pixels: exactly the executor's batch for these records in this epoch.
    ASSERT_EQ(r.image_shape,
              (std::vector<int64_t>{static_cast<int64_t>(r.indices.size()), 3, 16, 16}));
    auto expected = sluice::testonly::RunSplit(**executor, r.indices, r.epoch);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(expected->size(), 1u) << "one batch expected";
    EXPECT_EQ((*expected)[0].global_indices, r.indices);
    ASSERT_EQ((*expected)[0].columns.size(), 2u);
    const data_worker::Tensor& image = (*expected)[0].columns[0];
    EXPECT_EQ(r.image, std::string(reinterpret_cast<const char*>(image.data()), image.num_bytes()))
        << "pixel bytes differ from the in-process executor";
    (*executor)->Stop();
  }
}

}  // namespace
}  // namespace sluice
