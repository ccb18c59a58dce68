// sluice-dispatcher: serves DispatcherService (dispatcher/dispatcher_impl.h)
// over gRPC.
//
//   sluice-dispatcher --port 0 --address-file /tmp/disp.addr --metrics-port 0
//
// Prints "listening on HOST:PORT" (and the metrics port) on stdout once
// serving; with --address-file also writes HOST:PORT there atomically.
// SIGTERM/SIGINT shut it down gracefully (exit 0).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/duration_flag.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "dispatcher/dispatcher_impl.h"
#include "dispatcher/grpc_dispatcher_service.h"
#include "dispatcher/sqlite_journal.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace sluice::dispatcher {
namespace {

struct Flags {
  std::string host = "0.0.0.0";
  int port = 7070;
  std::string address_file;
  std::string work_dir;
  int metrics_port = -1;
  std::string log_level = "info";
  absl::Duration worker_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration consumer_timeout = absl::Seconds(60);
};

int Run(const Flags& flags) {
  // Block the shutdown signals in every thread (gRPC's and the exposer's
  // inherit the mask) and wait for them in this one.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<spdlog::level::level_enum> level =
      ParseLogLevel(flags.log_level);
  if (!level.ok()) {
    std::cerr << "--log-level: " << level.status().message() << "\n";
    return 2;
  }
  std::shared_ptr<spdlog::logger> logger =
      MakeStderrLogger("dispatcher", *level);
  DispatcherOptions options;
  if (flags.worker_timeout <= absl::ZeroDuration() ||
      flags.heartbeat_interval <= absl::ZeroDuration()) {
    logger->error("--worker-timeout and --heartbeat-interval must be positive");
    return 2;
  }
  options.worker_timeout = flags.worker_timeout;
  options.heartbeat_interval = flags.heartbeat_interval;
  if (!flags.work_dir.empty()) {
    absl::StatusOr<std::unique_ptr<SqliteJournal>> journal =
        SqliteJournal::Open(flags.work_dir);
    if (!journal.ok()) {
      logger->error("--work-dir {}: {}", flags.work_dir,
                    journal.status().ToString());
      return 1;
    }
    options.journal = std::move(*journal);
    logger->info("state journal: {}/journal.sqlite3 (SQLite, WAL)",
                 flags.work_dir);
  } else {
    logger->warn(
        "state journal: none (no --work-dir): a restart forgets datasets and "
        "jobs");
  }
  options.consumer_timeout = flags.consumer_timeout;

  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  if (flags.metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(
          absl::StrCat("127.0.0.1:", flags.metrics_port));
      exposer->RegisterCollectable(registry);
    } catch (const std::exception& e) {
      logger->error("--metrics-port {}: {}", flags.metrics_port, e.what());
      return 1;
    }
    const std::vector<int> ports = exposer->GetListeningPorts();
    std::cout << "metrics on 127.0.0.1:" << (ports.empty() ? 0 : ports[0])
              << std::endl;
  }

  options.registry = registry.get();
  options.logger = logger;
  absl::StatusOr<std::unique_ptr<DispatcherImpl>> impl =
      DispatcherImpl::Create(options);
  if (!impl.ok()) {
    logger->error("dispatcher: {}", impl.status().ToString());
    return 1;
  }
  if (absl::Status s = (*impl)->Start(); !s.ok()) {
    logger->error("dispatcher: {}", s.ToString());
    return 1;
  }
  GrpcDispatcherService service(impl->get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(flags.host, ":", flags.port),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    logger->error("cannot listen on {}:{} (in use? try --port 0)", flags.host,
                  flags.port);
    return 1;
  }
  const std::string host = flags.host == "0.0.0.0" || flags.host == "[::]"
                               ? "127.0.0.1"
                               : flags.host;
  const std::string address = absl::StrCat(host, ":", port);
  if (!flags.address_file.empty() &&
      !sluice::WriteFileAtomically(flags.address_file, address + "\n").ok()) {
    logger->error("--address-file {}: cannot write", flags.address_file);
    server->Shutdown();
    return 1;
  }
  std::cout << "listening on " << address << std::endl;
  logger->info("sluice-dispatcher listening on {}:{} (protocol version {})",
               flags.host, port, kProtocolVersion);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  logger->info("signal {}: shutting down", signal_number);
  // Every RPC is a short unary call: a short grace is enough, and gRPC would
  // otherwise wait the whole grace for idle client connections.
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(500));
  server->Wait();
  (*impl)->Stop();
  logger->info("stopped");
  return 0;
}

}  // namespace
}  // namespace sluice::dispatcher

int main(int argc, char** argv) {
  sluice::dispatcher::Flags flags;
  CLI::App app{
      "sluice-dispatcher: hands dataset splits to data workers "
      "(ARCHITECTURE.md §6)"};
  app.add_option("--host", flags.host, "Address to listen on")
      ->capture_default_str();
  app.add_option("--port", flags.port, "gRPC port; 0 = any free port")
      ->capture_default_str();
  app.add_option("--address-file", flags.address_file,
                 "Write host:port here (atomically) once listening");
  app.add_option("--work-dir", flags.work_dir,
                 "Folder for the dispatcher's durable state");
  app.add_option(
         "--metrics-port", flags.metrics_port,
         "Prometheus /metrics port on 127.0.0.1; 0 = any (printed), -1 = off")
      ->capture_default_str();
  app.add_option("--log-level", flags.log_level,
                 "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  sluice::AddDurationOption(app, "--worker-timeout", &flags.worker_timeout,
                            "A worker without a heartbeat this long is lost");
  sluice::AddDurationOption(
      app, "--heartbeat-interval", &flags.heartbeat_interval,
      "Heartbeat period asked of workers and of timeout checks");
  sluice::AddDurationOption(app, "--consumer-timeout", &flags.consumer_timeout,
                            "A consumer without a heartbeat this long is gone; "
                            "a job with no consumer left is "
                            "collected");
  CLI11_PARSE(app, argc, argv);
  return sluice::dispatcher::Run(flags);
}
