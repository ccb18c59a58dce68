// DispatcherMetrics: the dispatcher's Prometheus series (docs/deploy.md, "Metrics"), in one
// place: the cluster-wide counters and gauges, and the per-job series (label sluice_job), made
// on a job's first use and removed when it is collected, so they stay bounded.
//
// Not thread-safe: DispatcherImpl uses it under its own mutex.
#ifndef SLUICE_DISPATCHER_DISPATCHER_METRICS_H_
#define SLUICE_DISPATCHER_DISPATCHER_METRICS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace sluice::dispatcher {

class DispatcherMetrics {
 public:
  // One training job's series.
  struct JobSeries {
    prometheus::Counter* batches_returned = nullptr;
    prometheus::Counter* elements_returned = nullptr;
    prometheus::Counter* consumer_wait = nullptr;
    prometheus::Counter* splits_reassigned = nullptr;
    prometheus::Gauge* consumers = nullptr;
    prometheus::Gauge* allocated_workers = nullptr;
  };

  // Registers every series in `registry`, which must outlive this.
  explicit DispatcherMetrics(prometheus::Registry& registry);

  // A job's label: its name, or "id-<id>" when unnamed (live jobs never share a name).
  static std::string JobLabel(uint64_t job_id, const std::string& job_name);
  // The job's series, made on first use.
  JobSeries& ForJob(uint64_t job_id, const std::string& job_name);
  // Removes the series of every job whose label is not in `live_labels` (collected jobs).
  void KeepOnlyJobs(const std::set<std::string>& live_labels);

  prometheus::Counter& splits_assigned;
  prometheus::Counter& splits_reassigned;
  prometheus::Counter& splits_done;
  // By reason: timeout, unregistered, restarted (each series exists from the start).
  prometheus::Family<prometheus::Counter>& workers_lost;
  prometheus::Counter& consumer_wait;
  prometheus::Gauge& workers_alive;
  prometheus::Gauge& jobs_active;
  prometheus::Gauge& desired_workers;
  prometheus::Counter& journal_errors;
  prometheus::Counter& jobs_collected;
  prometheus::Counter& worker_heartbeats;
  // WatchAssignment calls answered work_available.
  prometheus::Counter& assignment_wakeups;

 private:
  prometheus::Family<prometheus::Counter>& job_batches_returned_;
  prometheus::Family<prometheus::Counter>& job_elements_returned_;
  prometheus::Family<prometheus::Counter>& job_consumer_wait_;
  prometheus::Family<prometheus::Counter>& job_splits_reassigned_;
  prometheus::Family<prometheus::Gauge>& job_consumers_;
  prometheus::Family<prometheus::Gauge>& job_allocated_workers_;
  std::map<std::string, JobSeries> jobs_;  // by label
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_DISPATCHER_METRICS_H_
