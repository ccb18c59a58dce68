// small_records_bench: the executor's per-element overhead, bounded with a
// pipeline whose elements cost almost nothing (bench/compare_pytorch.sh).
//
//   small_records_bench --make DIR [--records N]   writes the dataset
//   small_records_bench --loop DIR [--epochs E]    times the plain loop
//   small_records_bench --clocks                   the cost of one clock read
//
// The dataset: N records of label (int64, indexed) and feature (float32[16]),
// 100 bytes each. bench/pipelines/small_records.yaml batches them by 64 with
// `sluice pipeline run`; the plain loop reads the same records in the same
// order on one thread (the verified record view, the columns decoded) and
// copies them into batches of 64, which is what the pipeline does per element
// minus its queues, ordering and accounting. Prints `loop: <N> elements/s`.
// --clocks times 10 M reads of each clock a stage could time its busy time
// with (absl::Now, the executor's RealClock, clock_gettime MONOTONIC and
// MONOTONIC_COARSE, rdtsc): `clock <name>: <ns> ns per read`.
#include <time.h>
#include <x86intrin.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/record/dataset.h"
#include "common/record/record.h"

namespace rec = sluice::record;

int main(int argc, char** argv) {
  CLI::App app{"Per-element overhead: small records, plain loop"};
  std::string make, loop;
  int64_t records = 1000000;
  int epochs = 3;
  app.add_option("--make", make, "Write the small-record dataset here");
  app.add_option("--records", records, "Records to write")->capture_default_str();
  app.add_option("--loop", loop, "Time the plain loop over this dataset");
  app.add_option("--epochs", epochs, "Timed epochs")->capture_default_str();
  bool clocks = false;
  app.add_flag("--clocks", clocks, "Time one read of each clock");
  CLI11_PARSE(app, argc, argv);
  if (clocks) {
    constexpr int64_t kReads = 10'000'000;
    auto time_ns = [&](const char* name, auto read) {
      int64_t sink = 0;
      for (int64_t i = 0; i < kReads / 10; ++i) sink += read();  // warm-up
      const absl::Time t0 = absl::Now();
      for (int64_t i = 0; i < kReads; ++i) sink += read();
      const double ns = absl::ToDoubleNanoseconds(absl::Now() - t0) / kReads;
      std::printf("clock %s: %.1f ns per read (%lld)\n", name, ns,
                  static_cast<long long>(sink & 1));
    };
    auto gettime = [](clockid_t id) {
      timespec ts;
      clock_gettime(id, &ts);
      return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
    };
    sluice::Clock* real = sluice::RealClock::Get();
    time_ns("absl::Now", [] { return absl::ToUnixNanos(absl::Now()); });
    time_ns("RealClock", [&] { return absl::ToUnixNanos(real->Now()); });
    time_ns("CLOCK_MONOTONIC", [&] { return gettime(CLOCK_MONOTONIC); });
    time_ns("CLOCK_MONOTONIC_COARSE", [&] { return gettime(CLOCK_MONOTONIC_COARSE); });
    time_ns("rdtsc", [] { return static_cast<int64_t>(__rdtsc()); });
  }
  if (!make.empty()) {
    rec::Schema schema;
    schema.columns.push_back({"label", rec::DType::kInt64, {}, true});
    schema.columns.push_back({"feature", rec::DType::kFloat32, {16}, false});
    auto w = rec::DatasetWriter::Create(make, schema, {});
    if (!w.ok()) return 1;
    std::vector<float> feature(16);
    for (int64_t i = 0; i < records; ++i) {
      for (int k = 0; k < 16; ++k) feature[k] = static_cast<float>(i + k);
      if (!(*w)->Add({rec::Tensor::Int64(i % 1000), rec::Tensor::Of<float>({16}, feature)}).ok()) {
        return 1;
      }
    }
    if (!(*w)->Finish().ok()) return 1;
    std::printf("wrote %lld records to %s\n", static_cast<long long>(records), make.c_str());
  }
  if (loop.empty()) return 0;
  auto ds = rec::Dataset::Open(loop);
  if (!ds.ok()) return 1;
  const int64_t n = static_cast<int64_t>((*ds)->size());
  constexpr int64_t kBatch = 64;
  auto epoch = [&]() {
    std::vector<int64_t> labels(kBatch);
    std::vector<float> features(kBatch * 16);
    int64_t filled = 0, checksum = 0;
    for (int64_t g = 0; g < n; ++g) {
      auto encoded = (*ds)->ReadView(g);
      if (!encoded.ok()) return false;
      auto views = rec::DecodeRecord((*ds)->schema(), *encoded);
      if (!views.ok()) return false;
      std::memcpy(&labels[filled], (*views)[0].data.data(), 8);
      std::memcpy(&features[filled * 16], (*views)[1].data.data(), 64);
      if (++filled == kBatch) {
        checksum += labels[0];
        filled = 0;
      }
    }
    return checksum >= 0;
  };
  if (!epoch()) return 1;  // warm-up
  const absl::Time start = absl::Now();
  for (int e = 0; e < epochs; ++e) {
    if (!epoch()) return 1;
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("loop: %.1f elements/s\n", n * epochs / secs);
  return 0;
}
