// Shared plumbing of the `sluice` subcommands: each lives in its own file, adds
// itself to the CLI11 app with an Add*Command function, and reports its result
// through Finish().
#ifndef SLUICE_TOOLS_CLI_COMMAND_H_
#define SLUICE_TOOLS_CLI_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace sluice::cli {

// Records the running command's result: OK → exit 0; otherwise prints "sluice:
// error: <message>" to stderr and the process exits 1 (or `exit_code` if
// given).
void Finish(const absl::Status& status, int exit_code = 1);
int ExitCode();

// Subcommands, one file each.
void AddDatagenCommand(CLI::App& app);
void AddRecordCommands(CLI::App& app);
void AddDemoCommand(CLI::App& app);
void AddPipelineCommands(CLI::App& app);
void AddLocalCommand(CLI::App& app);
void AddConsumeCommand(CLI::App& app);
void AddStatusCommand(CLI::App& app);
void AddHealthCommand(CLI::App& app);
void AddCacheCommands(CLI::App& app);

}  // namespace sluice::cli

#endif  // SLUICE_TOOLS_CLI_COMMAND_H_
