#include "tools/cli/progress.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace sluice::cli {

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

void PrintFromFirstBatch(double seconds, uint64_t images, double cpu_seconds) {
  std::printf("throughput from first batch: %.1f images/s\n", seconds > 0 ? images / seconds : 0.0);
  std::printf("cpu from first batch: %.0f us/image\n",
              images > 0 ? 1e6 * cpu_seconds / images : 0.0);
}

ProgressBar::ProgressBar(std::string label, uint64_t total)
    : ProgressBar(std::move(label), total, Options()) {}

ProgressBar::ProgressBar(std::string label, uint64_t total, Options options)
    : label_(std::move(label)),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      out_(options.out != nullptr ? options.out : stderr),
      tty_(options.terminal >= 0 ? options.terminal == 1 : isatty(fileno(out_)) == 1),
      line_interval_(options.line_interval),
      start_(clock_->Now()),
      total_(total) {
  if (!tty_) last_draw_ = start_;  // the first line after one interval, not at once
}

ProgressBar::~ProgressBar() { Done(); }

void ProgressBar::Update(uint64_t done, uint64_t total) {
  absl::MutexLock lock(&mu_);
  done_ = done;
  if (total > 0) total_ = total;
  const absl::Duration interval = tty_ ? absl::Milliseconds(100) : line_interval_;
  if (clock_->Now() - last_draw_ >= interval) Draw(/*final=*/false);
}

void ProgressBar::Done() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  finished_ = true;
  Draw(/*final=*/true);
}

void ProgressBar::Draw(bool final) {
  last_draw_ = clock_->Now();
  const double seconds = absl::ToDoubleSeconds(last_draw_ - start_);
  const double rate = seconds > 0 ? done_ / seconds : 0;
  std::string line;
  if (total_ > 0) {
    constexpr int kWidth = 24;
    const double fraction = std::min(1.0, static_cast<double>(done_) / total_);
    const int filled = static_cast<int>(fraction * kWidth);
    const double eta = rate > 0 ? (total_ - std::min(total_, done_)) / rate : 0;
    line =
        absl::StrFormat("%-10s [%s%s] %6d/%-6d %3.0f%%  %.1f/s", label_, std::string(filled, '#'),
                        std::string(kWidth - filled, '.'), done_, total_, fraction * 100, rate);
    if (!final) line += absl::StrFormat("  ETA %.0fs", eta);
  } else {
    line = absl::StrFormat("%-10s %d  %.1f/s", label_, done_, rate);
  }
  if (final) line += absl::StrFormat("  (%.2fs)", seconds);
  // A terminal redraws one line in place; a log gets whole lines.
  std::fprintf(out_, "%s%s%s", tty_ ? "\r" : "", line.c_str(), final || !tty_ ? "\n" : "");
  std::fflush(out_);
}

}  // namespace sluice::cli
