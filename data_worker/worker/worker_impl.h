// WorkerImpl: the data worker's control side, transport-free: registration with the
// dispatcher, the heartbeat state machine, drain. It glues three parts together:
//   job_registry.h    the jobs it knows (pipeline, data-root check, executor pool);
//   task_runner.h     the producer threads that run splits through executors;
//   consumer_queues.h the tasks it holds, bounded per-consumer queues, and the streams that
//                     drain them (OpenStream/PollStream/ReturnBatch/CloseStream forward there).
//
// ---------------------------------------------------------------------------------------------
// Protocol (the dispatcher's side is in dispatcher/dispatcher_impl.h, the wire in worker.proto
// and worker_service.proto; docs/architecture.md walks through it)
//
// Splits. A SplitAssignment names records [first_global, first_global + (end - begin)), read
// in record::SplitRecordOrder. The worker emits the split's output batches numbered from 0,
// sending those from skip_batches on, then an end-of-split marker whose batch_index is the
// split's batch count:
//   split 5 = 10 records from global 100, batch 4, no shuffle, skip_batches 1:
//     batch_index 1: [104..107], batch_index 2: [108, 109], marker batch_index 3.
// A split that yields no batch (all records filtered out) sends only the marker (index 0).
// A split stays held (reported in every heartbeat with produced_batches counted from batch 0,
// and finished_producing once its marker is queued) until the dispatcher drops it: `drop`
// stops production and discards the split's queued batches.
//
// PARALLEL_EPOCHS. A ParallelTask runs the whole dataset config.num_epochs times (0 = forever)
// for one consumer; its batches carry key {job, consumer, epoch, position 0}; a marker follows
// the last epoch, after which that consumer's stream ends OK.
//
// Incarnations. Every dispatcher start has an incarnation id, carried in WorkerRegisterResponse
// and WorkerHeartbeatResponse. When it changes, the worker drops every job it cached and every
// task it held (the new dispatcher re-sends what is still wanted), so a job id reused by a
// dispatcher that forgot its state can never run an old pipeline.
//
// Assignment channel. Besides heartbeats, a watch thread keeps one WatchAssignment call open;
// when the dispatcher answers work_available, the next heartbeat goes at once (the splits come
// in its response), and the watch is renewed after that heartbeat. The call lists the jobs the
// worker runs: one that is over (its consumers left) answers jobs_over, and the heartbeat that
// follows drops it (finished_job_ids), so its producers stop at once. Against a dispatcher
// without the RPC (UNIMPLEMENTED) the thread ends and heartbeats alone bring work, with the
// sooner idle heartbeats below (wants_splits_).
//
// Paused consumers. A split whose consumer read nothing for --pause-unread-after while its queue
// was full pauses (task_runner.h): its producer is freed, the heartbeat that follows at once
// reports the split `detached` (it holds none of the worker's capacity; the dispatcher gives
// that consumer no new slot meanwhile), and it resumes from the batch that found no room as
// soon as the consumer reads again or attaches again.
//
// Lost and draining. NOT_FOUND from WorkerHeartbeat (the dispatcher declared us lost): every
// task and queued batch is dropped and the worker registers again. Drain(): DrainWorker RPC;
// the dispatcher stops assigning and drops the splits we have not finished producing;
// heartbeats go on until the response says may_exit.
//
// Threads: Start() registers, then starts `capacity` producer threads and, if
// options.heartbeat_thread, the heartbeat thread. Stop() ends every stream, cancels and joins
// them. All public methods are thread-safe.
// ---------------------------------------------------------------------------------------------
#ifndef SLUICE_DATA_WORKER_WORKER_WORKER_IMPL_H_
#define SLUICE_DATA_WORKER_WORKER_WORKER_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/service/identity.h"
#include "common/service/limits.h"
#include "common/service/protocol.h"
#include "data_worker/pipeline/executor.h"
#include "data_worker/pipeline/memory_budget.h"
#include "data_worker/worker/consumer_queues.h"
#include "data_worker/worker/job_registry.h"
#include "data_worker/worker/split_cache.h"
#include "data_worker/worker/task_runner.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/dispatcher.pb.h"
#include "proto/worker.pb.h"
#include "proto/worker_service.pb.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker {

// The wire protocol version all components share (proto/worker.proto).
using service::kProtocolVersion;

// The worker's view of the dispatcher's RPCs (grpc_dispatcher_client.h; tests
// fake it). Errors are the dispatcher's codes; Unavailable/DeadlineExceeded
// when it cannot be reached.
class DispatcherClient {
 public:
  virtual ~DispatcherClient() = default;
  virtual absl::Status WorkerRegister(const proto::WorkerRegisterRequest& request,
                                      proto::WorkerRegisterResponse* response) = 0;
  virtual absl::Status WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                                       proto::WorkerHeartbeatResponse* response) = 0;
  virtual absl::Status DrainWorker(const proto::DrainWorkerRequest& request,
                                   proto::DrainWorkerResponse* response) = 0;
  virtual absl::Status WorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                        proto::WorkerUnregisterResponse* response) = 0;
  // The assignment channel's long poll (proto/dispatcher.proto WatchAssignmentRequest): may
  // block up to twice request.max_wait_seconds. Unimplemented (the default, and an older
  // dispatcher's answer): the worker learns of splits at its heartbeats only.
  virtual absl::Status WatchAssignment(const proto::WatchAssignmentRequest& /*request*/,
                                       proto::WatchAssignmentResponse* /*response*/) {
    return absl::UnimplementedError("WatchAssignment");
  }
  // Ends a WatchAssignment call in progress (and any started later) at once, Cancelled.
  virtual void CancelWatch() {}
};

struct WorkerOptions {
  // Data-plane host:port told to the dispatcher; may be left empty until
  // Start(address).
  std::string address;
  std::vector<std::string> data_roots;  // at least one; canonicalized by Create
  int threads = 0;                      // each Executor's cpu_budget; 0 = all cores
  uint32_t capacity = 2;                // splits produced concurrently (producer threads)
  size_t queue_batches = 8;             // per consumer
  // The worker's one memory budget (pipeline/memory_budget.h; 0: none): column bytes all
  // consumer queues may hold together (ConsumerQueues), and, charged to the same budget, the
  // elements and batches in flight in every job's pipelines, whose feeds wait while it is
  // full (one output ahead of their reader at most).
  int64_t queue_bytes = int64_t{1} << 30;
  // Bytes the pipelines may hold in their stage queues, all producers together
  // (each Executor gets memory_budget_bytes / capacity). Output queues
  // (queue_batches) come on top.
  int64_t memory_budget_bytes = int64_t{256} << 20;
  // Until the dispatcher's WorkerRegisterResponse says otherwise.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // TaskRunner's: how long a production group waits for a member that fell behind.
  absl::Duration share_detach_after = absl::Seconds(2);
  // TaskRunner's ("Paused consumers"): how long a split's producer waits on the full queue of
  // a consumer that reads nothing before the split pauses and frees the producer
  // (InfiniteDuration: never).
  absl::Duration pause_unread_after = absl::Seconds(5);
  bool heartbeat_thread = true;  // false: the caller calls Heartbeat() (tests)
  Clock* clock = nullptr;        // null: RealClock::Get()
  // Open streams, batch bytes, pipeline bytes and nodes (common/service/limits.h).
  service::ServiceLimits limits;
  prometheus::Registry* registry = nullptr;  // null: a private registry
  std::shared_ptr<spdlog::logger> logger;    // null: NullLogger()
  // Where cache nodes' files live (docs/cache.md; shared storage on a cluster). Empty: jobs
  // with a cache node compute every element.
  std::string cache_root;
};

class WorkerImpl {
 public:
  // InvalidArgument: no data root, capacity or queue_batches 0.
  static absl::StatusOr<std::unique_ptr<WorkerImpl>> Create(
      WorkerOptions options, std::unique_ptr<DispatcherClient> dispatcher);
  ~WorkerImpl();  // Stop()s
  WorkerImpl(const WorkerImpl&) = delete;
  WorkerImpl& operator=(const WorkerImpl&) = delete;

  // Registers with `address` (if not empty, else options.address) as the data-plane address
  // (the DispatcherClient's error if that fails), then starts the threads.
  absl::Status Start(const std::string& address = "") ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every stream (kEnd OK), cancels and joins all threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // WorkerRegister; Start() calls it. Exposed for tests. InvalidArgument without an address.
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);
  // One heartbeat: report, then apply the response (new jobs, start, drop, draining). NotFound
  // from the dispatcher: drops everything and registers again. Returns the RPC's other errors.
  absl::Status Heartbeat() ABSL_LOCKS_EXCLUDED(mu_);
  // Scale-down: DrainWorker RPC, then take no new splits. Heartbeats continue.
  absl::Status Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // WorkerUnregister: the dispatcher hands back everything this worker holds at once. For a
  // worker that leaves without the dispatcher's may_exit.
  absl::Status Unregister() ABSL_LOCKS_EXCLUDED(mu_);
  // The dispatcher said may_exit (draining and nothing left to serve).
  bool may_exit() const ABSL_LOCKS_EXCLUDED(mu_);
  bool draining() const ABSL_LOCKS_EXCLUDED(mu_);

  // Attaches a reader to (job, consumer)'s queue (see consumer_queues.h; splits whose batches
  // were lost in flight are restarted from what the request says the client holds). `notify`
  // may be called from any thread, also after CloseStream, until the WorkerImpl is destroyed;
  // it must not block. Errors: FailedPrecondition for a protocol version mismatch, NotFound
  // for an unknown job, the job's refusal status (PermissionDenied/InvalidArgument/
  // FailedPrecondition), InvalidArgument for consumer_index >= num_consumers,
  // ResourceExhausted over --max-streams or, for an identity (not the development one), over
  // --max-streams-per-identity streams that identity holds open here,
  // PermissionDenied when `caller` is not a trainer or operator, or the job (its owner is in
  // its name, service::JobOwner) is not the caller's and the caller is no operator.
  absl::StatusOr<uint64_t> OpenStream(const proto::GetBatchesRequest& request,
                                      const service::Identity& caller, std::function<void()> notify)
      ABSL_LOCKS_EXCLUDED(mu_);
  // DescribeDataset (proto/worker_service.proto): the shard record counts of a dataset under
  // this worker's --data-root, for a client about to register it.
  absl::Status DescribeDataset(const proto::DescribeDatasetRequest& request,
                               proto::DescribeDatasetResponse* response) const;

  // Never blocks. After kEnd, further polls return kEnd again.
  StreamEvent PollStream(uint64_t stream_id) { return queues_.Poll(stream_id); }
  // A batch PollStream returned that was not delivered (the write failed): put it back at the
  // front of its queue, unless its split was dropped meanwhile.
  void ReturnBatch(uint64_t stream_id, service::WireBatch batch) {
    queues_.Return(stream_id, std::move(batch));
  }
  void CloseStream(uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);

  // For tests and metrics.
  uint64_t worker_id() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t queued_batches() const { return queues_.queued_batches(); }
  int64_t queued_bytes() const { return queues_.queued_bytes(); }
  // Peak over time of queued_bytes() plus the live bytes of every running Executor.
  int64_t peak_bytes() const { return runner_.peak_bytes(); }
  // Peak of the worker's budget in use: queued batches plus every pipeline's live bytes.
  int64_t budget_peak_bytes() const { return budget_.peak(); }
  // Stage threads the producers' pipelines have started (tests).
  uint64_t pipeline_thread_starts() const { return runner_.pipeline_thread_starts(); }
  // Producers blocked on a full consumer queue right now.
  int blocked_producers() const { return queues_.blocked_producers(); }
  // Cumulative busy worker-seconds and the elements of those runs (task_runner.h).
  double busy_seconds() const { return runner_.busy().busy_seconds; }
  uint64_t elements_run() const { return runner_.busy().elements; }
  // The last heartbeat request built (for tests).
  proto::WorkerHeartbeatRequest last_heartbeat() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  WorkerImpl(WorkerOptions options, std::vector<std::string> data_roots,
             std::unique_ptr<DispatcherClient> dispatcher);

  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The assignment channel's thread (see the protocol above).
  void WatchLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the heartbeat thread for a heartbeat now (heartbeat_due_) and wakes it.
  void HeartbeatSoon() ABSL_LOCKS_EXCLUDED(due_mu_);
  // Waits until `heartbeats_` passes `seen`, the worker stops, or `timeout` passes.
  void AwaitHeartbeat(uint64_t seen, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the response's new tasks to the queues and the runner.
  void StartTasks(const proto::WorkerHeartbeatResponse& response) ABSL_LOCKS_EXCLUDED(mu_);
  // A new dispatcher incarnation: forget every job and task.
  void ForgetEverything() ABSL_LOCKS_EXCLUDED(mu_);
  pipeline::ExecutorOptions MakeExecutorOptions();

  const WorkerOptions options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;
  std::unique_ptr<DispatcherClient> dispatcher_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Registry& registry_;

  pipeline::MemoryBudget budget_;  // options_.queue_bytes; before its users
  CacheStore caches_;              // before jobs_, which uses it
  JobRegistry jobs_;
  ConsumerQueues queues_;
  TaskRunner runner_;

  mutable absl::Mutex mu_;
  absl::CondVar stop_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool may_exit_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Open streams of identities (not the development one): stream id -> user, user -> count.
  std::map<uint64_t, std::string> stream_users_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> streams_per_user_ ABSL_GUARDED_BY(mu_);
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // of the dispatcher; 0 = none seen yet
  std::string address_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  // elements_per_second in the heartbeat: elements produced since
  // `rate_since_`, renewed once kMinRateSpan has passed.
  static constexpr absl::Duration kMinRateSpan = absl::Seconds(1);
  absl::Time rate_since_ ABSL_GUARDED_BY(mu_);
  uint64_t elements_at_rate_since_ ABSL_GUARDED_BY(mu_) = 0;
  double elements_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  proto::WorkerHeartbeatRequest last_request_ ABSL_GUARDED_BY(mu_);
  // Answers to the dispatcher's DescribeTasks, sent with the next heartbeat.
  std::vector<proto::DatasetDescription> described_ ABSL_GUARDED_BY(mu_);

  // A split stopped producing since the last heartbeat: the heartbeat thread sends the next
  // one at once (ConsumerQueues::set_on_split_end). Set through HeartbeatSoon(), which wakes
  // the heartbeat thread's wait on due_cv_ (due_mu_ is a leaf lock: taken from any context).
  std::atomic<bool> heartbeat_due_{false};
  absl::Mutex due_mu_;
  absl::CondVar due_cv_;
  // While the worker could produce more splits than it holds and a consumer is attached, the
  // next split may appear at any moment (the consumer finishing an epoch makes the dispatcher
  // hand out the next one): heartbeats come sooner, after interval / 8 (at least 10 ms), then
  // doubling up to the interval. An idle episode thus costs at most three extra heartbeats, so
  // a dispatcher with thousands of workers is not polled much harder. A split that ends, a
  // consumer that attaches or a full worker starts the next episode (idle_wait_ 0).
  bool wants_splits_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration idle_wait_ ABSL_GUARDED_BY(mu_);

  // Heartbeats sent (answered or not), for the watch thread to renew its call after one.
  uint64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  // The dispatcher answers WatchAssignment: the sooner idle heartbeats are not needed.
  std::atomic<bool> watching_{false};
  // sluice_worker_heartbeats_total by trigger: "start" (the first), "interval", "event" (a
  // split ended, a consumer attached, or the dispatcher said work waits).
  prometheus::Counter& start_heartbeats_;
  prometheus::Counter& interval_heartbeats_;
  prometheus::Counter& event_heartbeats_;

  absl::Mutex lifecycle_mu_;  // serializes Start/Stop
  std::thread heartbeat_thread_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::thread watch_thread_ ABSL_GUARDED_BY(lifecycle_mu_);
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_WORKER_IMPL_H_
