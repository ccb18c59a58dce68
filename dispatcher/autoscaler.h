// Autoscaler: how many data workers the jobs need, and why. The control law
// behind `sluice_desired_workers` (docs/autoscaling.md explains it in full).
//
// The caller (the dispatcher, once per scale period) gathers what heartbeats
// reported over the last window into an AutoscalerInput and calls Decide().
// Decide() does no I/O and reads no clock: time comes from `input.now` and the
// timestamps in the samples. It is not a pure function: between calls it keeps
// the needs of the stabilization window (which slow scale-downs), the last
// demand per consumer and capacity per job (for periods that measure none),
// the last decision (for one-for-one replacement) and the times of the first
// call, the last scale-up and the last scale-down. A test or the simulator
// (bench/autoscale_sim) drives it with made-up inputs.
//
// The law, in one step (no +1 probing):
//   demand_j   = Σ over job j's consumers of batches_per_second / (1 - wait)
//                × batch_size                                    [elements/s]
//                (what the trainer would consume if it never waited: its
//                 step rate, whichever side is the bottleneck)
//   capacity_j = robust mean over warm, healthy workers of the elements of j
//                they produce per BUSY second (outliers replaced by the median)
//   need       = Σ_j demand_j / capacity_j                     [workers, real]
//   noise      = noise_z × need's relative standard error, from the spread of
//                the capacities and of the demands (pooled over the jobs)
//   headroom   = 1 + noise within [min_headroom, headroom]; the fixed
//                headroom where no spread can be read
//   target     = ceil(need × headroom), within [min_workers, max_workers]
//   up         when need > current × scale_up_utilization × (1 + noise): at
//              once, to target, at most × max_scale_up_factor per call; in the
//              decision right after a down, or after an up that followed no
//              up, when need > current × utilization (that step's reading most
//              likely mixed the old level and the new)
//   down       to the fewest workers whose expected shortfall for max need
//              over the stabilization window ÷ (1 - noise) (without the ÷
//              after a confirmed fall), read with the headroom's spread, is at
//              most 0.5% (never more than ceil of it × headroom; just that
//              ceil when no spread was measured), at most one step per period,
//              where the window holds each job's demand and divides it by the
//              job's capacity now (cheaper elements count at once); demand that
//              left (a job
//              with no consumer) leaves the window at once, and so does a
//              job's earlier demand once two readings agree on a drop of more
//              than drop_tolerance, or fall by more than it one after the
//              other (a reading with a pause in it confirms no drop)
//   (the noise in the band is the measured part only, at most headroom - 1)
//
// Worked example (headroom 1.05): one job, batch 64, 2 consumers each returning
// 4 batches/s and waiting 50% of the time → demand 2 × 4 / 0.5 × 64 = 1024
// elements/s. Three warm workers each produce 128 elements per busy second →
// need = 8.0, target = ceil(8.4) = 9: up from 3 to 9 in one call (×3 < ×4).
// A 4th worker that registered 1 s ago is warming up and ignored; a 5th that
// produces 20 elements per busy second is an outlier, counted as 128 and
// listed in `replace`.
//
// Thread-compatible: one caller at a time.
#ifndef SLUICE_DISPATCHER_AUTOSCALER_H_
#define SLUICE_DISPATCHER_AUTOSCALER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace sluice::dispatcher {

struct AutoscalerOptions {
  int min_workers = 1;
  int max_workers = 64;
  // Provision need × headroom workers: at most 1/1.05 = 95% busy, so noise
  // in the measurements and in the pipeline's speed (a few %) does not make
  // trainers wait, and rounding up to whole workers adds the rest. This is
  // the headroom when the noise cannot be measured, and the most it can be.
  double headroom = 1.05;
  // When every job has at least three workers and three consumers measured, the
  // headroom is 1 + noise_z × need's relative standard error (from the
  // spread of the capacities and demands), within [min_headroom, headroom]:
  // the mean of 60 workers is known to a fraction of a percent, and 5% of 60
  // is 3 idle workers. noise_z = 0: always `headroom`.
  double noise_z = 2.0;
  double min_headroom = 1.01;
  // Rounding a scale-down to whole workers: the fewest n >= need whose
  // expected shortfall, E[max(0, N - n)] for a need N read with the
  // headroom's standard error ((headroom - 1) / noise_z of it), is at most
  // this fraction of the need; never more than ceil(need x headroom). A need
  // that fell to 4.97, read to 1%, gets 5 (short by 0.17% on average) where
  // 4.97 x 1.02 = 5.07 rounds to 6: 20% more workers for a fraction of a
  // percent. A scale-up keeps ceil(need x headroom): its first reading after
  // a step is the least sure. So does a scale-down whose noise could not be
  // measured (fewer than 3 workers or consumers): the spread the headroom
  // assumes is a guess, and one worker's capacity read over one period moves
  // by more than it (bench/autoscale.sh: 1 -> 2 -> 1 -> 2 workers for a need
  // of 0.97-1.07). 0: ceil(need x headroom) both ways.
  double max_expected_shortfall = 0.005;
  // Scale up only when the measured need passes this fraction of the current
  // workers: between 1/headroom and this (95-100% busy) noise cannot add a
  // worker, and above it the trainers are short of data.
  double scale_up_utilization = 1.0;
  // At most current × this per call: a wrong estimate (a trainer that waits
  // for another reason) costs at most one ×4 step before the next measurement.
  double max_scale_up_factor = 4.0;
  // The decision period: at most one scale-down per period.
  absl::Duration period = absl::Seconds(2);
  // A scale-down goes to the largest need seen over this window (each past
  // demand over the job's capacity now).
  absl::Duration scale_down_window = absl::Seconds(30);
  // The dispatcher recovered jobs or workers from its journal: the workers it
  // finds were sized on demand this autoscaler never saw, so nothing is scaled
  // down (except for demand that left) before a whole scale_down_window of its
  // own measurements. A fresh dispatcher has no such past and scales down from
  // its first decisions.
  bool restarted = false;
  // Except for a job whose demand fell and stayed down: when its last two
  // readings are both lower by more than this fraction than every earlier
  // one in the window, and either agree within it or the last is lower than
  // the one before by more than it (a fall that began inside a period reads
  // as a mix first), the readings before the lower level are forgotten. A
  // reading with a pause in it (see pause_idle_steps) confirms nothing.
  // 0: always the window.
  double drop_tolerance = 0.1;
  // A consumer's reading holds a pause (a checkpoint, an evaluation) when it
  // neither received a batch nor waited for longer than this many of its
  // steps (batch_size ÷ its demand), and for longer than drop_tolerance ×
  // period (a shorter stretch cannot by itself move a reading by the
  // tolerance). Its own steps are what a trainer does between batches.
  double pause_idle_steps = 4;
  // A worker's measurements count only this long after it registered (cold
  // caches, first splits opening files, the pipeline's autotune settling).
  absl::Duration warmup = absl::Seconds(5);
  // A consumer's wait right after its epoch started (pipelines refill,
  // shuffle buffers fill) is not demand: during this long its previous
  // estimate is kept. Not for a consumer whose previous epoch was shorter
  // than this: every window holds a refill, which is then its steady state,
  // and keeping the estimate would freeze it at its first reading.
  absl::Duration epoch_grace = absl::Seconds(5);
  // A worker whose last heartbeat is older than this is stalled (e.g.
  // SIGSTOPped): not measured, listed in `replace`, drained first.
  absl::Duration stale_after = absl::Seconds(5);
  // A warm worker whose capacity is below median × outlier_ratio or above
  // median / outlier_ratio counts as the median.
  double outlier_ratio = 0.5;
  // Smallest 1 - wait used in demand = rate / (1 - wait): a trainer that waits
  // 99% of the time is estimated at most 1/0.02 = 50× its rate (then capped
  // by max_scale_up_factor).
  double min_busy_fraction = 0.02;
  // Veto on scale-ups: if no consumer waits more than this and every warm
  // worker's output queue is full (or its producers blocked), the workers
  // already outrun the trainers; the measured need is not believed. Also the
  // wait above which a trainer that got no batch is starved (its demand
  // unread), and at or below which it paused.
  double idle_wait_fraction = 0.01;
  double full_queue_fraction = 0.9;
};

// Worker capacity measured for one job. job_id == kAllJobs: for every job the
// worker has no entry of its own for (a worker that only measures its total).
inline constexpr uint64_t kAllJobs = 0;
struct JobCapacity {
  uint64_t job_id = kAllJobs;
  // Elements of this job produced per second of busy time: elements ÷ the
  // worker-seconds spent producing them, where a worker-second is the whole
  // worker (all its pipeline threads) for one second, so that Σ over jobs of
  // busy seconds ≤ wall seconds. Excludes time the pipeline was blocked on a
  // full output queue or idle without splits. 0 = not measured.
  double elements_per_busy_second = 0;
};

// One data worker, from its heartbeats over the window.
struct WorkerSample {
  uint64_t worker_id = 0;
  absl::Time registered = absl::InfinitePast();
  absl::Time last_heartbeat = absl::InfinitePast();
  bool draining = false;  // not counted, not measured, never a victim
  std::vector<JobCapacity> capacity;
  uint64_t queue_depth = 0;     // batches in its output queues
  uint64_t queue_capacity = 0;  // their bound
  int blocked_producers = 0;    // pipeline threads blocked on a full queue
  // For choosing drain victims: splits it holds and batches it produced that
  // no consumer has yet (what a drain hands over or throws away).
  int held_splits = 0;
  uint64_t undelivered_batches = 0;
};

// One consumer (trainer), from its heartbeats over the window. List only live
// consumers of unfinished jobs: a consumer that left has no demand.
struct ConsumerSample {
  uint64_t job_id = 0;
  uint32_t consumer_index = 0;
  double batches_per_second = 0;  // returned to the trainer
  double wait_fraction = 0;       // of the window spent waiting for a batch
  // When its current epoch started; InfinitePast() = long ago.
  absl::Time epoch_started = absl::InfinitePast();
  // How long its previous epoch lasted (seconds; 0: unknown). Epochs shorter
  // than epoch_grace get none: their refill is in every window.
  double previous_epoch_seconds = 0;
  // The longest stretch of the window (seconds) in which it neither received
  // a batch nor waited: one step of its own work, or a pause. 0: not measured.
  double longest_idle_seconds = 0;
};

struct JobSample {
  uint64_t job_id = 0;
  uint64_t batch_size = 1;  // elements per batch
  // Job options for dividing a bounded pool (AllocateWorkers): a higher
  // priority is served first; min_workers is reserved before any need.
  int priority = 0;
  int min_workers = 0;
  // Elements its consumers have still to read before the job completes (the
  // splits of its remaining epochs); 0: unknown or endless.
  double remaining_elements = 0;
};

struct AutoscalerInput {
  absl::Time now;
  std::vector<WorkerSample> workers;
  std::vector<ConsumerSample> consumers;
  std::vector<JobSample> jobs;
  // Workers the actuator started that have not registered yet: counted as
  // current (so the next call does not start them again), never measured.
  int starting_workers = 0;
};

// What the autoscaler concluded about one job.
struct JobEstimate {
  uint64_t job_id = 0;
  int consumers = 0;
  double demand = 0;    // elements/s
  double capacity = 0;  // elements/s per worker (0: not measured)
  double need = 0;      // workers (real)
  int priority = 0;
  int min_workers = 0;
  // Seconds the job still runs if its trainers never wait: remaining
  // elements ÷ demand; 0 = unknown or endless.
  double remaining_seconds = 0;
  // Its trainers received nothing and waited all window, and no earlier
  // estimate exists (a new job the pool gave nothing yet): its demand cannot
  // be read; AllocateWorkers gives it one worker to read it.
  bool starved = false;
  // The share of the pool this job's splits go to, in workers (real), and
  // why (AllocateWorkers).
  double allocated = 0;
  std::string allocation_reason;
  // Its place in AllocateWorkers' order (0: served first): the order in
  // which AssignWorkersToJobs fills whole workers.
  int allocation_rank = 0;
  // Its allocation_rank in the previous decision (-1: none, a new job): a job
  // keeps its place ahead of another unless that one is clearly ahead
  // (AllocateWorkers).
  int previous_rank = -1;
  // It shared what was left of the pool with jobs alike (AllocateWorkers) in
  // this decision, and in the previous one: jobs that shared go on sharing
  // within the wider kKeepSharingMargin.
  bool shared = false;
  bool shared_before = false;
};

struct AutoscalerDecision {
  int desired_workers = 0;
  int current_workers = 0;  // non-draining registered + starting
  // One line for `sluice status` and the log, e.g.
  //   "up 3 -> 9: need 8.00 workers (job 1: 1024 el/s / 128 el/s per worker)
  //    x 1.05 headroom = 9"
  std::string reason;
  // When desired < current: the registered workers to drain, least useful
  // first (stalled, then slowest outliers, then fewest held splits, fewest
  // undelivered batches, newest). Size ≤ registered - desired: starting
  // workers are cancelled first.
  std::vector<uint64_t> drain;
  // Stalled (stale heartbeat) or outlier-slow workers, whatever the decision:
  // the actuator may replace them.
  std::vector<uint64_t> replace;
  std::vector<JobEstimate> jobs;
  double need = 0;      // Σ jobs' need
  double headroom = 0;  // the headroom this decision used
  // Σ need × headroom (or the reservations) exceeds max_workers: the pool
  // is divided by AllocateWorkers, and splits should be handed out in
  // proportion to each job's `allocated`. False: every job gets its need.
  bool pool_bound = false;
};

// Divides `pool` workers among `jobs` (their need, consumers, priority,
// min_workers and remaining_seconds set) and sets each job's `allocated` and
// `allocation_reason`:
//   1. min_workers first, whole, whatever the other jobs' priority, while
//      the pool holds every job's; when the reservations add up to more, the
//      largest are dropped (ties: the lower priority, then the later job)
//      until the rest fit, so that no job can reserve the others out and an
//      outsized reservation voids only its own; then one worker to each
//      starved job (its demand is read from it), whatever its priority: a
//      demand must be read before it can be weighed;
//   2. then the next worker goes where it removes the most trainer wait,
//      each job up to need × headroom. A job's trainers wait (1 - allocated
//      / need) of the time, so a worker removes consumers / need
//      trainer-seconds per second now; over the rest of the run, a job that
//      gets its need sooner also finishes sooner and frees its workers. Jobs
//      whose end is known are served shortest first by the worker-seconds
//      they still need (need × remaining_seconds): the order that minimises
//      their mean completion time (weighting by consumers instead, Smith's
//      rule for total trainer-seconds, measured worse on the mean JCT of
//      bench/autoscale_sim's tuning traces). Order: higher priority; then
//      jobs whose end is known, fewest worker-seconds first; then the others
//      by consumers / need; then the lower job id (the job that came first
//      finishes first rather than all late). The order is kept from one
//      decision to the next (previous_rank) unless a job is clearly ahead of
//      one served before it: a higher priority, or worker-seconds or a gain
//      better by more than kReorderMargin. Without that, two jobs whose
//      measured needs differ by noise alone would swap places, and the
//      workers between them, at every decision. Jobs alike (no end known,
//      the same priority, gains within kReorderMargin, or kKeepSharingMargin
//      for jobs that shared in the previous decision) share what is left in
//      proportion to their need rather than one after the other: the first
//      would otherwise take the pool for as long as both run, which for jobs
//      without an end is for ever;
//   3. what is left when every job has need × headroom goes to the jobs in
//      proportion to it.
// Example (pool 10, headroom 1, no end known): job 1 (2 consumers, need 4),
// job 2 (2 consumers, need 8), job 3 (1 consumer, need 6, min_workers 1).
// Job 3 gets its minimum 1; job 1 removes 2/4 per worker: 4; job 2 removes
// 2/8 and job 3 1/6: job 2 gets the remaining 5 of its 8, job 3 stays at 1.
// Had job 2 60 s left (8 × 60 = 480 worker-seconds) and job 1 200 s (4 ×
// 200 = 800), job 2 would get its 8 first and job 1 the last 1.
// `bound`: the most workers the pool may have (max_workers), which the
// reservations are weighed against (a kept one raises the pool to hold it).
void AllocateWorkers(double pool, double headroom, std::vector<JobEstimate>& jobs, double bound);

// How much better (relatively) a job's worker-seconds or gain must be for it
// to pass a job served before it in the previous decision: more than the
// noise of two needs measured on the same workers (each within the noise
// headroom, at most a few percent).
inline constexpr double kReorderMargin = 0.1;

// How far apart the gains of jobs that shared the pool in the previous
// decision may read for them to go on sharing. Gains measured on different
// workers differ with no difference in the jobs (two identical jobs on two
// workers, real processes: up to 15% apart), and without this margin such
// jobs went from halves to the whole pool and none in 10 of 24 decisions.
inline constexpr double kKeepSharingMargin = 0.25;

// The jobs (ids) whose min_workers a pool of `pool` workers does not keep:
// none while every reservation fits; otherwise the largest (ties: the lower
// priority, then the later job) until the rest fit.
std::set<uint64_t> DroppedReservations(const std::vector<JobEstimate>& jobs, double pool);

// Workers the jobs hold with their reservations: Σ max(need × headroom,
// min_workers), a reservation that `pool` does not keep counting 0. The
// autoscaler provisions at least this many (within max_workers), so that a
// reservation above a job's need takes no worker from the other jobs' need.
double ReservedNeed(const std::vector<JobEstimate>& jobs, double headroom, double pool);

// Worker affinity for a bounded pool: which job each of `workers` (the
// registered, non-draining ones) serves first, so that the split hand-out
// gives each job its share of AllocateWorkers' division in whole workers.
//   1. Quotas: each job gets floor(allocated) workers; while the quotas add up
//      to more than there are workers (some are still starting), the job
//      served last (highest allocation_rank) gives one up; while fewer, the
//      job with the largest fraction left (allocated - quota; ties: lower
//      rank) gets one more, each job at most one. Workers beyond Σ
//      ceil(allocated) stay unassigned.
//   2. A worker keeps the job it served in `previous` while that job's quota
//      has room (its splits in production stay where they are), lowest
//      worker id first.
//   3. The other workers, lowest id first, go to the jobs with room left,
//      lowest rank first.
// Returns worker id -> job id; a worker missing from it serves every job.
// Example: workers 1-4, job 7 allocated 2.6 (rank 0), job 8 1.4 (rank 1),
// previous {1: 8, 2: 8}. Quotas 2 and 1, and the spare worker goes to job 7
// (fraction 0.6 > 0.4): 3 and 1. Worker 1 keeps job 8 (quota 1); worker 2's
// job 8 is full, so workers 2, 3, 4 go to job 7: {1: 8, 2: 7, 3: 7, 4: 7}.
std::map<uint64_t, uint64_t> AssignWorkersToJobs(const std::vector<JobEstimate>& jobs,
                                                 const std::vector<uint64_t>& workers,
                                                 const std::map<uint64_t, uint64_t>& previous);

class Autoscaler {
 public:
  explicit Autoscaler(AutoscalerOptions options);

  // The worker count for `input`; call once per period (a call sooner than
  // `period` after the last scale-down cannot scale down again). Never fails:
  // missing measurements keep the current count and say so in `reason`.
  AutoscalerDecision Decide(const AutoscalerInput& input);

  const AutoscalerOptions& options() const { return options_; }

 private:
  // One decision's demand per job (elements/s) and headroom. The window holds
  // demand, not need: a trainer's pause is what it waits out, while a change
  // of the workers' capacity (a cheaper pipeline, a worker that recovered) is
  // divided in at the next decision.
  struct HistoryEntry {
    absl::Time time;
    std::map<uint64_t, double> demand_by_job;
    double headroom = 0;
    // Jobs with a paused consumer (it neither received nor waited): such a reading
    // confirms no drop.
    std::set<uint64_t> paused_jobs;
  };

  struct Census;
  struct Estimate;

  // One step each of Decide(), in order.
  Census CountWorkers(const AutoscalerInput& input) const;
  void EstimateDemand(const AutoscalerInput& input, Estimate& e, std::vector<std::string>& notes);
  void EstimateCapacity(const Census& census, Estimate& e);
  void FillUnmeasuredCapacity(Estimate& e) const;
  void SumNeed(Estimate& e) const;
  void MeasureNoise(Estimate& e) const;
  void RecordHistory(absl::Time now, Estimate& e);
  void ForgetConfirmedDrops(Estimate& e);
  // Whole workers for a scale-down to `need` read with `headroom`
  // (max_expected_shortfall; ceil(need x headroom) unless the noise was
  // measured).
  int ScaleDownTarget(double need, double headroom, bool noise_measured) const;
  bool StepJustTaken(absl::Time now) const;
  // Not restarted, or a whole scale-down window has passed since the first call.
  bool WindowSeen(absl::Time now) const;
  std::string ScaleUp(const AutoscalerInput& input, const Census& census, const Estimate& e,
                      int& desired) const;
  std::string ScaleDownOrHold(absl::Time now, const Estimate& e, int& desired);
  std::vector<uint64_t> DrainVictims(const AutoscalerInput& input, const Census& census,
                                     const Estimate& e, int surplus) const;

  AutoscalerOptions options_;
  std::deque<HistoryEntry> history_;
  // Last demand estimate per (job, consumer), for epoch starts.
  std::map<std::pair<uint64_t, uint32_t>, double> consumer_demand_;
  // Last measured capacity per job and over all jobs, for periods in which no
  // warm worker measured one.
  std::map<uint64_t, double> last_capacity_;
  double last_any_capacity_ = 0;
  // The last decision: while the need stays within its hold band, workers
  // lost since are replaced one for one.
  int last_desired_ = 0;
  absl::Time last_scale_down_ = absl::InfinitePast();
  // The last up, and the first of the ups in a row that ended with it (StepJustTaken).
  absl::Time last_scale_up_ = absl::InfinitePast();
  absl::Time first_scale_up_ = absl::InfinitePast();
  absl::Time first_call_ = absl::InfinitePast();
  // Unfinished jobs with a consumer in some call so far.
  std::set<uint64_t> heard_jobs_;
  // Each job's allocation_rank in the last decision that divided the pool.
  std::map<uint64_t, int> last_ranks_;
  // The jobs that shared the pool with jobs alike in the last decision.
  std::set<uint64_t> last_shared_;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_AUTOSCALER_H_
