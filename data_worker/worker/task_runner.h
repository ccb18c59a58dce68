// TaskRunner: the worker's producers. `threads` producer threads take tasks from a FIFO, run
// each through its job's long-lived Executor, encode every output element as a wire batch and
// Push() it into ConsumerQueues; a split ends with its end-of-split marker.
//
// Long-lived executors. Each producer thread keeps one Executor stream (executor.h: Open,
// Submit, Next) per job it has served, from JobRegistry's pool, until the job is removed: a
// split is a run submitted to the running pipeline, so its stage threads, their autotuned
// counts and full queues carry over from split to split. While the thread delivers a run's
// batches it submits the next run as soon as the current one's records have all entered the
// pipeline (look-ahead: the next epoch of a PARALLEL_EPOCHS walk, else the next task of the
// FIFO), so the stages never drain between splits. It takes a task for look-ahead only when
// no other producer is idle, so a producer blocked by a slow consumer holds at most one task
// besides its own. Runs come out in submission order and each run is its own epoch: batches
// never mix records of two splits, and a run's output is the same as a fresh executor's. One
// thread, not one executor for all producers, per job: each producer's runs come out in its
// own order, so a consumer that stops reading blocks one producer, not the job.
//
// CPU: the producers that have runs in flight share `cpu_budget` threads (Executor::
// SetCpuBudget on their pipelines), so two splits produced at once do not each size themselves
// to every core; a producer alone gets all of them.
//
// Progress counts output batches. A task with skip_batches = k runs its split from the first
// record (the output is a pure function of seed, epoch and records) and discards batches
// 0..k-1 instead of sending them: filters and skipped records cannot shift what a replacement
// worker sends. Example: split of 10 records, batch 4, skip 1 -> batches 1 ([4..7]) and 2
// ([8, 9]), then the marker with batch_index 3.
//
// A task stops when ConsumerQueues says it is gone (dropped, restarted, stopped); a pipeline
// error goes to the consumer's stream (ConsumerQueues::Fail). Start()/Stop() own the threads.
//
// Production groups (docs/sharing.md). Tasks of one EnqueueGroup() whose assignments have the
// same non-zero share_group, consumer, epoch, position and pieces are byte-identical: a
// producer takes them together and runs the slot once, streaming each batch to every member
// that needs it (batch index >= its skip_batches; each member keeps its own task id, queue and
// progress, so exactly-once stays per job). A member whose queue stays full for
// `share_detach_after` while another member took the batch is detached: it is queued again as
// a task of its own from the batch it misses (skip_batches = that index), which a producer
// takes only when its queue has room, and the others go on. Example: members A, B, C at
// batch 4; B's trainer stopped reading, its queue is full: A and C take batch 4, B does not
// within the bound; B is detached with skip 4; the run goes on for A and C; B's own task
// produces the slot again, discards batches 0-3 and sends 4, 5, ... when B reads again.
// A group whose members all stay full waits for them (nobody is behind the others).
//
// Paused consumers. A trainer that still heartbeats but stopped reading (an evaluation loop
// between its passes, a long checkpoint) fills its queue; its producer would then wait in
// Push() for as long as the trainer does, holding one of the worker's `--capacity` producers
// (and, at the dispatcher, one unit of the worker's capacity) that other jobs wait for. So a
// split task's producer waits at most `pause_unread_after` on a queue nobody reads
// (ConsumerQueues::PushUnlessUnread): then the task is *paused*. The run stops (its pipeline
// cancels the rest), the batches already queued stay queued (the queue's bound: bounded
// memory), and the task goes back to the FIFO as a detached task (like a member that fell
// behind its group) with skip_batches = the batch that found no room: it holds no producer,
// the heartbeat reports it `detached` (it takes none of the worker's capacity), and a producer
// takes it again only when its queue has room, i.e. once the consumer read (or attached
// again). Its run then produces the slot from its first record and discards the batches below
// that index, so each batch reaches the queue once. Example: slot of 10 batches, queue of 2,
// the trainer stops after reading 3: batches 3, 4 are queued, 5 finds no room; after the bound
// the task pauses with skip 5; when the trainer reads batch 3 the task resumes, discards 0-4
// and queues 5, 6, ..., then the marker 10. PARALLEL_EPOCHS walks and production groups are not
// paused (a group detaches its laggards instead).
#ifndef SLUICE_DATA_WORKER_WORKER_TASK_RUNNER_H_
#define SLUICE_DATA_WORKER_WORKER_TASK_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/service/wire_batch.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/worker/consumer_queues.h"
#include "data_worker/worker/job_registry.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker {

// Turns an executor output into a wire batch without copying: each column's Tensor moves into
// a shared owner that the queue and gRPC's slices reference (service/batch_codec.h). An
// unbatched pipeline's element gets a leading dimension of 1, so shape[0] is always the element
// count. InvalidArgument if the column counts differ.
absl::StatusOr<service::WireBatch> ToWireBatch(pipeline::Element element, const Job& job);

// Trainer-side finishing of one executor output (job.tail, job_registry.h): either runs the tail
// on the batch here, or leaves the column as it is and returns the ColumnFinish the header must
// carry (finish client; auto when the column is uint8, which the tail would make 4x larger).
// Errors: the tail op's own (e.g. InvalidArgument naming the op).
absl::StatusOr<std::optional<proto::ColumnFinish>> FinishOrShip(const Job& job,
                                                                pipeline::Element* element);

class TaskRunner {
 public:
  // `cpu_budget`: the stage threads of all pipelines together (the worker's --threads,
  // resolved).
  // `share_detach_after`: how long a production group waits for a member whose queue is full
  // while the others take their batch, before it detaches it.
  // `pause_unread_after`: how long a split task's producer waits on the full queue of a
  // consumer that reads nothing before the task pauses (InfiniteDuration: never).
  TaskRunner(ConsumerQueues* queues, JobRegistry* jobs, prometheus::Registry& registry,
             std::shared_ptr<spdlog::logger> logger, int cpu_budget,
             absl::Duration share_detach_after = absl::Seconds(2),
             absl::Duration pause_unread_after = absl::InfiniteDuration());
  ~TaskRunner();  // Stop()s

  void Start(int threads) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues task `task_id` (from ConsumerQueues::AddTask) for production.
  void Enqueue(uint64_t task_id, proto::SplitAssignment assignment, bool parallel)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Queues split tasks (task id, assignment) at once (one heartbeat's): the members of a
  // production group among them are produced together.
  void EnqueueGroup(std::vector<std::pair<uint64_t, proto::SplitAssignment>> tasks)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The detached tasks that wait for room in their consumer's queue (no producer runs them):
  // members that fell behind their group, and paused tasks.
  std::set<uint64_t> waiting_detached() const ABSL_LOCKS_EXCLUDED(mu_);

  // Called (from a producer thread, without a lock) when a task pauses and when a paused task
  // resumes, so that the worker reports it at once: the dispatcher then hands the freed
  // capacity to another job, or gives the consumer its next slots. Set before Start().
  void set_on_pause_change(std::function<void()> hook) { on_pause_change_ = std::move(hook); }

  // Peak over time of queued bytes plus the live bytes of every running Executor.
  int64_t peak_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Stage threads the producers' executors have started (Executor::thread_starts): flat
  // while split after split of a job runs on its long-lived executors (tests).
  uint64_t pipeline_thread_starts() const ABSL_LOCKS_EXCLUDED(mu_);

  // Busy time, for the autoscaler's capacity measurement (cumulative: every long-lived pipeline's
  // busy time so far, counted up at each run's end and read live in between, so that a worker's
  // first report does not wait for its first split to end). A pipeline is busy for the
  // thread-seconds of its bottleneck stage (the stage with the most busy time per thread) divided
  // by that stage's threads: the time that stage would need alone. Time blocked on a full queue or
  // idle without a split is not busy. The worker's busy seconds are the runs' busy seconds divided
  // by the producer count, so that they never exceed wall time: elements_run / busy_seconds is what
  // the worker produces per second when it never waits for its consumers. `elements` are the
  // elements (inside batches) of the runs `busy_seconds` counts. `by_job` holds the same two
  // counters per job (busy seconds divided by the producer count like the total), so that jobs of
  // different cost sharing this worker each get their own capacity. All are read from one snapshot
  // of each pipeline's counters (stage threads add busy time concurrently), so one job's entry
  // equals the totals.
  struct JobBusy {
    uint64_t elements = 0;
    double busy_seconds = 0;
  };
  struct Busy {
    double busy_seconds = 0;
    uint64_t elements = 0;
    std::map<uint64_t, JobBusy> by_job;
  };
  Busy busy() const ABSL_LOCKS_EXCLUDED(mu_);
  // Per job, its pipelines' stages (in plan order) summed over the runs that ended: what
  // `cache: auto` measures (docs/cache.md). `elements` are those the stage processed, `out` those
  // it passed on, `bytes_per_element` the largest average element size seen in its output queue.
  struct StageCost {
    std::string name;  // "map[1]", "filter[0]", "map[2]+batch", "source"
    uint64_t elements = 0;
    uint64_t out = 0;
    double busy_seconds = 0;
    double bytes_per_element = 0;
  };
  std::map<uint64_t, std::vector<StageCost>> stage_costs() const ABSL_LOCKS_EXCLUDED(mu_);
  // Stops reporting a job that is over, so the per-job counters stay bounded.
  void ForgetJob(uint64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct QueuedTask {
    uint64_t task_id = 0;
    proto::SplitAssignment assignment;
    bool parallel = false;
    // It fell behind its production group, or paused: produced alone, taken when its queue has
    // room.
    bool detached = false;
    bool paused = false;  // it paused (its consumer stopped reading)
    // How often it paused: each pause doubles the unread time the next one needs
    // (UnreadLimit), so a trainer whose step is longer than --pause-unread-after pauses
    // once per split, not at every batch (each resume recomputes the slot's prefix).
    uint32_t pauses = 0;
    // The other members of its production group, taken with it (Take).
    std::vector<QueuedTask> shared;
  };
  // A job's long-lived executor on one producer thread.
  struct Pipeline {
    uint64_t job_id = 0;
    std::unique_ptr<pipeline::Executor> ex;
    // The Job `ex` runs the pipeline of: a job built again (`cache: auto` decided) retires the
    // pipeline once no run uses it, and a run always uses its pipeline's Job (its cache).
    std::shared_ptr<const Job> job;
  };
  // A run submitted to a producer's pipeline: one split (or one epoch of a parallel walk).
  struct SubmittedRun {
    QueuedTask task;
    std::shared_ptr<const Job> job;
    Pipeline* pipeline = nullptr;
    uint64_t epoch = 0;
    uint64_t run = 0;  // the executor's run id
    uint64_t batch_index = 0;
    bool stopped = false;    // the task stopped: the run's outputs are dropped
    bool continued = false;  // a parallel walk's next epoch is submitted
    // Splits this run writes to the job's cache (split_cache.h): whole splits it reads that had
    // no committed file when it was submitted.
    std::vector<uint64_t> captures;
    // A shared run: every task it serves (`task` first while it is live). Empty: `task` only.
    std::vector<QueuedTask> members;
  };
  // One producer thread's state; touched by that thread only.
  struct Producer {
    std::map<uint64_t, Pipeline> pipelines;  // by job id
    std::deque<SubmittedRun> runs;           // in the order their outputs come
    bool busy = false;                       // counted in busy_producers_
    int cpu_share = 0;                       // its pipelines' CPU budget
  };

  void ProducerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts the producer busy or idle and gives its pipelines their share of the CPU budget. False
  // once Stop() was called.
  bool Share(Producer& producer) ABSL_LOCKS_EXCLUDED(mu_);
  // The next task: waits for one if `wait`, else takes one only if no producer is idle.
  std::optional<QueuedTask> Take(bool wait) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks the task's job and submits the task's first run.
  void Begin(Producer& producer, QueuedTask task) ABSL_LOCKS_EXCLUDED(mu_);
  // Submits `run` to its pipeline and appends it to the producer, or fails the task.
  void Submit(Producer& producer, SubmittedRun run) ABSL_LOCKS_EXCLUDED(mu_);
  // Submits the producer's next run if the last one's records have all entered its pipeline.
  void Lookahead(Producer& producer) ABSL_LOCKS_EXCLUDED(mu_);
  // Encodes one output of the producer's oldest run and queues it (or skips it).
  void Deliver(Producer& producer, SubmittedRun& run, pipeline::Element element)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Streams batch `index` of a shared run to every member that needs it; detaches laggards.
  void FanOut(Producer& producer, SubmittedRun& run, const service::WireBatch& batch,
              uint64_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues batch `index` of `run` for its own task's consumer, waiting for room; a split task
  // whose consumer reads nothing for UnreadLimit pauses instead (kFull; Pause). kGone: the
  // task was dropped.
  ConsumerQueues::PushResult PushOwn(Producer& producer, const SubmittedRun& run,
                                     service::WireBatch batch, uint64_t index)
      ABSL_LOCKS_EXCLUDED(mu_);
  // How long `task`'s queue may stay full and unread before it pauses:
  // --pause-unread-after, doubled per earlier pause of the task (at most 64x).
  absl::Duration UnreadLimit(const QueuedTask& task) const;
  // The task's consumer read nothing while its batch `index` waited for room: stops its runs
  // and queues it again, detached, from that batch.
  void Pause(Producer& producer, const QueuedTask& task, uint64_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails the queues of every task of `run` (its own and its sharing members) with `status`.
  void FailTasks(const SubmittedRun& run, const absl::Status& status);
  // Fails every task of `run` with `status` and stops it.
  void FailRun(Producer& producer, SubmittedRun& run, const absl::Status& status);
  // The producer's oldest run ended: its marker, or the walk's next epoch.
  void EndRun(Producer& producer) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes and reports the run's captured cache splits if it ran to its end, else drops them.
  void EndCaptures(SubmittedRun& run) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the rest of the task's runs on this producer (it failed or is gone).
  void StopTask(Producer& producer, uint64_t task_id);
  // The producer's executor for `job_id`, opened on first use.
  absl::StatusOr<Pipeline*> PipelineFor(Producer& producer, uint64_t job_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops and returns to the registry the pipelines of jobs the registry dropped (all of them
  // if `all`), unless a run of the producer still uses them.
  void Retire(Producer& producer, bool all) ABSL_LOCKS_EXCLUDED(mu_);
  void UpdatePeak() ABSL_LOCKS_EXCLUDED(mu_);
  struct PipelineCounters;
  // Adds `r`'s busy time and elements since they were last counted to the totals.
  void CountBusy(PipelineCounters& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PipelineCounters& CountersOf(const pipeline::Executor* ex) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ConsumerQueues* const queues_;
  JobRegistry* const jobs_;
  const std::shared_ptr<spdlog::logger> logger_;
  const int cpu_budget_;
  const absl::Duration share_detach_after_;
  const absl::Duration pause_unread_after_;
  std::function<void()> on_pause_change_;  // set before Start, then read only
  prometheus::Counter& splits_started_;
  prometheus::Counter& shared_joined_;    // members served by another task's production
  prometheus::Counter& shared_detached_;  // members that fell behind their group
  prometheus::Counter& paused_;           // tasks whose consumer stopped reading
  prometheus::Counter& resumed_;          // paused tasks taken again

  mutable absl::Mutex mu_;
  absl::CondVar work_available_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<QueuedTask> pending_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;            // producers waiting for a task
  int busy_producers_ ABSL_GUARDED_BY(mu_) = 0;  // producers with runs in flight
  // Every producer's pipelines, with what their stats were when busy time was last counted.
  struct PipelineCounters {
    pipeline::Executor* ex;
    uint64_t job_id;
    std::vector<double> busy_base;  // per stage
    uint64_t elements_base;
    std::vector<uint64_t> stage_elements_base;  // per stage, for stage_costs
    std::vector<uint64_t> stage_dropped_base;
    bool forgotten = false;  // its job is over (ForgetJob): counted in the totals only
  };
  std::vector<PipelineCounters> counters_ ABSL_GUARDED_BY(mu_);
  uint64_t retired_thread_starts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int producers_ ABSL_GUARDED_BY(mu_) = 0;
  double run_busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // summed over runs
  uint64_t elements_run_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, JobBusy> run_busy_by_job_ ABSL_GUARDED_BY(mu_);  // busy summed over runs
  std::map<uint64_t, std::vector<StageCost>> stage_costs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // started by Start, joined by Stop
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_TASK_RUNNER_H_
