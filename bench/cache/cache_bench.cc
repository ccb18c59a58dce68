// One consumer reading a 3-epoch job whose pipeline has a cache node, against a running
// dispatcher and workers (bench/cache.sh starts them). For each epoch it prints the images, the
// wall time, the workers' CPU seconds (utime + stime from /proc/<pid>/stat of every --worker-pid,
// sampled when the epoch's first batch arrives and when the next epoch's does) and a digest of
// the epoch's output (XXH3 of each element's bytes, combined in global-index order), so that the
// cached epochs can be compared byte for byte with the computed one:
//
//   epoch 0 images 2000 wall_s 9.81 cpu_s 18.90 digest 5a1f...
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "common/pipeline_spec/parse.h"
#include "common/record/checksum.h"
#include "sluice/client.h"

namespace {

// utime + stime of `pid`, in seconds.
double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) {
      stime = std::stod(f);
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("cache bench consumer");
  std::string dispatcher, spec, data, job;
  std::vector<int> pids;
  uint64_t epochs = 3, split_size = 0;
  std::string cache = "off";
  app.add_option("--dispatcher", dispatcher)->required();
  app.add_option("--spec", spec)->required();
  app.add_option("--data", data)->required();
  app.add_option("--job", job)->required();
  app.add_option("--worker-pid", pids)->required();
  app.add_option("--epochs", epochs);
  app.add_option("--split-size", split_size);
  app.add_option("--cache", cache, "JobOptions.cache: auto or off (docs/cache.md)");
  CLI11_PARSE(app, argc, argv);

  auto pipeline = sluice::pipeline_spec::LoadPipelineSpecFile(spec);
  if (!pipeline.ok()) {
    std::fprintf(stderr, "%s\n", pipeline.status().ToString().c_str());
    return 1;
  }
  pipeline->mutable_source()->mutable_dataset()->set_path(data);
  auto client = sluice::DataServiceClient::Create({.dispatcher_address = dispatcher});
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto it = (*client)->Open({.job_name = job,
                             .pipeline = *pipeline,
                             .num_epochs = epochs,
                             .split_size = split_size,
                             .cache = cache});
  if (!it.ok()) {
    std::fprintf(stderr, "%s\n", it.status().ToString().c_str());
    return 1;
  }
  auto cpu = [&] {
    double s = 0;
    for (int pid : pids) s += CpuSeconds(pid);
    return s;
  };
  struct Epoch {
    uint64_t images = 0;
    absl::Time start;
    double cpu_start = 0;
    std::map<uint64_t, uint64_t> digests;  // global index -> XXH3 of its bytes
  };
  std::map<uint64_t, Epoch> seen;
  auto report = [&](uint64_t e, absl::Time end, double cpu_end) {
    Epoch& ep = seen[e];
    std::string all;
    for (const auto& [g, d] : ep.digests) all.append(reinterpret_cast<const char*>(&d), 8);
    std::printf("epoch %llu images %llu wall_s %.3f cpu_s %.3f digest %s\n",
                static_cast<unsigned long long>(e), static_cast<unsigned long long>(ep.images),
                absl::ToDoubleSeconds(end - ep.start), cpu_end - ep.cpu_start,
                sluice::record::ChecksumHex(sluice::record::Checksum(all)).c_str());
    std::fflush(stdout);
  };
  const absl::Time open = absl::Now();
  const double cpu_open = cpu();
  bool first = true;
  uint64_t current = 0;
  while (true) {
    auto batch = (*it)->GetNext();
    if (!batch.ok()) {
      std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
      return 1;
    }
    if (!batch->has_value()) break;
    const sluice::Batch& b = **batch;
    if (first || b.epoch != current) {
      const absl::Time now = absl::Now();
      const double c = cpu();
      if (!first) report(current, now, c);
      Epoch& ep = seen[b.epoch];
      // The first epoch counts from opening the job: its first batch's work is its own.
      ep.start = first ? open : now;
      ep.cpu_start = first ? cpu_open : c;
      current = b.epoch;
      first = false;
    }
    Epoch& ep = seen[b.epoch];
    const size_t n = b.global_indices.size();
    for (size_t i = 0; i < n; ++i) {
      std::string bytes;
      for (const sluice::Column& col : b.columns) {
        const size_t each = col.size / n;
        bytes.append(col.bytes().substr(i * each, each));
      }
      ep.digests[b.global_indices[i]] = sluice::record::Checksum(bytes);
    }
    ep.images += n;
  }
  report(current, absl::Now(), cpu());
  return 0;
}
