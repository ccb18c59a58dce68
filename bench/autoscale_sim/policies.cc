// The policies the simulator compares: sluice's (dispatcher/autoscaler, the
// same code the dispatcher runs) and three peers, written from their
// published descriptions (docs/BENCHMARKS.md says what each one is).
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <utility>

#include "bench/autoscale_sim/sim.h"
#include "dispatcher/autoscaler.h"

namespace sluice::autoscale_sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

class SluicePolicy : public Policy {
 public:
  explicit SluicePolicy(dispatcher::AutoscalerOptions o)
      : scaler_(std::move(o)) {}
  std::string name() const override { return "sluice"; }
  PolicyDecision Decide(const Observation& obs) override {
    dispatcher::AutoscalerDecision d = scaler_.Decide(obs.input);
    last_reason_ = d.reason;
    return {d.desired_workers, d.drain};
  }
  std::string last_reason() const override { return last_reason_; }
  bool decides_when_demand_leaves() const override { return true; }

 private:
  dispatcher::Autoscaler scaler_;
  std::string last_reason_;
};

// Cachew (Graur et al., USENIX ATC '22): scale by probing the trainers' batch
// time. +1 worker per probe while the batch time improves by more than 7%;
// -1 per probe while removing one costs less than 3%; a probe is measured
// over the period that ends 3 periods after the worker it added registered.
// From a stable state it probes again every 5 measurements (up first), so
// load changes are found. A
// failed up-probe takes its worker back and starts probing down; with
// `probe_down` false it takes the worker back and stays (scale-up only).
class CachewPolicy : public Policy {
 public:
  CachewPolicy(int min_workers, int max_workers, bool probe_down)
      : min_(min_workers), max_(max_workers), probe_down_(probe_down) {}
  std::string name() const override {
    return probe_down_ ? "cachew" : "cachew-up";
  }

  PolicyDecision Decide(const Observation& obs) override {
    if (target_ < 0) target_ = obs.provisioned;
    absl::Time newest = absl::InfinitePast();
    for (const auto& w : obs.input.workers)
      newest = std::max(newest, w.registered);
    // Measure a full period once the newest worker is past its warm-up
    // (generous: Cachew does not know the warm-up, a shorter settle makes
    // every probe fail on a cold worker).
    const absl::Duration settle = absl::Seconds(3 * period_);
    if (obs.starting > 0 || obs.input.now - newest < settle ||
        obs.now - last_change_ < period_ - 1e-9) {
      return {target_, {}};
    }
    // The mean batch time; none when no consumer is left.
    double bt = 0;
    for (double b : obs.batch_seconds) bt += b;
    if (obs.batch_seconds.empty()) {
      Change(-1, obs.now);  // nothing to lose
      return {target_, {}};
    }
    bt /= static_cast<double>(obs.batch_seconds.size());
    switch (mode_) {
      case Mode::kStable:
        if (++stable_ >= 5) {
          stable_ = 0;
          mode_ = Mode::kUp;
          prev_ = bt;
          Change(+1, obs.now);
        }
        break;
      case Mode::kUp:
        if (Improvement(prev_, bt) > 0.07) {
          prev_ = bt;
          Change(+1, obs.now);
        } else {
          // The last worker did not help: take it back (and try going down).
          mode_ = probe_down_ ? Mode::kDown : Mode::kStable;
          prev_ = bt;
          Change(-1, obs.now);
        }
        break;
      case Mode::kDown:
        if (Improvement(bt, prev_) < 0.03) {  // the loss
          prev_ = bt;
          Change(-1, obs.now);
        } else {
          mode_ = Mode::kStable;
          Change(+1, obs.now);
        }
        break;
    }
    return {target_, {}};
  }

 private:
  enum class Mode { kStable, kUp, kDown };

  // How much smaller `now` is than `before`, as a fraction of `before`.
  static double Improvement(double before, double now) {
    if (before == kInf) return now == kInf ? 0 : 1;
    if (before <= 0) return 0;
    return (before - now) / before;
  }
  void Change(int delta, double now) {
    const int next = std::clamp(target_ + delta, min_, max_);
    if (next != target_) last_change_ = now;
    target_ = next;
  }

  const int min_, max_;
  const bool probe_down_;
  const double period_ = 2;
  Mode mode_ = Mode::kStable;
  int stable_ = 0;
  int target_ = -1;
  double prev_ = 0;
  double last_change_ = -1e9;
};

// tf.data service's auto-scaler (tensorflow/core/data/service/auto_scaler):
// ceil(Σ consumers' target rates ÷ the mean worker throughput), applied every
// period. A consumer's target rate is its step rate (batches/s ÷ (1 - wait) ×
// batch size: what it would consume if it never waited); a worker's
// throughput its elements per busy second, all workers alike.
class TfDataPolicy : public Policy {
 public:
  TfDataPolicy(int min_workers, int max_workers)
      : min_(min_workers), max_(max_workers) {}
  std::string name() const override { return "tf.data"; }
  PolicyDecision Decide(const Observation& obs) override {
    std::map<uint64_t, double> batch;
    for (const auto& j : obs.input.jobs) batch[j.job_id] = j.batch_size;
    double demand = 0;
    for (const auto& c : obs.input.consumers) {
      demand += c.batches_per_second / std::max(0.02, 1 - c.wait_fraction) *
                batch[c.job_id];
    }
    double throughput = 0;
    int n = 0;
    for (double t : obs.throughput) {
      throughput += t;
      ++n;
    }
    if (demand <= 0) return {min_, {}};
    if (n == 0 || throughput <= 0) {
      return {std::max(obs.provisioned, demand > 0 ? 1 : 0), {}};
    }
    throughput /= n;
    const int desired = static_cast<int>(std::ceil(demand / throughput - 1e-9));
    return {std::clamp(desired, min_, max_), {}};
  }

 private:
  const int min_, max_;
};

// A Kubernetes HorizontalPodAutoscaler on CPU utilization with its defaults:
// target 80%, tolerance 0.1, desired = ceil(Σ busy ÷ 0.8) (starting pods count
// as 0% when scaling up), scale-up at most max(×2, +4) per period, scale-down
// to the highest recommendation of the last 300 s.
class HpaPolicy : public Policy {
 public:
  HpaPolicy(int min_workers, int max_workers)
      : min_(min_workers), max_(max_workers) {}
  std::string name() const override { return "hpa-cpu"; }
  PolicyDecision Decide(const Observation& obs) override {
    const int current = obs.provisioned;
    int recommendation = current;
    if (obs.ready > 0) {
      double busy = 0;
      for (double b : obs.busy_fraction) busy += b;
      const double ratio = busy / obs.ready / 0.8;
      if (std::abs(ratio - 1) > 0.1) {
        recommendation = static_cast<int>(std::ceil(busy / 0.8 - 1e-9));
        if (ratio > 1 && recommendation <= current) recommendation = current;
      }
    }
    recommendation = std::clamp(recommendation, min_, max_);
    history_.emplace_back(obs.now, recommendation);
    while (history_.front().first < obs.now - 300) history_.pop_front();
    int desired = recommendation;
    if (desired < current) {
      for (const auto& [t, r] : history_) desired = std::max(desired, r);
      desired = std::min(desired, current);
    } else {
      desired = std::min(desired, std::max(2 * current, current + 4));
    }
    return {desired, {}};
  }

 private:
  const int min_, max_;
  std::deque<std::pair<double, int>> history_;
};

}  // namespace

std::unique_ptr<Policy> MakeSluicePolicy(dispatcher::AutoscalerOptions o) {
  return std::make_unique<SluicePolicy>(std::move(o));
}
std::unique_ptr<Policy> MakeCachewPolicy(int min_workers, int max_workers,
                                         bool probe_down) {
  return std::make_unique<CachewPolicy>(min_workers, max_workers, probe_down);
}
std::unique_ptr<Policy> MakeTfDataPolicy(int min_workers, int max_workers) {
  return std::make_unique<TfDataPolicy>(min_workers, max_workers);
}
std::unique_ptr<Policy> MakeHpaPolicy(int min_workers, int max_workers) {
  return std::make_unique<HpaPolicy>(min_workers, max_workers);
}

}  // namespace sluice::autoscale_sim
