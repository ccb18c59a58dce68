#include "common/base/retry.h"

#include <thread>

#include "gtest/gtest.h"

namespace sluice {
namespace {

// A clock whose SleepFor advances time at once, recording each wait.
class InstantClock : public Clock {
 public:
  absl::Time Now() override { return now_; }
  void SleepFor(absl::Duration d) override {
    waits.push_back(d);
    now_ += d;
  }
  std::vector<absl::Duration> waits;

 private:
  absl::Time now_ = absl::UnixEpoch();
};

TEST(Retry, RetriesUnavailableUntilSuccess) {
  InstantClock clock;
  int calls = 0;
  RetryOptions options;
  options.jitter = 0;
  absl::Status s = RetryWithBackoff(
      [&] { return ++calls < 4 ? absl::UnavailableError("down") : absl::OkStatus(); }, options,
      &clock);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 4);
  ASSERT_EQ(clock.waits.size(), 3u);
  EXPECT_EQ(clock.waits[0], absl::Milliseconds(100));
  EXPECT_EQ(clock.waits[1], absl::Milliseconds(200));
  EXPECT_EQ(clock.waits[2], absl::Milliseconds(400));
}

TEST(Retry, DoesNotRetryOtherCodes) {
  InstantClock clock;
  int calls = 0;
  absl::Status s = RetryWithBackoff(
      [&] {
        ++calls;
        return absl::InvalidArgumentError("bad");
      },
      RetryOptions{}, &clock);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
}

TEST(Retry, GivesUpAtDeadlineWithLastError) {
  InstantClock clock;
  RetryOptions options;
  options.deadline = absl::Seconds(2);
  int calls = 0;
  absl::Status s = RetryWithBackoff(
      [&] {
        ++calls;
        return absl::UnavailableError("still down");
      },
      options, &clock);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "still down");
  EXPECT_LE(clock.Now() - absl::UnixEpoch(), absl::Seconds(2));
  EXPECT_GT(calls, 3);
}

TEST(Retry, BackoffIsCapped) {
  RetryOptions options;
  EXPECT_EQ(BackoffFor(1, options), absl::Milliseconds(100));
  EXPECT_EQ(BackoffFor(20, options), absl::Seconds(5));
}

}  // namespace
}  // namespace sluice
