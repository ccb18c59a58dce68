// WorkerImpl: the data worker's logic, transport-free (ARCHITECTURE.md §5, §7).
// It registers with the dispatcher through a DispatcherClient, heartbeats, runs
// one pipeline Executor per assigned split of a job, and keeps a bounded queue
// of ready-to-send proto::Batch per consumer that the data-plane adapter
// (grpc_worker_service.h) drains through OpenStream/PollStream.
//
// ---------------------------------------------------------------------------------------------
// Protocol (the dispatcher's side is in dispatcher/dispatcher_impl.h, the wire
// in worker.proto and worker_service.proto)
//
// Splits. A SplitAssignment names records [first_global, first_global + (end -
// begin)). Their order inside the split is fixed by the job:
// record::Permutation(n, MixSeed({config.seed, split_id}), epoch) applied to
// that range if the pipeline shuffles, else natural order. The worker skips the
// first skip_batches * batch_size of them and emits batches numbered from the
// split's batch 0, so skipped batches keep their numbers:
//   split 5 = 10 records from global 100, batch 4, no shuffle, skip_batches 1:
//     batch_index 1: [104..107], batch_index 2: [108, 109] last_in_split.
// A split stays held (reported in every heartbeat with produced_batches counted
// from batch 0, and finished_producing once its last batch is queued) until the
// dispatcher drops it: `drop` stops production and discards the split's queued
// batches.
//
// PARALLEL_EPOCHS. A ParallelTask runs the whole dataset config.num_epochs
// times (0 = forever) for one consumer; its batches carry key {job, consumer,
// epoch, position 0}. When the last epoch is queued and sent, that consumer's
// stream ends OK.
//
// Queues and back-pressure. Each (job, consumer) has one queue of at most
// queue_batches batches. A producer whose consumer queue is full blocks (so
// does its Executor, whose own queues are bounded): a consumer that stops
// reading stops its splits with bounded memory.
//
// Streams. OpenStream(job, consumer, notify) attaches a reader to the
// consumer's queue (a newer stream supersedes an older one, which ends
// ABORTED). PollStream never blocks: it returns a batch, kPending (notify() is
// called when there is something new), or kEnd with the status that ends the
// stream: OK when the worker drains or stops and holds nothing more for the
// consumer, or when the consumer's parallel task is done; the pipeline's
// runtime error (e.g. DATA_LOSS naming the record) after the batches queued
// before it.
//
// Refused jobs. A job whose pipeline source lies outside every data root is
// refused with PERMISSION_DENIED "pipeline source '/x' is outside the worker's
// --data-root (/a, /b)"; a pipeline that fails validation with the validator's
// INVALID_ARGUMENT (a missing source path: FAILED_PRECONDITION, since NOT_FOUND
// means "job unknown yet, retry" to clients). OpenStream for a refused job
// returns that status. Its splits are held but never produced.
//
// Lost and draining. NOT_FOUND from WorkerHeartbeat (the dispatcher declared us
// lost): every split and queued batch is dropped and the worker registers
// again. Drain(): DrainWorker RPC; the dispatcher stops assigning and drops the
// splits we have not finished producing; heartbeats go on until the response
// says may_exit (see may_exit()).
//
// Threads: Start() registers, then starts `capacity` producer threads (each
// runs one split at a time on one of the job's Executors) and, if
// options.heartbeat_thread, the heartbeat thread. Stop() ends every stream,
// cancels and joins them. All public methods are thread-safe.
// ---------------------------------------------------------------------------------------------
#ifndef SLUICE_DATA_WORKER_WORKER_WORKER_IMPL_H_
#define SLUICE_DATA_WORKER_WORKER_WORKER_IMPL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "data_worker/pipeline/executor.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/dispatcher.pb.h"
#include "proto/worker.pb.h"
#include "proto/worker_service.pb.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker {

// The wire protocol version all components share (proto/worker.proto).
inline constexpr uint32_t kProtocolVersion = proto::PROTOCOL_VERSION_CURRENT;

// The worker's view of the dispatcher's RPCs (grpc_dispatcher_client.h; tests
// fake it). Errors are the dispatcher's codes; Unavailable/DeadlineExceeded
// when it cannot be reached.
class DispatcherClient {
 public:
  virtual ~DispatcherClient() = default;
  virtual absl::Status WorkerRegister(
      const proto::WorkerRegisterRequest& request,
      proto::WorkerRegisterResponse* response) = 0;
  virtual absl::Status WorkerHeartbeat(
      const proto::WorkerHeartbeatRequest& request,
      proto::WorkerHeartbeatResponse* response) = 0;
  virtual absl::Status DrainWorker(const proto::DrainWorkerRequest& request,
                                   proto::DrainWorkerResponse* response) = 0;
  virtual absl::Status WorkerUnregister(
      const proto::WorkerUnregisterRequest& request,
      proto::WorkerUnregisterResponse* response) = 0;
};

struct WorkerOptions {
  // Data-plane host:port told to the dispatcher; may be left empty until
  // Start(address).
  std::string address;
  std::vector<std::string> data_roots;  // at least one; canonicalized by Create
  int threads = 0;           // each Executor's cpu_budget; 0 = all cores
  uint32_t capacity = 2;     // splits produced concurrently (producer threads)
  size_t queue_batches = 8;  // per consumer
  // Bytes the pipelines may hold in their stage queues, all producers together
  // (each Executor gets memory_budget_bytes / capacity). Output queues
  // (queue_batches) come on top.
  int64_t memory_budget_bytes = int64_t{256} << 20;
  // Until the dispatcher's WorkerRegisterResponse says otherwise.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  bool heartbeat_thread = true;  // false: the caller calls Heartbeat() (tests)
  Clock* clock = nullptr;        // null: RealClock::Get()
  prometheus::Registry* registry = nullptr;  // null: a private registry
  std::shared_ptr<spdlog::logger> logger;    // null: NullLogger()
};

// What PollStream found.
struct StreamEvent {
  enum Kind { kBatch, kPending, kEnd };
  Kind kind = kPending;
  proto::Batch batch;   // kBatch
  absl::Status status;  // kEnd
};

// Converts an executor output into a wire batch (columns named `column_names`,
// bytes copied once). InvalidArgument if the counts differ.
absl::StatusOr<proto::Batch> ToWireBatch(
    pipeline::Element element, const std::vector<std::string>& column_names);

class WorkerImpl {
 public:
  // InvalidArgument: no data root, capacity or queue_batches 0.
  static absl::StatusOr<std::unique_ptr<WorkerImpl>> Create(
      WorkerOptions options, std::unique_ptr<DispatcherClient> dispatcher);
  ~WorkerImpl();  // Stop()s
  WorkerImpl(const WorkerImpl&) = delete;
  WorkerImpl& operator=(const WorkerImpl&) = delete;

  // Registers with `address` (if not empty, else options.address) as the
  // data-plane address (the DispatcherClient's error if that fails), then
  // starts the threads.
  absl::Status Start(const std::string& address = "") ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every stream (kEnd OK), cancels and joins all threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // WorkerRegister; Start() calls it. Exposed for tests. InvalidArgument
  // without an address.
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);
  // One heartbeat: report, then apply the response (new jobs, start, drop,
  // draining). NotFound from the dispatcher: drops everything and registers
  // again. Returns the RPC's other errors.
  absl::Status Heartbeat() ABSL_LOCKS_EXCLUDED(mu_);
  // Scale-down: DrainWorker RPC, then take no new splits. Heartbeats continue.
  absl::Status Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // WorkerUnregister: the dispatcher hands back everything this worker holds at
  // once. For a worker that leaves without the dispatcher's may_exit.
  absl::Status Unregister() ABSL_LOCKS_EXCLUDED(mu_);
  // The dispatcher said may_exit (draining and nothing left to serve).
  bool may_exit() const ABSL_LOCKS_EXCLUDED(mu_);

  // Attaches a reader to (job, consumer)'s queue. `notify` may be called from
  // any thread, also after CloseStream, until the WorkerImpl is destroyed; it
  // must not block. Errors: FailedPrecondition for a protocol version mismatch,
  // NotFound for an unknown job, the job's refusal status
  // (PermissionDenied/InvalidArgument/FailedPrecondition), InvalidArgument for
  // consumer_index >= num_consumers.
  absl::StatusOr<uint64_t> OpenStream(const proto::GetBatchesRequest& request,
                                      std::function<void()> notify)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Never blocks. After kEnd, further polls return kEnd again.
  StreamEvent PollStream(uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A batch PollStream returned that was not delivered (the write failed): put
  // it back at the front of its queue, unless its split was dropped meanwhile.
  void ReturnBatch(uint64_t stream_id, proto::Batch batch)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CloseStream(uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);

  // For tests and metrics.
  uint64_t worker_id() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t queued_batches() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t queued_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Peak over time of queued_bytes() plus the live bytes of every running
  // Executor.
  int64_t peak_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Producers blocked on a full consumer queue right now.
  int blocked_producers() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last heartbeat request built (for tests).
  proto::WorkerHeartbeatRequest last_heartbeat() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using TaskKey = std::tuple<uint64_t, uint32_t, uint64_t,
                             uint64_t>;  // job, consumer, epoch, pos
  using ConsumerKey = std::pair<uint64_t, uint32_t>;

  struct Job {
    proto::JobInfo info;
    absl::Status status;  // not OK: refused
    proto::Pipeline spec;
    std::vector<std::string> column_names;
    uint64_t batch_size = 1;
    bool shuffle = false;
    std::vector<std::unique_ptr<pipeline::Executor>>
        idle;  // executors not running a task
  };
  // A split or a parallel task.
  struct Task {
    proto::SplitAssignment split;  // key set for both kinds
    bool parallel = false;
    uint64_t produced_batches = 0;  // from batch 0, including skipped ones
    bool started = false;
    bool finished = false;  // last batch queued
    bool dropped = false;
  };
  struct ConsumerQueue {
    std::deque<proto::Batch> batches;
    int64_t bytes = 0;
    absl::Status
        error;  // sticky runtime error; reported after the queued batches
    uint64_t reader = 0;  // active stream id; 0 = none
    std::function<void()> notify;
  };
  struct Stream {
    ConsumerKey consumer;
    bool ended = false;
  };

  WorkerImpl(WorkerOptions options,
             std::unique_ptr<DispatcherClient> dispatcher);

  void ProducerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` on `ex` until it is finished, dropped, failed or the worker
  // stops.
  void RunTask(const std::shared_ptr<Task>& task,
               const std::shared_ptr<Job>& job, pipeline::Executor& ex)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records and batch count of one epoch run of `task`.
  std::vector<uint64_t> TaskIndices(const Task& task, const Job& job,
                                    uint64_t source_size,
                                    uint64_t* first_batch) const;
  // Blocks while the consumer queue is full. False if the task was dropped or
  // the worker stops. `finishes_task`: the batch is the task's last one.
  bool Push(const std::shared_ptr<Task>& task, proto::Batch batch,
            bool finishes_task) ABSL_LOCKS_EXCLUDED(mu_);
  void FailConsumer(const std::shared_ptr<Task>& task,
                    const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Parses, checks the data roots and builds the first Executor of a new job
  // (I/O: no lock).
  std::shared_ptr<Job> BuildJob(const proto::JobInfo& info)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckDataRoot(const proto::Pipeline& spec) const;
  pipeline::ExecutorOptions MakeExecutorOptions() const;
  void ApplyHeartbeatResponse(const proto::WorkerHeartbeatResponse& response,
                              std::vector<std::function<void()>>* notifies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropTask(const TaskKey& key,
                std::vector<std::function<void()>>* notifies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropEverything(std::vector<std::function<void()>>* notifies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ConsumerQueue& QueueFor(const ConsumerKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the consumer's stream should end now with OK (nothing more will
  // come).
  bool ConsumerDone(const ConsumerKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyAll(std::vector<std::function<void()>>* notifies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdatePeak() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static TaskKey KeyOf(const proto::SplitKey& key);

  const WorkerOptions options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;
  std::unique_ptr<DispatcherClient> dispatcher_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Registry& registry_;

  prometheus::Counter& elements_total_;
  prometheus::Counter& bytes_total_;
  prometheus::Counter& batches_total_;
  prometheus::Gauge& queue_depth_;
  prometheus::Counter& splits_started_;
  prometheus::Counter& splits_finished_;
  prometheus::Counter& splits_dropped_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // queue space, new tasks, drops, cancellation
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool may_exit_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t worker_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::string address_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<TaskKey, std::shared_ptr<Task>> tasks_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Task>> pending_ ABSL_GUARDED_BY(mu_);
  std::set<ConsumerKey> parallel_tasks_ ABSL_GUARDED_BY(mu_);  // ever started
  std::map<ConsumerKey, ConsumerQueue> queues_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
  uint64_t next_stream_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<pipeline::Executor*> running_ ABSL_GUARDED_BY(mu_);
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queued_batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t elements_produced_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t elements_at_last_heartbeat_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_heartbeat_time_ ABSL_GUARDED_BY(mu_);
  proto::WorkerHeartbeatRequest last_request_ ABSL_GUARDED_BY(mu_);

  absl::Mutex lifecycle_mu_;  // serializes Start/Stop
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(lifecycle_mu_);
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_WORKER_IMPL_H_
