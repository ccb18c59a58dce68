// Logging set-up over spdlog. Only main() calls MakeLogger with sinks;
// libraries receive the resulting `std::shared_ptr<spdlog::logger>` through
// their Options.
#ifndef SLUICE_COMMON_BASE_LOGGING_H_
#define SLUICE_COMMON_BASE_LOGGING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "spdlog/spdlog.h"

namespace sluice {

// Parses "trace|debug|info|warn|error|critical|off". InvalidArgument names the
// bad value.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name);

// kText: "2026-11-23T16:01:02.345 I worker: message" for people.
// kJson: one JSON object per line for log collectors (UTC time, level, logger, thread, msg):
//   {"time":"2026-11-23T16:01:02.345Z","level":"info","logger":"worker","thread":1234,"msg":"..."}
enum class LogFormat { kText, kJson };

// Parses "text|json". InvalidArgument names the bad value.
absl::StatusOr<LogFormat> ParseLogFormat(const std::string& name);

// The formatter of `format`, for any sink.
std::unique_ptr<spdlog::formatter> MakeLogFormatter(LogFormat format);

// A logger named `name` writing to stderr in `format`.
std::shared_ptr<spdlog::logger> MakeStderrLogger(const std::string& name,
                                                 spdlog::level::level_enum level,
                                                 LogFormat format = LogFormat::kText);

// A logger that drops everything: the default for library Options.
std::shared_ptr<spdlog::logger> NullLogger();

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_LOGGING_H_
