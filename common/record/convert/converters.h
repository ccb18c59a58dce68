// Internal to the convert library: what each input format provides to Convert
// (convert.cc).
//
// A format turns its input into an ordered list of SampleSources (one per input
// file, or per batch of small files). Convert runs the sources on worker
// threads and writes their samples in source order, so the output does not
// depend on the number of threads.
#ifndef SLUICE_COMMON_RECORD_CONVERT_CONVERTERS_H_
#define SLUICE_COMMON_RECORD_CONVERT_CONVERTERS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::record {

// One image-classification sample, as written to the dataset.
struct Sample {
  std::string image;  // encoded JPEG or PNG
  int64_t label = 0;
  std::string key;
};

// Receives the samples of one source in order. A non-OK return (the conversion
// was cancelled) must be returned by the source unchanged.
using SampleSink = std::function<absl::Status(Sample)>;
// Reads and validates one part of the input, handing each sample to the sink.
// Sources of one plan run concurrently with each other; each must be safe to
// run on any thread.
using SampleSource = std::function<absl::Status(const SampleSink&)>;

struct ConversionPlan {
  std::vector<SampleSource> sources;
  uint64_t total_samples = 0;  // 0 if unknown
};

// The plans of the three formats; see convert.h for the layouts. Planning only
// lists the input (NotFound for a missing input, InvalidArgument for an empty
// one); sources read the files.
absl::StatusOr<ConversionPlan> PlanImageFolder(const std::string& input);
absl::StatusOr<ConversionPlan> PlanTfRecord(const std::string& input);
absl::StatusOr<ConversionPlan> PlanWebDataset(const std::string& input);

// True if `bytes` start with the JPEG (FF D8 FF) or PNG (89 'PNG' 0D 0A 1A 0A)
// signature.
bool HasImageSignature(std::string_view bytes);

// The regular files directly inside `dir` whose names do not start with '.' and
// satisfy `keep`, sorted by name; or {input} if `input` is a regular file.
// NotFound if `input` does not exist.
absl::StatusOr<std::vector<std::string>> ListInputFiles(
    const std::string& input, const std::function<bool(std::string_view name)>& keep);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_CONVERT_CONVERTERS_H_
