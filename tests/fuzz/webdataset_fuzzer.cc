// libFuzzer target for the webdataset converter input: the input is a WebDataset tar (plain or gzip): the tar headers and the grouping of members into samples, read through
// PlanWebDataset and its sample sources as `sluice convert` does. Arbitrary
// bytes must give samples or a Status (DataLoss/InvalidArgument), never a crash.
#include <cstdint>

#include "common/record/convert/converters.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sluice::fuzz::WriteInput(data, size, "input.tar");
  auto plan = sluice::record::PlanWebDataset(path);
  if (!plan.ok()) return 0;
  for (const auto& source : plan->sources) {
    const absl::Status status = source([](sluice::record::Sample sample) {
      (void)sample;
      return absl::OkStatus();
    });
    if (!status.ok()) break;
  }
  return 0;
}
