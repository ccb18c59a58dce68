// sluice status --dispatcher ADDR [--json] [--tls-ca F --tls-cert F --tls-key F
//   --tls-server-name NAME --auth-token-file F]
// Workers, desired vs current workers and why, jobs with their consumers
// (docs/autoscaling.md describes the --json form). Every flag is also SLUICE_<FLAG>.
#include <cstdio>

#include "common/base/status_macros.h"
#include "common/service/server_main.h"
#include "tools/cli/command.h"
#include "tools/local_cluster/autoscale.h"

namespace sluice::cli {
namespace {

struct StatusFlags {
  std::string dispatcher;
  bool json = false;
  service::ChannelOptions security;
};

absl::Status RunStatus(const StatusFlags& flags) {
  ASSIGN_OR_RETURN(proto::GetStatusResponse status,
                   tools::FetchStatus(flags.dispatcher, /*starting_workers=*/-1, absl::Seconds(5),
                                      flags.security));
  if (flags.json) {
    std::printf("%s\n", tools::StatusJson(status).c_str());
  } else {
    std::printf("%s", tools::StatusText(status).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

void AddStatusCommand(CLI::App& app) {
  auto flags = std::make_shared<StatusFlags>();
  CLI::App* cmd = app.add_subcommand(
      "status", "Workers, desired vs current workers and why, jobs and consumers");
  cmd->add_option("--dispatcher", flags->dispatcher, "Dispatcher host:port")->required();
  cmd->add_flag("--json", flags->json, "One JSON object (stable keys, docs/autoscaling.md)");
  service::AddClientSecurityFlags(*cmd, &flags->security);
  // SLUICE_DISPATCHER, SLUICE_TLS_CA, ... (handy in a pod).
  service::SetEnvNames(*cmd);
  cmd->callback([flags] { Finish(RunStatus(*flags)); });
}

}  // namespace sluice::cli
