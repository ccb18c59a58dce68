#include "common/base/logging.h"

#include "absl/status/status.h"
#include "spdlog/sinks/null_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace sluice {

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(
    const std::string& name) {
  for (int i = spdlog::level::trace; i <= spdlog::level::off; ++i) {
    const auto level = static_cast<spdlog::level::level_enum>(i);
    if (spdlog::level::to_string_view(level) == name) return level;
  }
  if (name == "warn") return spdlog::level::warn;  // spdlog spells it "warning"
  return absl::InvalidArgumentError(
      "--log-level: '" + name +
      "' is not one of trace, debug, info, warn, error, critical, off");
}

std::shared_ptr<spdlog::logger> MakeStderrLogger(
    const std::string& name, spdlog::level::level_enum level) {
  auto logger = std::make_shared<spdlog::logger>(
      name, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %v");
  logger->set_level(level);
  return logger;
}

std::shared_ptr<spdlog::logger> NullLogger() {
  static auto logger = std::make_shared<spdlog::logger>(
      "null", std::make_shared<spdlog::sinks::null_sink_mt>());
  return logger;
}

}  // namespace sluice
