// libFuzzer target for the pipeline spec path a client's YAML/JSON takes:
// ParsePipelineSpec (YAML/JSON → proto::Pipeline), then Executor::Create
// (Validate: columns, dtypes, shapes; the optimizer; the op builder). Arbitrary
// text must give a Status, never a crash or an escaped exception. The source is
// replaced by a small synthetic one so that no input can make the fuzzer read
// the file system or allocate a huge image.
#include <cstdint>
#include <string_view>

#include "common/pipeline_spec/parse.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/pipeline/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace pl = sluice::data_worker::pipeline;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(text);
  if (!spec.ok()) return 0;
  auto* synthetic = spec->mutable_source()->mutable_synthetic();
  synthetic->set_num_records(synthetic->num_records() % 64);
  synthetic->set_height(synthetic->height() % 64);
  synthetic->set_width(synthetic->width() % 64);
  pl::ExecutorOptions options;
  options.cpu_budget = 1;
  auto executor = pl::Executor::Create(*spec, options);
  return 0;
}
