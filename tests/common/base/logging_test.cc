#include "common/base/logging.h"

#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"

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

TEST(ParseLogFormat, AcceptsTextAndJsonOnly) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(ParseLogFormat("xml").status().message(),
            "--log-format: 'xml' is not one of text, json");
}

TEST(MakeLogFormatter, JsonIsOneParseableObjectPerLineWithTheMessageEscaped) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "worker", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  logger->set_formatter(MakeLogFormatter(LogFormat::kJson));
  logger->warn("path \"{}\"\tline\nnext \\ \x01", "/data");
  logger->info("second");
  std::istringstream lines(out.str());
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  const nlohmann::json first = nlohmann::json::parse(line);
  EXPECT_EQ(first["level"], "warning");
  EXPECT_EQ(first["logger"], "worker");
  EXPECT_EQ(first["msg"], "path \"/data\"\tline\nnext \\ \x01");
  EXPECT_TRUE(first["thread"].is_number());
  EXPECT_EQ(first["time"].get<std::string>().back(), 'Z');
  ASSERT_TRUE(std::getline(lines, line));
  EXPECT_EQ(nlohmann::json::parse(line)["msg"], "second");
  EXPECT_FALSE(std::getline(lines, line));
}

}  // namespace
}  // namespace sluice
