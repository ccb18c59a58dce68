// DispatcherImpl: the dispatcher's logic, transport-free (proto in, proto out,
// absl::Status). The gRPC adapter (grpc_dispatcher_service.h) forwards each RPC
// here; tests call it directly with a FakeClock. One class, four files by
// concern: dispatcher_impl.cc (creation, the RPC shims, durability, the
// maintenance tick), dispatcher_impl_jobs.cc (datasets, jobs, consumers,
// resume and resize), dispatcher_impl_workers.cc (workers, split hand-out,
// drains), dispatcher_impl_status.cc (gauges, GetStatus, autoscaling).
//
// Thread-safety: all public methods are thread-safe (one mutex around
// DispatcherState). Start() runs one maintenance thread, owned and joined by
// this object, that calls Tick() every heartbeat_interval; tests call Tick()
// themselves instead. A DurableAcks thread (dispatcher/durable_acks.h), started
// by Create, answers the asynchronous RPC methods once what they changed (and
// everything changed before) is durable.
//
// Durability. Every state change is validated, enqueued to the journal, then
// applied, under the mutex (Journal::Enqueue: no I/O); the answer waits, outside
// the mutex, until the journal holds every update enqueued so far, so no answer
// ever reveals state a crash could take back. That wait is DurableAcks', so the
// heartbeats of one moment share one commit. A failed commit
// leaves the memory state ahead of the disk: every later RPC answers Unavailable
// until the dispatcher is restarted (it replays what reached the disk).
//
// -----------------------------------------------------------------------------
// Protocol (docs/architecture.md walks through it with a trace)
//
// Datasets. RegisterDataset(pipeline bytes, shard record counts, batch size) is
// idempotent: the same three values give the same dataset_id. `fingerprint` =
// XXH3-64 of the pipeline bytes. The dispatcher never opens the data; with
// verify_shard_counts it does not take the client's counts on trust either: a
// synthetic source must state the same record count, and a Unirecord dataset's
// counts are read by a worker. The call is held (like WatchAssignment, no thread)
// while a worker's WorkerHeartbeat answer carries a DescribeTask; the worker
// reads the manifest and reports it in its next heartbeat (sent at once); the
// counts must match shard by shard (else INVALID_ARGUMENT naming the shard and
// both counts) before the dataset is journaled, so a forged count never reaches
// a split. With no worker registered the call waits for one up to verify_timeout
// (then UNAVAILABLE); a task given to a worker that does not answer within two
// heartbeat intervals goes to another.
//   Example: RegisterDataset(ds, counts [64, 10^12]) -> held, ticket 1; worker 2
//   heartbeats -> describe {1, ds}; its next heartbeat: described {1, [64, 64]}
//   -> INVALID_ARGUMENT "shard 1 of dataset '/data/ds' has 64 records (read by
//   data worker 2), the request says 1000000000000".
// A dataset no job used for dataset_ttl is forgotten (RemoveDataset, journaled),
// so the journal's snapshot holds only live datasets.
//
// Jobs. GetOrCreateJob(name, dataset, config) creates the job or returns the
// existing one with that name when the normalized config and dataset are equal;
// otherwise FAILED_PRECONDITION. Normalizing: mode/remainder default to
// DISTRIBUTED_EPOCH/PAD, num_consumers 0 -> 1, then split_size is rounded to the
// nearest multiple of the batch size (at least one batch), so a batch never spans
// two slots and a consumer's progress inside a slot is a count of whole batches.
// split_size 0 picks min(1024, share / 4) rounded down to whole
// batches: every consumer gets about four slots or more, small datasets included.
//
// Splits, shares and slots (record::ConsumerSlots). The dataset's splits are
// EnumerateSplits(shard record counts, split_size): the units of reading (the
// last split of a shard may be shorter); N records in all. In epoch e the
// record sequence is the splits in P = Permutation(#splits, seed, e) order.
// Every consumer gets the same number of records, as DistributedSampler does:
//   PAD   ceil(N / C) each: the sequence wraps around, at most C - 1 records
//         are read twice this epoch.
//   DROP  floor(N / C) each: at most C - 1 records are not read this epoch
//         (others next epoch, as P changes with the epoch).
// Consumer k takes positions [k * share, (k + 1) * share) of the sequence, cut
// into slots of split_size records (the last slot of a share may be shorter),
// so every consumer also gets the same number of batches. A slot may end one
// split and start the next: it lists pieces (split, offset, count).
//
// Worked example: shards of 1000 and 600 records, batch 64, split size 250
// requested -> 256. 7 splits:
//   0 = shard 0 [0, 256)     4 = shard 1 [0, 256)
//   1 = shard 0 [256, 512)   5 = shard 1 [256, 512)
//   2 = shard 0 [512, 768)   6 = shard 1 [512, 600)  88 records
//   3 = shard 0 [768, 1000)  232 records
// Seed 7, epoch 0: P = Permutation(7, 7, 0) = [3, 1, 5, 2, 6, 0, 4].
//   C = 3, PAD: 534 records each (2 padded), slots of 256, 256 and 22 records,
//   i.e. 4 + 4 + 1 = 9 batches for every consumer:
//     consumer 0: 3[0,232)+1[0,24)    1[24,256)+5[0,24)    5[24,46)
//     consumer 1: 5[46,256)+2[0,46)   2[46,256)+6[0,46)    6[46,68)
//     consumer 2: 6[68,88)+0[0,236)   0[236,256)+4[0,236)  4[236,256)+3[0,2)
//   C = 3, DROP: 533 records each; record 255 of split 4 is not read:
//     consumer 2: 6[66,88)+0[0,234)   0[234,256)+4[0,234)  4[234,255)
// (offsets are positions in a split's record order: natural, or permuted per
// split when the pipeline shuffles.) A slot's index in its consumer's list is its
// "position"; (job, consumer, epoch, position) = SplitKey names the unit of work.
//
// Dynamic assignment. A worker's WorkerHeartbeat returns new SplitAssignments
// while it has capacity (capacity minus its splits not yet finished producing).
// Each pick takes the lowest pending position of the consumer with the fewest
// splits in production, ties to the lowest (job id, consumer), so every
// consumer's splits are produced roughly in release order.
//
// Consumer answers. ClientHeartbeat returns the consumer's epoch, its split
// sequence, the done positions and every worker as a Task. The sequence and the
// task list are versioned: a request that echoes their current versions gets
// them omitted (proto/dispatcher.proto, "Versioned lists"); a version names the
// list's contents within one dispatcher process, so after a restart every
// client gets whole lists once.
//
// Done and epochs. A split is DONE only when its consumer reports
// (ClientHeartbeat) that it holds the split's last batch (`complete`); the
// worker is then told to drop it. When all slots of a consumer's epoch are
// DONE, that consumer alone moves to epoch e + 1 (consumers do not wait for
// each other); after num_epochs epochs it is finished.
//
// Leaving. A client whose iterator is closed (after saving its state, or breaking early)
// sends one last ClientHeartbeat with `leaving`: its consumer is away at once instead of when
// its lease (consumer_timeout) runs out, and a job whose consumers are all away or finished is
// collected right then, so its splits stop holding worker capacity (the assignment channel
// then gives that capacity to waiting jobs). The saved state continues the work exactly once:
// restoring it recreates the job by name and produces everything the state had not returned.
//
// Paused consumers. A consumer that heartbeats but stopped reading (its worker queue stayed
// full, unread, for the worker's --pause-unread-after) has its slot paused by the worker
// (data_worker/worker/task_runner.h): the worker reports it `detached`, so it counts in none of
// that worker's capacity, and the consumer is *behind*: it gets no new slot until the worker
// reports the slot producing again (the consumer read, and the slot resumed), except a slot
// before the one that waits (a deterministic trainer may wait for it to release the other's
// batches). GetStatus shows such a consumer `paused`.
//
// Exactly-once under worker loss. A worker with no heartbeat for worker_timeout
// (Tick(), on the injected clock) is removed, and so is one that calls
// WorkerUnregister. Its unfinished splits go to AWAITING_PROGRESS: they are not
// handed out again until the consumer's next ClientHeartbeat, whose report (a
// cumulative snapshot: delivered prefix per split) sets skip_batches; the split
// is then PENDING and the next worker produces batches skip_batches,
// skip_batches + 1, ... A batch of the old worker still in flight may arrive
// after that report; clients keep exactly-once by accepting batch i of a split
// only when they hold exactly i of its batches (origins carry the index).
//   Example: split at position 2 of consumer 0, 4 batches. Worker 1 produced 3,
//   the consumer holds 2, worker 1 dies. Tick() after worker_timeout: position
//   2 AWAITING_PROGRESS. ClientHeartbeat {position 2, delivered 2}: PENDING,
//   skip 2. Worker 2's heartbeat: start position 2, skip 2.
//
// A worker's heartbeat lists every split it holds. A split the dispatcher
// counts as the worker's but that the heartbeat does not list (the response
// assigning it was lost) is handed back the same way; one it lists but no
// longer owns comes back in `drop`.
//
// Assignment channel. A worker learns of new splits when they exist, not at its next
// heartbeat: it keeps one WatchAssignment call open (a long poll, held here without a thread),
// which is answered work_available = true as soon as WorkerHeartbeat would hand it something
// (a consumer has a pending slot and the worker, not draining, has free capacity; or a
// PARALLEL_EPOCHS job newer than the call exists), and false after the heartbeat interval.
// The worker then heartbeats at once and re-watches after that heartbeat. The call also lists
// the jobs the worker runs: one that is over (collected because its consumers left, or
// finished) answers it at once with jobs_over, so the worker drops that job's splits and stops
// producing now, not at its next heartbeat (a trainer that leaves after one batch would
// otherwise leave its splits producing into full queues for up to an interval, taking the CPU
// of the next job's first batch). Every RPC that
// changed the state and every Tick() re-check the held calls. Example: worker 1 (capacity 2,
// idle) watches; GetOrCreateJob makes job 3 with 4 pending slots: the call returns at once,
// worker 1's heartbeat gets positions 0 and 1, its next watch is held (no free capacity) until
// a split finishes producing (the worker heartbeats then by itself) or the interval passes.
//
// Draining (scale-down, SIGTERM): DrainWorker marks the worker draining: it
// gets no new splits, and the splits it has not finished producing are handed
// back exactly like a lost worker's (await the consumer's report, then reassign
// with the delivered prefix skipped). Splits it finished producing stay with it
// until their consumer completes them; then WorkerHeartbeat answers may_exit.
//
// PARALLEL_EPOCHS. No splits: every worker gets one ParallelTask per (job,
// consumer) and walks the whole dataset num_epochs times for it, without
// coordination.
//
// Autoscaling. Every scale_period, Tick() feeds the window's heartbeats to
// Autoscaler::Decide (dispatcher/autoscaler.h; docs/autoscaling.md): per
// consumer Δbatches_returned_total/Δt and Δwait_seconds_total/Δt, per worker
// Δelements_total/Δbusy_seconds_total (its capacity), queue depth, held splits.
// The decision sets sluice_desired_workers and is what GetStatus reports. With
// scaler kLocal the dispatcher also drains decision.drain (exactly like
// DrainWorker); the worker process exits once its heartbeat answers may_exit,
// and `sluice local --autoscale` starts the missing workers.
// -----------------------------------------------------------------------------
#ifndef SLUICE_DISPATCHER_DISPATCHER_IMPL_H_
#define SLUICE_DISPATCHER_DISPATCHER_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/pipeline_spec/cache_key.h"
#include "common/service/limits.h"
#include "common/service/protocol.h"
#include "dispatcher/autoscale_signals.h"
#include "dispatcher/autoscaler.h"
#include "dispatcher/dispatcher_metrics.h"
#include "dispatcher/dispatcher_state.h"
#include "dispatcher/durable_acks.h"
#include "dispatcher/journal.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/dispatcher.pb.h"
#include "spdlog/spdlog.h"

namespace sluice::dispatcher {

// The wire protocol version all components share (proto/worker.proto).
using service::kProtocolVersion;

// `job`'s production group (docs/sharing.md): 0 when it does not share (sharing off, or
// PARALLEL_EPOCHS), else a non-zero hash of everything that decides the bytes of its slots
// (dataset id, which names the pipeline, shard record counts and batch size; seed; consumers;
// split size; remainder mode). Jobs of one group have byte-identical slots, epoch by epoch.
// Derived from journaled state only, so a restarted dispatcher finds the same groups.
uint64_t ShareGroupOf(const DispatcherState::Job& job);

struct DispatcherOptions {
  Clock* clock = nullptr;                    // null: RealClock::Get()
  prometheus::Registry* registry = nullptr;  // null: a private registry (metrics not exported)
  std::shared_ptr<spdlog::logger> logger;    // null: NullLogger()
  std::shared_ptr<Journal> journal;          // null: NullJournal (state lost on restart)
  absl::Duration worker_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);  // told to workers; Tick() period
  uint64_t default_split_size = 1024;
  // Autoscaling: kNone = sluice_desired_workers is advisory; kLocal = the
  // dispatcher also drains the workers the decision lets go.
  enum class Scaler { kNone, kLocal };
  Scaler scaler = Scaler::kNone;
  uint32_t min_workers = 1;
  uint32_t max_workers = 64;
  absl::Duration scale_period = absl::Seconds(2);
  // A scale-down goes to the largest need seen this long (AutoscalerOptions).
  absl::Duration scale_down_window = absl::Seconds(30);
  // A consumer without a ClientHeartbeat this long is gone (its lease expired); a job all of
  // whose consumers are gone (or finished) is collected: workers drop its splits and pipeline.
  absl::Duration consumer_timeout = absl::Seconds(60);
  // A consumer without a ClientHeartbeat this long is no demand: its client reports every 200 ms
  // while its iterator is open (at most 2 s apart while retrying), so its trainer died, is
  // stopped, or cannot reach the dispatcher. The autoscaler stops counting it, and a bounded
  // pool's share goes to the jobs that are still reading, within seconds instead of a lease;
  // the lease above still keeps its splits and job for a restarted trainer, and its next report
  // counts it again. A consumer that closed its iterator (`leaving`) is no demand at once.
  // Never less than the longest stall of the dispatcher itself that does not restart the leases
  // (3 heartbeat intervals + 1 s, RestartLeasesAfterPause) plus a second: a dispatcher that did
  // not run cannot tell a silent consumer from one it could not hear.
  absl::Duration consumer_silence = absl::Seconds(5);
  // A consumer that returned no batch yet gets one split in production at a time, so its first
  // batch gets all of the workers' CPU instead of a share (Assignable). sluice-dispatcher turns
  // it on (--first-split-alone); off here, every pick is by the rule above.
  bool first_split_alone = false;
  // Snapshot the state into the journal (compaction) after this many journaled updates, or
  // once the updates since the last snapshot hold max(snapshot_bytes, that snapshot's size)
  // bytes: the journal then holds at most about twice the live state plus snapshot_bytes.
  uint64_t snapshot_every = 10000;
  uint64_t snapshot_bytes = uint64_t{64} << 20;
  // RegisterDataset checks the client's shard record counts against the dataset ("Datasets"
  // above): a synthetic source's num_records here, a Unirecord dataset's manifest through a
  // worker. sluice-dispatcher turns it on (--verify-shard-counts); off, the counts are taken
  // as sent (tests of other parts, and the dispatcher_scale bench's opaque pipelines).
  bool verify_shard_counts = false;
  // How long RegisterDataset waits for a worker to read the manifest (none registered, or
  // none answering) before it answers UNAVAILABLE. Below the client's RPC timeout (10 s).
  absl::Duration verify_timeout = absl::Seconds(8);
  // The most RegisterDataset calls held for a worker at once (each holds its spec, up to
  // --max-pipeline-bytes): more are RESOURCE_EXHAUSTED, to retry.
  int max_held_verifications = 64;
  // A dataset that no job has used for this long is forgotten (journaled; --dataset-ttl).
  // Clients register a dataset right before they create its job, so this is only the gap
  // between the two calls. Zero: kept forever.
  absl::Duration dataset_ttl = absl::Minutes(10);
  // Pipeline size, jobs and consumers per job (common/service/limits.h).
  service::ServiceLimits limits;
  // Bytes all caches' committed files may take together (docs/cache.md,
  // dispatcher/cache_catalog.h: eviction by cache, oldest unused first); 0 = unlimited.
  uint64_t cache_budget_bytes = 0;
  // `cache: auto` (cache_auto.h): decide once the workers measured this many records of the
  // job (0: one epoch's), and the CPU seconds reading back one cached byte costs.
  uint64_t auto_cache_min_records = 0;
  double auto_cache_read_seconds_per_byte = 1e-9;
};

class DispatcherImpl {
 public:
  // Receives an asynchronous RPC's status once its response may be sent.
  using Done = DurableAcks::Done;

  // Replays options.journal. Errors: the journal's, or Internal if an update
  // does not apply.
  static absl::StatusOr<std::unique_ptr<DispatcherImpl>> Create(DispatcherOptions options);
  ~DispatcherImpl();  // Stop()s

  DispatcherImpl(const DispatcherImpl&) = delete;
  DispatcherImpl& operator=(const DispatcherImpl&) = delete;

  // Starts the maintenance thread (Tick() every heartbeat_interval of real
  // time). Idempotent.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The RPCs. Each runs in the caller's thread (a short critical section, no
  // I/O); `done` then receives the status, at once or from the DurableAcks
  // thread once the journal holds everything the call changed (so no answer
  // reveals state a crash could take back). `response` must stay valid until
  // then; `done` must not call back into this object. Tests that want the
  // answer in hand wrap this in tests/testing/sync_dispatcher.h.
  //
  // Every RPC: FAILED_PRECONDITION if request.protocol_version !=
  // kProtocolVersion; UNAVAILABLE once a journal commit failed.
  // InvalidArgument: empty pipeline, batch_size 0, no records.
  void RegisterDataset(const proto::RegisterDatasetRequest& request,
                       proto::RegisterDatasetResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NotFound: unknown dataset. FailedPrecondition: name taken by another
  // config. InvalidArgument: DROP leaves a consumer no split.
  // InvalidArgument: num_consumers above limits.max_consumers_per_job.
  void GetOrCreateJob(const proto::GetOrCreateJobRequest& request,
                      proto::GetOrCreateJobResponse* response, Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // NotFound: unknown job. InvalidArgument: consumer_index >= num_consumers.
  // `tasks` and `splits` are omitted when the request's tasks_version /
  // splits_version name the current lists (proto/dispatcher.proto).
  void ClientHeartbeat(const proto::ClientHeartbeatRequest& request,
                       proto::ClientHeartbeatResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // InvalidArgument: empty address. A live worker with the same address is
  // replaced (lost).
  void WorkerRegister(const proto::WorkerRegisterRequest& request,
                      proto::WorkerRegisterResponse* response, Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // NotFound: unknown or timed-out worker (register again).
  void WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                       proto::WorkerHeartbeatResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerUnregister(const proto::WorkerUnregisterRequest& request,
                        proto::WorkerUnregisterResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DrainWorker(const proto::DrainWorkerRequest& request, proto::DrainWorkerResponse* response,
                   Done done) ABSL_LOCKS_EXCLUDED(mu_);
  void GetJobState(const proto::GetJobStateRequest& request, proto::GetJobStateResponse* response,
                   Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Workers, jobs, the last autoscaling decision. A request with
  // starting_workers >= 0 (the local actuator) sets the count the next
  // decision adds to the current workers.
  void GetStatus(const proto::GetStatusRequest& request, proto::GetStatusResponse* response,
                 Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes every cache named request.name (docs/cache.md). NotFound: no such cache.
  // FailedPrecondition naming the job: a live job uses it.
  void RemoveCache(const proto::RemoveCacheRequest& request, proto::RemoveCacheResponse* response,
                   Done done) ABSL_LOCKS_EXCLUDED(mu_);

  // The assignment channel (above; proto/dispatcher.proto WatchAssignmentRequest): `done`
  // runs once work waits for the worker or after min(max_wait, heartbeat_interval), from a
  // later RPC's thread or the maintenance thread. NotFound: unknown worker (register again).
  // Unavailable: the dispatcher is stopping.
  void WatchAssignment(const proto::WatchAssignmentRequest& request,
                       proto::WatchAssignmentResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t incarnation() const { return incarnation_; }
  // Whether dataset `id` is registered (not forgotten after dataset_ttl).
  bool HasDataset(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Declares workers without a heartbeat for worker_timeout lost, collects jobs whose consumers
  // are gone and datasets unused for dataset_ttl, answers RegisterDataset calls past
  // verify_timeout, and refreshes the gauges.
  absl::Status Tick() ABSL_LOCKS_EXCLUDED(mu_);

  // The last value of sluice_desired_workers.
  int desired_workers() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit DispatcherImpl(DispatcherOptions options);

  // The RPCs' work: each takes mu_, changes the state through Commit(), fills
  // the response. The public methods then wait for durability (WaitDurable) or
  // leave that to acks_.
  absl::Status DoRegisterDataset(const proto::RegisterDatasetRequest& request,
                                 proto::RegisterDatasetResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  // What RegisterDataset refuses before anything else (limits, batch size, counts).
  absl::Status CheckDatasetRequest(const proto::RegisterDatasetRequest& request) const;
  // The id of a registered dataset equal to `request` (0: none); marks it used.
  uint64_t FindSameDataset(const proto::RegisterDatasetRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoGetOrCreateJob(const proto::GetOrCreateJobRequest& request,
                                proto::GetOrCreateJobResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoClientHeartbeat(const proto::ClientHeartbeatRequest& request,
                                 proto::ClientHeartbeatResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoWorkerRegister(const proto::WorkerRegisterRequest& request,
                                proto::WorkerRegisterResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoWorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                                 proto::WorkerHeartbeatResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoWorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                  proto::WorkerUnregisterResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoDrainWorker(const proto::DrainWorkerRequest& request,
                             proto::DrainWorkerResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoGetJobState(const proto::GetJobStateRequest& request,
                             proto::GetJobStateResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoGetStatus(const proto::GetStatusRequest& request,
                           proto::GetStatusResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoRemoveCache(const proto::RemoveCacheRequest& request,
                             proto::RemoveCacheResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoTick() ABSL_LOCKS_EXCLUDED(mu_);

  // Cache nodes (dispatcher_impl_cache.cc, docs/cache.md). The job's cache, from its
  // dataset's pipeline and split size; nullopt without a cache node.
  std::optional<pipeline_spec::CacheKey> CacheKeyOfJob(const DispatcherState::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pipeline the job's workers run: its dataset's, with the cache node `cache: auto`
  // decided on (cache_auto.h); nullopt when the dataset is gone.
  std::optional<proto::Pipeline> PipelineOfJob(const DispatcherState::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A `cache: auto` job still measuring (no decision journaled yet).
  static bool MeasuresCost(const DispatcherState::Job& job);
  // Its journaled decision, or DecideAutoCache over the costs measured so far.
  proto::CacheDecision AutoCacheDecisionOf(const DispatcherState::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat's node costs: kept per job and worker; a job whose costs now cover an epoch
  // gets its decision journaled (and its cache created).
  absl::Status DecideAutoCaches(const proto::WorkerHeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Journals the job's cache if it is new.
  absl::Status CreateCache(const DispatcherState::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fingerprints of the caches of live (unfinished) jobs, with one such job's id.
  std::map<std::string, uint64_t> CachesInUse() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat's cache reports: commits (evicting to fit the budget) or refusals, all acked;
  // then the cache events the worker has not seen.
  absl::Status CommitCacheFiles(const proto::WorkerHeartbeatRequest& request,
                                proto::WorkerHeartbeatResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetStatus: every cache, and each job's cache line.
  void FillCacheStatus(const proto::GetStatusRequest& request,
                       proto::GetStatusResponse* response) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The maintenance loop's last pass was at `last_tick`: if it is far longer ago than its
  // period, the process was stopped or paused, and every lease restarts at `now`.
  void RestartLeasesAfterPause(absl::Time last_tick, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  template <typename Request, typename Response>
  using Method = absl::Status (DispatcherImpl::*)(const Request&, Response*);
  template <typename Request, typename Response>
  void RunAsync(Method<Request, Response> method, const Request& request, Response* response,
                Done done) ABSL_LOCKS_EXCLUDED(mu_);

  // FailedPrecondition for another protocol version; Unavailable once a journal
  // commit failed.
  absl::Status Admit(uint32_t protocol_version) const;
  // Returns once every update enqueued so far is durable (in this thread).
  absl::Status WaitDurable() ABSL_LOCKS_EXCLUDED(mu_);
  // The journal made tickets up to `ticket` durable (or failed to).
  void MarkDurable(uint64_t ticket, const absl::Status& status);

  // The versions of ClientHeartbeatResponse.tasks and .splits (never 0).
  uint64_t TasksVersion() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t SplitsVersion(uint64_t job_id, const DispatcherState::Consumer& consumer) const;

  // Validates `update`, enqueues it to the journal, then applies it; compacts
  // the journal now and then. Internal if it does not apply after validating (a
  // bug in this class). The caller's answer must WaitDurable() (or go through
  // acks_) before it is sent.
  absl::Status Commit(const proto::Update& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `update` without journaling it: soft state that the next heartbeat reports again
  // (production counts, delivered prefixes that change nothing else).
  absl::Status ApplySoft(const proto::Update& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetOrCreateJobRequest.resize_from: checks that the states are one per old consumer of one
  // job at one epoch and re-partitions what they had not returned over config->num_consumers()
  // (repartition.h); sets config's split size to the old one. InvalidArgument naming what differs.
  absl::StatusOr<proto::ResizedEpoch> PlanResize(const proto::GetOrCreateJobRequest& request,
                                                 const DispatcherState::Dataset& dataset,
                                                 proto::JobConfig* config) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `given` is not the set of states `job` was resumed from.
  static std::string ResizeMismatch(const DispatcherState::Job& job,
                                    const proto::ResizedEpoch& given);
  // The consumer continues from a checkpoint (ClientHeartbeatRequest.restore).
  absl::Status RestoreConsumer(const DispatcherState::Job& job,
                               const proto::ClientHeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The consumer's done positions, as the request asks (a list, or ranges).
  void AddDonePositions(const proto::ClientHeartbeatRequest& request,
                        const DispatcherState::Consumer& consumer,
                        proto::ClientHeartbeatResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ClientHeartbeatRequest.consumer_token/claim: a claim makes the request's process the
  // consumer's owner; any other process's heartbeat is FailedPrecondition (fenced).
  absl::Status CheckConsumerOwner(const DispatcherState::Job& job,
                                  const proto::ClientHeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether some consumer of `job` is still there: not left, and reported within
  // consumer_timeout (a quarter of it once finished). A consumer that never reported gets the
  // timeout from now.
  bool AnyConsumerPresent(const DispatcherState::Job& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Collects jobs whose consumers are all gone or finished.
  absl::Status CollectJobs(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Journals the job's removal and forgets its consumers' signals.
  absl::Status RemoveJob(uint64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the datasets no job has used for dataset_ttl.
  absl::Status CollectDatasets(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A RegisterDataset call held until a worker has read the dataset's manifest.
  struct Verification {
    uint64_t ticket = 0;
    proto::RegisterDatasetRequest request;
    std::string path;  // the dataset's folder, for messages
    proto::RegisterDatasetResponse* response = nullptr;
    Done done;
    absl::Time deadline;
    uint64_t worker_id = 0;  // the worker it was handed to (0: none yet)
    absl::Time handed;
    std::optional<absl::Status> verdict;  // set once a worker answered
  };
  // Checks `request`'s counts when the dispatcher can by itself (a synthetic source): OK,
  // INVALID_ARGUMENT, or NotFound when a worker must read the manifest at `*path`.
  absl::Status CheckCountsLocally(const proto::RegisterDatasetRequest& request,
                                  std::string* path) const;
  // The verdict on a worker's description of `v`'s dataset.
  static absl::Status Verdict(const Verification& v, uint64_t worker_id, const std::string& address,
                              const proto::DatasetDescription& description);
  // WorkerHeartbeat: records the worker's descriptions and hands it the tasks nobody holds.
  void ExchangeDescriptions(const proto::WorkerHeartbeatRequest& request,
                            const DispatcherState::Worker& worker,
                            proto::WorkerHeartbeatResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a verification waits for a worker to take it.
  bool VerificationToHand(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the verifications that have a verdict (registering the dataset when it holds),
  // those past their deadline, and all of them with `stopping`.
  void AnswerVerifications(bool stopping = false) ABSL_LOCKS_EXCLUDED(mu_);
  // OK if no consumer of `job` returned anything of `epoch` or later (the job may change its
  // number of consumers there); FailedPrecondition naming the consumer otherwise.
  absl::Status CheckResizable(const DispatcherState::Job& job, uint64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillJobInfo(const DispatcherState::Job& job, proto::JobInfo* info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  proto::SplitAssignment MakeAssignment(const DispatcherState::Job& job, const SlotKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a split of `consumer` may be handed out now: it has one pending, it is not Behind
  // (unless its lowest pending slot comes before the slot that waits), and (with
  // options.first_split_alone) it is not starting up. Starting up = it returned no batch yet
  // and has a split in production: until its first batch, one split gets all of the workers'
  // CPU, so that batch comes about as soon as in-process (docs/architecture.md, "Work reaches
  // workers at once").
  //
  // Returns the epoch to hand a slot of out of: the consumer itself, or, while its epoch has
  // nothing left to hand out (no slot pending or awaiting progress), its following epoch opened
  // early (Consumer::next) if it is not Behind; nullptr when none. A following epoch's slots come after every current epoch's
  // slot of any job (AssignSplits): they use capacity that would otherwise idle.
  const DispatcherState::Consumer* Assignable(const DispatcherState::Job& job,
                                              const DispatcherState::Consumer& consumer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands up to `free` pending splits to `worker_id`, appending them to `out`. A slot of a
  // sharing job goes out with the same slot of every job of its production group that has it
  // pending (docs/sharing.md); together they take one of the worker's `free`.
  absl::Status AssignSplits(uint64_t worker_id, int free, proto::WorkerHeartbeatResponse* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the assignment of `key` to `worker_id` and appends it to `out` with `share_group`.
  absl::Status AssignSlot(const DispatcherState::Job& job, const SlotKey& key, uint64_t worker_id,
                          uint64_t share_group, proto::WorkerHeartbeatResponse* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The other live jobs of `job`'s production group (empty when it does not share).
  std::vector<const DispatcherState::Job*> SharePeers(const DispatcherState::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a consumer holds a slot its worker detached (from its production group,
  // docs/sharing.md, or paused: its trainer stopped reading) and that waits for the consumer to
  // read: the consumer is behind (`sluice status`: paused); it gets no slot until it reads
  // again, and joins no group.
  bool Behind(const DispatcherState::Consumer& consumer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slots `worker` is producing, a production group's same slot counted once (it is one
  // production on the worker), a detached one that waits for its consumer not at all.
  uint32_t SlotsInProduction(const DispatcherState::Worker& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the worker; `reason` labels sluice_dispatcher_workers_lost_total ("timeout",
  // "unregistered", "restarted"), `why` is for the log.
  absl::Status LoseWorker(uint64_t worker_id, const char* reason, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where `job` comes in the hand-out: infinite when the pool is bounded and
  // the last decision gave it nothing, else 0 (also for a job new since).
  double AllocationLoad(const DispatcherState::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where `consumer` of `job` comes in `worker_id`'s hand-out before the
  // load: 0 for the job the worker is assigned to (worker_jobs_); 1 for the
  // first split of a job new since the last decision; 2 for the rest. 0 for
  // every consumer when the worker is assigned no job.
  int AffinityTier(uint64_t worker_id, const DispatcherState::Job& job,
                   const DispatcherState::Consumer& consumer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One autoscaling decision from the window's signals (and, kLocal, drains).
  absl::Status Autoscale(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether consumer `index` of `job_id` counts as demand: it is not
  // finished and did not leave, it has reported, and not longer than
  // ConsumerSilence() ago.
  // options_.consumer_silence, at least 3 heartbeat intervals + 2 s.
  absl::Duration ConsumerSilence() const;
  bool LiveConsumer(uint64_t job_id, const DispatcherState::Consumer& consumer,
                    absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a job the last decision counted has no live consumer any more
  // (it finished, its consumers finished or left): Tick() then decides at
  // once instead of at the end of the period, since demand that left is a
  // fact, not a measurement to confirm.
  bool DemandLeft(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaintenanceLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A held WatchAssignment call.
  struct Watch {
    uint64_t worker_id = 0;
    uint64_t max_job_id = 0;              // the newest job when the call came
    std::vector<uint64_t> known_job_ids;  // WatchAssignmentRequest.known_job_ids
    absl::Time deadline;
    proto::WatchAssignmentResponse* response = nullptr;
    Done done;
  };
  // Whether WorkerHeartbeat would hand `watch`'s worker something now.
  // Whether some consumer has a slot AssignSplits would hand out now.
  bool AnyAssignableSlot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a job `watch`'s worker runs is over (gone or finished): its heartbeat answer then
  // lists it in finished_job_ids.
  bool KnownJobOver(const Watch& watch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `any_pending`: AnyAssignableSlot(); `newest_parallel`: the newest
  // PARALLEL_EPOCHS job (0: none).
  bool WorkWaitsFor(const Watch& watch, bool any_pending, uint64_t newest_parallel) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the held calls whose worker has work (all of them with `stopping`), and those
  // past their deadline.
  void AnswerWatches(bool stopping = false) ABSL_LOCKS_EXCLUDED(mu_);

  const DispatcherOptions options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<Journal> journal_;
  std::unique_ptr<prometheus::Registry> own_registry_;

  DispatcherMetrics metrics_;  // used under mu_

  mutable absl::Mutex mu_;
  DispatcherState state_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, WorkerSignal> worker_signals_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint64_t, uint32_t>, ConsumerSignal> consumer_signals_ ABSL_GUARDED_BY(mu_);
  // (job, consumer index) -> the owning process's consumer_token. Not journaled: after a
  // restart the first token heard is adopted.
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> consumer_owners_ ABSL_GUARDED_BY(mu_);
  int desired_workers_ ABSL_GUARDED_BY(mu_) = 0;
  Autoscaler autoscaler_ ABSL_GUARDED_BY(mu_);
  AutoscalerDecision decision_ ABSL_GUARDED_BY(mu_);
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
  // While the pool is bounded (decision_.pool_bound): each job's share of
  // the workers, which AssignSplits follows. Empty: splits by consumer only.
  std::map<uint64_t, double> allocation_ ABSL_GUARDED_BY(mu_);
  // While the pool is bounded: the job each worker serves first
  // (AssignWorkersToJobs), kept across decisions while its job's share has
  // room. Empty when the pool is not bounded.
  std::map<uint64_t, uint64_t> worker_jobs_ ABSL_GUARDED_BY(mu_);
  absl::Time last_decision_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int starting_workers_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Watch> watches_ ABSL_GUARDED_BY(mu_);
  std::vector<Verification> verifications_ ABSL_GUARDED_BY(mu_);
  uint64_t next_verification_ ABSL_GUARDED_BY(mu_) = 1;
  // When each dataset was last used (registered, or by a job); not journaled: after a
  // restart every dataset starts its dataset_ttl again.
  std::map<uint64_t, absl::Time> dataset_used_ ABSL_GUARDED_BY(mu_);
  // Something a held watch depends on changed (a commit, a consumer's first batch): the next
  // RPC to finish re-checks the watches. Plain soft-state reports (most heartbeats) do not.
  std::atomic<bool> recheck_watches_{false};
  uint64_t incarnation_ = 0;  // the state's incarnation (UpdateIdFloor); set once in Create
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread maintenance_ ABSL_GUARDED_BY(mu_);
  // Commits since the last snapshot was enqueued (the compaction policy).
  uint64_t updates_since_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  // `cache: auto` jobs still measuring: each worker's last NodeCost report (soft state).
  std::map<uint64_t, std::map<uint64_t, std::vector<proto::NodeCost>>> node_costs_
      ABSL_GUARDED_BY(mu_);
  uint64_t bytes_since_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_snapshot_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // A random value per process: versions of one process never name another's lists.
  uint64_t view_nonce_ = 0;

  // The last journal ticket enqueued (-1: none) and the last known durable.
  // Written under mu_ (last_ticket_) or by whoever saw the commit; read without.
  std::atomic<int64_t> last_ticket_{-1};
  std::atomic<int64_t> durable_ticket_{-1};
  std::atomic<bool> journal_failed_{false};
  // Last member: destroyed (answering what it holds) before the rest.
  std::unique_ptr<DurableAcks> acks_;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_DISPATCHER_IMPL_H_
