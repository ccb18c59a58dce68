#include "common/base/logging.h"

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(ParseLogLevel, AcceptsSpdlogNames) {
  EXPECT_EQ(*ParseLogLevel("debug"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("off"), spdlog::level::off);
}

TEST(ParseLogLevel, RejectsUnknownNamingTheValue) {
  auto level = ParseLogLevel("loud");
  ASSERT_EQ(level.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(level.status().message().find("'loud'"), std::string::npos);
}

}  // namespace
}  // namespace sluice
