#include "common/base/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(FakeClock, MovesOnlyWhenAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(105));
}

TEST(FakeClock, SleepForWakesOnceTimeIsAdvancedFarEnough) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke = true;
  });
  clock.AwaitSleepers(1);
  clock.Advance(absl::Seconds(4));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(woke);
  clock.Advance(absl::Seconds(6));
  sleeper.join();
  EXPECT_TRUE(woke);
}

}  // namespace
}  // namespace sluice
