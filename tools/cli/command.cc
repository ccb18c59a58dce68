#include "tools/cli/command.h"

#include <cstdio>
#include <string>

namespace sluice::cli {
namespace {
int exit_code = 0;
}  // namespace

void Finish(const absl::Status& status, int code) {
  if (status.ok()) return;
  std::fprintf(stderr, "sluice: error: %s\n", std::string(status.message()).c_str());
  exit_code = code;
}

int ExitCode() { return exit_code; }

}  // namespace sluice::cli
