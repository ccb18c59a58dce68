// libFuzzer target for WebDataset input to `sluice convert`: the input is a
// tar (plain or gzip) read through PlanWebDataset and its sample sources, i.e.
// libarchive's tar reading plus our grouping of members into samples (key,
// image member, .cls label). Arbitrary bytes must give samples or a Status
// (DataLoss/InvalidArgument), never a crash.
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
