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

// The workers the jobs' min_workers add up to.
double TotalReserved(const std::vector<JobEstimate>& jobs) {
  double total = 0;
  for (const JobEstimate& j : jobs) total += std::max(0, j.min_workers);
  return total;
}

std::vector<JobEstimate> JobsOf(const std::map<uint64_t, JobEstimate>& jobs) {
  std::vector<JobEstimate> out;
  for (const auto& [id, job] : jobs) out.push_back(job);
  return out;
}

// The estimate in one line: "need 8.00 workers (job 1: 1024 el/s / 128 el/s
// per worker) x 1.05 headroom".
std::string Describe(const std::map<uint64_t, JobEstimate>& jobs, double need, double headroom) {
  std::vector<std::string> parts;
  for (const auto& [job_id, job] : jobs) {
    if (job.capacity > 0) {
      parts.push_back(absl::StrFormat("job %d: %.0f el/s / %.0f el/s per worker", job_id,
                                      job.demand, job.capacity));
    } else {
      parts.push_back(absl::StrFormat("job %d: %.0f el/s, capacity unknown", job_id, job.demand));
    }
  }
  return absl::StrFormat("need %.2f workers (%s) x %.2f headroom", need,
                         parts.empty() ? "no consumer" : absl::StrJoin(parts, "; "), headroom);
}

}  // namespace

// What CountWorkers() found: who counts, who is measured.
struct Autoscaler::Census {
  int registered = 0;
  int warming = 0;
  std::vector<const WorkerSample*> warm;
  std::vector<const WorkerSample*> warming_workers;
  std::set<uint64_t> stalled;
};

// What the estimate steps of Decide() fill in, in order.
struct Autoscaler::Estimate {
  std::map<uint64_t, JobEstimate> jobs;  // jobs with live consumers
  std::map<uint64_t, std::vector<double>> demands_by_job;
  std::set<uint64_t> slow;  // outlier-slow workers
  PooledSpread capacity_spread;
  std::vector<double> measured_capacities;  // one per measured job
  int jobs_measured_warming = 0;
  bool need_known = true;
  double need = 0;
  double headroom = 0;
  double noise = 0;  // z × need's relative standard error, as measured
  // The largest need × headroom over the scale-down window.
  double stable_need = 0;
  double stable_headroom = 0;
  absl::Time time;                        // the decision's
  std::vector<uint64_t> confirmed_drops;  // ForgetConfirmedDrops(): readings agree
  std::vector<uint64_t> falling_drops;    // ForgetConfirmedDrops(): readings fall
  std::set<uint64_t> paused_jobs;         // a consumer paused (EstimateDemand)
  // Unfinished jobs none of whose consumers this autoscaler has heard from
  // (EstimateDemand): after a restart, their demand is unknown, not gone.
  std::vector<uint64_t> unheard_jobs;
  // Jobs with a consumer whose reading shows nothing (no batch, no wait) and
  // that has no earlier estimate here (EstimateDemand): a paused trainer, or
  // one whose first window since it registered, or since this dispatcher
  // started, covers no time yet.
  std::set<uint64_t> unread_jobs;
  std::string description;  // "need 8.00 workers (...) x 1.05 headroom"
};

Autoscaler::Autoscaler(AutoscalerOptions options) : options_(std::move(options)) {}

Autoscaler::Census Autoscaler::CountWorkers(const AutoscalerInput& input) const {
  const AutoscalerOptions& o = options_;
  Census census;
  for (const WorkerSample& w : input.workers) {
    if (w.draining) continue;
    ++census.registered;
    const bool stale =
        input.now - w.last_heartbeat > o.stale_after && input.now - w.registered > o.stale_after;
    if (stale) {
      census.stalled.insert(w.worker_id);
    } else if (input.now - w.registered < o.warmup) {
      ++census.warming;
      census.warming_workers.push_back(&w);
    } else {
      census.warm.push_back(&w);
    }
  }
  return census;
}

void Autoscaler::EstimateDemand(const AutoscalerInput& input, Estimate& e,
                                std::vector<std::string>& notes) {
  const AutoscalerOptions& o = options_;
  std::map<uint64_t, const JobSample*> job_samples;
  for (const JobSample& j : input.jobs) job_samples[j.job_id] = &j;
  std::map<std::pair<uint64_t, uint32_t>, double> consumer_demand;
  std::map<uint64_t, double> remaining_elements;
  std::set<uint64_t> starved_jobs;
  int unknown_job_consumers = 0;
  for (const ConsumerSample& c : input.consumers) {
    auto sample = job_samples.find(c.job_id);
    if (sample == job_samples.end()) {
      ++unknown_job_consumers;
      continue;
    }
    const auto key = std::make_pair(c.job_id, c.consumer_index);
    const double busy = std::max(o.min_busy_fraction, 1.0 - std::clamp(c.wait_fraction, 0.0, 1.0));
    const uint64_t batch_size = std::max<uint64_t>(1, sample->second->batch_size);
    double demand = std::max(0.0, c.batches_per_second) / busy * static_cast<double>(batch_size);
    auto previous = consumer_demand_.find(key);
    // A trainer that got nothing and waited (its job was given no worker, or
    // too few to deliver a batch in the window) shows no demand: the last
    // estimate stands, if any. Waiting only part of the window counts too: a
    // trainer that paused, then waited, still asked.
    const bool starved = c.batches_per_second <= 0 && c.wait_fraction > o.idle_wait_fraction;
    const bool known = previous != consumer_demand_.end() && previous->second > 0;
    const bool short_epochs = c.previous_epoch_seconds > 0 &&
                              c.previous_epoch_seconds < absl::ToDoubleSeconds(o.epoch_grace);
    const bool refilling = input.now - c.epoch_started < o.epoch_grace && !short_epochs;
    if ((refilling || starved) && known) {
      demand = previous->second;
    } else if (starved) {
      starved_jobs.insert(c.job_id);
    }
    // Nothing returned and no wait: the trainer did not ask (a checkpoint, an
    // evaluation). Its reading counts (the window holds the demand before the
    // pause), but a pause is not a lower demand: it confirms no drop. So does
    // a pause in part of the window: a stretch without a batch or a wait much
    // longer than the trainer's step (the shorter of this reading's and the
    // last one's: a pause lengthens the step this reading shows).
    const double fastest = std::max(demand, known ? previous->second : 0.0);
    const double idle_limit =
        std::max(fastest > 0 ? o.pause_idle_steps * static_cast<double>(batch_size) / fastest : 0.0,
                 o.drop_tolerance * absl::ToDoubleSeconds(o.period));
    const bool nothing = c.batches_per_second <= 0 && c.wait_fraction <= o.idle_wait_fraction;
    if (nothing || c.longest_idle_seconds > idle_limit) {
      e.paused_jobs.insert(c.job_id);
    }
    if (nothing && !known) e.unread_jobs.insert(c.job_id);
    consumer_demand[key] = demand;
    e.demands_by_job[c.job_id].push_back(demand);
    JobEstimate& job = e.jobs[c.job_id];
    job.job_id = c.job_id;
    job.priority = sample->second->priority;
    job.min_workers = std::max(0, sample->second->min_workers);
    remaining_elements[c.job_id] = sample->second->remaining_elements;
    ++job.consumers;
    job.demand += demand;
  }
  consumer_demand_ = std::move(consumer_demand);
  std::set<uint64_t> heard;
  for (const JobSample& j : input.jobs) {
    if (e.jobs.contains(j.job_id) || heard_jobs_.contains(j.job_id)) {
      heard.insert(j.job_id);
    } else {
      e.unheard_jobs.push_back(j.job_id);
    }
  }
  heard_jobs_ = std::move(heard);
  for (auto& [job_id, job] : e.jobs) {
    job.starved = starved_jobs.contains(job_id) && job.demand <= 0;
    const double remaining = remaining_elements[job_id];
    if (remaining > 0 && job.demand > 0) {
      job.remaining_seconds = remaining / job.demand;
    }
  }
  if (unknown_job_consumers > 0) {
    notes.push_back(absl::StrCat(unknown_job_consumers, " consumer(s) of unknown jobs ignored"));
  }
}

// Capacity per job: the mean over warm workers with outliers replaced by the
// median. When no warm worker measured the job (the first workers of a
// cluster that just started, all of them new), the warming workers'
// measurements are used rather than none: waiting out the warm-up would delay
// the first decision after a step by `warmup` (3 periods), and a cold
// worker's lower rate errs towards more workers, which the next periods
// correct.
void Autoscaler::EstimateCapacity(const Census& census, Estimate& e) {
  const AutoscalerOptions& o = options_;
  for (auto& [job_id, job] : e.jobs) {
    std::vector<std::pair<uint64_t, double>> values;
    for (const WorkerSample* w : census.warm) {
      const double c = CapacityFor(*w, job_id);
      if (c > 0) values.emplace_back(w->worker_id, c);
    }
    if (values.empty()) {
      for (const WorkerSample* w : census.warming_workers) {
        const double c = CapacityFor(*w, job_id);
        if (c > 0) values.emplace_back(w->worker_id, c);
      }
      if (!values.empty()) ++e.jobs_measured_warming;
    }
    if (values.empty()) continue;
    std::vector<double> raw;
    for (const auto& v : values) raw.push_back(v.second);
    const double median = Median(raw);
    std::vector<double> counted;
    for (const auto& [id, c] : values) {
      if (c < median * o.outlier_ratio) {
        e.slow.insert(id);
        counted.push_back(median);
      } else if (c * o.outlier_ratio > median) {
        counted.push_back(median);
      } else {
        counted.push_back(c);
      }
    }
    double sum = 0;
    for (double c : counted) sum += c;
    job.capacity = sum / static_cast<double>(values.size());
    e.capacity_spread.Add(job_id, counted);
    last_capacity_[job_id] = job.capacity;
    e.measured_capacities.push_back(job.capacity);
  }
  if (!e.measured_capacities.empty()) {
    last_any_capacity_ = Median(e.measured_capacities);
  }
}

// Jobs no warm worker measured: their last capacity, else what the other jobs
// cost (a new job's first period), else the last one seen at all.
void Autoscaler::FillUnmeasuredCapacity(Estimate& e) const {
  for (auto& [job_id, job] : e.jobs) {
    if (job.capacity > 0) continue;
    auto last = last_capacity_.find(job_id);
    if (last != last_capacity_.end()) {
      job.capacity = last->second;
    } else if (!e.measured_capacities.empty()) {
      job.capacity = Median(e.measured_capacities);
    } else if (last_any_capacity_ > 0) {
      job.capacity = last_any_capacity_;
    }
  }
}

void Autoscaler::SumNeed(Estimate& e) const {
  for (auto& [job_id, job] : e.jobs) {
    if (job.demand > 0 && job.capacity <= 0) {
      e.need_known = false;
      continue;
    }
    job.need = job.demand > 0 ? job.demand / job.capacity : 0;
    e.need += job.need;
  }
}

// Headroom from the measurements' own noise: need's relative standard error,
// from the spread of the workers' capacities and of the consumers' demands
// (data-parallel trainers of a job share a step time), × noise_z, within
// [min_headroom, headroom]. The same margin, at most headroom - 1, widens the
// band in which the count holds: up only when need exceeds the count by more
// than the noise, down only to a count that keeps it. The cap keeps trainers
// that genuinely differ (one paused, another job's step time) from reading as
// noise so large that nothing scales up.
void Autoscaler::MeasureNoise(Estimate& e) const {
  const AutoscalerOptions& o = options_;
  e.headroom = o.headroom;
  e.noise = 0;
  if (o.noise_z <= 0 || e.need <= 0) return;
  // For the headroom, a spread that cannot be read counts as the one the
  // fixed headroom stands for, so a job with one consumer keeps `headroom`
  // and another job's measured noise still narrows the pool's. The band
  // widens only by what was measured.
  const double assumed = (o.headroom - 1) / o.noise_z;
  PooledSpread demand_spread;
  for (const auto& [job_id, demands] : e.demands_by_job) {
    demand_spread.Add(job_id, demands);
  }
  double variance = 0;
  double measured_variance = 0;
  for (const auto& [job_id, job] : e.jobs) {
    if (job.need <= 0) continue;
    const double weight = job.need * job.need;
    for (double error :
         {demand_spread.StandardError(job_id), e.capacity_spread.StandardError(job_id)}) {
      if (error < 0) {
        variance += weight * assumed * assumed;
      } else {
        variance += weight * error * error;
        measured_variance += weight * error * error;
      }
    }
  }
  e.headroom = std::clamp(1 + o.noise_z * std::sqrt(variance) / e.need,
                          std::min(o.min_headroom, o.headroom), o.headroom);
  e.noise = std::clamp(o.noise_z * std::sqrt(measured_variance) / e.need, 0.0,
                       std::max(0.0, o.headroom - 1));
}

// History for scale-downs: only jobs that still have consumers count, so
// demand that left leaves at once. The largest need × headroom over the
// window, each past demand divided by the job's capacity now: a scale-up's own
// target (taken with the noisier headroom of a step) holds for the whole
// window, but workers that became faster per element (the pipeline's cost
// fell, a slow worker recovered) count at their new capacity at once. Only
// the trainers' side can pause for a while and come back (a checkpoint, an
// evaluation); the capacity is measured on the workers, averaged over them,
// and its noise is in the band's margin.
void Autoscaler::RecordHistory(absl::Time now, Estimate& e) {
  if (first_call_ == absl::InfinitePast()) first_call_ = now;
  e.time = now;
  if (e.need_known) {
    std::map<uint64_t, double> demand_by_job;
    for (const auto& [job_id, job] : e.jobs) demand_by_job[job_id] = job.demand;
    history_.push_back({now, std::move(demand_by_job), e.headroom, e.paused_jobs});
  }
  while (!history_.empty() && now - history_.front().time >= options_.scale_down_window) {
    history_.pop_front();
  }
  ForgetConfirmedDrops(e);
  e.stable_need = e.need;
  e.stable_headroom = e.headroom;
  for (const HistoryEntry& h : history_) {
    double sum = 0;
    for (const auto& [job_id, demand] : h.demand_by_job) {
      auto job = e.jobs.find(job_id);
      if (job != e.jobs.end() && job->second.capacity > 0) {
        sum += demand / job->second.capacity;
      }
    }
    if (sum * h.headroom > e.stable_need * e.stable_headroom) {
      e.stable_need = sum;
      e.stable_headroom = h.headroom;
    }
  }
}

// A job's demand that fell and stayed down is not a pause: when the last two
// readings, at least half a period apart, are both lower than every earlier
// reading of the window by more than `drop_tolerance`, and
//   - agree within it: the earlier readings are forgotten, the two kept;
//   - or the last is lower than the one before by more than it: the demand
//     fell in two steps, or in one that began inside the period before, whose
//     reading mixes the two levels; everything before the last is forgotten,
// so the scale-down follows in this decision rather than after the window.
// A pause (a checkpoint, an evaluation) does not look like this: a reading
// with a pause in it (EstimateDemand: a stretch without a batch or a wait of
// several steps) confirms nothing, so the window holds the demand before the
// pause, as it always did.
void Autoscaler::ForgetConfirmedDrops(Estimate& e) {
  const double tolerance = options_.drop_tolerance;
  if (tolerance <= 0 || history_.size() < 3) return;
  const HistoryEntry& last = history_[history_.size() - 1];
  const HistoryEntry& before = history_[history_.size() - 2];
  if (last.time != e.time || last.time - before.time < options_.period / 2) return;
  for (const auto& [job_id, job] : e.jobs) {
    auto a = last.demand_by_job.find(job_id);
    auto b = before.demand_by_job.find(job_id);
    if (a == last.demand_by_job.end() || b == before.demand_by_job.end()) continue;
    if (a->second <= 0 || b->second <= 0) continue;
    if (last.paused_jobs.contains(job_id) || before.paused_jobs.contains(job_id)) continue;
    const bool agree = std::abs(a->second / b->second - 1) <= tolerance;
    const bool falling = a->second < b->second * (1 - tolerance);
    if (!agree && !falling) continue;
    const double level = std::max(a->second, b->second);
    double earlier = 0;
    bool any = false;
    for (size_t i = 0; i + 2 < history_.size(); ++i) {
      auto d = history_[i].demand_by_job.find(job_id);
      if (d == history_[i].demand_by_job.end()) continue;
      earlier = std::max(earlier, d->second);
      any = true;
    }
    if (!any || level >= earlier * (1 - tolerance)) continue;
    const size_t kept = falling ? 1 : 2;
    for (size_t i = 0; i + kept < history_.size(); ++i) {
      history_[i].demand_by_job.erase(job_id);
    }
    (falling ? e.falling_drops : e.confirmed_drops).push_back(job_id);
  }
}

int Autoscaler::ScaleDownTarget(double need, double headroom, bool noise_measured) const {
  const AutoscalerOptions& o = options_;
  const int most = CeilWorkers(need * headroom);
  if (!noise_measured || o.max_expected_shortfall <= 0 || o.noise_z <= 0 || headroom <= 1) {
    return most;
  }
  const double sd = need * (headroom - 1) / o.noise_z;
  for (int n = std::max(1, CeilWorkers(need)); n < most; ++n) {
    // E[max(0, N - n)] for N ~ Normal(need, sd): sd x (density(d) - d x P(Z > d)).
    const double d = (n - need) / sd;
    const double above = 0.5 * std::erfc(d / std::sqrt(2.0));
    const double density = std::exp(-0.5 * d * d) / std::sqrt(2 * M_PI);
    if (sd * (density - d * above) <= o.max_expected_shortfall * need) return n;
  }
  return most;
}

bool Autoscaler::WindowSeen(absl::Time now) const {
  return !options_.restarted || now - first_call_ >= options_.scale_down_window;
}

// The decision before this one scaled down, or was the first up after one
// that was not. Its reading most likely straddled the change that set it off
// (a step inside the period reads as a mix of the two levels: an up falls
// short, a down on a cheaper pipeline goes too far when the demand rises
// with it), so this reading, the first whole one, corrects it upwards without
// the margin that keeps a steady count from chasing noise. Once after ups:
// after two in a row the step has had its whole reading.
bool Autoscaler::StepJustTaken(absl::Time now) const {
  const absl::Duration just = options_.period * 1.5;
  return now - first_scale_up_ <= just || now - last_scale_down_ <= just;
}

std::string Autoscaler::ScaleUp(const AutoscalerInput& input, const Census& census,
                                const Estimate& e, int& desired) const {
  const AutoscalerOptions& o = options_;
  const int current = desired;
  const int target = CeilWorkers(e.need * e.headroom);
  // Veto: trainers do not wait and every warm worker's queue is full.
  bool any_wait = false;
  for (const ConsumerSample& c : input.consumers) {
    any_wait |= c.wait_fraction > o.idle_wait_fraction;
  }
  bool all_full = !census.warm.empty();
  for (const WorkerSample* w : census.warm) {
    const bool full = w->blocked_producers > 0 ||
                      (w->queue_capacity > 0 &&
                       static_cast<double>(w->queue_depth) >=
                           o.full_queue_fraction * static_cast<double>(w->queue_capacity));
    all_full &= full;
  }
  if (!any_wait && all_full) {
    return absl::StrCat("hold ", current, ": ", e.description, " = ", target,
                        ", but no trainer waits and every worker's output queue is full");
  }
  const int cap = static_cast<int>(std::floor(std::max(1, current) * o.max_scale_up_factor + 1e-9));
  desired = std::min(target, cap);
  std::string verdict =
      absl::StrCat("up ", current, " -> ", desired, ": ", e.description, " = ", target);
  if (desired < target) {
    absl::StrAppend(&verdict, ", capped at x", o.max_scale_up_factor);
  }
  // Workers were lost since the last decision but the need is still within
  // the band that held that count: replace them one for one. Rounding need x
  // headroom up again would add a worker whenever the noise lifts the need
  // past count / headroom (8.53 workers of need read as 8.6 x 1.05 = 9.03 ->
  // 10 instead of the 9 there were).
  if (current < last_desired_ && e.need <= last_desired_ && desired > last_desired_) {
    desired = last_desired_;
    verdict = absl::StrFormat("up %d -> %d: replace lost workers, %s within the band of %d",
                              current, desired, e.description, last_desired_);
  }
  return verdict;
}

std::string Autoscaler::ScaleDownOrHold(absl::Time now, const Estimate& e, int& desired) {
  const AutoscalerOptions& o = options_;
  const int current = desired;
  const int min_workers = std::max(0, o.min_workers);
  const int max_workers = std::max(min_workers, o.max_workers);
  const int target = CeilWorkers(e.need * e.headroom);
  // The down band mirrors the up band: the count scaled down to keeps a noise
  // margin too, else a scale-up whose measurement came out a little high is
  // trimmed by one worker a window later (a direction change). Not after a
  // fall two readings confirmed: those readings are the new level, and no
  // scale-up's reading is in the window any more.
  const bool fell = !e.confirmed_drops.empty() || !e.falling_drops.empty();
  const double stable_need = fell ? e.stable_need : e.stable_need / (1 - e.noise);
  const int stable_target =
      std::clamp(ScaleDownTarget(stable_need, e.stable_headroom, /*noise_measured=*/e.noise > 0),
                 min_workers, max_workers);
  // A restarted dispatcher: until a whole window was seen, only demand that
  // left can scale down. A job recovered from the journal whose trainers have
  // not reported yet has not left: they reconnect within their lease.
  if (stable_target < current && !WindowSeen(now) && (!e.jobs.empty() || !e.unheard_jobs.empty())) {
    return absl::StrCat(
        "hold ", current, ": ", e.description, " = ", target, "; no scale-down before ",
        absl::FormatDuration(o.scale_down_window), " of measurements",
        e.unheard_jobs.empty() ? ""
                               : absl::StrCat(" (no report yet from the trainers of job ",
                                              absl::StrJoin(e.unheard_jobs, ", "), ")"));
  }
  if (stable_target < current) {
    if (now - last_scale_down_ < o.period) {
      return absl::StrCat("hold ", current, ": scaled down less than a period ago; ",
                          e.description);
    }
    desired = stable_target;
    if (e.jobs.empty()) {
      return absl::StrFormat("down %d -> %d: no live consumer", current, desired);
    }
    // The rounding, when it took fewer workers than the headroom would.
    std::string rounding;
    const int ceiled = CeilWorkers(stable_need * e.stable_headroom);
    if (desired < ceiled) {
      rounding = absl::StrFormat(
          "; %d rather than ceil(%.2f x %.2f) = %d: short by at most %.1f%% on average", desired,
          stable_need, e.stable_headroom, ceiled, 100 * o.max_expected_shortfall);
      if (!fell && e.noise > 0) {
        absl::StrAppendFormat(&rounding, " (%.2f = %.2f / (1 - %.3f noise))", stable_need,
                              e.stable_need, e.noise);
      }
    }
    if (fell) {
      std::vector<std::string> drops;
      if (!e.confirmed_drops.empty()) {
        drops.push_back(absl::StrCat("demand of job ", absl::StrJoin(e.confirmed_drops, ", "),
                                     " fell and two readings agree"));
      }
      if (!e.falling_drops.empty()) {
        drops.push_back(absl::StrCat("demand of job ", absl::StrJoin(e.falling_drops, ", "),
                                     " fell in each of the last two readings"));
      }
      return absl::StrFormat("down %d -> %d: %s; %s%s", current, desired,
                             absl::StrJoin(drops, "; "), e.description, rounding);
    }
    return absl::StrFormat(
        "down %d -> %d: largest need over the last %s %.2f workers x %.2f "
        "headroom; now %s%s",
        current, desired, absl::FormatDuration(o.scale_down_window), e.stable_need,
        e.stable_headroom, e.description, rounding);
  }
  // Workers were lost (not drained) since the last decision, and the need it
  // was sized for still stands: replace them, up to the count that need keeps.
  if (current < last_desired_ && stable_target > current && !e.jobs.empty()) {
    desired = std::min(last_desired_, stable_target);
    return absl::StrFormat("up %d -> %d: replace lost workers; %s = %d", current, desired,
                           e.description, stable_target);
  }
  std::string verdict = absl::StrCat("hold ", current, ": ", e.description, " = ", target);
  if (stable_target > target) {
    absl::StrAppend(&verdict,
                    absl::StrFormat(" (%.2f x %.2f seen in the last %s)", e.stable_need,
                                    e.stable_headroom, absl::FormatDuration(o.scale_down_window)));
  }
  return verdict;
}

// The least useful first: stalled, then slow outliers, then fewest held
// splits, fewest undelivered batches, then the newest (it has the least warm
// state), then the highest id.
std::vector<uint64_t> Autoscaler::DrainVictims(const AutoscalerInput& input, const Census& census,
                                               const Estimate& e, int surplus) const {
  std::vector<const WorkerSample*> order;
  for (const WorkerSample& w : input.workers) {
    if (!w.draining) order.push_back(&w);
  }
  auto rank = [&](const WorkerSample* w) {
    return std::make_tuple(!census.stalled.contains(w->worker_id), !e.slow.contains(w->worker_id),
                           w->held_splits, w->undelivered_batches);
  };
  std::sort(order.begin(), order.end(), [&](const WorkerSample* a, const WorkerSample* b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (a->registered != b->registered) {
      return a->registered > b->registered;
    }
    return a->worker_id > b->worker_id;
  });
  std::vector<uint64_t> drain;
  for (int i = 0; i < surplus && i < static_cast<int>(order.size()); ++i) {
    drain.push_back(order[i]->worker_id);
  }
  return drain;
}

AutoscalerDecision Autoscaler::Decide(const AutoscalerInput& input) {
  const AutoscalerOptions& o = options_;
  const absl::Time now = input.now;
  const int min_workers = std::max(0, o.min_workers);
  const int max_workers = std::max(min_workers, o.max_workers);
  AutoscalerDecision d;
  std::vector<std::string> notes;

  const Census census = CountWorkers(input);
  d.current_workers = census.registered + std::max(0, input.starting_workers);
  const int current = d.current_workers;

  Estimate e;
  EstimateDemand(input, e, notes);
  EstimateCapacity(census, e);
  FillUnmeasuredCapacity(e);
  SumNeed(e);
  MeasureNoise(e);
  RecordHistory(now, e);
  e.description = Describe(e.jobs, e.need, e.headroom);
  d.need = e.need;
  d.headroom = e.headroom;

  int desired = current;
  std::string verdict;
  if (!e.need_known) {
    desired = std::max(current, e.jobs.empty() ? 0 : 1);
    verdict = absl::StrCat("capacity not measured yet (", census.warming, " warming up, ",
                           census.warm.size(), " warm); ", e.description);
  } else if (e.need > current * o.scale_up_utilization * (1 + (StepJustTaken(now) ? 0 : e.noise)) &&
             CeilWorkers(e.need * e.headroom) > current) {
    verdict = ScaleUp(input, census, e, desired);
  } else {
    verdict = ScaleDownOrHold(now, e, desired);
  }
  // The jobs' reservations: the pool holds each job's min_workers even where
  // its need is less (those that fit in max_workers; the others are dropped
  // as AllocateWorkers drops them).
  d.jobs = JobsOf(e.jobs);
  const double held = e.need_known ? ReservedNeed(d.jobs, e.headroom, max_workers) : 0;
  if (e.need_known && CeilWorkers(held) > CeilWorkers(e.need * e.headroom) &&
      desired < CeilWorkers(held)) {
    desired = CeilWorkers(held);
    notes.push_back(absl::StrFormat("raised to %d for the jobs' min_workers", desired));
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
  if (desired > current) {
    if (now - last_scale_up_ > o.period * 1.5) first_scale_up_ = now;
    last_scale_up_ = now;
  }
  d.desired_workers = desired;
  last_desired_ = desired;

  if (e.need_known) {
    // Bound by max_workers, not by a count the hold band or the x4 step left
    // below it: the next decision gives every job its need then.
    d.pool_bound = std::max(e.need * e.headroom, held) > max_workers + 1e-9;
    // Right after a restart, a job whose trainers have not reported, or whose
    // first reading covers no time, reads as no demand: dividing the pool then
    // would give a lower-priority job every worker until the next decision.
    // Every worker serves every job until each has been read.
    std::vector<uint64_t> unread(e.unheard_jobs.begin(), e.unheard_jobs.end());
    unread.insert(unread.end(), e.unread_jobs.begin(), e.unread_jobs.end());
    if (d.pool_bound && !WindowSeen(now) && !unread.empty()) {
      d.pool_bound = false;
      notes.push_back(absl::StrCat("the pool is not divided until job ",
                                   absl::StrJoin(unread, ", "),
                                   " is read since the restart: every worker serves every job"));
    }
    for (JobEstimate& j : d.jobs) {
      auto it = last_ranks_.find(j.job_id);
      j.previous_rank = it == last_ranks_.end() ? -1 : it->second;
      j.shared_before = last_shared_.contains(j.job_id);
    }
    // Unbound, each job's share is its need (and reservation), even while the
    // count is still on its way there.
    AllocateWorkers(d.pool_bound ? desired : std::max<double>(desired, held), e.headroom, d.jobs,
                    max_workers);
    last_ranks_.clear();
    last_shared_.clear();
    for (const JobEstimate& j : d.jobs) {
      last_ranks_[j.job_id] = j.allocation_rank;
      if (j.shared) last_shared_.insert(j.job_id);
    }
  }

  for (uint64_t id : census.stalled) d.replace.push_back(id);
  for (uint64_t id : e.slow) d.replace.push_back(id);
  if (!census.stalled.empty()) {
    notes.push_back(
        absl::StrCat("stalled (no heartbeat): worker ", absl::StrJoin(census.stalled, ", ")));
  }
  if (!e.slow.empty()) {
    notes.push_back(
        absl::StrCat("slow outlier counted as the median: worker ", absl::StrJoin(e.slow, ", ")));
  }
  if (census.warming > 0 && e.need_known) {
    notes.push_back(absl::StrCat(census.warming, " warming up"));
  }
  if (e.jobs_measured_warming > 0) {
    notes.push_back(
        absl::StrCat(e.jobs_measured_warming, " job(s) measured on warming workers only"));
  }
  if (census.registered > desired) {
    d.drain = DrainVictims(input, census, e, census.registered - desired);
  }
  d.reason = verdict;
  if (!notes.empty()) absl::StrAppend(&d.reason, "; ", absl::StrJoin(notes, "; "));
  return d;
}

std::set<uint64_t> DroppedReservations(const std::vector<JobEstimate>& jobs, double pool) {
  double reserved = TotalReserved(jobs);
  std::vector<const JobEstimate*> reserving;
  for (const JobEstimate& j : jobs) {
    if (j.min_workers > 0) reserving.push_back(&j);
  }
  std::stable_sort(reserving.begin(), reserving.end(),
                   [](const JobEstimate* a, const JobEstimate* b) {
                     if (a->min_workers != b->min_workers) return a->min_workers > b->min_workers;
                     if (a->priority != b->priority) return a->priority < b->priority;
                     return a->job_id > b->job_id;
                   });
  std::set<uint64_t> dropped;
  for (const JobEstimate* j : reserving) {
    if (reserved <= std::max(0.0, pool) + 1e-9) break;
    reserved -= j->min_workers;
    dropped.insert(j->job_id);
  }
  return dropped;
}

double ReservedNeed(const std::vector<JobEstimate>& jobs, double headroom, double pool) {
  const std::set<uint64_t> dropped = DroppedReservations(jobs, pool);
  double total = 0;
  for (const JobEstimate& j : jobs) {
    const double kept = dropped.contains(j.job_id) ? 0.0 : static_cast<double>(j.min_workers);
    total += std::max(j.need * headroom, kept);
  }
  return total;
}

void AllocateWorkers(double pool, double headroom, std::vector<JobEstimate>& jobs, double bound) {
  double left = std::max(0.0, pool);
  std::vector<JobEstimate*> order;
  for (JobEstimate& job : jobs) {
    job.allocated = 0;
    job.allocation_reason.clear();
    job.shared = false;
    order.push_back(&job);
  }
  // Trainer-seconds of waiting one more worker removes per second.
  auto gain = [](const JobEstimate* j) { return j->need > 0 ? j->consumers / j->need : 0.0; };
  // 1 / the worker-seconds the job still needs (0: its end unknown).
  auto smith = [](const JobEstimate* j) {
    return j->remaining_seconds > 0 && j->need > 0 ? 1 / (j->need * j->remaining_seconds) : 0.0;
  };
  // 1. min_workers, whole, while the pool holds every reservation; when they add up to more,
  // the largest are dropped (ties: the lower priority, then the later job) until the rest fit.
  const std::set<uint64_t> dropped_ids = DroppedReservations(jobs, bound);
  std::set<JobEstimate*> dropped;
  for (JobEstimate* j : order) {
    if (dropped_ids.contains(j->job_id)) dropped.insert(j);
  }
  std::stable_sort(order.begin(), order.end(), [](const JobEstimate* a, const JobEstimate* b) {
    return a->priority > b->priority;
  });
  for (JobEstimate* j : order) {
    if (dropped.contains(j)) continue;
    const double given = std::min<double>(j->min_workers, left);
    j->allocated = given;
    left -= given;
  }
  for (JobEstimate* j : order) {
    if (!j->starved || j->allocated >= 1) continue;
    const double given = std::min(1 - j->allocated, left);
    j->allocated += given;
    left -= given;
  }
  // 2. Up to need × headroom, the most wait removed per worker first.
  std::stable_sort(order.begin(), order.end(), [&](const JobEstimate* a, const JobEstimate* b) {
    if (a->priority != b->priority) {
      return a->priority > b->priority;
    }
    if (smith(a) != smith(b)) return smith(a) > smith(b);
    return gain(a) > gain(b);
  });
  // Kept from the previous decision unless clearly ahead: an insertion pass
  // moves a job back behind the ones served before it last time.
  auto clearly_ahead = [&](const JobEstimate* a, const JobEstimate* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (smith(a) > 0 || smith(b) > 0) return smith(a) > smith(b) * (1 + kReorderMargin);
    return gain(a) > gain(b) * (1 + kReorderMargin);
  };
  auto served_before = [](const JobEstimate* a, const JobEstimate* b) {
    return a->previous_rank >= 0 && b->previous_rank >= 0 && a->previous_rank < b->previous_rank;
  };
  for (size_t i = 1; i < order.size(); ++i) {
    for (size_t k = i;
         k > 0 && served_before(order[k], order[k - 1]) && !clearly_ahead(order[k - 1], order[k]);
         --k) {
      std::swap(order[k], order[k - 1]);
    }
  }
  for (size_t rank = 0; rank < order.size(); ++rank) {
    order[rank]->allocation_rank = static_cast<int>(rank);
  }
  // Filled one after the other, except jobs alike: without an end known, of
  // the same priority and gains within kReorderMargin of each other
  // (kKeepSharingMargin for two jobs that shared in the previous decision). They
  // share what is left in proportion to what each still wants: one after the
  // other, the first would take the whole pool and the others none for as
  // long as they all run, which for jobs without an end is for ever, though
  // a worker removes as much wait at one as at another.
  auto alike = [&](const JobEstimate* a, const JobEstimate* b) {
    const double margin =
        a->shared_before && b->shared_before ? kKeepSharingMargin : kReorderMargin;
    return a->priority == b->priority && smith(a) == 0 && smith(b) == 0 && gain(a) > 0 &&
           gain(b) > 0 && std::max(gain(a), gain(b)) <= std::min(gain(a), gain(b)) * (1 + margin);
  };
  std::map<const JobEstimate*, std::vector<uint64_t>> shared_with;
  for (size_t first = 0; first < order.size();) {
    size_t end = first + 1;
    while (end < order.size() && alike(order[first], order[end])) ++end;
    double group_wants = 0;
    for (size_t k = first; k < end; ++k) {
      group_wants += std::max(0.0, order[k]->need * headroom - order[k]->allocated);
    }
    if (group_wants <= left || end == first + 1) {  // each gets what it wants, or what is left
      for (size_t k = first; k < end; ++k) {
        JobEstimate* j = order[k];
        const double given = std::clamp(j->need * headroom - j->allocated, 0.0, left);
        j->allocated += given;
        left -= given;
      }
    } else {
      for (size_t k = first; k < end; ++k) {
        JobEstimate* j = order[k];
        j->allocated += std::max(0.0, j->need * headroom - j->allocated) * (left / group_wants);
        j->shared = true;
        for (size_t other = first; other < end; ++other) {
          if (other != k) shared_with[j].push_back(order[other]->job_id);
        }
      }
      left = 0;
    }
    first = end;
  }
  double wanted = 0;
  for (JobEstimate* j : order) {
    const double want = j->need * headroom;
    wanted += std::max(want, j->allocated);
    if (j->starved) {
      j->allocation_reason =
          absl::StrFormat("%.2f to read its demand: its trainers got nothing yet", j->allocated);
    } else if (j->need <= 0 && j->min_workers == 0) {
      j->allocation_reason =
          "no demand: its trainers took no batch and waited for none (paused, or starting)";
    } else if (j->min_workers > 0 && j->min_workers >= want &&
               j->allocated >= j->min_workers - 1e-9 && !dropped.contains(j)) {
      j->allocation_reason = absl::StrFormat(
          "its min_workers %d (its need %.2f x %.2f headroom "
          "is less)",
          j->min_workers, j->need, headroom);
    } else if (j->allocated >= want - 1e-9) {
      j->allocation_reason = absl::StrFormat("its need %.2f x %.2f headroom", j->need, headroom);
    } else if (j->allocated > 0 && j->allocated <= j->min_workers && !dropped.contains(j)) {
      j->allocation_reason = absl::StrFormat(
          "min_workers %d of its need %.2f: priority %d, %.2f "
          "trainers' wait removed per worker",
          j->min_workers, j->need, j->priority, gain(j));
    } else {
      j->allocation_reason = absl::StrFormat(
          "%.2f of its need %.2f: the pool ran out (priority %d, %.2f "
          "trainers' wait removed per worker)",
          j->allocated, j->need, j->priority, gain(j));
      if (auto partners = shared_with.find(j); partners != shared_with.end()) {
        absl::StrAppend(&j->allocation_reason, "; shared in proportion to the need with job ",
                        absl::StrJoin(partners->second, ", "),
                        " (no end known, the same priority and gain)");
      }
    }
  }
  for (JobEstimate* j : dropped) {
    absl::StrAppend(&j->allocation_reason,
                    absl::StrFormat("; min_workers %d not reserved: the jobs reserve %.0f of a "
                                    "pool of at most %.2f, and the largest reservations are "
                                    "dropped",
                                    j->min_workers, TotalReserved(jobs), bound));
  }
  // 3. The rest in proportion to what each job wanted.
  if (left > 1e-9 && wanted > 0) {
    for (JobEstimate* j : order) {
      j->allocated += left * std::max(j->need * headroom, j->allocated) / wanted;
    }
  }
}

std::map<uint64_t, uint64_t> AssignWorkersToJobs(const std::vector<JobEstimate>& jobs,
                                                 const std::vector<uint64_t>& workers,
                                                 const std::map<uint64_t, uint64_t>& previous) {
  std::vector<const JobEstimate*> by_rank;
  for (const JobEstimate& j : jobs) by_rank.push_back(&j);
  std::stable_sort(by_rank.begin(), by_rank.end(), [](const JobEstimate* a, const JobEstimate* b) {
    if (a->allocation_rank != b->allocation_rank) {
      return a->allocation_rank < b->allocation_rank;
    }
    return a->job_id < b->job_id;
  });
  // 1. Quotas in whole workers.
  std::map<uint64_t, int> quota;
  int total = 0;
  for (const JobEstimate* j : by_rank) {
    quota[j->job_id] = static_cast<int>(std::floor(std::max(0.0, j->allocated) + 1e-9));
    total += quota[j->job_id];
  }
  const int n = static_cast<int>(workers.size());
  for (auto it = by_rank.rbegin(); it != by_rank.rend() && total > n; ++it) {
    const int cut = std::min(quota[(*it)->job_id], total - n);
    quota[(*it)->job_id] -= cut;
    total -= cut;
  }
  std::vector<const JobEstimate*> by_fraction;
  for (const JobEstimate* j : by_rank) {
    if (j->allocated - quota[j->job_id] > 1e-9) by_fraction.push_back(j);
  }
  std::stable_sort(
      by_fraction.begin(), by_fraction.end(), [&](const JobEstimate* a, const JobEstimate* b) {
        return a->allocated - quota[a->job_id] > b->allocated - quota[b->job_id] + 1e-9;
      });
  for (const JobEstimate* j : by_fraction) {
    if (total >= n) break;
    ++quota[j->job_id];
    ++total;
  }
  // 2. Workers keep their job while it has room.
  std::vector<uint64_t> sorted = workers;
  std::sort(sorted.begin(), sorted.end());
  std::map<uint64_t, uint64_t> assigned;
  for (uint64_t w : sorted) {
    auto prev = previous.find(w);
    if (prev == previous.end()) continue;
    auto q = quota.find(prev->second);
    if (q == quota.end() || q->second <= 0) continue;
    assigned[w] = prev->second;
    --q->second;
  }
  // 3. The rest to the jobs with room, lowest rank first.
  auto next = by_rank.begin();
  for (uint64_t w : sorted) {
    if (assigned.contains(w)) continue;
    while (next != by_rank.end() && quota[(*next)->job_id] <= 0) ++next;
    if (next == by_rank.end()) break;
    assigned[w] = (*next)->job_id;
    --quota[(*next)->job_id];
  }
  return assigned;
}

}  // namespace sluice::dispatcher
