// libFuzzer target for a pipeline as a worker receives it from the dispatcher:
// JobInfo.pipeline holds arbitrary bytes, and JobRegistry::Add parses them as
// proto::Pipeline, checks the data root and builds the executor (Validate,
// optimizer, op builder). A bad pipeline must leave a refused job with a
// Status, never crash the worker. A synthetic source is shrunk so that no input
// can allocate a huge image; a dataset or image-folder source outside the
// (empty, temporary) data root is refused before any file is read.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/base/logging.h"
#include "data_worker/worker/job_registry.h"
#include "proto/pipeline.pb.h"
#include "proto/worker.pb.h"

namespace {

const std::string& DataRoot() {
  static const std::string* root = [] {
    auto dir =
        std::filesystem::temp_directory_path() / ("sluice-fuzz-root-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    return new std::string(dir.string());
  }();
  return *root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::data_worker::JobRegistry;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  sluice::proto::Pipeline spec;
  if (spec.ParseFromString(bytes) && spec.source().has_synthetic()) {
    auto* synthetic = spec.mutable_source()->mutable_synthetic();
    synthetic->set_num_records(synthetic->num_records() % 64);
    synthetic->set_height(synthetic->height() % 64);
    synthetic->set_width(synthetic->width() % 64);
    bytes = spec.SerializeAsString();
  }
  auto roots = JobRegistry::CanonicalDataRoots({DataRoot()});
  if (!roots.ok()) std::abort();
  sluice::data_worker::pipeline::ExecutorOptions options;
  options.cpu_budget = 1;
  JobRegistry registry(*roots, options, sluice::NullLogger());
  sluice::proto::JobInfo info;
  info.set_job_id(7);
  info.set_job_name("fuzz");
  info.set_pipeline(bytes);
  registry.Add(info);
  auto job = registry.Get(7);
  if (job == nullptr) std::abort();  // Add never fails: a bad job is refused
  if (job->status.ok()) {
    auto executor = registry.AcquireExecutor(7);
    if (!executor.ok()) std::abort();
  }
  return 0;
}
