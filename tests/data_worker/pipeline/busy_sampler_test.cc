#include "data_worker/pipeline/busy_sampler.h"

#include <vector>

#include "gtest/gtest.h"

namespace sluice::data_worker::pipeline {
namespace {

TEST(BusySampler, LongGroupsAreEachTimedOnce) {
  BusySampler sampler;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(sampler.Next(), 1) << "group " << i;
    sampler.Timed(absl::Milliseconds(3));
  }
}

TEST(BusySampler, ShortGroupsAreSampledOneInEightCountedEightTimes) {
  BusySampler sampler;
  std::vector<int64_t> weights;
  for (int i = 0; i < 17; ++i) {
    const int64_t w = sampler.Next();
    weights.push_back(w);
    if (w > 0) sampler.Timed(absl::Microseconds(1));
  }
  EXPECT_EQ(weights, (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 8}));
}

TEST(BusySampler, ALongSampledGroupSwitchesBackToTimingEveryGroup) {
  BusySampler sampler;
  ASSERT_EQ(sampler.Next(), 1);
  sampler.Timed(absl::Microseconds(49));  // short: sample
  for (int i = 1; i < 8; ++i) ASSERT_EQ(sampler.Next(), 0) << "group " << i;
  ASSERT_EQ(sampler.Next(), 8);
  sampler.Timed(absl::Microseconds(50));  // long: time each
  EXPECT_EQ(sampler.Next(), 1);
  EXPECT_EQ(sampler.Next(), 1);
}

}  // namespace
}  // namespace sluice::data_worker::pipeline
