// What the real-process tests share (tests/integration): where the binaries are, small labelled
// datasets (of placeholder or JPEG images), a batch pipeline, and a cluster secured with mutual TLS
// and a token.
#ifndef SLUICE_TESTS_TESTING_CLUSTER_TESTING_H_
#define SLUICE_TESTS_TESTING_CLUSTER_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "gtest/gtest.h"
#include "opencv2/core.hpp"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"
#include "proto/pipeline.pb.h"
#include "sluice/client.h"
#include "tools/local_cluster/certificates.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice::testing {

// The folder of sluice-dispatcher and sluice-worker: $SLUICE_BIN_DIR, else next to the test.
inline std::string BinDir() {
  const char* dir = std::getenv("SLUICE_BIN_DIR");
  return dir != nullptr ? dir : tools::BinDir();
}

// A dataset of `records` image-classification records under `dir`: record i has label i % 10
// and image bytes `image` (never decoded by the pipelines below).
inline void WriteLabelDataset(const std::string& dir, int records,
                              const std::string& image = "not decoded") {
  auto writer = record::DatasetWriter::Create(dir, record::ImageClassificationSchema(), {});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < records; ++i) {
    ASSERT_TRUE((*writer)
                    ->Add({record::Tensor::Bytes(image), record::Tensor::Int64(i % 10),
                           record::Tensor::Bytes("k")})
                    .ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

// `image` as JPEG bytes (OpenCV's default quality).
inline std::string Jpeg(const cv::Mat& image) {
  std::vector<uchar> jpeg;
  EXPECT_TRUE(cv::imencode(".jpg", image, jpeg));
  return std::string(jpeg.begin(), jpeg.end());
}

// Record i's image of the JPEG datasets: 32x24 pixels of its own colour with a white disc.
inline std::string DiscJpeg(int i) {
  cv::Mat image(24, 32, CV_8UC3, cv::Scalar(i % 256, (i * 7) % 256, (i * 13) % 256));
  cv::circle(image, {i % 32, i % 24}, 5, cv::Scalar(255, 255, 255), -1);
  return Jpeg(image);
}

struct JpegDatasetOptions {
  int records = 0;
  uint64_t shard_size_bytes = record::DatasetWriter::Options().shard_size_bytes;
  // Record i's image bytes (usually Jpeg(some cv::Mat made from i)).
  std::function<std::string(int)> image;
  // 0: an empty key. Else each key pads its record's image to this many bytes, so records have
  // one size and a shard holds a known number of them.
  size_t pad_to = 0;
};

// A dataset of image-classification records under `dir`: record i has image `image(i)`, label
// i % 10 and the key above. `manifest`, if given, receives what the writer wrote.
inline void WriteJpegDataset(const std::string& dir, const JpegDatasetOptions& options,
                             record::Manifest* manifest = nullptr) {
  auto writer = record::DatasetWriter::Create(dir, record::ImageClassificationSchema(),
                                              {.shard_size_bytes = options.shard_size_bytes});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i = 0; i < options.records; ++i) {
    std::string image = options.image(i);
    ASSERT_LE(image.size(), options.pad_to == 0 ? image.size() : options.pad_to) << "record " << i;
    std::string key = options.pad_to == 0 ? "" : std::string(options.pad_to - image.size(), 'k');
    ASSERT_TRUE((*writer)
                    ->Add({record::Tensor::Bytes(std::move(image)), record::Tensor::Int64(i % 10),
                           record::Tensor::Bytes(std::move(key))})
                    .ok());
  }
  auto written = (*writer)->Finish();
  ASSERT_TRUE(written.ok()) << written.status();
  if (manifest != nullptr) *manifest = *std::move(written);
}

// The labels of `dataset` in batches of 8, the last one short.
inline proto::Pipeline LabelPipeline(const std::string& dataset) {
  auto pipeline = pipeline_spec::ParsePipelineSpec(
      absl::StrCat("source:\n  dataset: {path: ", dataset,
                   "}\n  columns: [label]\nnodes:\n  - batch: {size: 8, "
                   "drop_remainder: false}\n"));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.value_or(proto::Pipeline());
}

// What one consumer received until its job ended or its first error.
struct Received {
  std::map<uint64_t, std::vector<uint64_t>> ids;  // per epoch, in delivery order
  std::vector<std::vector<int64_t>> shapes;       // of the first column, per batch
  int max_buffered = 0;                           // the most batches the iterator held
  absl::Status status;                            // OK when the job ended
};

// Opens `job` with a client made of `options` and reads it to the end (or its first error);
// `after_batch(n)` runs after the n-th batch.
inline Received ConsumeJob(const ClientOptions& options, const JobOptions& job,
                           const std::function<void(int batches)>& after_batch = nullptr) {
  Received out;
  auto client = DataServiceClient::Create(options);
  if (!client.ok()) return {.status = client.status()};
  auto it = (*client)->Open(job);
  if (!it.ok()) return {.status = it.status()};
  for (int batches = 0;;) {
    auto batch = (*it)->GetNext();
    out.max_buffered = std::max(out.max_buffered, (*it)->buffered_batches());
    if (!batch.ok()) {
      out.status = batch.status();
      return out;
    }
    if (!batch->has_value()) return out;
    auto& ids = out.ids[(*batch)->epoch];
    ids.insert(ids.end(), (*batch)->global_indices.begin(), (*batch)->global_indices.end());
    out.shapes.push_back((*batch)->columns.at(0).shape);
    if (after_batch) after_batch(++batches);
  }
}

// One worker and a dispatcher serving `data_root` under mutual TLS with `certs`; the processes
// present `auth_token_file` to each other and take `extra_*_flags` (e.g. --tokens-file).
inline tools::LocalClusterOptions SecuredCluster(
    const std::string& data_root, const std::string& work_dir, const tools::Certificates& certs,
    std::string auth_token_file, std::vector<std::string> extra_worker_flags = {},
    std::vector<std::string> extra_dispatcher_flags = {}) {
  return {.bin_dir = BinDir(),
          .workers = 1,
          .data_roots = {data_root},
          .work_dir = work_dir,
          .worker_threads = 1,
          .heartbeat_interval = absl::Milliseconds(100),
          .extra_worker_flags = std::move(extra_worker_flags),
          .extra_dispatcher_flags = std::move(extra_dispatcher_flags),
          .tls_cert = certs.server_cert,
          .tls_key = certs.server_key,
          .tls_ca = certs.ca,
          .auth_token_file = std::move(auth_token_file)};
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_CLUSTER_TESTING_H_
