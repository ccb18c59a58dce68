#include "dispatcher/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace sluice::dispatcher {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The relative spread of measurements that should agree (the workers'
// capacities for a job, a job's consumers' demands), pooled over the jobs:
// each sample's deviation from its job's mean, relative to that mean, so a job
// with one consumer borrows the spread the others show.
class PooledSpread {
 public:
  void Add(uint64_t job_id, const std::vector<double>& samples) {
    n_[job_id] = samples.size();
    if (samples.size() < 2) return;
    double mean = 0;
    for (double x : samples) mean += x;
    mean /= static_cast<double>(samples.size());
    if (mean <= 0) return;
    for (double x : samples) squares_ += (x / mean - 1) * (x / mean - 1);
    degrees_of_freedom_ += samples.size() - 1;
  }

  // The standard error of job_id's mean, relative to it; -1 when fewer than
  // two degrees of freedom were pooled (two equal measurements by chance
  // would read as no noise at all).
  double StandardError(uint64_t job_id) const {
    auto n = n_.find(job_id);
    if (degrees_of_freedom_ < 2 || n == n_.end() || n->second == 0) return -1;
    return std::sqrt(squares_ / static_cast<double>(degrees_of_freedom_) /
                     static_cast<double>(n->second));
  }

 private:
  double squares_ = 0;
  size_t degrees_of_freedom_ = 0;
  std::map<uint64_t, size_t> n_;
};

// The capacity a worker reports for `job_id`: its own entry, else its
// all-jobs entry, else 0 (not measured).
double CapacityFor(const WorkerSample& w, uint64_t job_id) {
  double all = 0;
  for (const JobCapacity& c : w.capacity) {
    if (c.job_id == job_id && job_id != kAllJobs) {
      return c.elements_per_busy_second;
    }
    if (c.job_id == kAllJobs) all = c.elements_per_busy_second;
  }
  return all;
}

// ceil() that ignores floating-point dust: 8.0000000001 workers is 8.
int CeilWorkers(double x) {
  if (x <= 0) return 0;
  return static_cast<int>(std::ceil(x - 1e-9));
}

}  // namespace

Autoscaler::Autoscaler(AutoscalerOptions options)
    : options_(std::move(options)) {}

AutoscalerDecision Autoscaler::Decide(const AutoscalerInput& input) {
  const AutoscalerOptions& o = options_;
  const absl::Time now = input.now;
  const int min_workers = std::max(0, o.min_workers);
  const int max_workers = std::max(min_workers, o.max_workers);
  AutoscalerDecision d;
  std::vector<std::string> notes;

  // Workers: who counts, who is measured.
  int registered = 0, warming = 0;
  std::vector<const WorkerSample*> warm, warming_workers;
  std::set<uint64_t> stalled;
  for (const WorkerSample& w : input.workers) {
    if (w.draining) continue;
    ++registered;
    const bool stale = now - w.last_heartbeat > o.stale_after &&
                       now - w.registered > o.stale_after;
    if (stale) {
      stalled.insert(w.worker_id);
    } else if (now - w.registered < o.warmup) {
      ++warming;
      warming_workers.push_back(&w);
    } else {
      warm.push_back(&w);
    }
  }
  d.current_workers = registered + std::max(0, input.starting_workers);
  const int current = d.current_workers;

  // Jobs with live consumers, and their demand.
  std::map<uint64_t, uint64_t> batch_size;
  for (const JobSample& j : input.jobs) {
    batch_size[j.job_id] = std::max<uint64_t>(1, j.batch_size);
  }
  std::map<uint64_t, JobEstimate> jobs;
  std::map<std::pair<uint64_t, uint32_t>, double> consumer_demand;
  std::map<uint64_t, std::vector<double>> demands_by_job;
  int unknown_job_consumers = 0;
  for (const ConsumerSample& c : input.consumers) {
    auto bs = batch_size.find(c.job_id);
    if (bs == batch_size.end()) {
      ++unknown_job_consumers;
      continue;
    }
    const auto key = std::make_pair(c.job_id, c.consumer_index);
    const double busy = std::max(o.min_busy_fraction,
                                 1.0 - std::clamp(c.wait_fraction, 0.0, 1.0));
    double demand = std::max(0.0, c.batches_per_second) / busy *
                    static_cast<double>(bs->second);
    auto previous = consumer_demand_.find(key);
    if (now - c.epoch_started < o.epoch_grace &&
        previous != consumer_demand_.end()) {
      demand = previous->second;
    }
    consumer_demand[key] = demand;
    demands_by_job[c.job_id].push_back(demand);
    JobEstimate& e = jobs[c.job_id];
    e.job_id = c.job_id;
    ++e.consumers;
    e.demand += demand;
  }
  consumer_demand_ = std::move(consumer_demand);
  if (unknown_job_consumers > 0) {
    notes.push_back(absl::StrCat(unknown_job_consumers,
                                 " consumer(s) of unknown jobs ignored"));
  }

  // Capacity per job: the mean over warm workers with outliers replaced by
  // the median. When no warm worker measured the job (the first workers of
  // a cluster that just started, all of them new), the warming workers'
  // measurements are used rather than none: waiting out the warm-up would
  // delay the first decision after a step by `warmup` (3 periods), and a
  // cold worker's lower rate errs towards more workers, which the next
  // periods correct.
  std::set<uint64_t> slow;
  PooledSpread capacity_spread;
  std::vector<double> all_values;
  int jobs_measured_warming = 0;
  for (auto& [job_id, e] : jobs) {
    std::vector<std::pair<uint64_t, double>> values;
    for (const WorkerSample* w : warm) {
      const double c = CapacityFor(*w, job_id);
      if (c > 0) values.emplace_back(w->worker_id, c);
    }
    if (values.empty()) {
      for (const WorkerSample* w : warming_workers) {
        const double c = CapacityFor(*w, job_id);
        if (c > 0) values.emplace_back(w->worker_id, c);
      }
      if (!values.empty()) ++jobs_measured_warming;
    }
    if (values.empty()) continue;
    std::vector<double> raw;
    for (const auto& v : values) raw.push_back(v.second);
    const double median = Median(raw);
    std::vector<double> counted;
    for (const auto& [id, c] : values) {
      if (c < median * o.outlier_ratio) {
        slow.insert(id);
        counted.push_back(median);
      } else if (c * o.outlier_ratio > median) {
        counted.push_back(median);
      } else {
        counted.push_back(c);
      }
    }
    double sum = 0;
    for (double c : counted) sum += c;
    e.capacity = sum / static_cast<double>(values.size());
    capacity_spread.Add(job_id, counted);
    last_capacity_[job_id] = e.capacity;
    all_values.push_back(e.capacity);
  }
  if (!all_values.empty()) last_any_capacity_ = Median(all_values);
  // Jobs no warm worker measured: their last capacity, else what the other
  // jobs cost (a new job's first period), else the last one seen at all.
  std::vector<uint64_t> unmeasured;
  for (auto& [job_id, e] : jobs) {
    if (e.capacity > 0) continue;
    auto last = last_capacity_.find(job_id);
    if (last != last_capacity_.end()) {
      e.capacity = last->second;
    } else if (!all_values.empty()) {
      e.capacity = Median(all_values);
      unmeasured.push_back(job_id);
    } else if (last_any_capacity_ > 0) {
      e.capacity = last_any_capacity_;
      unmeasured.push_back(job_id);
    } else if (e.demand > 0) {
      unmeasured.push_back(job_id);
    }
  }
  bool need_known = true;
  double need = 0;
  std::map<uint64_t, double> need_by_job;
  for (auto& [job_id, e] : jobs) {
    if (e.demand > 0 && e.capacity <= 0) {
      need_known = false;
      continue;
    }
    e.need = e.demand > 0 ? e.demand / e.capacity : 0;
    need += e.need;
    need_by_job[job_id] = e.need;
  }
  for (const auto& [id, e] : jobs) d.jobs.push_back(e);
  d.need = need;

  // Headroom from the measurements' own noise: need's relative standard
  // error, from the spread of the workers' capacities and of the consumers'
  // demands (data-parallel trainers of a job share a step time), × noise_z,
  // within [min_headroom, headroom]. The same margin, at most headroom - 1,
  // widens the band in which the count holds: up only when need exceeds the
  // count by more than the noise, down only to a count that keeps it. The cap
  // keeps trainers that genuinely differ (one paused, another job's step
  // time) from reading as noise so large that nothing scales up.
  double headroom = o.headroom;
  double noise = 0;  // z × need's relative standard error, as measured
  if (o.noise_z > 0 && need > 0) {
    // For the headroom, a spread that cannot be read counts as the one the
    // fixed headroom stands for, so a job with one consumer keeps `headroom`
    // and another job's measured noise still narrows the pool's. The band
    // (below) widens only by what was measured.
    const double assumed = (o.headroom - 1) / o.noise_z;
    PooledSpread demand_spread;
    for (const auto& [job_id, demands] : demands_by_job) {
      demand_spread.Add(job_id, demands);
    }
    double variance = 0;
    double measured_variance = 0;
    for (const auto& [job_id, e] : jobs) {
      if (e.need <= 0) continue;
      const double weight = e.need * e.need;
      for (double error : {demand_spread.StandardError(job_id),
                           capacity_spread.StandardError(job_id)}) {
        if (error < 0) {
          variance += weight * assumed * assumed;
        } else {
          variance += weight * error * error;
          measured_variance += weight * error * error;
        }
      }
    }
    headroom = std::clamp(1 + o.noise_z * std::sqrt(variance) / need,
                          std::min(o.min_headroom, o.headroom), o.headroom);
    noise = std::clamp(o.noise_z * std::sqrt(measured_variance) / need, 0.0,
                       std::max(0.0, o.headroom - 1));
  }
  d.headroom = headroom;

  // History for scale-downs: only jobs that still have consumers count, so
  // demand that left leaves at once.
  if (first_call_ == absl::InfinitePast()) first_call_ = now;
  if (need_known) history_.push_back({now, need_by_job, headroom});
  while (!history_.empty() &&
         now - history_.front().time >= o.scale_down_window) {
    history_.pop_front();
  }
  // The largest need × headroom over the window: a scale-up's own target
  // (taken with the noisier headroom of a step) holds for the whole window.
  double stable_need = need;
  double stable_headroom = headroom;
  for (const HistoryEntry& h : history_) {
    double sum = 0;
    for (const auto& [job_id, n] : h.need_by_job) {
      if (jobs.contains(job_id)) sum += n;
    }
    if (sum * h.headroom > stable_need * stable_headroom) {
      stable_need = sum;
      stable_headroom = h.headroom;
    }
  }

  // Why: the estimate in one line.
  std::vector<std::string> parts;
  for (const auto& [job_id, e] : jobs) {
    if (e.capacity > 0) {
      parts.push_back(
          absl::StrFormat("job %d: %.0f el/s / %.0f el/s per worker", job_id,
                          e.demand, e.capacity));
    } else {
      parts.push_back(absl::StrFormat("job %d: %.0f el/s, capacity unknown",
                                      job_id, e.demand));
    }
  }
  const std::string estimate = absl::StrFormat(
      "need %.2f workers (%s) x %.2f headroom", need,
      parts.empty() ? "no consumer" : absl::StrJoin(parts, "; "), headroom);

  int desired = current;
  std::string verdict;
  const int target = CeilWorkers(need * headroom);
  if (!need_known) {
    desired = std::max(current, jobs.empty() ? 0 : 1);
    verdict = absl::StrCat("capacity not measured yet (", warming,
                           " warming up, ", warm.size(), " warm); ", estimate);
  } else if (need > current * o.scale_up_utilization * (1 + noise) &&
             target > current) {
    // Veto: trainers do not wait and every warm worker's queue is full.
    bool any_wait = false;
    for (const ConsumerSample& c : input.consumers) {
      any_wait |= c.wait_fraction > o.idle_wait_fraction;
    }
    bool all_full = !warm.empty();
    for (const WorkerSample* w : warm) {
      const bool full =
          w->blocked_producers > 0 ||
          (w->queue_capacity > 0 &&
           static_cast<double>(w->queue_depth) >=
               o.full_queue_fraction * static_cast<double>(w->queue_capacity));
      all_full &= full;
    }
    if (!any_wait && all_full) {
      verdict = absl::StrCat(
          "hold ", current, ": ", estimate, " = ", target,
          ", but no trainer waits and every worker's output queue is full");
    } else {
      const int cap = static_cast<int>(
          std::floor(std::max(1, current) * o.max_scale_up_factor + 1e-9));
      desired = std::min(target, cap);
      verdict = absl::StrCat("up ", current, " -> ", desired, ": ", estimate,
                             " = ", target);
      if (desired < target) {
        absl::StrAppend(&verdict, ", capped at x", o.max_scale_up_factor);
      }
      // Workers were lost since the last decision but the need is still
      // within the band that held that count: replace them one for one.
      // Rounding need x headroom up again would add a worker whenever the
      // noise lifts the need past count / headroom (8.53 workers of need
      // read as 8.6 x 1.05 = 9.03 -> 10 instead of the 9 there were).
      if (current < last_desired_ && need <= last_desired_ &&
          desired > last_desired_) {
        desired = last_desired_;
        verdict = absl::StrFormat(
            "up %d -> %d: replace lost workers, %s within the band of %d",
            current, desired, estimate, last_desired_);
      }
    }
  } else {
    // The down band mirrors the up band: the count scaled down to keeps a
    // noise margin too, else a scale-up whose measurement came out a little
    // high is trimmed by one worker a window later (a direction change).
    const int stable_target =
        std::clamp(CeilWorkers(stable_need * stable_headroom / (1 - noise)),
                   min_workers, max_workers);
    // Until a whole window was seen (a restarted dispatcher), only demand
    // that left can scale down.
    const bool window_seen = now - first_call_ >= o.scale_down_window;
    if (stable_target < current && !window_seen && !jobs.empty()) {
      verdict = absl::StrCat("hold ", current, ": ", estimate, " = ", target,
                             "; no scale-down before ",
                             absl::FormatDuration(o.scale_down_window),
                             " of measurements");
    } else if (stable_target < current) {
      if (now - last_scale_down_ >= o.period) {
        desired = stable_target;
        verdict = jobs.empty()
                      ? absl::StrFormat("down %d -> %d: no live consumer",
                                        current, desired)
                      : absl::StrFormat(
                            "down %d -> %d: largest need over the last %s "
                            "%.2f workers x %.2f headroom; now %s",
                            current, desired,
                            absl::FormatDuration(o.scale_down_window),
                            stable_need, stable_headroom, estimate);
      } else {
        verdict =
            absl::StrCat("hold ", current,
                         ": scaled down less than a period ago; ", estimate);
      }
    } else {
      verdict = absl::StrCat("hold ", current, ": ", estimate, " = ", target);
      if (stable_target > target) {
        absl::StrAppend(
            &verdict,
            absl::StrFormat(" (%.2f x %.2f seen in the last %s)", stable_need,
                            stable_headroom,
                            absl::FormatDuration(o.scale_down_window)));
      }
    }
  }
  if (desired > max_workers) {
    desired = max_workers;
    notes.push_back(absl::StrCat("limited to max_workers ", max_workers));
  }
  if (desired < min_workers) {
    desired = min_workers;
    notes.push_back(absl::StrCat("kept at min_workers ", min_workers));
  }
  if (desired < current) last_scale_down_ = now;
  d.desired_workers = desired;
  last_desired_ = desired;

  // Who is least useful.
  for (uint64_t id : stalled) d.replace.push_back(id);
  for (uint64_t id : slow) d.replace.push_back(id);
  if (!stalled.empty()) {
    notes.push_back(absl::StrCat("stalled (no heartbeat): worker ",
                                 absl::StrJoin(stalled, ", ")));
  }
  if (!slow.empty()) {
    notes.push_back(absl::StrCat("slow outlier counted as the median: worker ",
                                 absl::StrJoin(slow, ", ")));
  }
  if (warming > 0 && need_known) {
    notes.push_back(absl::StrCat(warming, " warming up"));
  }
  if (jobs_measured_warming > 0) {
    notes.push_back(absl::StrCat(jobs_measured_warming,
                                 " job(s) measured on warming workers only"));
  }
  const int surplus = registered - desired;
  if (surplus > 0) {
    std::vector<const WorkerSample*> order;
    for (const WorkerSample& w : input.workers) {
      if (!w.draining) order.push_back(&w);
    }
    auto rank = [&](const WorkerSample* w) {
      return std::make_tuple(!stalled.contains(w->worker_id),
                             !slow.contains(w->worker_id), w->held_splits,
                             w->undelivered_batches);
    };
    std::sort(order.begin(), order.end(),
              [&](const WorkerSample* a, const WorkerSample* b) {
                if (rank(a) != rank(b)) return rank(a) < rank(b);
                // Then the newest (it has the least warm state), then the
                // highest id.
                if (a->registered != b->registered) {
                  return a->registered > b->registered;
                }
                return a->worker_id > b->worker_id;
              });
    for (int i = 0; i < surplus; ++i) d.drain.push_back(order[i]->worker_id);
  }
  d.reason = verdict;
  if (!notes.empty())
    absl::StrAppend(&d.reason, "; ", absl::StrJoin(notes, "; "));
  return d;
}

}  // namespace sluice::dispatcher
