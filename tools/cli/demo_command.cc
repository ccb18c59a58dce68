// sluice demo — the whole path from nothing, on this machine: synthetic JPEGs → Unirecord →
// verify → read every record, then a summary. Cleans up after itself unless --keep.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/record/convert/convert.h"
#include "common/record/dataset.h"
#include "common/record/sharding.h"
#include "tools/cli/command.h"
#include "tools/cli/progress.h"
#include "tools/datagen/datagen.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

struct DemoFlags {
  int images = 2000;
  int classes = 10;
  std::string work_dir;
  bool keep = false;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

// Removes the demo's folder when the demo ends, however it ends.
class ScopedDir {
 public:
  ScopedDir(std::string path, bool keep) : path_(std::move(path)), keep_(keep) {}
  ~ScopedDir() {
    if (keep_) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  const bool keep_;
};

absl::Status RunDemo(const DemoFlags& flags) {
  std::string root = flags.work_dir;
  if (root.empty()) {
    std::string pattern = (fs::temp_directory_path() / "sluice-demo-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return absl::InternalError("cannot create a temp folder");
    root = pattern;
  } else if (fs::exists(root) && !fs::is_empty(root)) {
    return absl::FailedPreconditionError("--work-dir '" + root + "' is not empty");
  }
  ScopedDir dir(root, flags.keep);
  const std::string images = (fs::path(root) / "images").string();
  const std::string dataset = (fs::path(root) / "dataset").string();
  std::printf("sluice demo: working in %s\n", root.c_str());
  std::fflush(stdout);

  // 1. Synthetic ImageNet-like JPEGs.
  {
    ProgressBar bar("datagen", flags.images);
    tools::DatagenOptions options{.output = images, .images = flags.images,
                                  .classes = flags.classes, .seed = 0, .threads = flags.threads};
    options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
    RETURN_IF_ERROR(tools::GenerateImageFolder(options));
  }
  // 2. Convert to Unirecord.
  record::Manifest manifest;
  {
    ProgressBar bar("convert", flags.images);
    record::ConvertOptions options{.input = images, .output = dataset,
                                   .format = record::InputFormat::kImageFolder,
                                   .threads = flags.threads};
    options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
    ASSIGN_OR_RETURN(manifest, record::Convert(options));
  }
  // 3. Verify every checksum.
  const absl::Time verify_start = absl::Now();
  const std::vector<std::string> problems = record::VerifyDataset(dataset);
  if (!problems.empty()) return absl::DataLossError("verify: " + problems.front());
  const double verify_seconds = absl::ToDoubleSeconds(absl::Now() - verify_start);
  // 4. Read every record by random access, in a shuffled order, on all threads.
  ASSIGN_OR_RETURN(std::unique_ptr<record::Dataset> ds, record::Dataset::Open(dataset));
  const std::vector<uint64_t> order = record::Permutation(ds->size(), /*seed=*/1, /*epoch=*/0);
  std::atomic<uint64_t> next{0}, done{0}, bytes{0};
  std::atomic<bool> failed{false};
  absl::Status read_error;
  absl::Mutex error_mu;
  ProgressBar bar("read", ds->size());
  const absl::Time read_start = absl::Now();
  {
    std::vector<std::jthread> readers;
    for (int t = 0; t < flags.threads; ++t) {
      readers.emplace_back([&] {
        for (uint64_t i; !failed && (i = next.fetch_add(1)) < order.size();) {
          auto encoded = ds->ReadEncoded(order[i]);
          if (!encoded.ok()) {
            absl::MutexLock lock(&error_mu);
            read_error = encoded.status();
            failed = true;
            return;
          }
          bytes += encoded->size();
          bar.Update(++done);
        }
      });
    }
  }
  RETURN_IF_ERROR(read_error);
  bar.Done();
  const double read_seconds = absl::ToDoubleSeconds(absl::Now() - read_start);

  uint64_t dataset_bytes = 0;
  for (const auto& s : manifest.shards) dataset_bytes += s.bytes;
  std::printf("\nsummary\n");
  std::printf("  dataset      %llu records, %zu shard(s), %.1f MB (%s)\n",
              static_cast<unsigned long long>(manifest.total_records), manifest.shards.size(),
              dataset_bytes / 1e6, flags.keep ? dataset.c_str() : "removed after the demo");
  std::printf("  verify       %.0f records/s, %.1f MB/s (every checksum)\n",
              ds->size() / verify_seconds, dataset_bytes / 1e6 / verify_seconds);
  std::printf("  random read  %.0f records/s, %.1f MB/s on %d thread(s), checksums verified\n",
              ds->size() / read_seconds, bytes.load() / 1e6 / read_seconds, flags.threads);
  return absl::OkStatus();
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Run the whole path on this machine from nothing and print a summary");
  cmd->add_option("--images", flags->images, "Synthetic images to generate")->capture_default_str();
  cmd->add_option("--classes", flags->classes, "Classes")->capture_default_str();
  cmd->add_option("--work-dir", flags->work_dir, "Folder to work in (default: a new temp folder)");
  cmd->add_flag("--keep", flags->keep, "Keep the work folder");
  cmd->add_option("--threads", flags->threads, "Threads")->capture_default_str();
  cmd->callback([flags] { Finish(RunDemo(*flags)); });
}

}  // namespace sluice::cli
