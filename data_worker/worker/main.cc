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
#include "data_worker/pipeline/executor.h"
#include "data_worker/python/python_flags.h"
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

// Every flag of sluice-worker but the shared ones (common/service/server_main.h).
struct WorkerFlags {
  service::ServerFlags server{.host = "127.0.0.1", .port = 0};
  service::ServiceLimits limits;
  std::string dispatcher;
  std::string advertise;
  std::string tls_server_name;
  std::vector<std::string> data_roots;
  std::string cache_root;
  int threads = 0;
  uint32_t capacity = 2;
  size_t queue_batches = 8;
  int64_t memory_mb = 256;
  int64_t queue_mb = 1024;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration drain_timeout = absl::Seconds(30);
  absl::Duration share_detach_after = absl::Seconds(2);
  absl::Duration pause_unread_after = absl::Seconds(5);
  sluice::data_worker::python::PythonOptions python;
};

void AddWorkerFlags(CLI::App& app, WorkerFlags* f) {
  app.add_option("--dispatcher", f->dispatcher, "host:port of sluice-dispatcher")->required();
  service::AddServerFlags(app, &f->server);
  service::AddVersionFlag(app, "sluice-worker");
  app.add_option("--advertise-address", f->advertise,
                 "HOST[:PORT] told to the dispatcher, that trainers connect to "
                 "(in pods: the pod IP); PORT defaults to the bound port "
                 "(default: --host:bound port)");
  app.add_option("--tls-server-name", f->tls_server_name,
                 "Name the dispatcher's certificate carries, when it is not "
                 "the host of --dispatcher");
  app.add_option("--data-root", f->data_roots, "folder pipelines may read (repeatable)")
      ->required();
  app.add_option("--cache-root", f->cache_root,
                 "folder for cache nodes' files (docs/cache.md; shared storage on a cluster, "
                 "the same path on every worker); empty: cache nodes compute everything");
  app.add_option("--threads", f->threads, "CPU budget of each pipeline; 0 = all cores")
      ->capture_default_str();
  app.add_option("--capacity", f->capacity, "splits produced concurrently")->capture_default_str();
  app.add_option("--memory-mb", f->memory_mb,
                 "MB the pipelines may hold in their queues (all splits together)")
      ->capture_default_str();
  app.add_option("--queue-batches", f->queue_batches, "bounded queue per consumer, in batches")
      ->capture_default_str();
  app.add_option("--queue-mb", f->queue_mb,
                 "MB of batches the worker holds: all consumer queues together, "
                 "and the pipelines' elements and batches in flight, which wait "
                 "when it is full (one budget per worker, whatever the "
                 "consumers and jobs; 0: none)")
      ->capture_default_str();
  app.add_option("--max-pipeline-bytes", f->limits.max_pipeline_bytes,
                 "Largest serialized pipeline spec accepted")
      ->capture_default_str();
  app.add_option("--max-pipeline-nodes", f->limits.max_pipeline_nodes,
                 "Most nodes (plus map ops) in a pipeline spec")
      ->capture_default_str();
  app.add_option("--max-batch-bytes", f->limits.max_batch_bytes,
                 "Largest batch (column bytes) served; sets gRPC's message "
                 "size limit")
      ->capture_default_str();
  app.add_option("--max-streams", f->limits.max_streams, "Most GetBatches streams open at once")
      ->capture_default_str();
  app.add_option("--max-streams-per-identity", f->limits.max_streams_per_identity,
                 "Most GetBatches streams one identity holds open on this "
                 "worker (so one caller cannot take every --max-streams)")
      ->capture_default_str();
  AddDurationOption(app, "--heartbeat-interval", &f->heartbeat_interval,
                    "Time between heartbeats until the dispatcher says otherwise");
  AddDurationOption(
      app, "--share-detach-after", &f->share_detach_after,
      "How long a production group (jobs with sharing auto, docs/sharing.md) waits for a "
      "job whose queue is full while the others read, before that job gets its batches "
      "produced again for it alone");
  AddDurationOption(
      app, "--pause-unread-after", &f->pause_unread_after,
      "How long a split's producer waits on the full queue of a trainer that reads nothing "
      "(it still heartbeats: a paused evaluation loop, a long checkpoint) before the split "
      "pauses: its producer and capacity go to other jobs, and it resumes from where delivery "
      "stopped when the trainer reads again; each pause of a split doubles the next one's wait "
      "(a trainer with a longer step pauses once, not per batch); 0: never");
  AddDurationOption(app, "--connect-timeout", &f->connect_timeout,
                    "How long to keep retrying an unreachable dispatcher");
  AddDurationOption(app, "--drain-timeout", &f->drain_timeout, "How long a drain may take");
  sluice::data_worker::python::AddPythonFlags(app, &f->python);
  service::SetEnvNames(app);
}

// The worker's exit code for a failed step: 2 for a bad flag (InvalidArgument), else 1.
int ExitCode(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// A client of the dispatcher that calls it with this worker's own certificate (mutual TLS) and
// the same CA and token as the worker requires of its callers. Fails fast, saying why, when the
// dispatcher's transport security does not match ours (a retry would never heal it):
// InvalidArgument for a bad flag, FailedPrecondition when the dispatcher cannot be joined.
absl::StatusOr<std::unique_ptr<GrpcDispatcherClient>> ConnectToDispatcher(const WorkerFlags& f) {
  GrpcDispatcherClientOptions options;
  options.address = f.dispatcher;
  options.connect_timeout = f.connect_timeout;
  const service::ServerSecurityOptions& security = f.server.security;
  if (security.tls() && security.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert needs --tls-ca on sluice-worker: it verifies the "
        "dispatcher's certificate with it (and requires client certificates "
        "signed by it)");
  }
  options.channel.tls_ca = security.tls_ca;
  options.channel.tls_cert = security.tls_cert;
  options.channel.tls_key = security.tls_key;
  options.channel.tls_server_name = f.tls_server_name;
  options.channel.auth_token_file = security.auth_token_file;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      service::CreateChannel(f.dispatcher, options.channel);
  if (!channel.ok()) return absl::InvalidArgumentError(channel.status().message());
  if (absl::Status tls = service::DiagnoseTls(f.dispatcher, options.channel, absl::Seconds(3));
      !tls.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot join the dispatcher: ", tls.message()));
  }
  absl::StatusOr<std::unique_ptr<GrpcDispatcherClient>> client =
      GrpcDispatcherClient::Create(options);
  if (!client.ok()) return absl::InvalidArgumentError(client.status().ToString());
  return client;
}

absl::StatusOr<std::unique_ptr<WorkerImpl>> CreateWorker(
    const WorkerFlags& f, service::ServerMain& server,
    std::unique_ptr<GrpcDispatcherClient> client) {
  WorkerOptions options;
  options.data_roots = f.data_roots;
  options.cache_root = f.cache_root;
  options.threads = f.threads;
  options.capacity = f.capacity;
  options.queue_batches = f.queue_batches;
  options.memory_budget_bytes = f.memory_mb << 20;
  options.queue_bytes = f.queue_mb << 20;
  options.limits = f.limits;
  options.heartbeat_interval = f.heartbeat_interval;
  options.share_detach_after = f.share_detach_after;
  options.pause_unread_after = f.pause_unread_after == absl::ZeroDuration()
                                   ? absl::InfiniteDuration()
                                   : f.pause_unread_after;
  options.registry = &server.registry();
  options.logger = server.logger();
  return WorkerImpl::Create(options, std::move(client));
}

// The host:port told to the dispatcher: --advertise-address, its port defaulting to the bound
// one (`advertise_host`/`advertise_port` parsed from it), or the server's own address.
std::string AdvertisedAddress(const WorkerFlags& f, const std::string& advertise_host,
                              int advertise_port, const service::ServerMain& server) {
  if (f.advertise.empty()) return server.address();
  return absl::StrCat(advertise_host.find(':') != std::string::npos
                          ? absl::StrCat("[", advertise_host, "]")
                          : advertise_host,
                      ":", advertise_port >= 0 ? advertise_port : server.bound_port());
}

// Serves until a signal or the dispatcher's drain, then drains and stops the worker.
// grpc.health.v1 turns NOT_SERVING once the worker drains, whether a signal or the dispatcher
// started it, so probes and load balancers stop sending new trainers here. A worker the
// dispatcher drained (`--scaler local`) exits once the dispatcher says may_exit, like after
// SIGTERM; a second signal or --drain-timeout cuts a drain short.
void ServeThenDrain(service::ServerMain& server, WorkerImpl& impl, absl::Duration drain_timeout) {
  const std::shared_ptr<spdlog::logger>& logger = server.logger();
  bool serving = true;
  bool drained_by_dispatcher = false;
  while (!server.WaitForSignal(absl::Milliseconds(200))) {
    if (serving && impl.draining()) {
      serving = false;
      server.SetServing(false);
      logger->info("draining (asked by the dispatcher): health NOT_SERVING");
    }
    if (impl.draining() && impl.may_exit()) {
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
    drained = impl.Drain();
  }
  if (!drained.ok()) logger->warn("DrainWorker failed: {}", drained.ToString());
  const absl::Time deadline = absl::Now() + drain_timeout;
  bool again = false;
  while (drained.ok() && !impl.may_exit() && absl::Now() < deadline) {
    if (server.WaitForSignal(absl::Milliseconds(100))) {
      again = true;
      break;
    }
  }
  if (!impl.may_exit()) {
    logger->warn("stopping before the dispatcher allowed it ({})",
                 again ? "second signal" : "drain timeout or error");
  }
  impl.Stop();  // ends the streams once their queues are empty
  if (!impl.may_exit()) {
    absl::Status s = impl.Unregister();
    if (!s.ok()) logger->warn("WorkerUnregister failed: {}", s.ToString());
  }
}

int Run(int argc, char** argv) {
  CLI::App app{
      "sluice-worker: runs preprocessing pipelines on splits and streams "
      "batches. Every flag can also be set as SLUICE_<FLAG>, e.g. "
      "SLUICE_ADVERTISE_ADDRESS=$(POD_IP)"};
  WorkerFlags f;
  AddWorkerFlags(app, &f);
  CLI11_PARSE(app, argc, argv);

  std::string advertise_host;
  int advertise_port = -1;
  if (!f.advertise.empty()) {
    if (absl::Status s = service::ParseHostPort(f.advertise, "--advertise-address", &advertise_host,
                                                &advertise_port);
        !s.ok()) {
      std::fprintf(stderr, "sluice-worker: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }

  // Blocks the shutdown signals before any thread starts.
  absl::StatusOr<std::unique_ptr<service::ServerMain>> main =
      service::ServerMain::Create("worker", f.server);
  if (!main.ok()) {
    std::fprintf(stderr, "sluice-worker: %s\n", std::string(main.status().message()).c_str());
    return ExitCode(main.status());
  }
  service::ServerMain& server = **main;
  const std::shared_ptr<spdlog::logger>& logger = server.logger();
  // Before any pipeline is built (the python op takes the pool then). One
  // element's results may take at most the worker's memory budget.
  f.python.max_result_bytes = f.memory_mb << 20;
  // A pipeline's python op starts as many processes as the pipeline may have threads.
  f.python.warm = sluice::data_worker::pipeline::CpuBudgetOrAllCores(f.threads);
  // And as many wait, numpy imported, for the next job's pipeline.
  f.python.spares = f.python.warm;
  if (absl::Status python = sluice::data_worker::python::CheckPythonInterpreter(f.python);
      !python.ok()) {
    logger->error("{}", std::string(python.message()));
    return ExitCode(python);
  }
  sluice::data_worker::python::ConfigurePython(f.python, &server.registry(), logger);
  // ServerMain printed "metrics on HOST:PORT" on stdout; stderr carries only log lines (JSON
  // with --log-format json).

  absl::StatusOr<std::unique_ptr<GrpcDispatcherClient>> client = ConnectToDispatcher(f);
  if (!client.ok()) {
    logger->error("{}", std::string(client.status().message()));
    return ExitCode(client.status());
  }
  absl::StatusOr<std::unique_ptr<WorkerImpl>> impl = CreateWorker(f, server, *std::move(client));
  if (!impl.ok()) {
    logger->error("{}", impl.status().ToString());
    return 2;
  }

  GrpcWorkerService service(impl->get());
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(service::MaxMessageBytes(f.limits));
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(f.limits.max_pipeline_bytes + service::kMessageOverheadBytes, INT32_MAX)));
  if (absl::Status s = server.Start(builder); !s.ok()) {
    logger->error("{} (--host/--port)", std::string(s.message()));
    return 1;
  }
  logger->info("data plane listening on {} (bound to {})", server.address(), server.bind_address());

  const std::string advertised = AdvertisedAddress(f, advertise_host, advertise_port, server);
  if (absl::Status started = (*impl)->Start(advertised); !started.ok()) {
    logger->error("cannot join the dispatcher: {}", started.ToString());
    server.Shutdown(absl::Seconds(1));
    (*impl)->Stop();
    return 1;
  }
  logger->info("registered as {}", advertised);

  ServeThenDrain(server, **impl, f.drain_timeout);
  server.Shutdown(absl::Seconds(2));
  logger->info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::data_worker::pipeline::ConfigureAllocatorForPipelines();
  return Run(argc, argv);
}
