// sluice local --workers N [--port P] [--data-root DIR]... [--address-file FILE]
//     [--tls | --tls-cert F --tls-key F [--tls-ca F] [--auth-token-file F]]
// A dispatcher and N worker processes on loopback, until Ctrl-C or SIGTERM; a
// worker that dies is replaced (ReplaceExitedWorkers), the dispatcher's exit
// stops the cluster.
//
// sluice local ... [--allow-python-ops [--python-path DIR]... [--python-modules M,...]
//     [--python-op-timeout 60s]]: the workers' python-op flags (docs/python.md).
//
// sluice local --autoscale --min-workers N --max-workers M [--scale-interval 2s]
//     [--max-cpus C [--worker-cpus W]]
// Starts N workers; the dispatcher (--scaler local) sizes the pool and drains
// the workers that leave; this loop starts the ones it asks for
// (tools/local_cluster/autoscale.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/duration_flag.h"
#include "common/base/process.h"
#include "common/base/signals.h"
#include "common/base/status_macros.h"
#include "common/service/server_main.h"
#include "data_worker/python/python_flags.h"
#include "tools/cli/command.h"
#include "tools/local_cluster/autoscale.h"
#include "tools/local_cluster/certificates.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

struct LocalFlags {
  int workers = 2;
  int port = 0;
  std::vector<std::string> data_roots;
  std::string address_file;
  std::string work_dir;
  int threads_per_worker = 0;
  std::string log_level = "info";
  bool tls = false;
  std::string tls_cert, tls_key, tls_ca, auth_token_file;
  // Autoscaling.
  bool autoscale = false;
  int min_workers = 1;
  int max_workers = 8;
  double max_cpus = 0;  // the dispatcher's CPU budget (0: none)
  double worker_cpus = 1;
  absl::Duration scale_interval = absl::Seconds(2);
  // Handed to every worker (python ops: docs/python.md).
  data_worker::python::PythonOptions python;
};

// A fixed pool's workers that exited (killed, out of memory, crashed) are replaced by new
// ones, printed as they are. Workers that keep dying (more than kMaxReplacements within
// kReplacementWindow: a crash loop) stop the cluster instead, with the last one's exit.
constexpr int kMaxReplacements = 5;
constexpr absl::Duration kReplacementWindow = absl::Minutes(1);

absl::Status ReplaceExitedWorkers(tools::LocalCluster& cluster,
                                  std::deque<absl::Time>& replacements) {
  for (const std::string& exited : cluster.ReapExitedWorkers()) {
    const absl::Time now = absl::Now();
    while (!replacements.empty() && now - replacements.front() > kReplacementWindow) {
      replacements.pop_front();
    }
    if (static_cast<int>(replacements.size()) >= kMaxReplacements) {
      cluster.Stop();
      return absl::AbortedError(absl::StrFormat(
          "sluice local: %s; %d workers were replaced in the last %s: stopped the cluster", exited,
          replacements.size(), absl::FormatDuration(kReplacementWindow)));
    }
    replacements.push_back(now);
    std::printf("sluice local: %s; starting a new worker\n", exited.c_str());
    std::fflush(stdout);
    absl::StatusOr<int> added = cluster.AddWorker();
    if (!added.ok()) {
      cluster.Stop();
      return absl::AbortedError(absl::StrCat(
          "sluice local: ", exited, "; its replacement did not start: ", added.status().message(),
          "; stopped the cluster"));
    }
    std::printf("  worker %d    %s   metrics http://127.0.0.1:%d/metrics\n", *added,
                cluster.worker(*added).address.c_str(), cluster.worker(*added).metrics_port);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status RunLocal(const LocalFlags& flags) {
  // Block the stop signals before any child starts; they are taken with
  // WaitForStopSignal below.
  BlockStopSignals();

  tools::LocalClusterOptions options{
      .bin_dir = tools::BinDir(),
      .workers = flags.workers,
      .dispatcher_port = flags.port,
      .data_roots = flags.data_roots,
      .work_dir = flags.work_dir,
      .worker_threads = flags.threads_per_worker,
      .log_level = flags.log_level,
      .extra_worker_flags = data_worker::python::PythonWorkerFlags(flags.python)};
  if (!(flags.max_cpus >= 0) || !(flags.worker_cpus > 0)) {  // NaN too
    return absl::InvalidArgumentError(absl::StrCat("--max-cpus must be >= 0 (got ", flags.max_cpus,
                                                   ") and --worker-cpus positive (got ",
                                                   flags.worker_cpus, ")"));
  }
  // Before any child starts: each worker would refuse to start on its own.
  RETURN_IF_ERROR(data_worker::python::CheckPythonInterpreter(flags.python));
  if (flags.autoscale) {
    if (flags.min_workers < 0 || flags.min_workers > flags.max_workers ||
        flags.scale_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          "--autoscale needs 0 <= --min-workers <= --max-workers and a "
          "positive --scale-interval");
    }
    options.workers = flags.min_workers;
    options.extra_dispatcher_flags = {"--scaler",       "local",
                                      "--min-workers",  std::to_string(flags.min_workers),
                                      "--max-workers",  std::to_string(flags.max_workers),
                                      "--scale-period", absl::FormatDuration(flags.scale_interval)};
    if (flags.max_cpus > 0) {
      // The dispatcher checks the budget (it must hold --min-workers) and bounds the pool.
      options.extra_dispatcher_flags.insert(options.extra_dispatcher_flags.end(),
                                            {"--max-cpus", absl::StrCat(flags.max_cpus),
                                             "--worker-cpus", absl::StrCat(flags.worker_cpus)});
    }
  } else if (flags.max_cpus > 0) {
    return absl::InvalidArgumentError("--max-cpus bounds an autoscaled pool: add --autoscale");
  }
  if (options.data_roots.empty()) options.data_roots.push_back(fs::current_path().string());
  if (options.work_dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "sluice-local-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr)
      return absl::InternalError("cannot create a temp folder");
    options.work_dir = pattern;
  }
  options.tls_cert = flags.tls_cert;
  options.tls_key = flags.tls_key;
  options.tls_ca = flags.tls_ca;
  options.auth_token_file = flags.auth_token_file;
  std::string consumer_flags;
  if (flags.tls &&
      (!flags.tls_cert.empty() || !flags.tls_ca.empty() || !flags.auth_token_file.empty())) {
    return absl::InvalidArgumentError(
        "--tls makes its own certificates and token: drop --tls-cert, --tls-ca "
        "and --auth-token-file, or drop --tls");
  }
  if (flags.tls) {
    // Throwaway CA, certificates and token: mutual TLS and a bearer token.
    ASSIGN_OR_RETURN(tools::Certificates certs,
                     tools::MakeCertificates((fs::path(options.work_dir) / "tls").string()));
    options.tls_cert = certs.server_cert;
    options.tls_key = certs.server_key;
    options.tls_ca = certs.ca;
    options.auth_token_file = certs.token;
    consumer_flags = absl::StrFormat("--tls-ca %s --tls-cert %s --tls-key %s --auth-token-file %s",
                                     certs.ca, certs.client_cert, certs.client_key, certs.token);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<tools::LocalCluster> cluster,
                   tools::LocalCluster::Start(options));
  if (!flags.address_file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(flags.address_file, cluster->dispatcher_address() + "\n"));
  }
  std::printf("sluice local: dispatcher %s   metrics http://127.0.0.1:%d/metrics\n",
              cluster->dispatcher_address().c_str(), cluster->dispatcher_metrics_port());
  for (int i = 0; i < cluster->num_workers(); ++i) {
    std::printf("  worker %d    %s   metrics http://127.0.0.1:%d/metrics\n", i,
                cluster->worker(i).address.c_str(), cluster->worker(i).metrics_port);
  }
  if (!consumer_flags.empty()) {
    std::printf(
        "  secured     mutual TLS + bearer token; consumers pass:\n"
        "              %s\n",
        consumer_flags.c_str());
  }
  std::printf("  data roots  %s\n  logs        %s\nCtrl-C stops the cluster.\n",
              absl::StrJoin(options.data_roots, ", ").c_str(), options.work_dir.c_str());
  std::fflush(stdout);

  tools::LocalAutoscaler scaler(cluster.get(), flags.max_workers);
  std::deque<absl::Time> replacements;
  absl::Time next_step = absl::Now();
  const absl::Time start = absl::Now();
  while (true) {
    if (WaitForStopSignal(absl::Milliseconds(200)) != 0) {
      std::printf("sluice local: stopping (workers drain first)\n");
      cluster->Stop();
      return absl::OkStatus();
    }
    if (flags.autoscale && absl::Now() >= next_step) {
      // The actuator polls faster than the dispatcher decides (a GetStatus
      // is cheap), so that a decision's workers start within 0.5 s instead
      // of up to a whole interval later.
      next_step = absl::Now() + std::min(flags.scale_interval, absl::Milliseconds(500));
      absl::StatusOr<tools::AutoscaleStep> step = scaler.Step();
      if (!step.ok()) {
        std::fprintf(stderr, "sluice local: autoscale: %s\n", step.status().ToString().c_str());
      } else {
        for (const std::string& e : step->exited) std::printf("sluice local: %s\n", e.c_str());
        if (step->started > 0 || !step->exited.empty()) {
          std::printf(
              "sluice local: t=%.1fs workers %d (%d draining), desired %d, "
              "started %d: %s\n",
              absl::ToDoubleSeconds(absl::Now() - start), step->live, step->draining, step->desired,
              step->started, step->reason.c_str());
        }
        std::fflush(stdout);
      }
      continue;
    }
    // Only the dispatcher's exit stops the cluster. Autoscaled workers come and go (the step
    // above forgets them); a fixed pool replaces a worker that died, as a Deployment would.
    if (std::string exited = cluster->FindExitedChild();
        !exited.empty() && exited.rfind("sluice-dispatcher", 0) == 0) {
      cluster->Stop();
      return absl::AbortedError("sluice local: " + exited + "; stopped the cluster");
    }
    if (!flags.autoscale) RETURN_IF_ERROR(ReplaceExitedWorkers(*cluster, replacements));
  }
}

}  // namespace

void AddLocalCommand(CLI::App& app) {
  auto flags = std::make_shared<LocalFlags>();
  CLI::App* cmd = app.add_subcommand(
      "local", "Run a dispatcher and N workers on loopback until Ctrl-C or SIGTERM");
  cmd->add_option("--workers", flags->workers, "Worker processes")->capture_default_str();
  cmd->add_option("--port", flags->port, "Dispatcher port (0: any free port)")
      ->capture_default_str();
  cmd->add_option("--data-root", flags->data_roots,
                  "Folder workers may read (repeatable; default: the current folder)");
  cmd->add_option("--address-file", flags->address_file, "Write the dispatcher's host:port here");
  cmd->add_option("--work-dir", flags->work_dir, "Logs and state (default: a new temp folder)");
  cmd->add_option("--threads-per-worker", flags->threads_per_worker, "Pipeline threads per worker");
  cmd->add_option("--log-level", flags->log_level, "trace|debug|info|warn|error")
      ->capture_default_str();
  cmd->add_flag("--tls", flags->tls,
                "Secure the cluster with a throwaway CA, certificates and "
                "token made in the work dir (openssl); prints the consumer's "
                "flags");
  cmd->add_option("--tls-cert", flags->tls_cert, "PEM certificate of every server (TLS)");
  cmd->add_option("--tls-key", flags->tls_key, "PEM private key of --tls-cert");
  cmd->add_option("--tls-ca", flags->tls_ca,
                  "PEM CA: mutual TLS (client certificates signed by it)");
  cmd->add_option("--auth-token-file", flags->auth_token_file,
                  "Bearer token file every call must carry (needs TLS)");
  cmd->add_flag("--autoscale", flags->autoscale,
                "Size the worker pool to the jobs' demand "
                "(docs/autoscaling.md); --workers is ignored");
  cmd->add_option("--min-workers", flags->min_workers, "With --autoscale: fewest workers")
      ->capture_default_str();
  cmd->add_option("--max-workers", flags->max_workers, "With --autoscale: most workers")
      ->capture_default_str();
  cmd->add_option("--max-cpus", flags->max_cpus,
                  "With --autoscale: a CPU budget, at most floor(C / --worker-cpus) workers "
                  "(0: none)");
  cmd->add_option("--worker-cpus", flags->worker_cpus, "With --max-cpus: CPUs one worker takes")
      ->capture_default_str();
  AddDurationOption(*cmd, "--scale-interval", &flags->scale_interval,
                    "With --autoscale: how often to decide and act");
  data_worker::python::AddPythonFlags(*cmd, &flags->python);
  service::SetEnvNames(*cmd);
  cmd->callback([flags] { Finish(RunLocal(*flags)); });
}

}  // namespace sluice::cli
