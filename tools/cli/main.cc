// `sluice`: the command line. Each subcommand lives in its own file (see command.h).
#include "CLI/CLI.hpp"
#include "data_worker/pipeline/allocator.h"
#include "tools/cli/command.h"

int main(int argc, char** argv) {
  sluice::data_worker::pipeline::ConfigureAllocatorForPipelines();
  CLI::App app{"sluice: disaggregated data preprocessing for deep-learning training"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  sluice::cli::AddDatagenCommand(app);
  sluice::cli::AddRecordCommands(app);
  sluice::cli::AddPipelineCommands(app);
  sluice::cli::AddLocalCommand(app);
  sluice::cli::AddConsumeCommand(app);
  sluice::cli::AddDemoCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return sluice::cli::ExitCode();
}
