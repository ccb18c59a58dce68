// DispatcherImpl, continued: what the dispatcher reports (gauges, per-job
// metrics, GetStatus) and the autoscaler's decision each tick.

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "dispatcher/dispatcher_impl.h"

namespace sluice::dispatcher {
namespace {

// Records the job's consumers have still to read before it completes: the
// slots of this epoch not done and of the epochs after it, a split's records
// each; 0 when it runs forever (num_epochs 0) or its consumers have no slot
// list (parallel epochs). What AllocateWorkers ranks jobs by.
double RemainingRecords(const DispatcherState::Job& job) {
  const uint64_t epochs = job.config.num_epochs();
  if (epochs == 0) return 0;
  double slots = 0;
  for (const DispatcherState::Consumer& c : job.consumers) {
    if (c.finished) continue;
    if (c.slots.empty()) return 0;
    const double per_epoch = static_cast<double>(c.slots.size());
    slots += per_epoch - static_cast<double>(std::min<uint64_t>(c.done, c.slots.size()));
    if (c.epoch + 1 < epochs) {
      slots += per_epoch * static_cast<double>(epochs - c.epoch - 1);
    }
  }
  return slots * static_cast<double>(job.config.split_size());
}

}  // namespace

void DispatcherImpl::UpdateGauges() {
  int alive = 0;
  for (const auto& [id, worker] : state_.workers()) {
    if (!worker.draining) ++alive;
  }
  int active_jobs = 0;
  for (const auto& [id, job] : state_.jobs()) {
    if (!job.finished()) ++active_jobs;
  }
  // Until the first decision: the workers there are, within the bounds.
  const int desired =
      decided_ ? decision_.desired_workers
               : std::clamp(alive, static_cast<int>(options_.min_workers),
                            static_cast<int>(std::max(options_.min_workers, options_.max_workers)));
  desired_workers_ = desired;
  metrics_.desired_workers.Set(desired);
  metrics_.workers_alive.Set(static_cast<double>(state_.workers().size()));
  metrics_.jobs_active.Set(active_jobs);
  std::set<std::string> live;
  for (const auto& [id, job] : state_.jobs()) {
    const double unfinished = static_cast<double>(
        std::count_if(job.consumers.begin(), job.consumers.end(),
                      [](const DispatcherState::Consumer& c) { return !c.finished; }));
    metrics_.ForJob(job.id, job.name).consumers->Set(unfinished);
    live.insert(DispatcherMetrics::JobLabel(job.id, job.name));
  }
  metrics_.KeepOnlyJobs(live);
}

absl::Duration DispatcherImpl::ConsumerSilence() const {
  return std::max(options_.consumer_silence, 3 * options_.heartbeat_interval + absl::Seconds(2));
}

bool DispatcherImpl::LiveConsumer(uint64_t job_id, const DispatcherState::Consumer& consumer,
                                  absl::Time now) const {
  if (consumer.finished) return false;
  auto it = consumer_signals_.find({job_id, consumer.index});
  // Never reported, left, or silent.
  return it != consumer_signals_.end() && it->second.window_start != absl::InfinitePast() &&
         !it->second.left && now - it->second.last_report < ConsumerSilence();
}

bool DispatcherImpl::DemandLeft(absl::Time now) const {
  if (!decided_) return false;
  for (const JobEstimate& e : decision_.jobs) {
    if (e.consumers == 0) continue;
    const DispatcherState::Job* job = state_.FindJob(e.job_id);
    if (job == nullptr || job->finished()) return true;
    bool live = false;
    for (const DispatcherState::Consumer& c : job->consumers)
      live = live || LiveConsumer(e.job_id, c, now);
    if (!live) return true;
  }
  return false;
}

absl::Status DispatcherImpl::Autoscale(absl::Time now) {
  AutoscalerInput in;
  in.now = now;
  in.starting_workers = starting_workers_;
  for (const auto& [id, worker] : state_.workers()) {
    WorkerSample w;
    w.worker_id = id;
    w.draining = worker.draining;
    w.held_splits = static_cast<int>(worker.slots.size());
    for (const SlotKey& key : worker.slots) {
      const DispatcherState::Slot* slot = state_.FindSlot(key);
      if (slot != nullptr && slot->produced_batches > slot->delivered_batches)
        w.undelivered_batches += slot->produced_batches - slot->delivered_batches;
    }
    auto it = worker_signals_.find(id);
    if (it != worker_signals_.end()) {
      WorkerSignal& signal = it->second;
      w.registered = signal.registered;
      w.last_heartbeat = signal.last_seen;
      w.queue_depth = signal.queue_depth;
      w.queue_capacity = signal.queue_capacity;
      w.blocked_producers = static_cast<int>(signal.blocked_producers);
      // Capacity over the window, per job when the worker reports jobs: a
      // worker that has not produced job j has no measurement of j (its
      // other jobs' cost says nothing about j's). Only a worker that
      // reports totals alone gives them for every job.
      signal.all.Measure();
      for (auto& [job_id, counter] : signal.jobs) {
        counter.Measure();
        if (counter.elements_per_busy_second > 0)
          w.capacity.push_back(
              {.job_id = job_id, .elements_per_busy_second = counter.elements_per_busy_second});
      }
      if (signal.jobs.empty() && signal.all.elements_per_busy_second > 0)
        w.capacity.push_back(
            {.job_id = kAllJobs, .elements_per_busy_second = signal.all.elements_per_busy_second});
    }
    in.workers.push_back(std::move(w));
  }
  for (const auto& [id, job] : state_.jobs()) {
    if (job.finished()) continue;
    const DispatcherState::Dataset* dataset = state_.FindDataset(job.dataset_id);
    in.jobs.push_back({.job_id = id,
                       .batch_size = dataset != nullptr ? dataset->batch_size : uint64_t{1},
                       .priority = job.config.priority(),
                       // uint32 on the wire: above INT_MAX is as outsized as INT_MAX.
                       .min_workers = static_cast<int>(std::min<uint32_t>(
                           job.config.min_workers(), std::numeric_limits<int>::max())),
                       .remaining_elements = RemainingRecords(job)});
    for (const DispatcherState::Consumer& c : job.consumers) {
      if (!LiveConsumer(id, c, now)) continue;
      ConsumerSignal& signal = consumer_signals_.at({id, c.index});
      // The window runs from one report to the newest one, not to `now`:
      // the counters are as of the report, and counting the time since then
      // (up to a heartbeat interval) would understate both the rate and
      // the wait, and demand with them, most in a short first window right
      // after a step.
      // A window that returned exactly one batch is extended to the next
      // report: the consumer's step on that batch has not been seen yet, and
      // the first such window (registration to first batch) is the job's
      // start-up, nearly all wait: its demand, batch / the few ms not
      // waiting, would be the consumer's own start-up speed, not its steps'.
      const double dt = absl::ToDoubleSeconds(signal.last_report - signal.window_start);
      const double longest_idle = signal.window_longest_idle;
      if (dt > 0 && signal.batches_returned_total - signal.window_batches != 1) {
        signal.window_longest_idle = 0;
        signal.batches_per_second =
            static_cast<double>(signal.batches_returned_total - signal.window_batches) / dt;
        signal.window_wait_fraction =
            std::clamp((signal.wait_seconds_total - signal.window_wait) / dt, 0.0, 1.0);
        signal.window_start = signal.last_report;
        signal.window_batches = signal.batches_returned_total;
        signal.window_wait = signal.wait_seconds_total;
      }
      in.consumers.push_back({.job_id = id,
                              .consumer_index = c.index,
                              .batches_per_second = signal.batches_per_second,
                              .wait_fraction = signal.window_wait_fraction,
                              .epoch_started = signal.epoch_started,
                              .previous_epoch_seconds = signal.previous_epoch_seconds,
                              .longest_idle_seconds = longest_idle});
    }
  }
  AutoscalerDecision decision = autoscaler_.Decide(in);
  if (!decided_ || decision.desired_workers != decision_.desired_workers) {
    logger_->info("autoscaler: {}", decision.reason);
  }
  decision_ = std::move(decision);
  decided_ = true;
  last_decision_ = now;
  // A job that left is in no decision: its share is 0 from now on.
  allocation_.clear();
  std::map<uint64_t, double> allocated;
  for (const JobEstimate& e : decision_.jobs) allocated[e.job_id] = e.allocated;
  for (const auto& [id, job] : state_.jobs()) {
    metrics_.ForJob(job.id, job.name).allocated_workers->Set(allocated[id]);
  }
  if (decision_.pool_bound) allocation_ = std::move(allocated);
  std::vector<uint64_t> serving;
  for (const auto& [id, worker] : state_.workers()) {
    if (!worker.draining) serving.push_back(id);
  }
  worker_jobs_ = decision_.pool_bound ? AssignWorkersToJobs(decision_.jobs, serving, worker_jobs_)
                                      : std::map<uint64_t, uint64_t>{};
  if (options_.scaler == DispatcherOptions::Scaler::kLocal) {
    for (uint64_t id : decision_.drain) {
      const DispatcherState::Worker* worker = state_.FindWorker(id);
      if (worker == nullptr || worker->draining) continue;
      proto::Update update;
      update.mutable_drain_worker()->set_worker_id(id);
      RETURN_IF_ERROR(Commit(update));
      logger_->info("autoscaler drains worker {} at {}", id, worker->address);
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoGetStatus(const proto::GetStatusRequest& request,
                                         proto::GetStatusResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (request.starting_workers() >= 0) starting_workers_ = request.starting_workers();
  const AutoscalerOptions& scaler = autoscaler_.options();
  for (const auto& [id, worker] : state_.workers()) {
    proto::WorkerStatus* w = response->add_workers();
    w->set_worker_id(id);
    w->set_address(worker.address);
    w->set_splits(static_cast<uint32_t>(worker.slots.size()));
    std::string state = worker.draining ? "draining" : "active";
    auto it = worker_signals_.find(id);
    if (it != worker_signals_.end()) {
      const WorkerSignal& signal = it->second;
      if (!worker.draining && now - signal.last_seen > scaler.stale_after) state = "stalled";
      w->set_queue_depth(signal.queue_depth);
      w->set_queue_capacity(signal.queue_capacity);
      w->set_elements_per_second(signal.elements_per_second);
      w->set_elements_per_busy_second(signal.all.elements_per_busy_second);
      if (signal.registered != absl::InfinitePast())
        w->set_age_seconds(absl::ToDoubleSeconds(now - signal.registered));
    }
    w->set_state(state);
    auto assigned = worker_jobs_.find(id);
    if (assigned != worker_jobs_.end()) w->set_assigned_job_id(assigned->second);
  }
  int alive = 0;
  for (const auto& [id, worker] : state_.workers()) {
    if (!worker.draining) ++alive;
  }
  response->set_desired_workers(desired_workers_);
  response->set_current_workers(decided_ ? decision_.current_workers : alive + starting_workers_);
  response->set_reason(decided_ ? decision_.reason : "no decision yet");
  response->set_scaler(options_.scaler == DispatcherOptions::Scaler::kLocal ? "local" : "none");
  for (uint64_t id : decision_.drain) response->add_drain(id);
  response->set_min_workers(options_.min_workers);
  response->set_max_workers(options_.max_workers);
  response->set_pool_bound(decided_ && decision_.pool_bound);
  for (const auto& [id, job] : state_.jobs()) {
    proto::JobStatus* j = response->add_jobs();
    j->set_job_id(id);
    j->set_job_name(job.name);
    const DispatcherState::Dataset* dataset = state_.FindDataset(job.dataset_id);
    j->set_batch_size(dataset != nullptr ? dataset->batch_size : 0);
    j->set_num_epochs(job.config.num_epochs());
    bool estimated = false;
    for (const JobEstimate& e : decision_.jobs) {
      if (e.job_id != id) continue;
      estimated = true;
      j->set_demand_elements_per_second(e.demand);
      j->set_capacity_elements_per_second(e.capacity);
      j->set_need_workers(e.need);
      j->set_allocated_workers(e.allocated);
      j->set_allocation_reason(e.allocation_reason);
    }
    if (!estimated) {  // in no decision yet, or not in the last one
      j->set_allocation_reason(
          "no demand: none of its consumers is reading (finished, left, silent or not started)");
    }
    j->set_priority(job.config.priority());
    j->set_min_workers(job.config.min_workers());
    j->set_share_group(ShareGroupOf(job));
    for (const DispatcherState::Job* peer : SharePeers(job)) j->add_shares_with(peer->id);
    for (const DispatcherState::Consumer& c : job.consumers) {
      proto::ConsumerStatus* cs = j->add_consumers();
      cs->set_consumer_index(c.index);
      cs->set_epoch(c.epoch);
      cs->set_finished(c.finished);
      cs->set_splits_done(c.done);
      cs->set_splits(c.slots.size());
      cs->set_paused(Behind(c));
      auto it = consumer_signals_.find({id, c.index});
      if (it != consumer_signals_.end()) {
        cs->set_batches_per_second(it->second.batches_per_second);
        cs->set_wait_fraction(it->second.window_wait_fraction);
        const absl::Duration silent = now - it->second.last_report;
        if (!c.finished && it->second.last_report != absl::InfinitePast() &&
            silent >= ConsumerSilence()) {
          cs->set_silent_seconds(absl::ToDoubleSeconds(silent));
        }
      }
    }
  }
  FillCacheStatus(request, response);
  return absl::OkStatus();
}

int DispatcherImpl::desired_workers() const {
  absl::MutexLock lock(&mu_);
  return desired_workers_;
}

}  // namespace sluice::dispatcher
