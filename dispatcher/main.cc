// sluice-dispatcher: serves DispatcherService (dispatcher/dispatcher_impl.h)
// over gRPC.
//
//   sluice-dispatcher --port 0 --address-file /tmp/disp.addr --metrics-port 0
//
// Prints "listening on HOST:PORT" (and the metrics port) on stdout once
// serving; with --address-file also writes HOST:PORT there atomically.
// SIGTERM/SIGINT shut it down gracefully (exit 0). grpc.health.v1 answers
// SERVING while it serves. Shared flags (--metrics-address, --log-format,
// --tls-*, --auth-token-file, SLUICE_<FLAG> environment variables):
// common/service/server_main.h; security: docs/security.md.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/duration_flag.h"
#include "common/service/limits.h"
#include "common/service/server_main.h"
#include "dispatcher/dispatcher_impl.h"
#include "dispatcher/grpc_dispatcher_service.h"
#include "dispatcher/sqlite_journal.h"
#include "grpcpp/grpcpp.h"

namespace sluice::dispatcher {
namespace {

struct Flags {
  service::ServerFlags server{.host = "127.0.0.1", .port = 7070};
  uint32_t max_worker_capacity = 64;
  int64_t max_datasets_per_identity = 256;
  std::string work_dir;
  absl::Duration worker_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  service::ServiceLimits limits;
  absl::Duration consumer_timeout = absl::Seconds(60);
  bool first_split_alone = true;
  bool verify_shard_counts = true;
  absl::Duration dataset_ttl = absl::Minutes(10);
  uint64_t cache_budget_bytes = 0;
  double auto_cache_read_ns_per_byte = 1;
  // Autoscaling (docs/autoscaling.md).
  std::string scaler = "none";
  uint32_t min_workers = 1;
  uint32_t max_workers = 64;
  // A CPU budget for the pool: at most floor(max_cpus / worker_cpus)
  // workers (0: no CPU budget).
  double max_cpus = 0;
  double worker_cpus = 1;
  absl::Duration scale_period = absl::Seconds(2);
  absl::Duration scale_down_window = absl::Seconds(30);
};

int Run(const Flags& flags) {
  absl::StatusOr<std::unique_ptr<service::ServerMain>> main =
      service::ServerMain::Create("dispatcher", flags.server);
  if (!main.ok()) {
    std::cerr << "sluice-dispatcher: " << main.status().message() << "\n";
    return main.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  service::ServerMain& server = **main;
  const std::shared_ptr<spdlog::logger>& logger = server.logger();
  DispatcherOptions options;
  if (flags.worker_timeout <= absl::ZeroDuration() ||
      flags.heartbeat_interval <= absl::ZeroDuration()) {
    logger->error("--worker-timeout and --heartbeat-interval must be positive");
    return 2;
  }
  options.worker_timeout = flags.worker_timeout;
  options.heartbeat_interval = flags.heartbeat_interval;
  if (!flags.work_dir.empty()) {
    absl::StatusOr<std::unique_ptr<SqliteJournal>> journal = SqliteJournal::Open(flags.work_dir);
    if (!journal.ok()) {
      logger->error("--work-dir {}: {}", flags.work_dir, journal.status().ToString());
      return 1;
    }
    options.journal = std::move(*journal);
    logger->info("state journal: {}/journal.sqlite3 (SQLite, WAL)", flags.work_dir);
  } else {
    logger->warn(
        "state journal: none (no --work-dir): a restart forgets datasets and "
        "jobs");
  }
  options.consumer_timeout = flags.consumer_timeout;
  options.first_split_alone = flags.first_split_alone;
  options.verify_shard_counts = flags.verify_shard_counts;
  options.dataset_ttl = flags.dataset_ttl;
  options.cache_budget_bytes = flags.cache_budget_bytes;
  options.auto_cache_read_seconds_per_byte = flags.auto_cache_read_ns_per_byte * 1e-9;
  options.limits = flags.limits;
  if (flags.min_workers > flags.max_workers || flags.scale_period <= absl::ZeroDuration()) {
    logger->error("--min-workers must be <= --max-workers and --scale-period positive");
    return 2;
  }
  options.scaler = flags.scaler == "local" ? DispatcherOptions::Scaler::kLocal
                                           : DispatcherOptions::Scaler::kNone;
  options.min_workers = flags.min_workers;
  options.max_workers = flags.max_workers;
  if (!(flags.max_cpus >= 0) || !(flags.worker_cpus > 0)) {  // NaN too
    logger->error("--max-cpus must be >= 0 and --worker-cpus positive");
    return 2;
  }
  if (flags.max_cpus > 0) {
    const double by_cpus = std::floor(flags.max_cpus / flags.worker_cpus);
    if (by_cpus < flags.min_workers) {
      logger->error(
          "--max-cpus {} holds {} workers of --worker-cpus {}, fewer than "
          "--min-workers {}",
          flags.max_cpus, by_cpus, flags.worker_cpus, flags.min_workers);
      return 2;
    }
    options.max_workers = static_cast<uint32_t>(std::min<double>(by_cpus, flags.max_workers));
    logger->info(
        "autoscaler: at most {} workers (--max-cpus {} / "
        "--worker-cpus {}, --max-workers {})",
        options.max_workers, flags.max_cpus, flags.worker_cpus, flags.max_workers);
  }
  options.scale_period = flags.scale_period;
  options.scale_down_window = flags.scale_down_window;

  options.registry = &server.registry();
  options.logger = logger;
  absl::StatusOr<std::unique_ptr<DispatcherImpl>> impl = DispatcherImpl::Create(options);
  if (!impl.ok()) {
    logger->error("dispatcher: {}", impl.status().ToString());
    return 1;
  }
  if (absl::Status s = (*impl)->Start(); !s.ok()) {
    logger->error("dispatcher: {}", s.ToString());
    return 1;
  }
  GrpcDispatcherService service(impl->get(),
                                {.max_worker_capacity = flags.max_worker_capacity,
                                 .max_datasets_per_identity = flags.max_datasets_per_identity});
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  // A spec over --max-pipeline-bytes is refused by gRPC before it is parsed.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
      flags.limits.max_pipeline_bytes + service::kMessageOverheadBytes, INT32_MAX)));
  if (absl::Status s = server.Start(builder); !s.ok()) {
    logger->error("{}", std::string(s.message()));
    (*impl)->Stop();
    return 1;
  }
  logger->info("sluice-dispatcher listening on {} (bound to {}; protocol version {}{}{})",
               server.address(), server.bind_address(), kProtocolVersion,
               flags.server.security.tls()
                   ? (flags.server.security.tls_ca.empty() ? ", TLS" : ", mutual TLS")
                   : ", plaintext",
               !flags.server.security.tokens_file.empty()
                   ? ", identities from --tokens-file"
                   : (!flags.server.security.auth_token_file.empty()
                          ? ", one token with every role (development mode)"
                          : (flags.server.security.tls_ca.empty()
                                 ? ", no client authentication: every caller holds "
                                   "every role"
                                 : ", identities from client certificates")));

  while (!server.WaitForSignal(absl::Seconds(1))) {
  }
  logger->info("shutting down");
  // Every RPC is a short unary call: a short grace is enough, and gRPC would
  // otherwise wait the whole grace for idle client connections.
  server.SetServing(false);
  // Stop() first: it answers the held WatchAssignment calls, which Shutdown would wait for.
  (*impl)->Stop();
  server.Shutdown(absl::Milliseconds(500));
  logger->info("stopped");
  return 0;
}

}  // namespace
}  // namespace sluice::dispatcher

int main(int argc, char** argv) {
  // Abseil's mutex deadlock detection (on in Debian's Abseil build) records
  // every acquisition of DispatcherImpl::mu_ in a graph: a debugging aid that
  // costs CPU on every RPC. Tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  sluice::dispatcher::Flags flags;
  CLI::App app{
      "sluice-dispatcher: hands dataset splits to data workers "
      "(docs/architecture.md). Every flag can also be set as SLUICE_<FLAG>, "
      "e.g. SLUICE_METRICS_ADDRESS=0.0.0.0"};
  sluice::service::AddServerFlags(app, &flags.server);
  sluice::service::AddVersionFlag(app, "sluice-dispatcher");
  app.add_option("--work-dir", flags.work_dir, "Folder for the dispatcher's durable state");
  sluice::AddDurationOption(app, "--worker-timeout", &flags.worker_timeout,
                            "A worker without a heartbeat this long is lost");
  sluice::AddDurationOption(app, "--heartbeat-interval", &flags.heartbeat_interval,
                            "Heartbeat period asked of workers and of timeout checks");
  app.add_option("--first-split-alone", flags.first_split_alone,
                 "A consumer that returned no batch yet has one split in production, "
                 "so its first batch gets all of the workers' CPU (true/false)")
      ->capture_default_str();
  app.add_option("--verify-shard-counts", flags.verify_shard_counts,
                 "RegisterDataset checks the client's shard record counts "
                 "against the dataset (a worker reads its manifest) before it "
                 "accepts them (true/false)")
      ->capture_default_str();
  sluice::AddDurationOption(app, "--dataset-ttl", &flags.dataset_ttl,
                            "A dataset no job has used this long is forgotten (0: never)");
  app.add_option("--cache-budget-bytes", flags.cache_budget_bytes,
                 "Bytes all cache nodes' committed files may take together (the dispatcher "
                 "sees every commit, so it keeps the budget): a commit that would exceed it "
                 "evicts the oldest cache no live job uses, or is skipped (docs/cache.md); "
                 "0 = unlimited")
      ->capture_default_str();
  app.add_option("--auto-cache-read-ns-per-byte", flags.auto_cache_read_ns_per_byte,
                 "`cache: auto` jobs: the CPU nanoseconds reading one cached byte back costs "
                 "(file read, checksum, copy), weighed against recomputing the prefix "
                 "(docs/cache.md); raise it for slow shared storage")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sluice::AddDurationOption(app, "--consumer-timeout", &flags.consumer_timeout,
                            "A consumer without a heartbeat this long is gone; "
                            "a job with no consumer left is "
                            "collected");
  app.add_option("--max-pipeline-bytes", flags.limits.max_pipeline_bytes,
                 "Largest serialized pipeline spec accepted")
      ->capture_default_str();
  app.add_option("--max-pipeline-nodes", flags.limits.max_pipeline_nodes,
                 "Most nodes (plus map ops) in a pipeline spec")
      ->capture_default_str();
  app.add_option("--max-jobs", flags.limits.max_jobs, "Most jobs the dispatcher holds at once")
      ->capture_default_str();
  app.add_option("--max-worker-capacity", flags.max_worker_capacity,
                 "Most splits a worker may register to produce at once")
      ->capture_default_str();
  app.add_option("--max-consumers-per-job", flags.limits.max_consumers_per_job,
                 "Most consumers (trainer processes) of one job")
      ->check(CLI::Range(int64_t{1}, int64_t{sluice::dispatcher::kMaxJobConsumers}))
      ->capture_default_str();
  app.add_option("--max-jobs-per-identity", flags.limits.max_jobs_per_identity,
                 "Most jobs one identity (--tokens-file user or certificate "
                 "CN) holds at once")
      ->capture_default_str();
  app.add_option("--max-datasets-per-identity", flags.max_datasets_per_identity,
                 "Most distinct datasets one identity may register")
      ->capture_default_str();
  app.add_option("--max-splits-per-job", flags.limits.max_splits_per_job,
                 "Most splits in one epoch of a job (bounds the dispatcher's "
                 "memory per job)")
      ->check(CLI::Range(int64_t{1}, static_cast<int64_t>(sluice::dispatcher::kMaxJobSplits)))
      ->capture_default_str();
  app.add_option("--scaler", flags.scaler,
                 "none: sluice_desired_workers is advisory; local: the "
                 "dispatcher also drains the workers the autoscaler lets go "
                 "(for `sluice local --autoscale`)")
      ->check(CLI::IsMember({"none", "local"}))
      ->capture_default_str();
  app.add_option("--min-workers", flags.min_workers, "Autoscaler lower bound")
      ->capture_default_str();
  app.add_option("--max-workers", flags.max_workers, "Autoscaler upper bound")
      ->capture_default_str();
  app.add_option("--max-cpus", flags.max_cpus,
                 "CPU budget for the workers: at most max-cpus / worker-cpus "
                 "of them (0: none); the pool is divided among the jobs when "
                 "it binds")
      ->capture_default_str();
  app.add_option("--worker-cpus", flags.worker_cpus, "CPUs one worker uses, for --max-cpus")
      ->capture_default_str();
  sluice::AddDurationOption(app, "--scale-period", &flags.scale_period,
                            "How often the autoscaler decides");
  sluice::AddDurationOption(app, "--scale-down-window", &flags.scale_down_window,
                            "A scale-down goes to the largest need seen this long");
  sluice::service::SetEnvNames(app);
  CLI11_PARSE(app, argc, argv);
  return sluice::dispatcher::Run(flags);
}
