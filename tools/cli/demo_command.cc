// sluice demo — the whole path from nothing, on this machine: synthetic JPEGs →
// Unirecord → verify → a local cluster (dispatcher + workers as processes) →
// two epochs of ImageNet training preprocessing consumed through the client
// library → a summary. Cleans up after itself unless
// --keep.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/record/convert/convert.h"
#include "common/record/dataset.h"
#include "sluice/client.h"
#include "sluice/pipeline_builder.h"
#include "tools/cli/command.h"
#include "tools/cli/progress.h"
#include "tools/datagen/datagen.h"
#include "tools/local_cluster/certificates.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

struct DemoFlags {
  int images = 2000;
  int classes = 10;
  int workers = 2;
  int epochs = 2;
  std::string work_dir;
  bool keep = false;
  bool tls = false;
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
    if (mkdtemp(pattern.data()) == nullptr)
      return absl::InternalError("cannot create a temp folder");
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
    tools::DatagenOptions options{.output = images,
                                  .images = flags.images,
                                  .classes = flags.classes,
                                  .seed = 0,
                                  .threads = flags.threads};
    options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
    RETURN_IF_ERROR(tools::GenerateImageFolder(options));
  }
  // 2. Convert to Unirecord.
  record::Manifest manifest;
  {
    ProgressBar bar("convert", flags.images);
    record::ConvertOptions options{.input = images,
                                   .output = dataset,
                                   .format = record::InputFormat::kImageFolder,
                                   .threads = flags.threads};
    options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
    ASSIGN_OR_RETURN(manifest, record::Convert(options));
  }
  // 3. Verify every checksum.
  const std::vector<std::string> problems = record::VerifyDataset(dataset);
  if (!problems.empty()) return absl::DataLossError("verify: " + problems.front());
  uint64_t dataset_bytes = 0;
  for (const auto& s : manifest.shards) dataset_bytes += s.bytes;
  std::printf("verified   %llu records, %zu shard(s), %.1f MB\n",
              static_cast<unsigned long long>(manifest.total_records), manifest.shards.size(),
              dataset_bytes / 1e6);

  // 4. A local cluster: the dispatcher and the workers as processes on
  // loopback.
  tools::LocalClusterOptions cluster_options{.bin_dir = tools::BinDir(),
                                             .workers = flags.workers,
                                             .data_roots = {root},
                                             .work_dir = (fs::path(root) / "cluster").string()};
  ClientOptions client_options;
  if (flags.tls) {
    // Mutual TLS and a bearer token with throwaway certificates.
    ASSIGN_OR_RETURN(tools::Certificates certs,
                     tools::MakeCertificates((fs::path(root) / "tls").string()));
    cluster_options.tls_cert = certs.server_cert;
    cluster_options.tls_key = certs.server_key;
    cluster_options.tls_ca = certs.ca;
    cluster_options.auth_token_file = certs.token;
    client_options.tls_ca = certs.ca;
    client_options.tls_cert = certs.client_cert;
    client_options.tls_key = certs.client_key;
    client_options.auth_token_file = certs.token;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<tools::LocalCluster> cluster,
                   tools::LocalCluster::Start(cluster_options));
  std::printf("cluster    dispatcher %s, %d workers%s\n", cluster->dispatcher_address().c_str(),
              cluster->num_workers(), flags.tls ? " (mutual TLS + bearer token)" : "");
  std::fflush(stdout);

  // 5. Two epochs of ImageNet training preprocessing, consumed as a trainer
  // would.
  client_options.dispatcher_address = cluster->dispatcher_address();
  ASSIGN_OR_RETURN(std::unique_ptr<DataServiceClient> client,
                   DataServiceClient::Create(client_options));
  JobOptions job{
      .job_name = "demo",
      .pipeline = PipelineBuilder()
                      .Dataset(dataset)
                      .Columns({"image", "label"})
                      .Shuffle(/*seed=*/0)
                      .Map({"image"}, {Decode(), RandomResizedCrop(224), RandomHorizontalFlip(),
                                       Normalize(kImageNetMean, kImageNetStd), HWC2CHW()})
                      .Batch(64)
                      .Prefetch(kAutotune)
                      .Build(),
      .num_epochs = static_cast<uint64_t>(flags.epochs)};
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<BatchIterator> batches, client->Open(job));
  ProgressBar bar("consume", manifest.total_records * flags.epochs);
  uint64_t delivered = 0, num_batches = 0, bytes = 0;
  double first_batch_seconds = 0;
  while (true) {
    ASSIGN_OR_RETURN(std::optional<Batch> batch, batches->GetNext());
    if (!batch.has_value()) break;
    if (num_batches++ == 0) first_batch_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    delivered += batch->global_indices.size();
    for (const Column& c : batch->columns) bytes += c.size;
    bar.Update(delivered);
  }
  bar.Done();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // Per-stage figures, scraped from the workers' /metrics like Prometheus
  // would.
  std::map<std::string, double> busy, elements;
  for (int i = 0; i < cluster->num_workers(); ++i) {
    auto text = tools::ScrapeMetrics(cluster->worker(i).metrics_port);
    if (!text.ok()) continue;
    for (const auto& [stage, v] :
         tools::SumByLabel(*text, "sluice_pipeline_stage_busy_seconds_total", "stage")) {
      busy[stage] += v;
    }
    for (const auto& [stage, v] :
         tools::SumByLabel(*text, "sluice_pipeline_stage_elements_total", "stage")) {
      elements[stage] += v;
    }
  }

  std::printf("\nsummary\n");
  std::printf(
      "  throughput   %.1f images/s (%.1f MB/s of float32 batches) over %d "
      "epochs\n",
      delivered / seconds, bytes / 1e6 / seconds, flags.epochs);
  std::printf(
      "  delivered    %llu images in %llu batches of 64; first batch after "
      "%.2fs\n",
      static_cast<unsigned long long>(delivered), static_cast<unsigned long long>(num_batches),
      first_batch_seconds);
  std::printf(
      "  workers      %d (each with %u cores' worth of pipeline threads), "
      "trainer waited "
      "%.2fs\n",
      cluster->num_workers(), std::thread::hardware_concurrency(), batches->wait_seconds());
  std::printf("  stages       busy CPU-seconds and elements, all workers:\n");
  for (const auto& [stage, seconds_busy] : busy) {
    std::printf("    %-26s %8.2fs  %8.0f elements  %7.2f ms/element\n", stage.c_str(), seconds_busy,
                elements[stage], elements[stage] > 0 ? 1e3 * seconds_busy / elements[stage] : 0.0);
  }
  std::printf("  metrics      dispatcher http://127.0.0.1:%d/metrics, workers",
              cluster->dispatcher_metrics_port());
  for (int i = 0; i < cluster->num_workers(); ++i) {
    std::printf(" :%d", cluster->worker(i).metrics_port);
  }
  std::printf(" (while a cluster runs: `sluice local`)\n");
  std::printf("  dataset      %s\n", flags.keep ? dataset.c_str() : "removed after the demo");
  cluster->Stop();
  return absl::OkStatus();
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Run the whole path on this machine from nothing and print a summary");
  cmd->add_option("--images", flags->images, "Synthetic images to generate")->capture_default_str();
  cmd->add_option("--classes", flags->classes, "Classes")->capture_default_str();
  cmd->add_option("--workers", flags->workers, "Worker processes")->capture_default_str();
  cmd->add_option("--epochs", flags->epochs, "Epochs to consume")->capture_default_str();
  cmd->add_option("--work-dir", flags->work_dir, "Folder to work in (default: a new temp folder)");
  cmd->add_flag("--keep", flags->keep, "Keep the work folder");
  cmd->add_flag("--tls", flags->tls,
                "Run secured: mutual TLS and a bearer token with throwaway "
                "certificates (openssl)");
  cmd->add_option("--threads", flags->threads, "Threads")->capture_default_str();
  cmd->callback([flags] { Finish(RunDemo(*flags)); });
}

}  // namespace sluice::cli
