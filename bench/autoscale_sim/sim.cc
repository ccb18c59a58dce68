#include "bench/autoscale_sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

#include "absl/time/time.h"
#include "common/base/random.h"

namespace sluice::autoscale_sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps = 1e-9;

enum NoiseKind : uint64_t { kSpeed = 1, kCapacity = 2, kConsumer = 3 };

double Noise(const WorldOptions& o, uint64_t kind, uint64_t id, int64_t period, double amplitude) {
  if (amplitude <= 0) return 1;
  Rng rng(MixSeed({o.seed, kind, id, static_cast<uint64_t>(period)}));
  return rng.Uniform(1 - amplitude, 1 + amplitude);
}

absl::Time At(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

struct Worker {
  uint64_t id = 0;
  double ready_at = 0;
  double speed = 1;                     // × jitter × cold
  std::map<uint64_t, double> busy;      // worker-seconds per job, this period
  std::map<uint64_t, double> elements;  // per job, this period
};

struct Job {
  JobSpec spec;
  bool active = true;
  // When it arrived: a new consumer's first window starts at its first
  // report, as the dispatcher's does, not at the last tick.
  double arrived = -kInf;
  double buffer = 0;  // elements
  double consumed_total = 0;
  double completed = -1;
  double stopped = -1;  // its trainers left (`stop`) before it completed: when
  // This period:
  double consumed = 0;
  double wait = 0;  // seconds a consumer waited (all consumers alike)
  // The longest step a consumer took (its longest stretch without a batch or
  // a wait: the trainers never pause in this model).
  double longest_step = 0;
  double demand() const {
    return active ? spec.consumers * static_cast<double>(spec.batch_size) / spec.step_seconds : 0;
  }
  double capacity() const {
    return static_cast<double>(spec.consumers) * static_cast<double>(spec.buffer_batches) *
           static_cast<double>(spec.batch_size);
  }
};

class World {
 public:
  World(const Scenario& s, Policy& policy, const WorldOptions& o) : s_(s), policy_(policy), o_(o) {
    for (const JobSpec& j : s.jobs) {
      jobs_.push_back(Job{.spec = j, .arrived = 0});
    }
    for (Job& j : jobs_) j.buffer = j.capacity();  // steady state: full
    int n = s.initial_workers;
    if (n <= 0) n = OracleWorkers(Need(), o);
    for (int i = 0; i < n; ++i) {
      workers_.push_back(Worker{.id = next_id_++, .ready_at = -100});
    }
  }

  RunResult Run() {
    double t = 0;
    double next_tick = o_.period;
    size_t next_step = 0;
    while (t < s_.duration - kEps) {
      double t_next = std::min(next_tick, s_.duration);
      if (next_step < s_.steps.size()) {
        t_next = std::min(t_next, s_.steps[next_step].at);
      }
      if (t < s_.measure_from) t_next = std::min(t_next, s_.measure_from);
      for (const Worker& w : workers_) {
        if (w.ready_at > t + kEps) t_next = std::min(t_next, w.ready_at);
        const double warm = w.ready_at + o_.cold_seconds;
        if (warm > t + kEps) t_next = std::min(t_next, warm);
      }
      const double reached = Advance(t, t_next);
      if (reached < t_next - kEps) {
        // A job ran its epochs: its consumers left.
        t = reached;
        if (t > last_tick_ + kEps) Decide(t, t - last_tick_, /*tick=*/false);
        continue;
      }
      t = t_next;
      // A tick measures the period that ends now, before a step at the
      // same time changes anything.
      if (t >= next_tick - kEps) {
        Tick(t);
        last_tick_ = t;
        next_tick += o_.period;
      }
      while (next_step < s_.steps.size() && s_.steps[next_step].at <= t + kEps) {
        const LoadStep& step = s_.steps[next_step++];
        Apply(step, t);
        if ((step.kind == LoadStep::Kind::kAllStop || step.kind == LoadStep::Kind::kJobStop) &&
            t > last_tick_ + kEps) {
          Decide(t, t - last_tick_, /*tick=*/false);
        }
      }
    }
    for (const Job& j : jobs_) {
      result_.jobs.push_back(
          {.id = j.spec.id, .arrived = j.arrived, .completed = j.completed, .stopped = j.stopped});
    }
    return result_;
  }

 private:
  double Need() const {
    double need = 0;
    for (const Job& j : jobs_) need += j.demand() * j.spec.cost;
    return need;
  }

  int64_t PeriodIndex(double t) const {
    return static_cast<int64_t>(std::floor(t / o_.period + kEps));
  }

  double Speed(const Worker& w, double t) const {
    if (w.ready_at > t + kEps) return 0;
    double s = w.speed * Noise(o_, kSpeed, w.id, PeriodIndex(t), o_.speed_jitter);
    if (t < w.ready_at + o_.cold_seconds - kEps) s *= o_.cold_speed;
    return s;
  }

  // Shares of `total` worker-seconds/s among jobs capped at `caps`, in
  // proportion to `weights` (water-filling: what a capped job leaves goes to
  // the others); then what is left max-min fairly among the jobs of weight 0.
  static std::vector<double> Share(double total, const std::vector<double>& caps,
                                   const std::vector<double>& weights) {
    std::vector<double> a(caps.size(), 0);
    double remaining = total;
    auto fill = [&](const std::vector<double>& w) {
      std::vector<size_t> open;
      for (size_t i = 0; i < caps.size(); ++i) {
        if (caps[i] > 0 && w[i] > 0 && a[i] == 0) open.push_back(i);
      }
      while (!open.empty() && remaining > kEps) {
        double sum = 0;
        for (size_t i : open) sum += w[i];
        std::vector<size_t> next;
        for (size_t i : open) {
          if (caps[i] <= remaining * w[i] / sum) {
            a[i] = caps[i];
          } else {
            next.push_back(i);
          }
        }
        if (next.size() == open.size()) {
          for (size_t i : open) a[i] = remaining * w[i] / sum;
          remaining = 0;
          break;
        }
        for (size_t i : open) {
          if (a[i] > 0) remaining -= a[i];
        }
        open = std::move(next);
      }
    };
    fill(weights);
    fill(std::vector<double>(caps.size(), 1.0));
    return a;
  }

  // Runs the world from t0 towards t1; returns where it stopped: t1, or
  // earlier when a job completed.
  double Advance(double t0, double t1) {
    // Speeds are constant on (t0, t1): every change is an event.
    const double mid = (t0 + t1) / 2;
    std::vector<double> speed(workers_.size());
    double total = 0;
    for (size_t i = 0; i < workers_.size(); ++i) {
      speed[i] = Speed(workers_[i], mid);
      total += speed[i];
    }
    int provisioned = static_cast<int>(workers_.size());
    const int oracle = OracleWorkers(Need(), o_);
    // The jobs whose trainers read (no other job changes until one completes, which ends the
    // call): a trace of thousands of jobs costs what the ones running at once cost.
    std::vector<Job*> live;
    for (Job& job : jobs_) {
      if (job.active) live.push_back(&job);
    }
    std::vector<double> weights(live.size(), allocation_.empty() ? 1.0 : 0);
    for (size_t j = 0; j < live.size(); ++j) {
      auto it = allocation_.find(live[j]->spec.id);
      if (it != allocation_.end()) weights[j] = it->second;
    }
    // Every step reaches t1, or fills, empties or completes a job; a job fills or empties once
    // between two of the caller's events, so this bound is never reached.
    const size_t max_steps = 1000 + 4 * live.size();
    std::vector<double> share_seconds(live.size(), 0);  // per job: each ready worker's time
    bool completed = false;                             // a job completed at t0
    for (size_t steps = 0; t0 < t1 - kEps && !completed; ++steps) {
      if (steps == max_steps) {
        std::fprintf(stderr, "autoscale_sim: internal error: no progress at %.9g s\n", t0);
        std::abort();
      }
      std::vector<double> caps(live.size());
      for (size_t j = 0; j < live.size(); ++j) {
        const Job& job = *live[j];
        const bool full = job.buffer >= job.capacity() - kEps;
        caps[j] = full ? job.demand() * job.spec.cost : kInf;
      }
      const std::vector<double> a = Share(total, caps, weights);
      double dt = t1 - t0;
      std::vector<double> produced(live.size()), consumed(live.size());
      for (size_t j = 0; j < live.size(); ++j) {
        const Job& job = *live[j];
        produced[j] = a[j] / job.spec.cost;
        const bool empty = job.buffer <= kEps;
        consumed[j] = empty ? std::min(job.demand(), produced[j]) : job.demand();
        const double rate = produced[j] - consumed[j];
        if (rate > kEps && job.buffer < job.capacity() - kEps) {
          dt = std::min(dt, (job.capacity() - job.buffer) / rate);
        } else if (rate < -kEps && !empty) {
          dt = std::min(dt, job.buffer / -rate);
        }
        if (job.spec.work > 0 && consumed[j] > kEps) {
          dt = std::min(dt, (job.spec.work - job.consumed_total) / consumed[j]);
        }
      }
      dt = std::max(dt, kEps);
      for (size_t j = 0; j < live.size(); ++j) {
        Job& job = *live[j];
        job.buffer += (produced[j] - consumed[j]) * dt;
        if (job.buffer < kEps) job.buffer = 0;
        if (job.buffer > job.capacity() - kEps) job.buffer = job.capacity();
        job.consumed += consumed[j] * dt;
        job.consumed_total += consumed[j] * dt;
        if (job.demand() > 0) {
          const double waited = (1 - consumed[j] / job.demand()) * dt;
          job.wait += waited;
          if (t0 >= s_.measure_from - kEps) {
            result_.wait_seconds += waited * job.spec.consumers;
            result_.trainer_seconds += dt * job.spec.consumers;
          }
        }
        if (job.spec.work > 0 && job.consumed_total >= job.spec.work - 1e-6) {
          job.active = false;
          job.completed = t0 + dt;
          jobs_left_.push_back(job.spec.id);
          completed = true;
        }
        if (total > 0) share_seconds[j] += a[j] / total * dt;
      }
      if (t0 >= s_.measure_from - kEps) {
        result_.worker_seconds += provisioned * dt;
        result_.oracle_worker_seconds += oracle * dt;
      }
      t0 += dt;
    }
    // Each ready worker spent the same share of its time on a job.
    for (size_t j = 0; j < live.size(); ++j) {
      if (share_seconds[j] <= 0) continue;
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (speed[i] <= 0) continue;
        workers_[i].busy[live[j]->spec.id] += share_seconds[j];
        workers_[i].elements[live[j]->spec.id] += speed[i] * share_seconds[j] / live[j]->spec.cost;
      }
    }
    return completed ? t0 : t1;
  }

  // What the heartbeats carried over the last `window` seconds (the period,
  // or less for a decision between ticks).
  Observation Observe(double t, double window, bool tick) const {
    const int64_t k = PeriodIndex(t);
    Observation obs;
    obs.now = t;
    obs.tick = tick;
    obs.jobs_left = jobs_left_;
    dispatcher::AutoscalerInput& in = obs.input;
    in.now = At(t);
    bool all_full = true;
    double fill = 0;
    int active = 0;
    for (const Job& j : jobs_) {
      if (!j.active) continue;
      ++active;
      fill += j.buffer / j.capacity();
      all_full &= j.buffer >= j.capacity() - kEps;
    }
    if (active > 0) fill /= active;
    for (const Worker& w : workers_) {
      if (w.ready_at > t + kEps) {
        ++obs.starting;
        continue;
      }
      ++obs.ready;
      dispatcher::WorkerSample ws;
      ws.worker_id = w.id;
      ws.registered = At(w.ready_at);
      ws.last_heartbeat = At(t);
      double busy = 0, elements = 0;
      for (const auto& [job, b] : w.busy) {
        busy += b;
        obs.workers_used[job] += b / std::max(kEps, window);
        elements += w.elements.at(job);
        if (b > kEps) {
          ws.capacity.push_back(
              {job, w.elements.at(job) / b *
                        Noise(o_, kCapacity, w.id * 1000 + job, k, o_.measure_noise)});
        }
      }
      if (busy > kEps) {
        obs.throughput.push_back(elements / busy *
                                 Noise(o_, kCapacity, w.id * 1000, k, o_.measure_noise));
      }
      ws.queue_capacity = 8;
      ws.queue_depth = all_full ? 8 : static_cast<uint64_t>(std::floor(fill * 8));
      ws.blocked_producers = all_full ? 1 : 0;
      ws.held_splits = 1;
      in.workers.push_back(ws);
      const double up = std::min(window, t - w.ready_at);
      obs.busy_fraction.push_back(up > kEps ? std::min(1.0, busy / up) : 0);
    }
    in.starting_workers = obs.starting;
    obs.provisioned = obs.ready + obs.starting;
    for (const Job& j : jobs_) {
      if (!j.active) continue;
      in.jobs.push_back(
          {.job_id = j.spec.id,
           .batch_size = j.spec.batch_size,
           .priority = j.spec.priority,
           .min_workers = j.spec.min_workers,
           .remaining_elements = j.spec.work > 0 ? j.spec.work - j.consumed_total : 0});
      obs.queued_elements[j.spec.id] = j.buffer;
      const double measured = std::max(kEps, std::min(window, t - j.arrived));
      const double per_consumer =
          j.consumed / j.spec.consumers / static_cast<double>(j.spec.batch_size) / measured;
      for (int c = 0; c < j.spec.consumers; ++c) {
        dispatcher::ConsumerSample cs;
        cs.job_id = j.spec.id;
        cs.consumer_index = static_cast<uint32_t>(c);
        cs.batches_per_second =
            per_consumer * Noise(o_, kConsumer, j.spec.id * 1000 + c, k, o_.measure_noise);
        cs.wait_fraction = std::clamp(j.wait / measured, 0.0, 1.0);
        cs.longest_idle_seconds =
            j.consumed > 0 ? std::min(measured, std::max(j.longest_step, j.spec.step_seconds)) : 0;
        in.consumers.push_back(cs);
        obs.batch_seconds.push_back(cs.batches_per_second > 0 ? 1 / cs.batches_per_second : kInf);
      }
    }
    return obs;
  }

  // Asks the policy and actuates; returns the clamped count.
  int Decide(double t, double window, bool tick) {
    PolicyDecision decision = policy_.Decide(Observe(t, window, tick));
    jobs_left_.clear();
    const int desired = std::clamp(decision.desired, o_.min_workers, o_.max_workers);
    Actuate(desired, decision.drain, t);
    allocation_ = std::move(decision.allocation);
    return desired;
  }

  void Tick(double t) {
    int ready = 0;
    for (const Worker& w : workers_) ready += w.ready_at > t + kEps ? 0 : 1;
    const int desired = Decide(t, o_.period, /*tick=*/true);
    double wait = 0, demand = 0, served = 0;
    int consumers = 0;
    for (const Job& j : jobs_) {
      if (!j.active) continue;
      wait += j.wait / o_.period * j.spec.consumers;
      consumers += j.spec.consumers;
      demand += j.demand();
      served += j.consumed / o_.period;
    }

    PeriodRecord r;
    r.time = t;
    r.desired = desired;
    r.reason = policy_.last_reason();
    r.provisioned = static_cast<int>(workers_.size());
    r.ready = ready;
    r.need = Need();
    r.oracle = OracleWorkers(r.need, o_);
    r.wait = consumers > 0 ? wait / consumers : 0;
    r.demand = demand;
    r.served = served;
    result_.periods.push_back(r);
    for (Worker& w : workers_) {
      w.busy.clear();
      w.elements.clear();
    }
    for (Job& j : jobs_) {
      j.consumed = 0;
      j.wait = 0;
      j.longest_step = j.spec.step_seconds;
    }
  }

  void Actuate(int desired, const std::vector<uint64_t>& drain, double t) {
    int provisioned = static_cast<int>(workers_.size());
    while (provisioned < desired) {
      workers_.push_back(Worker{.id = next_id_++, .ready_at = t + o_.startup_delay});
      ++provisioned;
    }
    // Cancel starting workers first, newest first.
    for (size_t i = workers_.size(); i-- > 0 && provisioned > desired;) {
      if (workers_[i].ready_at > t + kEps) {
        workers_.erase(workers_.begin() + static_cast<ptrdiff_t>(i));
        --provisioned;
      }
    }
    for (uint64_t id : drain) {
      if (provisioned <= desired) break;
      auto it = std::find_if(workers_.begin(), workers_.end(),
                             [&](const Worker& w) { return w.id == id; });
      if (it != workers_.end()) {
        workers_.erase(it);
        --provisioned;
      }
    }
    while (provisioned > desired) {
      workers_.pop_back();  // the newest
      --provisioned;
    }
  }

  void Apply(const LoadStep& step, double t) {
    switch (step.kind) {
      case LoadStep::Kind::kDemandTimes:
        for (Job& j : jobs_) {
          j.spec.step_seconds /= step.factor;
          j.longest_step = std::max(j.longest_step, j.spec.step_seconds);
        }
        break;
      case LoadStep::Kind::kCostTimes:
        for (Job& j : jobs_) {
          if (j.spec.id == step.job) j.spec.cost *= step.factor;
        }
        break;
      case LoadStep::Kind::kLoseWorker:
      case LoadStep::Kind::kSlowWorker:
        for (size_t i = 0; i < workers_.size(); ++i) {
          if (workers_[i].ready_at > t + kEps) continue;
          if (step.kind == LoadStep::Kind::kLoseWorker) {
            workers_.erase(workers_.begin() + static_cast<ptrdiff_t>(i));
          } else {
            workers_[i].speed *= step.factor;
          }
          break;
        }
        break;
      case LoadStep::Kind::kAddJob: {
        Job j{.spec = step.job_spec, .arrived = t};
        jobs_.push_back(j);
        break;
      }
      case LoadStep::Kind::kPriority:
        for (Job& j : jobs_) {
          if (j.spec.id == step.job) j.spec.priority = static_cast<int>(step.factor);
        }
        break;
      case LoadStep::Kind::kAllStop:
      case LoadStep::Kind::kJobStop:
        for (Job& j : jobs_) {
          if (!j.active) continue;
          if (step.kind == LoadStep::Kind::kJobStop && j.spec.id != step.job) continue;
          j.active = false;
          jobs_left_.push_back(j.spec.id);
          if (j.completed < 0) j.stopped = t;
        }
        break;
    }
  }

  const Scenario& s_;
  Policy& policy_;
  const WorldOptions& o_;
  std::vector<Job> jobs_;
  std::vector<Worker> workers_;
  double last_tick_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, double> allocation_;  // the last decision's
  std::vector<uint64_t> jobs_left_;        // since the last decision
  RunResult result_;
};

}  // namespace

double TrueNeed(const std::vector<JobSpec>& jobs) {
  double need = 0;
  for (const JobSpec& j : jobs) {
    need += j.consumers * static_cast<double>(j.batch_size) / j.step_seconds * j.cost;
  }
  return need;
}

int OracleWorkers(double need, const WorldOptions& options) {
  const double n = std::ceil(need - 1e-9);
  if (!(n < options.max_workers)) return options.max_workers;  // NaN too: no cast out of range
  return std::max(options.min_workers, static_cast<int>(std::max(n, 0.0)));
}

RunResult Run(const Scenario& scenario, Policy& policy, const WorldOptions& options) {
  WorldOptions o = options;
  if (scenario.max_workers > 0) o.max_workers = scenario.max_workers;
  World world(scenario, policy, o);
  return world.Run();
}

}  // namespace sluice::autoscale_sim
