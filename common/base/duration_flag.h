// Command-line durations, written as Abseil parses them: "250ms", "10s",
// "1m30s". Every sluice binary takes its timeouts and intervals this way.
//
//   absl::Duration timeout = absl::Seconds(10);
//   AddDurationOption(app, "--connect-timeout", &timeout,
//                     "How long to retry the dispatcher");
#ifndef SLUICE_COMMON_BASE_DURATION_FLAG_H_
#define SLUICE_COMMON_BASE_DURATION_FLAG_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"

namespace sluice {

inline CLI::Option* AddDurationOption(CLI::App& app, const std::string& name, absl::Duration* value,
                                      const std::string& help) {
  return app.add_option_function<std::string>(
      name,
      [name, value](const std::string& text) {
        // CLI11 reports its own exception type as a usage error naming the
        // flag.
        if (!absl::ParseDuration(text, value)) {
          throw CLI::ValidationError(name,
                                     "'" + text + "' is not a duration like 250ms, 10s or 1m");
        }
        if (*value < absl::ZeroDuration()) {
          throw CLI::ValidationError(
              name, "'" + text + "' is negative: give a duration like 250ms, 10s or 1m");
        }
      },
      help + " (e.g. 250ms, 10s; default " + absl::FormatDuration(*value) + ")");
}

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_DURATION_FLAG_H_
