// `sluice`: the command line. Each subcommand lives in its own file (see
// command.h).
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "common/service/server_main.h"
#include "data_worker/pipeline/allocator.h"
#include "tools/cli/command.h"

namespace {

bool IsCommand(CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->check_name(name)) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::data_worker::pipeline::ConfigureAllocatorForPipelines();
  CLI::App app{"sluice: disaggregated data preprocessing for deep-learning training"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  sluice::service::AddVersionFlag(app, "sluice");
  sluice::cli::AddDatagenCommand(app);
  sluice::cli::AddRecordCommands(app);
  sluice::cli::AddPipelineCommands(app);
  sluice::cli::AddLocalCommand(app);
  sluice::cli::AddConsumeCommand(app);
  sluice::cli::AddStatusCommand(app);
  sluice::cli::AddCacheCommands(app);
  sluice::cli::AddHealthCommand(app);
  sluice::cli::AddDemoCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 calls an unknown command "a subcommand is required"; name it
    // instead.
    if (argc > 1 && argv[1][0] != '-' && !IsCommand(app, argv[1])) {
      std::fprintf(stderr, "sluice: unknown command '%s' (see sluice --help)\n", argv[1]);
      return 2;
    }
    return app.exit(e);
  }
  return sluice::cli::ExitCode();
}
