// sluice health --address HOST:PORT [--timeout 3s] [--tls-ca F --tls-cert F --tls-key F
//   --tls-server-name NAME --auth-token-file F]
// One grpc.health.v1 Check of a sluice-dispatcher or sluice-worker: exit 0 when it answers
// SERVING; otherwise exit 1 with "sluice: error: ..." naming what it answered (NOT_SERVING: a
// draining worker) or why the call failed. Kubernetes' own gRPC probe speaks neither TLS nor
// tokens, so the production manifests run this as an exec probe (docs/kubernetes.md). Every
// flag is also SLUICE_<FLAG>: in a pod it picks up the server's own SLUICE_TLS_* files.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/base/duration_flag.h"
#include "common/base/status_macros.h"
#include "common/service/channel_factory.h"
#include "common/service/grpc_status.h"
#include "common/service/server_main.h"
#include "grpcpp/generic/generic_stub.h"
#include "tools/cli/command.h"

namespace sluice::cli {
namespace {

struct HealthFlags {
  std::string address;
  absl::Duration timeout = absl::Seconds(3);
  service::ChannelOptions security;
};

// grpc.health.v1.HealthCheckResponse.ServingStatus names.
const char* ServingStatusName(int status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "an unknown status";
  }
}

absl::Status RunHealth(const HealthFlags& flags) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   service::CreateChannel(flags.address, flags.security));
  // The messages are tiny, so they are written by hand instead of linking the health proto:
  // HealthCheckRequest{service: ""} is empty; the response is {1: status} (tag 0x08).
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + flags.timeout));
  grpc::Slice no_bytes("", 0);
  grpc::ByteBuffer request(&no_bytes, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    absl::Status s = service::FromGrpcStatus(status);
    return absl::Status(s.code(),
                        absl::StrCat("health check of ", flags.address, ": ", s.message()));
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  // Status 0 (UNKNOWN) is the proto default and so encodes as nothing.
  const int serving = bytes.empty() ? 0 : (bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1);
  if (serving == 1) {
    std::printf("%s: SERVING\n", flags.address.c_str());
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(flags.address, " answers ", ServingStatusName(serving),
                                             serving == 2 ? " (draining or stopping)" : ""));
}

}  // namespace

void AddHealthCommand(CLI::App& app) {
  auto flags = std::make_shared<HealthFlags>();
  CLI::App* cmd = app.add_subcommand(
      "health",
      "One grpc.health.v1 check of a dispatcher or worker (with TLS and token): exit 0 when "
      "SERVING. Kubernetes exec probes use it");
  cmd->add_option("--address", flags->address, "host:port of the server")->required();
  AddDurationOption(*cmd, "--timeout", &flags->timeout,
                    "Deadline of the check, connecting included (default 3s)");
  service::AddClientSecurityFlags(*cmd, &flags->security);
  service::SetEnvNames(*cmd);
  cmd->callback([flags] { Finish(RunHealth(*flags)); });
}

}  // namespace sluice::cli
