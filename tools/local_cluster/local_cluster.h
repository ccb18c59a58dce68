// LocalCluster: a sluice-dispatcher and N sluice-worker processes on 127.0.0.1,
// each on a free port it reports through --address-file, with their logs in
// `work_dir`. Used by `sluice local`, `sluice demo` and the integration tests
// (which kill workers for real with KillWorker).
//
//   ASSIGN_OR_RETURN(auto cluster,
//                    LocalCluster::Start({.bin_dir = BinDir(),
//                                         .workers = 2,
//                                         .data_roots = {dataset_dir}}));
//   ... clients connect to cluster->dispatcher_address() ...
//   cluster->Stop();  // workers drain on SIGTERM, then the dispatcher stops
//
// Not thread-safe: one owner thread. The destructor stops whatever still runs,
// and the children get SIGTERM if the owner thread ends without it (the process
// killed or crashed: Subprocess::Options::exit_with_parent).
#ifndef SLUICE_TOOLS_LOCAL_CLUSTER_LOCAL_CLUSTER_H_
#define SLUICE_TOOLS_LOCAL_CLUSTER_LOCAL_CLUSTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/process.h"

namespace sluice::tools {

struct LocalClusterOptions {
  std::string bin_dir;  // where sluice-dispatcher and sluice-worker are
  int workers = 2;
  int dispatcher_port = 0;  // 0: any free port
  std::vector<std::string> data_roots;
  std::string work_dir;    // logs, address files, dispatcher state; required
  int worker_threads = 0;  // 0: the worker's default
  std::string log_level = "info";
  absl::Duration heartbeat_interval = absl::Milliseconds(200);
  absl::Duration worker_timeout = absl::Seconds(2);
  absl::Duration start_timeout = absl::Seconds(20);
  std::vector<std::string> extra_worker_flags;      // e.g. {"--memory-mb", "64"}
  std::vector<std::string> extra_dispatcher_flags;  // e.g. {"--consumer-timeout", "2s"}
  std::string dispatcher_host;                      // its --host ("": its default)
  std::string dispatcher_target;  // what workers dial, e.g. a DNS name ("": its address)

  // Transport security of every process (docs/security.md; certificates.h makes throwaway
  // ones): --tls-cert/--tls-key serve TLS, --tls-ca adds mutual TLS (workers present the same
  // certificate to the dispatcher), --auth-token-file requires a bearer token.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  std::string auth_token_file;
};

struct ServerProcess {
  std::unique_ptr<Subprocess> process;
  std::string address;  // host:port of its gRPC server
  int metrics_port = 0;
};

class LocalCluster {
 public:
  // Starts the dispatcher, then the workers, and waits until all listen. A
  // child that fails to start is reported with the tail of its log.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(LocalClusterOptions options);
  ~LocalCluster();

  const std::string& dispatcher_address() const { return dispatcher_.address; }
  int dispatcher_metrics_port() const { return dispatcher_.metrics_port; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  ServerProcess& worker(int i) { return workers_[i]; }
  const LocalClusterOptions& options() const { return options_; }

  // SIGKILLs the dispatcher and starts it again on the same port with the same --work-dir, so
  // it recovers from its journal; on `host` if given (another address), else where it was.
  absl::Status RestartDispatcher(const std::string& host = "");
  // Sends `signal` to the dispatcher (SIGSTOP/SIGCONT: a paused node).
  void SignalDispatcher(int signal);
  // Starts one more worker; returns its index.
  absl::StatusOr<int> AddWorker();
  // Sends `signal` to worker i (SIGKILL to kill it for real, SIGTERM to drain
  // it).
  void SignalWorker(int i, int signal);
  // Autoscaling: forgets the workers that exited (a drained worker exits 0)
  // and returns them as FindExitedChild describes them. Indices shift.
  std::vector<std::string> ReapExitedWorkers();
  // The first child found to have exited, as "name (pid) exited with code N",
  // or empty.
  std::string FindExitedChild();
  // SIGTERM to every worker (they drain), then to the dispatcher; SIGKILL after
  // `grace`.
  void Stop(absl::Duration grace = absl::Seconds(10));

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  absl::StatusOr<ServerProcess> Launch(const std::string& name, std::vector<std::string> argv,
                                       const std::vector<std::string>& extra = {});
  absl::StatusOr<ServerProcess> LaunchDispatcher(const std::string& host, int port);

  const LocalClusterOptions options_;
  ServerProcess dispatcher_;
  std::vector<ServerProcess> workers_;
  int next_worker_id_ = 0;
};

// The folder of the running executable: where its sibling binaries are.
std::string BinDir();

// A TCP port on 127.0.0.1 that was free a moment ago (bound and released).
absl::StatusOr<int> PickFreePort();

// The body of http://127.0.0.1:port/metrics (Prometheus text format), with a 5
// s timeout.
absl::StatusOr<std::string> ScrapeMetrics(int port);

// Sums the samples of `metric` in Prometheus text `exposition` by the value of
// `label`: SumByLabel(text, "sluice_pipeline_stage_busy_seconds_total",
// "stage") → {"map[0]": 12.5, ...}.
std::map<std::string, double> SumByLabel(const std::string& exposition, const std::string& metric,
                                         const std::string& label);

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_LOCAL_CLUSTER_LOCAL_CLUSTER_H_
