// The policies the simulator compares: sluice's (dispatcher/autoscaler, the
// same code the dispatcher runs) and three peers ported from their source or
// documented defaults; each peer's comments cite the file and lines it
// follows. Every policy gets the same Observation (sim.h) and the same
// events; what a policy does not read, its design cannot see.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include "bench/autoscale_sim/sim.h"
#include "dispatcher/autoscaler.h"

namespace sluice::autoscale_sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

class SluicePolicy : public Policy {
 public:
  explicit SluicePolicy(dispatcher::AutoscalerOptions o) : scaler_(std::move(o)) {}
  std::string name() const override { return "sluice"; }
  PolicyDecision Decide(const Observation& obs) override {
    dispatcher::AutoscalerDecision d = scaler_.Decide(obs.input);
    last_reason_ = d.reason;
    PolicyDecision out{d.desired_workers, d.drain, {}};
    // Splits go by allocation only when the pool is bounded; otherwise every
    // worker serves every job (each job has its need).
    if (d.pool_bound) {
      for (const dispatcher::JobEstimate& j : d.jobs) {
        out.allocation[j.job_id] = j.allocated;
      }
    }
    return out;
  }
  std::string last_reason() const override { return last_reason_; }

 private:
  dispatcher::Autoscaler scaler_;
  std::string last_reason_;
};

// Cachew (Graur et al., USENIX ATC '22), ported from
// eth-easl/cachew tensorflow/core/data/service/easl/scaling_utils.cc
// (commit 1c03540f), DynamicWorkerCountUpdate, once per job and period:
//   lines 24-28   constants: +7% batch time to keep scaling up, -3% allowed
//                 when scaling down, 20 stable periods, x1.5 growth triggers;
//   lines 83-89   while the job's actual worker count differs from its target
//                 (workers starting, or the pool cannot give them), keep the
//                 target and measure nothing;
//   lines 91-98   a new job (is_scaling, one metrics entry): target + 1;
//   lines 100-118 compare with the last entry of a different worker count;
//   lines 124-130 a relative improvement beyond +-1.2 is discarded;
//   lines 132-149 up: improvement > 7% -> +1, else settle at the previous
//                 count (converged there, stop scaling);
//   lines 150-169 down: loss < 3% and > 1 worker -> -1, else settle at the
//                 previous count;
//   lines 172-227 stable: every 21st period compare with the converged
//                 metrics: result queue x1.5 -> converged - 1 and scale;
//                 batch time x1.5 -> converged + 1 and scale (both only when
//                 the queue ratio is finite); else keep the count.
// The metrics entry of a period is (workers serving the job, the trainers'
// mean seconds per batch, elements in the clients' result queues). Cachew
// gives each job its own workers; when the pool cannot meet every target the
// earlier job keeps its workers. A job that ends frees its workers.
class CachewPolicy : public Policy {
 public:
  CachewPolicy(int min_workers, int max_workers) : min_(min_workers), max_(max_workers) {}
  std::string name() const override { return "cachew"; }

  PolicyDecision Decide(const Observation& obs) override {
    for (uint64_t id : obs.jobs_left) jobs_.erase(id);
    std::map<uint64_t, std::vector<double>> batch_seconds;
    size_t c = 0;
    for (const auto& cs : obs.input.consumers) {
      batch_seconds[cs.job_id].push_back(obs.batch_seconds[c++]);
    }
    // New jobs: the first gets the workers running, later ones 1.
    for (const auto& j : obs.input.jobs) {
      if (jobs_.contains(j.job_id)) continue;
      JobState& s = jobs_[j.job_id];
      s.target = jobs_.size() == 1 ? std::max(1, obs.provisioned) : 1;
      order_.push_back(j.job_id);
    }
    std::erase_if(order_, [&](uint64_t id) { return !jobs_.contains(id); });
    if (obs.tick) {
      const std::map<uint64_t, int> actual = Granted(obs.ready);
      for (auto& [id, s] : jobs_) {
        auto bt = batch_seconds.find(id);
        if (bt == batch_seconds.end()) continue;
        double mean = 0;
        for (double b : bt->second) mean += b;
        mean /= static_cast<double>(bt->second.size());
        auto q = obs.queued_elements.find(id);
        Update(s, Metrics{actual.at(id), mean, q == obs.queued_elements.end() ? 0 : q->second});
      }
    }
    PolicyDecision out;
    int total = 0;
    for (const auto& [id, n] : Granted(max_)) {
      out.allocation[id] = n;
      total += n;
    }
    out.desired = std::clamp(total, min_, max_);
    if (jobs_.empty()) out.allocation.clear();
    return out;
  }

 private:
  struct Metrics {
    int workers = 0;
    double batch_seconds = 0;
    double queue = 0;
  };
  struct JobState {
    int target = 1;
    bool scaling = true;
    uint32_t same_scale = 0;
    std::vector<Metrics> history;
    Metrics converged;
  };

  // Each job's target, earlier jobs first, within `pool` workers.
  std::map<uint64_t, int> Granted(int pool) const {
    std::map<uint64_t, int> granted;
    for (uint64_t id : order_) {
      const int n = std::min(jobs_.at(id).target, std::max(0, pool));
      granted[id] = n;
      pool -= n;
    }
    return granted;
  }

  void Update(JobState& s, const Metrics& last) {
    s.history.push_back(last);
    if (last.workers != s.target) return;  // lines 83-89
    if (s.scaling) {
      if (s.history.size() == 1) {  // lines 93-98
        s.target = last.workers + 1;
        return;
      }
      int i = static_cast<int>(s.history.size()) - 2;  // lines 100-118
      while (s.history[static_cast<size_t>(i)].workers == last.workers) {
        if (i == 0) {
          s.target = last.workers;
          s.converged = last;
          s.scaling = false;
          s.same_scale = 0;
          return;
        }
        --i;
      }
      const Metrics& stl = s.history[static_cast<size_t>(i)];
      const double improvement = 1.0 - last.batch_seconds / stl.batch_seconds;
      if (!(improvement <= 1.2 && improvement >= -1.2)) return;  // 124-130
      if (stl.workers < last.workers) {                          // lines 132-149
        if (improvement > 0.07) {
          s.target = last.workers + 1;
        } else {
          Settle(s, stl);
        }
      } else if (improvement > -0.03 && last.workers > 1) {  // lines 150-169
        s.target = last.workers - 1;
      } else {
        Settle(s, stl);
      }
      s.target = std::clamp(s.target, 1, max_);
      return;
    }
    if (++s.same_scale > 20) {  // lines 172-227
      s.same_scale = 0;
      const double queue = last.queue / s.converged.queue;
      const double batch = last.batch_seconds / s.converged.batch_seconds;
      if (std::isfinite(queue) && queue > 1.5 && s.converged.workers > 1) {
        s.target = s.converged.workers - 1;
        s.scaling = true;
      } else if (std::isfinite(queue) && batch > 1.5) {
        s.target = s.converged.workers + 1;
        s.scaling = true;
      } else {
        s.target = last.workers;
      }
    }
  }

  static void Settle(JobState& s, const Metrics& previous) {
    s.target = previous.workers;
    s.converged = previous;
    s.scaling = false;
    s.same_scale = 0;
  }

  const int min_, max_;
  std::map<uint64_t, JobState> jobs_;
  std::vector<uint64_t> order_;  // arrival order
};

// tf.data service's auto-scaler, ported from tensorflow/tensorflow
// tensorflow/core/data/service/auto_scaler.cc (the 2023 version with
// MultipleIterationsAutoScaler):
//   lines 76-98   ReplaceOutliers: a rate more than one (sample) standard
//                 deviation from the mean counts as the median (the upper
//                 median, sorted[n / 2]);
//   lines 100-132 per iteration (job): ceil(Σ consumers' target rates ÷
//                 the mean worker throughput), at least 1;
//   lines 134-189 a worker's throughput and a consumer's rate are the last
//                 reported, kept until the worker or consumer is removed;
//   lines 245-264 over iterations: the maximum, not the sum;
//   lines 225-235 growth bound: more than current x 4 or current + 500 ->
//                 min(current x 4, current + 500); at most 100000.
// tf.data exports the bounded estimate as a metric for an external actuator;
// here it is applied every period. A consumer's target rate is its step rate
// (batches/s ÷ (1 - wait) × batch size), a worker's throughput for an
// iteration its elements per busy second for that job.
class TfDataPolicy : public Policy {
 public:
  TfDataPolicy(int min_workers, int max_workers) : min_(min_workers), max_(max_workers) {}
  std::string name() const override { return "tf.data"; }
  PolicyDecision Decide(const Observation& obs) override {
    for (uint64_t id : obs.jobs_left) iterations_.erase(id);
    std::map<uint64_t, double> batch;
    for (const auto& j : obs.input.jobs) batch[j.job_id] = j.batch_size;
    std::set<uint64_t> live_workers;
    for (const auto& w : obs.input.workers) {
      live_workers.insert(w.worker_id);
      for (const auto& c : w.capacity) {
        if (c.elements_per_busy_second > 0 && batch.contains(c.job_id)) {
          iterations_[c.job_id].throughputs[w.worker_id] = c.elements_per_busy_second;
        }
      }
    }
    for (const auto& c : obs.input.consumers) {
      const double rate =
          c.batches_per_second / std::max(0.02, 1 - c.wait_fraction) * batch[c.job_id];
      if (rate > 0) iterations_[c.job_id].rates[c.consumer_index] = rate;
    }
    // RemoveWorker: workers that left.
    for (auto& [id, it] : iterations_) {
      std::erase_if(it.throughputs,
                    [&](const auto& kv) { return !live_workers.contains(kv.first); });
    }
    int64_t optimal = 0;
    for (const auto& [id, it] : iterations_) {
      if (it.throughputs.empty() || it.rates.empty()) continue;
      const std::vector<double> rates = WithoutOutliers(it.rates);
      const std::vector<double> tput = WithoutOutliers(it.throughputs);
      const double demand = std::accumulate(rates.begin(), rates.end(), 0.0);
      const double mean =
          std::accumulate(tput.begin(), tput.end(), 0.0) / static_cast<double>(tput.size());
      optimal =
          std::max(optimal, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(demand / mean))));
    }
    const int64_t current = std::max(1, obs.provisioned);
    // No estimate (nullopt): the metric keeps its last value.
    if (optimal == 0) return {obs.provisioned, {}, {}};
    if (optimal > current * 4 || optimal > current + 500) {
      optimal = std::min(current * 4, current + 500);
    }
    optimal = std::min<int64_t>(optimal, 100000);
    return {std::clamp(static_cast<int>(optimal), min_, max_), {}, {}};
  }

 private:
  struct Iteration {
    std::map<uint64_t, double> throughputs;  // per worker
    std::map<uint32_t, double> rates;        // per consumer
  };

  template <typename K>
  static std::vector<double> WithoutOutliers(const std::map<K, double>& m) {
    std::vector<double> v;
    for (const auto& [k, x] : m) v.push_back(x);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    double squares = 0;
    for (double x : v) squares += (x - mean) * (x - mean);
    const double sd = v.size() <= 1 ? 0 : std::sqrt(squares / static_cast<double>(v.size() - 1));
    for (double& x : v) {
      if (x < mean - sd || x > mean + sd) x = median;
    }
    return v;
  }

  const int min_, max_;
  std::map<uint64_t, Iteration> iterations_;
};

// A Kubernetes HorizontalPodAutoscaler (autoscaling/v2) on CPU utilization
// with its defaults: a 15 s sync period (kube-controller-manager
// --horizontal-pod-autoscaler-sync-period), tolerance 0.1, target 80% (the
// autoscaling/v1 default), desired = ceil(replicas × utilization / target)
// where a starting pod counts as 0% when scaling up; scale-up at most
// max(+100%, +4 pods) per 15 s with no stabilization; scale-down at most
// -100% per 15 s to the highest recommendation of the last 300 s (the
// default `behavior`). Utilization is the ready pods' busy time averaged
// since the last sync. Between syncs, and on events, it does nothing.
class HpaPolicy : public Policy {
 public:
  HpaPolicy(int min_workers, int max_workers, double period)
      : min_(min_workers), max_(max_workers), period_(period) {}
  std::string name() const override { return "hpa-cpu"; }
  PolicyDecision Decide(const Observation& obs) override {
    if (desired_ < 0) desired_ = obs.provisioned;
    if (!obs.tick) return {desired_, {}, {}};
    for (double b : obs.busy_fraction) busy_sum_ += b * period_;
    ready_seconds_ += obs.ready * period_;
    if (obs.now + 1e-9 < next_sync_) return {desired_, {}, {}};
    next_sync_ = obs.now + 15;
    const int current = obs.provisioned;
    int recommendation = current;
    if (ready_seconds_ > 0 && obs.ready > 0) {
      // Usage in pods; a starting pod's missing metric counts as 0% when
      // scaling up and as 100% when scaling down, and the tolerance is
      // checked again with it (replica_calculator.go's missing pods).
      const double usage = busy_sum_ / ready_seconds_ * obs.ready;
      const double ratio = usage / obs.ready / 0.8;
      if (std::abs(ratio - 1) > 0.1) {
        const double filled = ratio > 1 ? usage : usage + obs.starting;
        const double new_ratio = filled / current / 0.8;
        if (std::abs(new_ratio - 1) > 0.1 && (new_ratio > 1) == (ratio > 1)) {
          recommendation = static_cast<int>(std::ceil(filled / 0.8 - 1e-9));
        }
      }
    }
    busy_sum_ = 0;
    ready_seconds_ = 0;
    recommendation = std::clamp(recommendation, min_, max_);
    history_.emplace_back(obs.now, recommendation);
    while (history_.front().first <= obs.now - 300) history_.pop_front();
    int desired = recommendation;
    if (desired < current) {
      for (const auto& [t, r] : history_) desired = std::max(desired, r);
      desired = std::min(desired, current);
    } else {
      desired = std::min(desired, std::max(2 * current, current + 4));
    }
    desired_ = desired;
    return {desired_, {}, {}};
  }

 private:
  const int min_, max_;
  const double period_;
  int desired_ = -1;
  double next_sync_ = 0;
  double busy_sum_ = 0;
  double ready_seconds_ = 0;
  std::deque<std::pair<double, int>> history_;
};

}  // namespace

std::unique_ptr<Policy> MakeSluicePolicy(dispatcher::AutoscalerOptions o) {
  return std::make_unique<SluicePolicy>(std::move(o));
}
std::unique_ptr<Policy> MakeCachewPolicy(int min_workers, int max_workers) {
  return std::make_unique<CachewPolicy>(min_workers, max_workers);
}
std::unique_ptr<Policy> MakeTfDataPolicy(int min_workers, int max_workers) {
  return std::make_unique<TfDataPolicy>(min_workers, max_workers);
}
std::unique_ptr<Policy> MakeHpaPolicy(int min_workers, int max_workers, double period) {
  return std::make_unique<HpaPolicy>(min_workers, max_workers, period);
}

}  // namespace sluice::autoscale_sim
