#include "common/record/convert/convert.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/record/convert/converters.h"
#include "common/record/record.h"
#include "common/record/schema.h"

namespace sluice::record {
namespace fs = std::filesystem;

namespace {

// Runs the sources of a plan on `threads` worker threads and hands their
// samples to a writer on the calling thread, in source order. At most `2 *
// threads` sources are started ahead of the one being written and each buffers
// at most kMaxBufferedBytes (plus one sample), which bounds memory. The workers
// are started and joined inside Run().
class OrderedRunner {
 public:
  OrderedRunner(const std::vector<SampleSource>& sources, int threads)
      : sources_(sources), threads_(threads), window_(2 * static_cast<size_t>(threads)) {}

  // Calls `write` for every sample in order. Returns the first error in source
  // order (a source's or write's); the remaining sources are then cancelled.
  absl::Status Run(const std::function<absl::Status(Sample)>& write) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr uint64_t kMaxBufferedBytes = 16 << 20;

  struct Slot {
    std::deque<Sample> samples;
    uint64_t bytes = 0;
    bool done = false;
    absl::Status status;
  };

  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Push(size_t source, Sample sample) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the next sample of `source`: true with *sample set, or false with
  // *status set when the source has finished.
  bool Pop(size_t source, Sample* sample, absl::Status* status) ABSL_LOCKS_EXCLUDED(mu_);

  static uint64_t Size(const Sample& s) { return s.image.size() + s.key.size(); }

  const std::vector<SampleSource>& sources_;
  const int threads_;
  const size_t window_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every change of the fields below
  std::map<size_t, Slot> slots_ ABSL_GUARDED_BY(mu_);  // sources started and not yet written
  size_t next_source_ ABSL_GUARDED_BY(mu_) = 0;        // next source to start
  size_t writing_ ABSL_GUARDED_BY(mu_) = 0;            // source being written
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status OrderedRunner::Run(const std::function<absl::Status(Sample)>& write) {
  std::vector<std::thread> workers;
  for (int i = 0; i < threads_; ++i) workers.emplace_back([this] { WorkerLoop(); });
  absl::Status result;
  for (size_t i = 0; i < sources_.size() && result.ok(); ++i) {
    Sample sample;
    absl::Status status;
    while (result.ok() && Pop(i, &sample, &status)) result = write(std::move(sample));
    if (result.ok()) result = status;
  }
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : workers) t.join();
  return result;
}

void OrderedRunner::WorkerLoop() {
  for (;;) {
    size_t source;
    {
      absl::MutexLock lock(&mu_);
      while (!cancelled_ && next_source_ < sources_.size() && next_source_ >= writing_ + window_) {
        cv_.Wait(&mu_);
      }
      if (cancelled_ || next_source_ >= sources_.size()) return;
      source = next_source_++;
      slots_[source];
    }
    absl::Status status =
        sources_[source]([this, source](Sample s) { return Push(source, std::move(s)); });
    absl::MutexLock lock(&mu_);
    Slot& slot = slots_[source];
    slot.done = true;
    slot.status = std::move(status);
    cv_.SignalAll();
  }
}

absl::Status OrderedRunner::Push(size_t source, Sample sample) {
  const uint64_t size = Size(sample);
  absl::MutexLock lock(&mu_);
  Slot& slot = slots_[source];
  while (!cancelled_ && slot.bytes > 0 && slot.bytes + size > kMaxBufferedBytes) cv_.Wait(&mu_);
  if (cancelled_) return absl::CancelledError("conversion cancelled");
  slot.bytes += size;
  slot.samples.push_back(std::move(sample));
  cv_.SignalAll();
  return absl::OkStatus();
}

bool OrderedRunner::Pop(size_t source, Sample* sample, absl::Status* status) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto it = slots_.find(source);
    if (it != slots_.end() && !it->second.samples.empty()) {
      Slot& slot = it->second;
      *sample = std::move(slot.samples.front());
      slot.samples.pop_front();
      slot.bytes -= Size(*sample);
      cv_.SignalAll();
      return true;
    }
    if (it != slots_.end() && it->second.done) {
      *status = std::move(it->second.status);
      slots_.erase(it);
      writing_ = source + 1;
      cv_.SignalAll();
      return false;
    }
    cv_.Wait(&mu_);
  }
}

absl::Status ValidateOptions(const ConvertOptions& options) {
  if (options.input.empty()) return absl::InvalidArgumentError("--input must name the input");
  if (options.output.empty()) {
    return absl::InvalidArgumentError("--output must name the dataset folder to create");
  }
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 1, got ", options.threads));
  }
  if (options.shard_size_bytes == 0) return absl::InvalidArgumentError("--shard-size must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<ConversionPlan> Plan(const ConvertOptions& options) {
  switch (options.format) {
    case InputFormat::kImageFolder:
      return PlanImageFolder(options.input);
    case InputFormat::kTfRecord:
      return PlanTfRecord(options.input);
    case InputFormat::kWebDataset:
      return PlanWebDataset(options.input);
  }
  return absl::InvalidArgumentError("unknown input format");
}

absl::StatusOr<Manifest> WriteDataset(const ConvertOptions& options, const ConversionPlan& plan,
                                      DatasetWriter& writer) {
  uint64_t done = 0;
  auto write = [&](Sample s) -> absl::Status {
    RETURN_IF_ERROR(writer.Add({Tensor::Bytes(std::move(s.image)), Tensor::Int64(s.label),
                                Tensor::Bytes(std::move(s.key))}));
    ++done;
    if (options.progress) options.progress(done, plan.total_samples);
    return absl::OkStatus();
  };
  if (options.threads == 1 || plan.sources.size() == 1) {
    for (const SampleSource& source : plan.sources) RETURN_IF_ERROR(source(write));
  } else {
    const int threads = static_cast<int>(
        std::min<size_t>(static_cast<size_t>(options.threads), plan.sources.size()));
    OrderedRunner runner(plan.sources, threads);
    RETURN_IF_ERROR(runner.Run(write));
  }
  if (writer.record_count() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no samples found in ", options.input, "; nothing to convert"));
  }
  return writer.Finish();
}

}  // namespace

absl::StatusOr<InputFormat> ParseInputFormat(std::string_view name) {
  if (name == "imagefolder") return InputFormat::kImageFolder;
  if (name == "tfrecord") return InputFormat::kTfRecord;
  if (name == "wds") return InputFormat::kWebDataset;
  return absl::InvalidArgumentError(absl::StrCat("unknown input format \"", std::string(name),
                                                 "\"; expected imagefolder, tfrecord or wds"));
}

bool HasImageSignature(std::string_view bytes) {
  static constexpr std::string_view kJpeg("\xff\xd8\xff", 3);
  static constexpr std::string_view kPng("\x89PNG\r\n\x1a\n", 8);
  return bytes.starts_with(kJpeg) || bytes.starts_with(kPng);
}

absl::StatusOr<std::vector<std::string>> ListInputFiles(
    const std::string& input, const std::function<bool(std::string_view name)>& keep) {
  std::error_code ec;
  const fs::file_status status = fs::status(input, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot stat input ", input));
  }
  if (!fs::exists(status))
    return absl::NotFoundError(absl::StrCat("input ", input, " does not exist"));
  if (fs::is_regular_file(status)) return std::vector<std::string>{input};
  if (!fs::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input ", input, " is neither a file nor a folder"));
  }
  std::vector<std::string> files;
  fs::directory_iterator it(input, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(".") || !keep(name)) continue;
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) files.push_back(it->path().string());
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot list folder ", input));
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<Manifest> Convert(const ConvertOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(const ConversionPlan plan, Plan(options));
  std::error_code ec;
  const bool output_existed = fs::exists(options.output, ec);
  ASSIGN_OR_RETURN(std::unique_ptr<DatasetWriter> writer,
                   DatasetWriter::Create(options.output, ImageClassificationSchema(),
                                         {.shard_size_bytes = options.shard_size_bytes}));
  absl::StatusOr<Manifest> manifest = WriteDataset(options, plan, *writer);
  if (!manifest.ok() && !output_existed) {
    writer.reset();
    fs::remove_all(options.output, ec);
  }
  return manifest;
}

}  // namespace sluice::record
