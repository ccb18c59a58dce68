// A discrete-event simulator of data workers feeding trainers, to compare
// autoscaling policies on the same load traces (docs/autoscaling.md,
// docs/BENCHMARKS.md "Autoscaling policies (bench/autoscale_sim)").
//
// The world is a fluid model between events. Each job j has consumers that
// together want d_j elements/s (batch size ÷ step time each), a buffer of Q_j
// elements (the workers' output queues plus the clients' prefetch), and a
// pipeline cost c_j in worker-seconds per element. The ready workers' speeds
// (1.0 each, ×0.4 while cold, × a per-period jitter) add up to S
// worker-seconds per second, shared max-min fairly between the jobs: a job
// whose buffer is full takes only d_j·c_j. Production p_j = a_j / c_j;
// consumption is d_j while the buffer holds anything, else min(d_j, p_j), and
// the trainer waits the rest of the time. Rates are constant between events
// (control ticks, a worker becoming ready or warm, a load step, a buffer
// becoming full or empty), so the simulation is exact and fast: an event loop,
// no time step.
//
// Every control period the simulator builds, from what the period's
// heartbeats would carry, the same AutoscalerInput the dispatcher builds (a
// consumer's longest stretch without a batch or a wait is its longest step of
// the period: trainers do not pause in this model), and
// asks a Policy for a worker count (and, for a policy that divides a bounded
// pool, each job's share: the ready workers' time then goes to the jobs in
// that proportion). Every policy is also asked at once when a job's trainers
// leave or its epochs end. The actuator (the same for every policy) starts
// workers (ready after `startup_delay`), or cancels starting ones and removes
// the policy's drain victims (else the newest workers). A job with `work`
// completes once its trainers consumed that many elements (its JCT).
//
// Deterministic: all noise comes from Rng(MixSeed({seed, worker or job,
// period})), so every policy sees the same noise on the same trace.
#ifndef SLUICE_BENCH_AUTOSCALE_SIM_SIM_H_
#define SLUICE_BENCH_AUTOSCALE_SIM_SIM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dispatcher/autoscaler.h"

namespace sluice::autoscale_sim {

struct JobSpec {
  uint64_t id = 1;
  int consumers = 4;
  uint64_t batch_size = 64;
  double step_seconds = 0.25;  // per consumer: demand = batch / step
  double cost = 1.0 / 120;     // worker-seconds per element
  int buffer_batches = 8;      // per consumer
  // Elements the job consumes before it completes (its epochs); 0: runs
  // until a kJobStop or the end of the trace.
  double work = 0;
  int priority = 0;     // job option: a higher one is served first
  int min_workers = 0;  // job option: reserved before any need
};

// A change of the load at time `at` (seconds).
struct LoadStep {
  enum class Kind {
    kDemandTimes,  // every job's step time ÷ factor
    kCostTimes,    // job `job`'s cost × factor
    kLoseWorker,   // the oldest ready worker dies
    kSlowWorker,   // the oldest ready worker's speed × factor
    kAddJob,       // `job_spec` arrives
    kAllStop,      // every consumer leaves
    kJobStop,      // job `job`'s consumers leave (it ran its epochs)
    kPriority,     // job `job`'s priority becomes `factor` (an integer)
  };
  double at = 0;
  Kind kind = Kind::kDemandTimes;
  double factor = 1;
  uint64_t job = 1;
  JobSpec job_spec;
};

struct Scenario {
  std::string name;
  std::vector<JobSpec> jobs;
  std::vector<LoadStep> steps;
  double duration = 90;
  int initial_workers = 0;  // 0: the oracle's count for the initial load
  // Metrics are taken from this time (the step) to the end.
  double measure_from = 30;
  // The pool's bound for this trace (0: WorldOptions::max_workers).
  int max_workers = 0;
};

struct WorldOptions {
  double period = 2;         // control period, seconds
  double startup_delay = 4;  // request to registered
  double cold_seconds = 3;   // after registering, at cold_speed
  double cold_speed = 0.4;
  double speed_jitter = 0.05;   // speed × U(1 - j, 1 + j) per worker and period
  double measure_noise = 0.03;  // each reported rate × U(1 - n, 1 + n)
  int min_workers = 1;
  int max_workers = 128;
  uint64_t seed = 1;
};

// What a policy sees each period.
struct Observation {
  double now = 0;
  dispatcher::AutoscalerInput input;  // what the dispatcher would pass
  int provisioned = 0;                // ready + starting
  int ready = 0;
  int starting = 0;
  // Per ready worker, the fraction of the period it was busy (a CPU
  // utilization), and per consumer, seconds per batch returned (infinite
  // when none came back).
  std::vector<double> busy_fraction;
  std::vector<double> batch_seconds;
  // Per ready worker that was busy: elements (all jobs) per busy second,
  // with the same measurement noise.
  std::vector<double> throughput;
  // Per live job: elements in its buffer (the clients' result queues) and
  // how many workers' time it got over the period (Σ busy / period).
  std::map<uint64_t, double> queued_elements;
  std::map<uint64_t, double> workers_used;
  // Jobs that left since the last call (ran their epochs or stopped).
  std::vector<uint64_t> jobs_left;
  // Whether this call is the periodic tick (false: an event between ticks,
  // every job's consumers of which left).
  bool tick = true;
};

struct PolicyDecision {
  int desired = 0;
  std::vector<uint64_t> drain;  // victims in order; empty: newest first
  // Workers per job (real) for a policy that divides the pool: the ready
  // workers' time goes to the jobs in proportion to it (a job whose buffer
  // is full passes its surplus on). Empty: shared max-min fairly, as
  // workers that serve every job's splits in turn do.
  std::map<uint64_t, double> allocation;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  virtual PolicyDecision Decide(const Observation& obs) = 0;
  // Why the last decision was taken, if the policy says.
  virtual std::string last_reason() const { return ""; }
};

// Every policy is asked every period and, with Observation::tick false, at
// once when a job's consumers leave between ticks (what each does with that
// is its own: the peers below react as their source does).
std::unique_ptr<Policy> MakeSluicePolicy(dispatcher::AutoscalerOptions o);
std::unique_ptr<Policy> MakeCachewPolicy(int min_workers, int max_workers);
std::unique_ptr<Policy> MakeTfDataPolicy(int min_workers, int max_workers);
std::unique_ptr<Policy> MakeHpaPolicy(int min_workers, int max_workers, double period);

// One sample per control period.
struct PeriodRecord {
  double time = 0;
  std::string reason;   // the policy's last_reason()
  int desired = 0;      // the policy's decision at this tick
  int provisioned = 0;  // after actuation
  int ready = 0;
  double oracle = 0;  // ceil(true need), at least min_workers
  double need = 0;    // true need (workers, real)
  double wait = 0;    // mean trainer wait fraction over the period
  double demand = 0;  // elements/s wanted
  double served = 0;  // elements/s consumed
};

struct JobRecord {
  uint64_t id = 0;
  double arrived = 0;
  double completed = -1;  // -1: did not complete (no work, stopped, or trace ended)
  double stopped = -1;    // its trainers left before it completed: when (-1: they did not)
};

struct RunResult {
  std::vector<PeriodRecord> periods;
  std::vector<JobRecord> jobs;
  double worker_seconds = 0;  // from measure_from to the end
  double oracle_worker_seconds = 0;
  // Trainer-seconds spent waiting and trainer-seconds in all, from
  // measure_from to the end.
  double wait_seconds = 0;
  double trainer_seconds = 0;
};

// The fewest workers the true load needs (no noise, no start-up delay).
double TrueNeed(const std::vector<JobSpec>& jobs);
int OracleWorkers(double need, const WorldOptions& options);

RunResult Run(const Scenario& scenario, Policy& policy, const WorldOptions& options);

}  // namespace sluice::autoscale_sim

#endif  // SLUICE_BENCH_AUTOSCALE_SIM_SIM_H_
