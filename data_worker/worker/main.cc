// sluice-worker: a stateless data worker (docs/architecture.md).
//
//   sluice-worker --dispatcher 127.0.0.1:7000 --data-root /data --port 0
//       --address-file /tmp/w0.addr --metrics-port 0
//
// Listens for GetBatches on --host:--port (0 = any free port; the bound
// host:port is written atomically to --address-file), registers with the
// dispatcher and heartbeats. SIGTERM/SIGINT drains: DrainWorker, no new splits,
// keep serving until the dispatcher says may_exit (or
// --drain-timeout), then stop and exit 0. A second signal cuts the drain short.
// Exits 1 if the dispatcher cannot be reached within --connect-timeout, at once
// if its transport security does not match ours (the message says how).
// grpc.health.v1 answers SERVING until the drain starts, NOT_SERVING after.
// Shared flags (--metrics-address, --log-format, --tls-*, --auth-token-file,
// SLUICE_<FLAG> environment variables): common/service/server_main.h;
// security: docs/security.md.
// A worker the dispatcher drains (autoscaling, `--scaler local`) exits 0 the
// same way once may_exit.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/duration_flag.h"
#include "common/service/channel_factory.h"
#include "common/service/limits.h"
#include "common/service/server_main.h"
#include "data_worker/pipeline/allocator.h"
#include "data_worker/python/python_pool.h"
#include "data_worker/worker/grpc_dispatcher_client.h"
#include "data_worker/worker/grpc_worker_service.h"
#include "data_worker/worker/worker_impl.h"
#include "grpcpp/grpcpp.h"

namespace {

using sluice::AddDurationOption;
using sluice::data_worker::GrpcDispatcherClient;
using sluice::data_worker::GrpcDispatcherClientOptions;
using sluice::data_worker::GrpcWorkerService;
using sluice::data_worker::WorkerImpl;
using sluice::data_worker::WorkerOptions;
namespace service = sluice::service;

int Run(int argc, char** argv) {
  CLI::App app{
      "sluice-worker: runs preprocessing pipelines on splits and streams "
      "batches. Every flag can also be set as SLUICE_<FLAG>, e.g. "
      "SLUICE_ADVERTISE_ADDRESS=$(POD_IP)"};
  service::ServerFlags server_flags{.host = "127.0.0.1", .port = 0};
  service::ServiceLimits limits;
  std::string dispatcher;
  std::string advertise;
  std::string tls_server_name;
  std::vector<std::string> data_roots;
  int threads = 0;
  uint32_t capacity = 2;
  size_t queue_batches = 8;
  int64_t memory_mb = 256;
  int64_t queue_mb = 1024;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration drain_timeout = absl::Seconds(30);
  sluice::data_worker::python::PythonOptions python;
  python.timeout = absl::Seconds(60);
  app.add_option("--dispatcher", dispatcher, "host:port of sluice-dispatcher")
      ->required();
  service::AddServerFlags(app, &server_flags);
  service::AddVersionFlag(app, "sluice-worker");
  app.add_option("--advertise-address", advertise,
                 "HOST[:PORT] told to the dispatcher, that trainers connect to "
                 "(in pods: the pod IP); PORT defaults to the bound port "
                 "(default: --host:bound port)");
  app.add_option("--tls-server-name", tls_server_name,
                 "Name the dispatcher's certificate carries, when it is not "
                 "the host of --dispatcher");
  app.add_option("--data-root", data_roots,
                 "folder pipelines may read (repeatable)")
      ->required();
  app.add_option("--threads", threads,
                 "CPU budget of each pipeline; 0 = all cores")
      ->capture_default_str();
  app.add_option("--capacity", capacity, "splits produced concurrently")
      ->capture_default_str();
  app.add_option(
         "--memory-mb", memory_mb,
         "MB the pipelines may hold in their queues (all splits together)")
      ->capture_default_str();
  app.add_option("--queue-batches", queue_batches,
                 "bounded queue per consumer, in batches")
      ->capture_default_str();
  app.add_option(
         "--queue-mb", queue_mb,
         "MB of batches the worker holds: all consumer queues together, "
         "and the pipelines' elements and batches in flight, which wait "
         "when it is full (one budget per worker, whatever the "
         "consumers and jobs; 0: none)")
      ->capture_default_str();
  app.add_option("--max-pipeline-bytes", limits.max_pipeline_bytes,
                 "Largest serialized pipeline spec accepted")
      ->capture_default_str();
  app.add_option("--max-pipeline-nodes", limits.max_pipeline_nodes,
                 "Most nodes (plus map ops) in a pipeline spec")
      ->capture_default_str();
  app.add_option("--max-batch-bytes", limits.max_batch_bytes,
                 "Largest batch (column bytes) served; sets gRPC's message "
                 "size limit")
      ->capture_default_str();
  app.add_option("--max-streams", limits.max_streams,
                 "Most GetBatches streams open at once")
      ->capture_default_str();
  app.add_option("--max-streams-per-identity", limits.max_streams_per_identity,
                 "Most GetBatches streams one identity holds open on this "
                 "worker (so one caller cannot take every --max-streams)")
      ->capture_default_str();
  AddDurationOption(
      app, "--heartbeat-interval", &heartbeat_interval,
      "Time between heartbeats until the dispatcher says otherwise");
  AddDurationOption(app, "--connect-timeout", &connect_timeout,
                    "How long to keep retrying an unreachable dispatcher");
  AddDurationOption(app, "--drain-timeout", &drain_timeout,
                    "How long a drain may take");
  app.add_flag("--allow-python-ops", python.allow,
               "Run pipelines' python ops (user functions named by module "
               "and function, imported from this worker's image or "
               "--python-path; never code sent by a client). Off: such "
               "pipelines are refused");
  app.add_option("--python-path", python.python_path,
                 "Folder searched for the python ops' modules, before the "
                 "image's packages (repeatable)")
      ->check(CLI::ExistingDirectory);
  AddDurationOption(app, "--python-op-timeout", &python.timeout,
                    "A python op call that takes longer is killed and redone "
                    "on a fresh process, like a crash (0: no limit)");
  service::SetEnvNames(app);
  CLI11_PARSE(app, argc, argv);
  if (python.timeout == absl::ZeroDuration()) {
    python.timeout = absl::InfiniteDuration();
  }
  // Before any pipeline is built: the python op takes the pool then.
  sluice::data_worker::python::ConfigurePython(python);

  std::string advertise_host;
  int advertise_port = -1;
  if (!advertise.empty()) {
    if (absl::Status s = service::ParseHostPort(
            advertise, "--advertise-address", &advertise_host, &advertise_port);
        !s.ok()) {
      std::fprintf(stderr, "sluice-worker: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }

  // Blocks the shutdown signals before any thread starts.
  absl::StatusOr<std::unique_ptr<service::ServerMain>> main =
      service::ServerMain::Create("worker", server_flags);
  if (!main.ok()) {
    std::fprintf(stderr, "sluice-worker: %s\n",
                 std::string(main.status().message()).c_str());
    return main.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  service::ServerMain& server = **main;
  const std::shared_ptr<spdlog::logger>& logger = server.logger();
  // ServerMain printed "metrics on HOST:PORT" on stdout; stderr carries only log lines (JSON
  // with --log-format json).

  // The worker calls the dispatcher with its own certificate (mutual TLS) and
  // the same CA and token as it requires of its callers.
  GrpcDispatcherClientOptions client_options;
  client_options.address = dispatcher;
  client_options.connect_timeout = connect_timeout;
  const service::ServerSecurityOptions& security = server_flags.security;
  if (security.tls() && security.tls_ca.empty()) {
    logger->error(
        "--tls-cert needs --tls-ca on sluice-worker: it verifies the "
        "dispatcher's certificate with it (and requires client certificates "
        "signed by it)");
    return 2;
  }
  client_options.channel.tls_ca = security.tls_ca;
  client_options.channel.tls_cert = security.tls_cert;
  client_options.channel.tls_key = security.tls_key;
  client_options.channel.tls_server_name = tls_server_name;
  client_options.channel.auth_token_file = security.auth_token_file;
  {
    // Fail fast, saying why, when the dispatcher's transport security does
    // not match ours (a retry would never heal it).
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        service::CreateChannel(dispatcher, client_options.channel);
    if (!channel.ok()) {
      logger->error("{}", std::string(channel.status().message()));
      return 2;
    }
    absl::Status tls = service::DiagnoseTls(dispatcher, client_options.channel,
                                            absl::Seconds(3));
    if (!tls.ok()) {
      logger->error("cannot join the dispatcher: {}",
                    std::string(tls.message()));
      return 1;
    }
  }
  auto client = GrpcDispatcherClient::Create(client_options);
  if (!client.ok()) {
    logger->error("{}", client.status().ToString());
    return 2;
  }

  WorkerOptions options;
  options.data_roots = data_roots;
  options.threads = threads;
  options.capacity = capacity;
  options.queue_batches = queue_batches;
  options.memory_budget_bytes = memory_mb << 20;
  options.queue_bytes = queue_mb << 20;
  options.limits = limits;
  options.heartbeat_interval = heartbeat_interval;
  options.registry = &server.registry();
  options.logger = logger;
  auto impl = WorkerImpl::Create(options, std::move(*client));
  if (!impl.ok()) {
    logger->error("{}", impl.status().ToString());
    return 2;
  }

  GrpcWorkerService service(impl->get());
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(service::MaxMessageBytes(limits));
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
      limits.max_pipeline_bytes + service::kMessageOverheadBytes, INT32_MAX)));
  if (absl::Status s = server.Start(builder); !s.ok()) {
    logger->error("{} (--host/--port)", std::string(s.message()));
    return 1;
  }
  logger->info("data plane listening on {} (bound to {})", server.address(),
               server.bind_address());

  std::string advertised = server.address();
  if (!advertise.empty()) {
    advertised = absl::StrCat(
        advertise_host.find(':') != std::string::npos
            ? absl::StrCat("[", advertise_host, "]")
            : advertise_host,
        ":", advertise_port >= 0 ? advertise_port : server.bound_port());
  }
  absl::Status started = (*impl)->Start(advertised);
  if (!started.ok()) {
    logger->error("cannot join the dispatcher: {}", started.ToString());
    server.Shutdown(absl::Seconds(1));
    (*impl)->Stop();
    return 1;
  }
  logger->info("registered as {}", advertised);

  // grpc.health.v1 turns NOT_SERVING once the worker drains, whether a signal
  // or the dispatcher started it, so probes and load balancers stop sending
  // new trainers here. A worker the dispatcher drained (`--scaler local`)
  // exits 0 once the dispatcher says may_exit, like after SIGTERM.
  bool serving = true;
  bool drained_by_dispatcher = false;
  while (!server.WaitForSignal(absl::Milliseconds(200))) {
    if (serving && (*impl)->draining()) {
      serving = false;
      server.SetServing(false);
      logger->info("draining (asked by the dispatcher): health NOT_SERVING");
    }
    if ((*impl)->draining() && (*impl)->may_exit()) {
      drained_by_dispatcher = true;
      break;
    }
  }
  server.SetServing(false);
  absl::Status drained;
  if (drained_by_dispatcher) {
    logger->info("drained by the dispatcher: exiting");
  } else {
    logger->info("draining (up to {}; signal again to stop now)",
                 absl::FormatDuration(drain_timeout));
    drained = (*impl)->Drain();
  }
  if (!drained.ok()) logger->warn("DrainWorker failed: {}", drained.ToString());
  const absl::Time deadline = absl::Now() + drain_timeout;
  bool again = false;
  while (drained.ok() && !(*impl)->may_exit() && absl::Now() < deadline) {
    if (server.WaitForSignal(absl::Milliseconds(100))) {
      again = true;
      break;
    }
  }
  if (!(*impl)->may_exit()) {
    logger->warn("stopping before the dispatcher allowed it ({})",
                 again ? "second signal" : "drain timeout or error");
  }
  (*impl)->Stop();  // ends the streams once their queues are empty
  if (!(*impl)->may_exit()) {
    absl::Status s = (*impl)->Unregister();
    if (!s.ok()) logger->warn("WorkerUnregister failed: {}", s.ToString());
  }
  server.Shutdown(absl::Seconds(2));
  logger->info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::data_worker::pipeline::ConfigureAllocatorForPipelines();
  return Run(argc, argv);
}
