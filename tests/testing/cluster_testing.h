// What the real-process tests share (tests/integration): where the binaries are, a small labelled
// dataset, its batch pipeline, and a cluster secured with mutual TLS and a token.
#ifndef SLUICE_TESTS_TESTING_CLUSTER_TESTING_H_
#define SLUICE_TESTS_TESTING_CLUSTER_TESTING_H_

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/dataset.h"
#include "gtest/gtest.h"
#include "proto/pipeline.pb.h"
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

// The labels of `dataset` in batches of 8, the last one short.
inline proto::Pipeline LabelPipeline(const std::string& dataset) {
  auto pipeline = pipeline_spec::ParsePipelineSpec(
      absl::StrCat("source:\n  dataset: {path: ", dataset,
                   "}\n  columns: [label]\nnodes:\n  - batch: {size: 8, "
                   "drop_remainder: false}\n"));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  return pipeline.value_or(proto::Pipeline());
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
