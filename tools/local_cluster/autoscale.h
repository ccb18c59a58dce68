// The dispatcher's GetStatus as `sluice status` shows it, and the local
// autoscaling actuator of `sluice local --autoscale` (docs/autoscaling.md).
//
// The actuator only starts workers. The dispatcher (run with `--scaler local`)
// decides how many workers the jobs need and which ones leave; it drains those
// itself (no new splits, unfinished splits handed over with the consumer's
// prefix skipped) and a drained worker exits 0 once its consumers hold
// everything it produced. Each Step():
//   1. forget the worker processes that exited;
//   2. GetStatus(starting_workers = processes not registered yet);
//   3. start desired - (live processes not draining) workers, if positive.
//
// Not thread-safe: one owner thread (the loop in `sluice local`).
#ifndef SLUICE_TOOLS_LOCAL_CLUSTER_AUTOSCALE_H_
#define SLUICE_TOOLS_LOCAL_CLUSTER_AUTOSCALE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/service/channel_factory.h"
#include "proto/dispatcher.pb.h"
#include "tools/local_cluster/local_cluster.h"

namespace sluice::tools {

// GetStatus from the dispatcher at `address`. starting_workers >= 0 reports the
// actuator's workers that have not registered yet; -1 leaves it alone. The
// RPC's error (Unavailable when the dispatcher cannot be reached). `channel`: transport
// security (TLS, token) of the call.
absl::StatusOr<proto::GetStatusResponse> FetchStatus(const std::string& address,
                                                     int starting_workers = -1,
                                                     absl::Duration timeout = absl::Seconds(5),
                                                     const service::ChannelOptions& security = {});

// `sluice status --json`: the stable form documented in docs/autoscaling.md
// (top-level keys workers, desired_workers, current_workers, reason, scaler,
// min_workers, max_workers, jobs). One line, no trailing newline.
std::string StatusJson(const proto::GetStatusResponse& status);
// `sluice cache list --json`: {"caches": [{name, fingerprint, splits_committed, splits_total,
// bytes, job_ids}], "cache_budget_bytes": N} (the same "caches" as StatusJson's).
std::string CachesJsonText(const proto::GetStatusResponse& status);
// `sluice status`: a human-readable table.
std::string StatusText(const proto::GetStatusResponse& status);

struct AutoscaleStep {
  int desired = 0;
  int live = 0;                     // worker processes running, draining or not
  int draining = 0;                 // of those, draining per the dispatcher
  int started = 0;                  // this step
  std::vector<std::string> exited;  // this step
  std::string reason;
};

class LocalAutoscaler {
 public:
  // `cluster` must outlive this; its dispatcher runs with `--scaler local`.
  LocalAutoscaler(LocalCluster* cluster, int max_workers)
      : cluster_(cluster), max_workers_(max_workers) {}
  // One round (see the file comment). Errors: FetchStatus's, AddWorker's.
  absl::StatusOr<AutoscaleStep> Step();

 private:
  LocalCluster* const cluster_;
  const int max_workers_;
};

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_LOCAL_CLUSTER_AUTOSCALE_H_
