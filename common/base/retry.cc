#include "common/base/retry.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace sluice {

absl::Duration BackoffFor(int attempt, const RetryOptions& options) {
  const double factor = std::pow(options.multiplier, std::max(0, attempt - 1));
  return std::min(options.initial_backoff * factor, options.max_backoff);
}

absl::Duration JitteredBackoff(int attempt, const RetryOptions& options) {
  thread_local std::minstd_rand rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(1.0 - options.jitter, 1.0);
  return BackoffFor(attempt, options) * jitter(rng);
}

absl::Status RetryWithBackoff(const std::function<absl::Status()>& fn, const RetryOptions& options,
                              Clock* clock) {
  const absl::Time give_up = clock->Now() + options.deadline;
  for (int attempt = 1;; ++attempt) {
    absl::Status status = fn();
    if (status.ok()) return status;
    const bool retryable = std::find(options.retry_on.begin(), options.retry_on.end(),
                                     status.code()) != options.retry_on.end();
    const absl::Duration wait = JitteredBackoff(attempt, options);
    if (!retryable || clock->Now() + wait > give_up) return status;
    clock->SleepFor(wait);
  }
}

}  // namespace sluice
