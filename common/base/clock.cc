#include "common/base/clock.h"

#include "absl/time/clock.h"

namespace sluice {

RealClock* RealClock::Get() {
  static auto* clock = new RealClock();
  return clock;
}

absl::Time RealClock::Now() { return absl::Now(); }

void RealClock::SleepFor(absl::Duration d) { absl::SleepFor(d); }

absl::Time FakeClock::Now() {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  const absl::Time wake = now_ + d;
  auto reached = [this, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= wake; };
  ++sleepers_;
  mu_.Await(absl::Condition(&reached));
  --sleepers_;
}

void FakeClock::AwaitSleepers(int n) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sleepers_ >= n; };
  mu_.Await(absl::Condition(&enough));
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace sluice
