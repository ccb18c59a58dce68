// sluice-worker: a stateless data worker (ARCHITECTURE.md §5, §7, §8).
//
//   sluice-worker --dispatcher 127.0.0.1:7000 --data-root /data --port 0
//       --address-file /tmp/w0.addr --metrics-port 0
//
// Listens for GetBatches on --host:--port (0 = any free port; the bound
// host:port is written atomically to --address-file), registers with the
// dispatcher and heartbeats. SIGTERM/SIGINT drains: DrainWorker, no new splits,
// keep serving until the dispatcher says may_exit (or
// --drain-timeout), then stop and exit 0. A second signal cuts the drain short.
// A worker the dispatcher drains (autoscaling, `--scaler local`) exits 0 the
// same way once may_exit.
// Exits 1 if the dispatcher cannot be reached within --connect-timeout.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/duration_flag.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "data_worker/pipeline/allocator.h"
#include "data_worker/worker/grpc_dispatcher_client.h"
#include "data_worker/worker/grpc_worker_service.h"
#include "data_worker/worker/worker_impl.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace {

using sluice::AddDurationOption;
using sluice::data_worker::GrpcDispatcherClient;
using sluice::data_worker::GrpcDispatcherClientOptions;
using sluice::data_worker::GrpcWorkerService;
using sluice::data_worker::WorkerImpl;
using sluice::data_worker::WorkerOptions;

// Waits up to `timeout` for SIGTERM/SIGINT (blocked in every thread). True if
// one arrived.
bool WaitForSignal(sigset_t* signals, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  return sigtimedwait(signals, nullptr, &ts) > 0;
}

int Run(int argc, char** argv) {
  CLI::App app{
      "sluice-worker: runs preprocessing pipelines on splits and streams "
      "batches"};
  std::string dispatcher;
  std::string host = "127.0.0.1";
  std::string advertise;
  int port = 0;
  std::string address_file;
  std::vector<std::string> data_roots;
  int threads = 0;
  uint32_t capacity = 2;
  size_t queue_batches = 8;
  int64_t memory_mb = 256;
  int metrics_port = -1;
  std::string log_level = "info";
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration drain_timeout = absl::Seconds(30);
  app.add_option("--dispatcher", dispatcher, "host:port of sluice-dispatcher")
      ->required();
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "data-plane port; 0 = any free port")
      ->capture_default_str();
  app.add_option(
      "--advertise-address", advertise,
      "host:port told to the dispatcher (default: --host:bound port)");
  app.add_option("--address-file", address_file,
                 "write host:port here once listening");
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
  app.add_option("--metrics-port", metrics_port,
                 "Prometheus /metrics port; 0 = any free port; -1 = off")
      ->capture_default_str();
  app.add_option("--log-level", log_level,
                 "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  AddDurationOption(
      app, "--heartbeat-interval", &heartbeat_interval,
      "Time between heartbeats until the dispatcher says otherwise");
  AddDurationOption(app, "--connect-timeout", &connect_timeout,
                    "How long to keep retrying an unreachable dispatcher");
  AddDurationOption(app, "--drain-timeout", &drain_timeout,
                    "How long a drain may take");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<spdlog::level::level_enum> level =
      sluice::ParseLogLevel(log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "sluice-worker: --log-level: %s\n",
                 std::string(level.status().message()).c_str());
    return 2;
  }
  std::shared_ptr<spdlog::logger> logger =
      sluice::MakeStderrLogger("worker", *level);

  // Signals are handled by sigtimedwait in this thread only: block them before
  // any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  if (metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(
          absl::StrCat(host, ":", metrics_port));
      exposer->RegisterCollectable(registry);
      const std::vector<int> ports = exposer->GetListeningPorts();
      std::fprintf(stderr, "sluice-worker: metrics on http://%s:%d/metrics\n",
                   host.c_str(), ports.empty() ? metrics_port : ports.front());
    } catch (const std::exception& e) {
      logger->error("--metrics-port {}: cannot listen: {}", metrics_port,
                    e.what());
      return 1;
    }
  }

  GrpcDispatcherClientOptions client_options;
  client_options.address = dispatcher;
  client_options.connect_timeout = connect_timeout;
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
  options.heartbeat_interval = heartbeat_interval;
  options.registry = registry.get();
  options.logger = logger;
  auto impl = WorkerImpl::Create(options, std::move(*client));
  if (!impl.ok()) {
    logger->error("{}", impl.status().ToString());
    return 2;
  }

  GrpcWorkerService service(impl->get());
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", port),
                           grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    logger->error("cannot listen on {}:{} (--host/--port)", host, port);
    return 1;
  }
  const std::string address = absl::StrCat(host, ":", bound_port);
  logger->info("data plane listening on {}", address);
  if (!address_file.empty() &&
      !sluice::WriteFileAtomically(address_file, address + "\n").ok()) {
    logger->error("--address-file {}: cannot write it", address_file);
    server->Shutdown();
    return 1;
  }

  absl::Status started =
      (*impl)->Start(advertise.empty() ? address : advertise);
  if (!started.ok()) {
    logger->error("cannot join the dispatcher: {}", started.ToString());
    server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    (*impl)->Stop();
    return 1;
  }

  // The dispatcher may drain this worker itself (`--scaler local`): it then
  // exits 0 once the dispatcher says may_exit, like after SIGTERM.
  bool drained_by_dispatcher = false;
  while (!WaitForSignal(&signals, absl::Milliseconds(200))) {
    if ((*impl)->draining() && (*impl)->may_exit()) {
      drained_by_dispatcher = true;
      break;
    }
  }
  absl::Status drained;
  if (drained_by_dispatcher) {
    logger->info("drained by the dispatcher: exiting");
  } else {
    logger->info(
        "signal received: draining (up to {}; signal again to stop now)",
        absl::FormatDuration(drain_timeout));
    drained = (*impl)->Drain();
  }
  if (!drained.ok()) logger->warn("DrainWorker failed: {}", drained.ToString());
  const absl::Time deadline = absl::Now() + drain_timeout;
  bool again = false;
  while (drained.ok() && !(*impl)->may_exit() && absl::Now() < deadline) {
    if (WaitForSignal(&signals, absl::Milliseconds(100))) {
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
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server->Wait();
  logger->info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::data_worker::pipeline::ConfigureAllocatorForPipelines();
  return Run(argc, argv);
}
