// kernel_ceiling_bench: the ceiling for `sluice pipeline run` — the same op
// chain and batching on N threads with no queues, no reads and no scheduling.
//
//   kernel_ceiling_bench --spec bench/pipelines/imagenet_train.yaml --data DS
//       [--threads N] [--epochs E]
//
// Loads every encoded image of the dataset into memory, builds the spec's map
// ops (kernel fusion on, as the pipeline does), and has thread t process images
// t, t+N, t+2N, ... writing each result into a thread-local batch buffer of the
// spec's batch size. Prints `kernels: <N> images/s` over the timed epochs (one
// warm-up epoch first).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/record/dataset.h"
#include "data_worker/ops/op.h"
#include "data_worker/pipeline/allocator.h"
#include "data_worker/pipeline/spec.h"

namespace dw = sluice::data_worker;

int main(int argc, char** argv) {
  CLI::App app{
      "Bare op-chain throughput on N threads (the pipeline's ceiling)"};
  std::string spec_path, data;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int epochs = 2;
  app.add_option("--spec", spec_path,
                 "Pipeline spec (its map ops and batch size are used)")
      ->required();
  app.add_option("--data", data, "Unirecord dataset folder")->required();
  app.add_option("--threads", threads, "Threads")->capture_default_str();
  app.add_option("--epochs", epochs, "Timed epochs")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  dw::pipeline::ConfigureAllocatorForPipelines();  // the same allocator
                                                   // settings as the CLI

  auto spec = dw::pipeline::LoadPipelineFile(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  std::vector<sluice::proto::OpSpec> specs;
  int batch = 1;
  for (const auto& node : spec->nodes()) {
    if (node.has_map())
      specs.insert(specs.end(), node.map().ops().begin(),
                   node.map().ops().end());
    if (node.has_batch()) batch = node.batch().size();
  }
  auto ops = dw::BuildOps(specs, /*first_position=*/0, /*fuse=*/true);
  auto ds = sluice::record::Dataset::Open(data);
  if (!ops.ok() || !ds.ok()) {
    std::fprintf(
        stderr, "%s\n",
        std::string((ops.ok() ? ds.status() : ops.status()).message()).c_str());
    return 1;
  }
  const int image_col = (*ds)->schema().ColumnIndex("image");
  std::vector<std::string> images;
  for (uint64_t i = 0; i < (*ds)->size(); ++i) {
    auto rec = (*ds)->Read(i);
    if (!rec.ok()) return 1;
    images.emplace_back(rec->columns[image_col].data);
  }
  std::printf("kernels: %zu images in memory, chain:", images.size());
  for (const auto& op : *ops)
    std::printf(" %s", std::string(op->name()).c_str());
  std::printf(", %d threads, batch %d\n", threads, batch);

  auto run_epoch = [&](uint64_t epoch) {
    std::atomic<bool> failed{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<uint8_t> buffer;
        int filled = 0;
        for (size_t i = t; i < images.size(); i += threads) {
          dw::Tensor x = dw::Tensor::FromBytes(images[i]);
          const dw::ElementContext ctx{spec->seed(), epoch, i};
          for (const auto& op : *ops) {
            auto r = op->Apply(std::move(x), ctx);
            if (!r.ok()) {
              failed = true;
              return;
            }
            x = std::move(*r);
          }
          if (buffer.size() < x.num_bytes() * batch)
            buffer.resize(x.num_bytes() * batch);
          std::memcpy(buffer.data() + filled * x.num_bytes(), x.data(),
                      x.num_bytes());
          filled = (filled + 1) % batch;
        }
      });
    }
    for (auto& th : pool) th.join();
    return !failed;
  };
  if (!run_epoch(0)) return 1;  // warm-up
  const absl::Time start = absl::Now();
  for (int e = 1; e <= epochs; ++e) {
    if (!run_epoch(e)) return 1;
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("kernels: %.1f images/s\n", images.size() * epochs / secs);
  return 0;
}
