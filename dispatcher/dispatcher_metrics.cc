#include "dispatcher/dispatcher_metrics.h"

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"

namespace sluice::dispatcher {
namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

}  // namespace

DispatcherMetrics::DispatcherMetrics(prometheus::Registry& registry)
    : splits_assigned(AddCounter(registry, "sluice_dispatcher_splits_assigned_total",
                                 "Splits handed to a worker (first assignments).")),
      splits_reassigned(AddCounter(registry, "sluice_dispatcher_splits_reassigned_total",
                                   "Splits handed to another worker after a loss or drain.")),
      splits_done(AddCounter(registry, "sluice_dispatcher_splits_done_total",
                             "Splits whose consumer received every batch.")),
      workers_lost(CounterFamily(registry, "sluice_dispatcher_workers_lost_total",
                                 "Workers removed, by reason: timeout (no heartbeat for "
                                 "--worker-timeout), unregistered (drained and left), "
                                 "restarted (registered again at the same address).")),
      consumer_wait(AddCounter(registry, "sluice_dispatcher_consumer_wait_seconds_total",
                               "Time trainers waited for a batch, as reported by clients.")),
      workers_alive(AddGauge(registry, "sluice_dispatcher_workers", "Registered, live workers.")),
      jobs_active(
          AddGauge(registry, "sluice_dispatcher_jobs", "Jobs with an unfinished consumer.")),
      desired_workers(
          AddGauge(registry, "sluice_desired_workers", "Workers the autoscaling policy asks for.")),
      journal_errors(AddCounter(registry, "sluice_dispatcher_journal_errors_total",
                                "Journal appends or compactions that failed.")),
      jobs_collected(AddCounter(registry, "sluice_dispatcher_jobs_collected_total",
                                "Jobs forgotten because their consumers finished or left.")),
      worker_heartbeats(AddCounter(registry, "sluice_dispatcher_worker_heartbeats_total",
                                   "WorkerHeartbeat calls answered.")),
      assignment_wakeups(AddCounter(registry, "sluice_dispatcher_assignment_wakeups_total",
                                    "WatchAssignment calls answered work_available: a worker "
                                    "told of new work before its next heartbeat.")),
      job_batches_returned_(CounterFamily(registry, "sluice_dispatcher_job_batches_returned_total",
                                          "Batches returned to the job's trainers, as reported by "
                                          "clients (label sluice_job).")),
      job_elements_returned_(CounterFamily(
          registry, "sluice_dispatcher_job_elements_returned_total",
          "Elements (images) returned to the job's trainers: batches reported by clients times "
          "the batch size (label sluice_job).")),
      job_consumer_wait_(CounterFamily(registry,
                                       "sluice_dispatcher_job_consumer_wait_seconds_total",
                                       "Time the job's trainers waited for a batch, as reported "
                                       "by clients (label sluice_job).")),
      job_splits_reassigned_(CounterFamily(
          registry, "sluice_dispatcher_job_splits_reassigned_total",
          "The job's splits handed to another worker after a loss or drain (label sluice_job).")),
      job_consumers_(GaugeFamily(registry, "sluice_dispatcher_consumers",
                                 "The job's consumers (trainers) that have not finished "
                                 "(label sluice_job).")),
      job_allocated_workers_(GaugeFamily(registry, "sluice_job_allocated_workers",
                                         "The job's share of the autoscaler's pool, in workers "
                                         "(label sluice_job); sluice status says why.")) {
  // Every reason's series exists from the start (at 0), so rates and dashboards have data.
  for (const char* reason : {"timeout", "unregistered", "restarted"}) {
    workers_lost.Add({{"reason", reason}});
  }
}

std::string DispatcherMetrics::JobLabel(uint64_t job_id, const std::string& job_name) {
  return job_name.empty() ? absl::StrCat("id-", job_id) : job_name;
}

DispatcherMetrics::JobSeries& DispatcherMetrics::ForJob(uint64_t job_id,
                                                        const std::string& job_name) {
  auto [it, inserted] = jobs_.try_emplace(JobLabel(job_id, job_name));
  if (inserted) {
    const MetricLabels labels = {{"sluice_job", it->first}};
    it->second.batches_returned = &job_batches_returned_.Add(labels);
    it->second.elements_returned = &job_elements_returned_.Add(labels);
    it->second.consumer_wait = &job_consumer_wait_.Add(labels);
    it->second.splits_reassigned = &job_splits_reassigned_.Add(labels);
    it->second.consumers = &job_consumers_.Add(labels);
    it->second.allocated_workers = &job_allocated_workers_.Add(labels);
  }
  return it->second;
}

void DispatcherMetrics::KeepOnlyJobs(const std::set<std::string>& live_labels) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (live_labels.contains(it->first)) {
      ++it;
      continue;
    }
    job_batches_returned_.Remove(it->second.batches_returned);
    job_elements_returned_.Remove(it->second.elements_returned);
    job_consumer_wait_.Remove(it->second.consumer_wait);
    job_splits_reassigned_.Remove(it->second.splits_reassigned);
    job_consumers_.Remove(it->second.consumers);
    job_allocated_workers_.Remove(it->second.allocated_workers);
    it = jobs_.erase(it);
  }
}

}  // namespace sluice::dispatcher
