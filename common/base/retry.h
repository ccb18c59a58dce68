// Retry with exponential backoff and jitter, for calls that may fail with
// `Unavailable` while a peer (re)starts.
//
//   RetryOptions options;  // 100 ms, doubling, capped at 5 s, 30 s overall
//   absl::Status s = RetryWithBackoff([&] { return Connect(); }, options,
//                                     RealClock::Get());
//
// Only the codes in `options.retry_on` are retried; any other error, or the
// last error once the deadline passes, is returned as is.
#ifndef SLUICE_COMMON_BASE_RETRY_H_
#define SLUICE_COMMON_BASE_RETRY_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace sluice {

struct RetryOptions {
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  double multiplier = 2.0;
  // Each wait is scaled by a random factor in [1 - jitter, 1].
  double jitter = 0.2;
  // Overall budget, measured on the clock from the first attempt.
  absl::Duration deadline = absl::Seconds(30);
  std::vector<absl::StatusCode> retry_on = {absl::StatusCode::kUnavailable};
};

// The backoff before attempt `attempt` (1-based: attempt 1 is the first retry),
// without jitter.
absl::Duration BackoffFor(int attempt, const RetryOptions& options);

// BackoffFor(attempt, options) scaled by a random factor in [1 - jitter, 1]: the wait before
// retry `attempt`, for loops that retry on their own (heartbeats, streams). Thread-safe.
absl::Duration JitteredBackoff(int attempt, const RetryOptions& options);

absl::Status RetryWithBackoff(const std::function<absl::Status()>& fn, const RetryOptions& options,
                              Clock* clock);

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_RETRY_H_
