#include "tools/cli/command.h"
namespace sluice::cli {
void AddPipelineCommands(CLI::App&) {}
}  // namespace sluice::cli
