// ConsumerQueues: the worker's data-transfer side. It holds every task (a split, or a
// PARALLEL_EPOCHS walk) the worker serves, one bounded queue of ready-to-send batches per
// consumer (job, consumer index), and the GetBatches streams that drain those queues.
//
// Producers (task_runner.h) Push() batches of a task, blocking while its consumer's queue is
// full, or while all queues together hold `queue_bytes` (one memory bound per worker, whatever
// the number of consumers and jobs); that is the back-pressure that stops a pipeline whose
// trainer stopped reading. The
// gRPC adapter (grpc_worker_service.h) reads through Open/Poll/Return/Close and never blocks.
//
// Tasks. AddTask(key) makes a task live and returns its id; every Push names the id, so a
// task that was dropped, or restarted under a new id, cannot slip a stale batch in. A task's
// batches carry indices from the split's batch 0; its last message is the end-of-split marker
// (service/batch_codec.h), after which it is `finished`.
//
// Streams resume from what the client holds. Open() takes the client's per-split counts
// (GetBatchesRequest.held): for a split whose batches left this queue (were written to an
// earlier stream) beyond what the client holds, those batches were lost in flight, so the
// split must be produced again from the client's count: Open() drops the task and returns
// its assignment with skip_batches = held, for the caller to restart. The same happens when
// the client holds fewer batches than the task skips (it restored a state saved before the
// split's last reassignment): the task would never produce the batch the client needs next.
// Batches still queued that the client already holds are discarded, and producers waiting
// for that space wake up.
//
// Streams end. Poll() returns kEnd with OK when the consumer will get nothing more from this
// worker: the worker stopped, or drains and every task of the consumer is finished and sent,
// or the consumer's parallel task is finished and sent; with the pipeline's error (Fail())
// after the batches queued before it.
//
// Thread-safe; one mutex. `notify` callbacks are called without it held.
#ifndef SLUICE_DATA_WORKER_WORKER_CONSUMER_QUEUES_H_
#define SLUICE_DATA_WORKER_WORKER_CONSUMER_QUEUES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/service/wire_batch.h"
#include "data_worker/pipeline/memory_budget.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "proto/worker.pb.h"
#include "proto/worker_service.pb.h"

namespace sluice::data_worker {

// A task's slot (proto::SplitKey as a map key). A parallel task is (job, consumer, 0, 0).
struct TaskKey {
  uint64_t job_id = 0;
  uint32_t consumer_index = 0;
  uint64_t epoch = 0;
  uint64_t position = 0;
  auto operator<=>(const TaskKey&) const = default;
};
using ConsumerKey = std::pair<uint64_t, uint32_t>;
TaskKey KeyOf(const proto::SplitKey& key);

// What Poll() found.
struct StreamEvent {
  enum Kind { kBatch, kPending, kEnd };
  Kind kind = kPending;
  service::WireBatch batch;  // kBatch
  absl::Status status;       // kEnd
};

// One task's progress, for the heartbeat.
struct TaskProgress {
  proto::SplitKey key;
  bool parallel = false;
  uint64_t produced_batches = 0;  // from batch 0, including skipped ones
  bool finished = false;          // the end-of-split marker is queued
  // Fail()ed: it produces nothing more. Reported to the dispatcher as finished producing, so
  // that a split whose pipeline failed (or whose job this worker refused) stops holding one
  // of the worker's --capacity slots while its consumer is told the error.
  bool failed = false;
  uint64_t share_group = 0;  // its assignment's (docs/sharing.md)
  uint64_t task_id = 0;
};

class ConsumerQueues {
 public:
  // `queue_batches` > 0: the bound of each consumer's queue. `queue_bytes` > 0: one bound on
  // the column bytes of all queues together (every consumer and job of the worker); a Push
  // that would exceed it waits, unless its consumer's queue is empty (so every consumer keeps
  // progressing whatever the others hold; the bound is passed by at most one batch per such
  // consumer). 0: no byte bound. `budget`: the worker's (memory_budget.h; not owned; null:
  // none), charged with the queued bytes so that the pipelines' feeds wait while it is full.
  ConsumerQueues(size_t queue_batches, int64_t queue_bytes, prometheus::Registry& registry,
                 pipeline::MemoryBudget* budget = nullptr);

  // ---- tasks (heartbeat thread) ----
  // Makes `assignment` live (no-op returning 0 if its key already is). `parallel`: a
  // PARALLEL_EPOCHS walk. Returns the task id Push() must name.
  uint64_t AddTask(const proto::SplitAssignment& assignment, bool parallel)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the task and its queued batches; its producer's next Push() returns false.
  void DropTask(const TaskKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops every task and batch (the dispatcher lost us, or another dispatcher incarnation).
  void DropAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops every task of `job` (its consumers are gone: the job was collected).
  void DropJob(uint64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Streams of consumers whose tasks are all finished and sent end OK (drain).
  void SetDraining() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every stream and unblocks every producer. Final.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<TaskProgress> Progress() const ABSL_LOCKS_EXCLUDED(mu_);
  bool HasTask(const TaskKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- producers ----
  // Queues `batch` of task `task_id` (its header's batch_index counts from the split's batch 0),
  // blocking while the consumer's queue is full. A marker (end_of_split) finishes the task.
  // False if the task is gone (dropped, restarted) or the queues stopped: stop producing.
  bool Push(uint64_t task_id, service::WireBatch batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Push() that waits at most `bound` for room (a production group's fan-out, task_runner.h):
  // kFull when the consumer's queue stayed full that long (the batch is not queued).
  enum class PushResult { kPushed, kFull, kGone };
  PushResult PushWithin(uint64_t task_id, service::WireBatch batch, absl::Duration bound)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Push() that gives up when its consumer stopped reading (task_runner.h, "Paused
  // consumers"): kFull once the queue stayed full for `unread_after` with no batch taken from
  // it by a stream (nor a stream attached) in that time; the batch is not queued. A consumer
  // that reads, however slowly, keeps the wait going.
  PushResult PushUnlessUnread(uint64_t task_id, service::WireBatch batch,
                              absl::Duration unread_after) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a Push() of the task would queue a batch now without waiting (true if the task is
  // gone: its producer finds out at once).
  bool HasRoom(uint64_t task_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // The task's pipeline failed (or its job was refused): its consumer's stream ends with
  // `status` after the batches queued before it, and Progress() reports the task `failed`.
  void Fail(uint64_t task_id, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the task is still live (producers poll this between batches they skip).
  bool IsLive(uint64_t task_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- streams (the gRPC adapter) ----
  struct Opened {
    uint64_t stream_id = 0;
    // Splits whose in-flight batches were lost: restart them with these assignments.
    std::vector<proto::SplitAssignment> restart;
  };
  // Attaches a stream to `consumer`'s queue, superseding an older one (which ends ABORTED).
  // `held`: the client's counts (see the class comment). `notify` may be called from any thread
  // until Close(); it must not block.
  Opened Open(const ConsumerKey& consumer, const std::vector<proto::HeldSplit>& held,
              std::function<void()> notify) ABSL_LOCKS_EXCLUDED(mu_);
  StreamEvent Poll(uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A batch Poll() returned whose write failed: back to the front of its queue, unless its
  // task is gone.
  void Return(uint64_t stream_id, service::WireBatch batch) ABSL_LOCKS_EXCLUDED(mu_);
  void Close(uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Called (without the lock, from the producer's thread) each time a split task stops
  // producing: its end-of-split marker was queued, or it failed. The worker heartbeats at
  // once then, so that the dispatcher hands out the next split now rather than at the next
  // heartbeat period (with splits that take about one period, the wait left a producer idle
  // for up to half the time). Set it before the first Push.
  void set_on_split_end(std::function<void()> hook) { on_split_end_ = std::move(hook); }

  // ---- accounting ----
  size_t queued_batches() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t queued_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t queue_capacity() const ABSL_LOCKS_EXCLUDED(mu_);  // all consumers' bounds
  int blocked_producers() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t open_streams() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t elements_produced() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Task {
    uint64_t id = 0;
    proto::SplitAssignment assignment;
    bool parallel = false;
    uint64_t produced = 0;  // messages queued, counted from batch 0 (markers included)
    uint64_t sent = 0;      // messages that left the queue to a stream, from batch 0
    bool finished = false;
    bool failed = false;  // Fail()ed
  };
  struct Queued {
    uint64_t task_id = 0;
    service::WireBatch batch;
  };
  struct Queue {
    std::deque<Queued> batches;
    absl::Status error;   // sticky; reported after the queued batches
    uint64_t reader = 0;  // active stream id; 0 = none
    std::function<void()> notify;
    uint64_t reads = 0;  // batches streams took from it, and streams attached (PushUnlessUnread)
  };

  Task* FindTask(uint64_t task_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Task* FindTask(uint64_t task_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push() until `deadline` (InfiniteFuture: no bound), or until the consumer's queue was not
  // read for `unread_after` (InfiniteDuration: no bound).
  PushResult PushUntil(uint64_t task_id, service::WireBatch batch, absl::Time deadline,
                       absl::Duration unread_after) ABSL_LOCKS_EXCLUDED(mu_);
  void EraseTask(std::map<TaskKey, Task>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases a queued batch; returns the next.
  std::deque<Queued>::iterator Unqueue(Queue& q, std::deque<Queued>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ConsumerDone(const ConsumerKey& consumer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyAllLocked(std::vector<std::function<void()>>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queued bytes change by `delta`, here and in the worker's budget.
  void Charge(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t queue_batches_;
  const int64_t queue_bytes_;
  pipeline::MemoryBudget* const budget_;
  prometheus::Counter& elements_total_;
  prometheus::Counter& bytes_total_;
  prometheus::Counter& batches_total_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& blocked_producers_;
  prometheus::Counter& splits_finished_;
  prometheus::Counter& splits_dropped_;
  prometheus::Counter& splits_restarted_;

  std::function<void()> on_split_end_;  // set before use, then read only

  mutable absl::Mutex mu_;
  absl::CondVar space_;  // queue space, drops, stop
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_task_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_stream_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<TaskKey, Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, TaskKey> task_ids_ ABSL_GUARDED_BY(mu_);
  std::map<ConsumerKey, Queue> queues_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ConsumerKey> streams_ ABSL_GUARDED_BY(mu_);  // open streams
  std::map<uint64_t, bool> ended_ ABSL_GUARDED_BY(mu_);           // stream id -> ended
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queued_batches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t elements_produced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_CONSUMER_QUEUES_H_
