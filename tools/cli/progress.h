// How long CLI work reports itself: ProcessCpuSeconds() and PrintFromFirstBatch() for the
// figures benchmarks read, and a one-line progress bar on stderr:
//   convert [##########..........]  1000/2000  50%  812.3/s  ETA 1s
// Redraws at most 10 times a second on a terminal. When stderr is not a terminal (CI logs,
// `kubectl logs -f`) it prints one full line every Options::line_interval (5 s) while
// Update() is called, so a long run is visibly alive, and Done() prints the summary line.
// Thread-safe.
#ifndef SLUICE_TOOLS_CLI_PROGRESS_H_
#define SLUICE_TOOLS_CLI_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace sluice::cli {

// Process CPU time (user + system), seconds.
double ProcessCpuSeconds();

// The steady state from the first batch on, without job creation and the pipeline's fill (what
// bench/service_overhead.sh compares), given the seconds, images and process CPU seconds since
// the first batch:
//   throughput from first batch: 2916.0 images/s
//   cpu from first batch: 650 us/image
void PrintFromFirstBatch(double seconds, uint64_t images, double cpu_seconds);

class ProgressBar {
 public:
  struct Options {
    Clock* clock = nullptr;                           // null: RealClock::Get()
    std::FILE* out = nullptr;                         // null: stderr
    int terminal = -1;                                // -1: isatty(out); 0/1: as given
    absl::Duration line_interval = absl::Seconds(5);  // not on a terminal
  };
  // `total` may be 0 when unknown; Update() may then pass it later.
  ProgressBar(std::string label, uint64_t total);
  ProgressBar(std::string label, uint64_t total, Options options);
  ~ProgressBar();

  void Update(uint64_t done, uint64_t total = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // Prints the final line: label, count, elapsed time and rate.
  void Done() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Draw(bool final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string label_;
  Clock* const clock_;
  std::FILE* const out_;
  const bool tty_;
  const absl::Duration line_interval_;
  const absl::Time start_;
  absl::Mutex mu_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_ ABSL_GUARDED_BY(mu_);
  absl::Time last_draw_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::cli

#endif  // SLUICE_TOOLS_CLI_PROGRESS_H_
