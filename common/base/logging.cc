#include "common/base/logging.h"

#include "absl/status/status.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/null_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace sluice {

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name) {
  for (int i = spdlog::level::trace; i <= spdlog::level::off; ++i) {
    const auto level = static_cast<spdlog::level::level_enum>(i);
    if (spdlog::level::to_string_view(level) == name) return level;
  }
  if (name == "warn") return spdlog::level::warn;  // spdlog spells it "warning"
  return absl::InvalidArgumentError(
      "--log-level: '" + name + "' is not one of trace, debug, info, warn, error, critical, off");
}

absl::StatusOr<LogFormat> ParseLogFormat(const std::string& name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError("--log-format: '" + name + "' is not one of text, json");
}

namespace {

void Append(std::string_view text, spdlog::memory_buf_t& dest) {
  dest.append(text.data(), text.data() + text.size());
}

// %* in a pattern: the message as the body of a JSON string (quotes,
// backslashes and control characters escaped).
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char c : msg.payload) {
      switch (c) {
        case '"':
          Append("\\\"", dest);
          break;
        case '\\':
          Append("\\\\", dest);
          break;
        case '\n':
          Append("\\n", dest);
          break;
        case '\t':
          Append("\\t", dest);
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const char escaped[] = {'\\', 'u', '0', '0', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
            dest.append(escaped, escaped + sizeof escaped);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

}  // namespace

std::unique_ptr<spdlog::formatter> MakeLogFormatter(LogFormat format) {
  if (format == LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc,
                                                                 std::string("\n"));
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","logger":"%n",)"
        R"("thread":%t,"msg":"%*"})");
    return formatter;
  }
  return std::make_unique<spdlog::pattern_formatter>("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %v");
}

std::shared_ptr<spdlog::logger> MakeStderrLogger(const std::string& name,
                                                 spdlog::level::level_enum level,
                                                 LogFormat format) {
  auto logger = std::make_shared<spdlog::logger>(
      name, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_formatter(MakeLogFormatter(format));
  logger->set_level(level);
  return logger;
}

std::shared_ptr<spdlog::logger> NullLogger() {
  static auto logger =
      std::make_shared<spdlog::logger>("null", std::make_shared<spdlog::sinks::null_sink_mt>());
  return logger;
}

}  // namespace sluice
