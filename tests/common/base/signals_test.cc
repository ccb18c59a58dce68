#include "common/base/signals.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(StopSignals, ABlockedSigtermIsTakenByTheWait) {
  BlockStopSignals();
  ASSERT_EQ(raise(SIGTERM), 0);  // pending, not delivered: the test lives on
  EXPECT_EQ(WaitForStopSignal(absl::Seconds(10)), SIGTERM);
  EXPECT_EQ(WaitForStopSignal(absl::ZeroDuration()), 0);  // taken once
}

TEST(StopSignals, ABlockedSigintIsTakenByTheWait) {
  BlockStopSignals();
  ASSERT_EQ(raise(SIGINT), 0);
  EXPECT_EQ(WaitForStopSignal(absl::Seconds(10)), SIGINT);
}

TEST(StopSignals, NoSignalIsZeroAfterTheTimeout) {
  BlockStopSignals();
  EXPECT_EQ(WaitForStopSignal(absl::Milliseconds(1)), 0);
}

}  // namespace
}  // namespace sluice
