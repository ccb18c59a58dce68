// Clock: the one way sluice code reads time or sleeps, so tests can drive time
// by hand.
//
// Production code takes a `Clock*` (usually `RealClock::Get()`); tests pass a
// `FakeClock` and call `Advance()`. Both are thread-safe.
#ifndef SLUICE_COMMON_BASE_CLOCK_H_
#define SLUICE_COMMON_BASE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sluice {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // Blocks the calling thread until Now() has advanced by `d`.
  virtual void SleepFor(absl::Duration d) = 0;
};

// Wall-clock time. A process-wide instance that is never destroyed.
class RealClock : public Clock {
 public:
  static RealClock* Get();
  absl::Time Now() override;
  void SleepFor(absl::Duration d) override;
};

// Time that moves only when a test calls Advance(). SleepFor() blocks until
// enough time was advanced by another thread, so a test can check what a
// sleeping component does at each step.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() override ABSL_LOCKS_EXCLUDED(mu_);
  void SleepFor(absl::Duration d) override ABSL_LOCKS_EXCLUDED(mu_);
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until at least `n` threads are inside SleepFor, so a test can
  // advance time knowing who is waiting for it.
  void AwaitSleepers(int n) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_CLOCK_H_
