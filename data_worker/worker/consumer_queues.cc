#include "data_worker/worker/consumer_queues.h"

#include <algorithm>
#include <utility>

#include "common/metrics/metrics.h"
#include "common/service/wire_batch.h"

namespace sluice::data_worker {
namespace {

void CallAll(std::vector<std::function<void()>>& notifies) {
  for (auto& f : notifies) {
    if (f) f();
  }
  notifies.clear();
}

}  // namespace

TaskKey KeyOf(const proto::SplitKey& key) {
  return {key.job_id(), key.consumer_index(), key.epoch(), key.position()};
}

ConsumerQueues::ConsumerQueues(size_t queue_batches, int64_t queue_bytes,
                               prometheus::Registry& registry, pipeline::MemoryBudget* budget)
    : queue_batches_(queue_batches),
      queue_bytes_(queue_bytes),
      budget_(budget),
      elements_total_(AddCounter(registry, "sluice_worker_elements_total",
                                 "Elements produced into consumer queues.")),
      bytes_total_(AddCounter(registry, "sluice_worker_bytes_total",
                              "Column bytes produced into consumer queues.")),
      batches_total_(AddCounter(registry, "sluice_worker_batches_total",
                                "Batches produced into consumer queues.")),
      queue_depth_(AddGauge(registry, "sluice_worker_queue_depth",
                            "Batches waiting in the worker's consumer queues.")),
      blocked_producers_(AddGauge(registry, "sluice_worker_blocked_producers",
                                  "Producers waiting for room in a full "
                                  "consumer queue (back-pressure).")),
      splits_finished_(AddCounter(registry, "sluice_worker_splits_total", "Splits by event.",
                                  {{"event", "finished"}})),
      splits_dropped_(AddCounter(registry, "sluice_worker_splits_total", "Splits by event.",
                                 {{"event", "dropped"}})),
      splits_restarted_(AddCounter(registry, "sluice_worker_splits_total", "Splits by event.",
                                   {{"event", "restarted"}})) {}

uint64_t ConsumerQueues::AddTask(const proto::SplitAssignment& assignment, bool parallel) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return 0;
  const TaskKey key = KeyOf(assignment.key());
  if (tasks_.contains(key)) return 0;
  Task task;
  const uint64_t id = next_task_id_++;
  task.id = id;
  task.assignment = assignment;
  task.parallel = parallel;
  task.produced = assignment.skip_batches();
  task.sent = assignment.skip_batches();
  task_ids_[task.id] = key;
  tasks_.emplace(key, std::move(task));
  queues_[{key.job_id, key.consumer_index}];  // the consumer's queue exists from now on
  return id;
}

ConsumerQueues::Task* ConsumerQueues::FindTask(uint64_t task_id) {
  auto id = task_ids_.find(task_id);
  if (id == task_ids_.end()) return nullptr;
  auto it = tasks_.find(id->second);
  return it == tasks_.end() || it->second.id != task_id ? nullptr : &it->second;
}

const ConsumerQueues::Task* ConsumerQueues::FindTask(uint64_t task_id) const {
  auto id = task_ids_.find(task_id);
  if (id == task_ids_.end()) return nullptr;
  auto it = tasks_.find(id->second);
  return it == tasks_.end() || it->second.id != task_id ? nullptr : &it->second;
}

std::deque<ConsumerQueues::Queued>::iterator ConsumerQueues::Unqueue(
    Queue& q, std::deque<Queued>::iterator it) {
  Charge(-service::BatchBytes(it->batch));
  --queued_batches_;
  // A producer may be waiting for exactly this space (Open() discards held batches of a full
  // queue that no stream will ever Poll()).
  space_.SignalAll();
  return q.batches.erase(it);
}

void ConsumerQueues::EraseTask(std::map<TaskKey, Task>::iterator it) {
  const uint64_t id = it->second.id;
  if (!it->second.finished) splits_dropped_.Increment();
  Queue& q = queues_[{it->first.job_id, it->first.consumer_index}];
  for (auto b = q.batches.begin(); b != q.batches.end();) {
    b = b->task_id == id ? Unqueue(q, b) : std::next(b);
  }
  task_ids_.erase(id);
  tasks_.erase(it);
  UpdateGauge();
  space_.SignalAll();
}

void ConsumerQueues::DropTask(const TaskKey& key) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(key);
    if (it == tasks_.end()) return;
    EraseTask(it);
    notify = queues_[{key.job_id, key.consumer_index}].notify;
  }
  if (notify) notify();
}

void ConsumerQueues::DropAll() {
  std::vector<std::function<void()>> notifies;
  {
    absl::MutexLock lock(&mu_);
    while (!tasks_.empty()) EraseTask(tasks_.begin());
    for (auto& [consumer, q] : queues_) q.error = absl::OkStatus();
    NotifyAllLocked(&notifies);
  }
  CallAll(notifies);
}

void ConsumerQueues::DropJob(uint64_t job_id) {
  std::vector<std::function<void()>> notifies;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = tasks_.lower_bound({job_id, 0, 0, 0});
         it != tasks_.end() && it->first.job_id == job_id;) {
      auto next = std::next(it);
      EraseTask(it);
      it = next;
    }
    for (auto it = queues_.lower_bound({job_id, 0});
         it != queues_.end() && it->first.first == job_id; ++it) {
      notifies.push_back(it->second.notify);
    }
  }
  CallAll(notifies);
}

void ConsumerQueues::SetDraining() {
  std::vector<std::function<void()>> notifies;
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return;
    draining_ = true;
    NotifyAllLocked(&notifies);
  }
  CallAll(notifies);
}

void ConsumerQueues::Stop() {
  std::vector<std::function<void()>> notifies;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    space_.SignalAll();
    NotifyAllLocked(&notifies);
  }
  CallAll(notifies);
}

std::vector<TaskProgress> ConsumerQueues::Progress() const {
  absl::MutexLock lock(&mu_);
  std::vector<TaskProgress> out;
  out.reserve(tasks_.size());
  for (const auto& [key, task] : tasks_) {
    TaskProgress p;
    p.key = task.assignment.key();
    p.parallel = task.parallel;
    // The marker is not a batch.
    p.produced_batches = task.finished ? task.produced - 1 : task.produced;
    p.finished = task.finished;
    p.failed = task.failed;
    p.share_group = task.assignment.share_group();
    p.task_id = task.id;
    out.push_back(std::move(p));
  }
  return out;
}

bool ConsumerQueues::HasTask(const TaskKey& key) const {
  absl::MutexLock lock(&mu_);
  return tasks_.contains(key);
}

bool ConsumerQueues::IsLive(uint64_t task_id) const {
  absl::MutexLock lock(&mu_);
  return !stopped_ && task_ids_.contains(task_id);
}

bool ConsumerQueues::Push(uint64_t task_id, service::WireBatch batch) {
  return PushUntil(task_id, std::move(batch), absl::InfiniteFuture(), absl::InfiniteDuration()) ==
         PushResult::kPushed;
}

ConsumerQueues::PushResult ConsumerQueues::PushWithin(uint64_t task_id, service::WireBatch batch,
                                                      absl::Duration bound) {
  return PushUntil(task_id, std::move(batch), absl::Now() + bound, absl::InfiniteDuration());
}

ConsumerQueues::PushResult ConsumerQueues::PushUnlessUnread(uint64_t task_id,
                                                            service::WireBatch batch,
                                                            absl::Duration unread_after) {
  return PushUntil(task_id, std::move(batch), absl::InfiniteFuture(), unread_after);
}

bool ConsumerQueues::HasRoom(uint64_t task_id) const {
  absl::MutexLock lock(&mu_);
  if (FindTask(task_id) == nullptr || stopped_) return true;
  auto it = queues_.find({task_ids_.at(task_id).job_id, task_ids_.at(task_id).consumer_index});
  if (it == queues_.end() || it->second.batches.empty()) return true;
  return it->second.batches.size() < queue_batches_ &&
         (queue_bytes_ <= 0 || queued_bytes_ < queue_bytes_);
}

ConsumerQueues::PushResult ConsumerQueues::PushUntil(uint64_t task_id, service::WireBatch batch,
                                                     absl::Time deadline,
                                                     absl::Duration unread_after) {
  std::function<void()> notify;
  bool split_ended = false;
  {
    absl::MutexLock lock(&mu_);
    Task* task = FindTask(task_id);
    if (task == nullptr || stopped_) return PushResult::kGone;
    const ConsumerKey consumer{task_ids_[task_id].job_id, task_ids_[task_id].consumer_index};
    Queue* q = &queues_[consumer];
    const int64_t incoming = service::BatchBytes(batch);
    auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (q->batches.size() >= queue_batches_) return true;
      // The worker-wide byte bound; an empty queue always takes one batch.
      return queue_bytes_ > 0 && !q->batches.empty() && queued_bytes_ + incoming > queue_bytes_;
    };
    ++blocked_;
    bool timed_out = false;
    if (!stopped_ && FindTask(task_id) != nullptr && full()) {
      blocked_producers_.Increment();
      // Renewed whenever a stream reads the queue: only a consumer that reads nothing for
      // `unread_after` ends the wait.
      uint64_t reads = q->reads;
      absl::Time unread_at = absl::Now() + unread_after;
      while (!stopped_ && FindTask(task_id) != nullptr && full() && !timed_out) {
        timed_out = space_.WaitWithDeadline(&mu_, std::min(deadline, unread_at));
        if (timed_out && q->reads != reads && absl::Now() < deadline) {
          reads = q->reads;
          unread_at = absl::Now() + unread_after;
          timed_out = false;
        }
      }
      blocked_producers_.Decrement();
    }
    --blocked_;
    task = FindTask(task_id);
    if (task == nullptr || stopped_) return PushResult::kGone;
    if (full()) return PushResult::kFull;
    const bool marker = batch.header.end_of_split();
    const int64_t bytes = service::BatchBytes(batch);
    const uint64_t elements = static_cast<uint64_t>(batch.header.global_indices_size());
    task->produced = batch.header.batch_index() + 1;
    if (marker) {
      task->finished = true;
      split_ended = !task->parallel;
      if (split_ended) splits_finished_.Increment();
    } else {
      elements_produced_ += elements;
      elements_total_.Increment(static_cast<double>(elements));
      bytes_total_.Increment(static_cast<double>(bytes));
      batches_total_.Increment();
    }
    q->batches.push_back(Queued{task_id, std::move(batch)});
    Charge(bytes);
    ++queued_batches_;
    UpdateGauge();
    notify = q->notify;
  }
  if (notify) notify();
  if (split_ended && on_split_end_) on_split_end_();
  return PushResult::kPushed;
}

void ConsumerQueues::Fail(uint64_t task_id, const absl::Status& status) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    Task* task = FindTask(task_id);
    if (task == nullptr || stopped_) return;
    task->failed = true;
    Queue& q = queues_[{task_ids_[task_id].job_id, task_ids_[task_id].consumer_index}];
    if (q.error.ok()) q.error = status;
    notify = q.notify;
  }
  if (notify) notify();
  if (on_split_end_) on_split_end_();
}

ConsumerQueues::Opened ConsumerQueues::Open(const ConsumerKey& consumer,
                                            const std::vector<proto::HeldSplit>& held,
                                            std::function<void()> notify) {
  Opened opened;
  std::function<void()> superseded;
  {
    absl::MutexLock lock(&mu_);
    std::map<TaskKey, const proto::HeldSplit*> holds;
    for (const proto::HeldSplit& h : held) holds[KeyOf(h.key())] = &h;
    Queue& q = queues_[consumer];
    for (auto it = tasks_.lower_bound({consumer.first, consumer.second, 0, 0});
         it != tasks_.end() && it->first.job_id == consumer.first &&
         it->first.consumer_index == consumer.second;) {
      auto next = std::next(it);
      Task& task = it->second;
      auto h = holds.find(it->first);
      const uint64_t has = h == holds.end() ? 0 : h->second->batches();
      const bool complete = h != holds.end() && h->second->complete();
      if (!task.parallel && !complete) {
        // Discard queued batches the client holds already.
        for (auto b = q.batches.begin(); b != q.batches.end();) {
          const bool held_already = b->task_id == task.id && !b->batch.header.end_of_split() &&
                                    b->batch.header.batch_index() < has;
          b = held_already ? Unqueue(q, b) : std::next(b);
        }
        const uint64_t skip = task.assignment.skip_batches();
        // Batches [has, sent) went to an earlier stream and never arrived; or the client holds
        // fewer than the task skips (it restored a state older than the split's last
        // reassignment), so the batches it needs next would never be produced and every
        // stream would be rejected at the same position.
        const bool lost_in_flight = task.sent > has && task.sent > skip;
        if (lost_in_flight || has < skip) {
          proto::SplitAssignment again = task.assignment;
          again.set_skip_batches(has);
          opened.restart.push_back(std::move(again));
          splits_restarted_.Increment();
          EraseTask(it);
        }
      }
      it = next;
    }
    UpdateGauge();
    opened.stream_id = next_stream_id_++;
    streams_[opened.stream_id] = consumer;
    ended_[opened.stream_id] = false;
    superseded = std::move(q.notify);
    ++q.reads;  // a consumer that attaches reads again
    q.reader = opened.stream_id;
    q.notify = std::move(notify);
  }
  if (superseded) superseded();
  return opened;
}

bool ConsumerQueues::ConsumerDone(const ConsumerKey& consumer) const {
  auto q = queues_.find(consumer);
  if (q != queues_.end() && !q->second.batches.empty()) return false;
  if (stopped_) return true;
  bool any = false;
  bool all_finished = true;
  for (auto it = tasks_.lower_bound({consumer.first, consumer.second, 0, 0});
       it != tasks_.end() && it->first.job_id == consumer.first &&
       it->first.consumer_index == consumer.second;
       ++it) {
    any = true;
    if (it->second.parallel && it->second.finished) return true;
    all_finished = all_finished && it->second.finished;
  }
  return draining_ && (!any || all_finished);
}

StreamEvent ConsumerQueues::Poll(uint64_t stream_id) {
  StreamEvent event;
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream_id);
  if (s == streams_.end()) {
    event.kind = StreamEvent::kEnd;
    event.status = absl::NotFoundError("stream closed");
    return event;
  }
  auto end = [&](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ended_[stream_id] = true;
    event.kind = StreamEvent::kEnd;
    event.status = std::move(status);
  };
  if (ended_[stream_id]) {
    event.kind = StreamEvent::kEnd;
    return event;
  }
  Queue& q = queues_[s->second];
  if (q.reader != stream_id) {
    end(absl::AbortedError("superseded by a newer GetBatches stream for this consumer"));
    return event;
  }
  if (!q.batches.empty()) {
    // Lowest (epoch, position, index) first: a split's batches keep their order, and the split
    // a deterministic consumer releases next is never stuck behind later ones.
    auto lowest = q.batches.begin();
    for (auto it = q.batches.begin(); it != q.batches.end(); ++it) {
      const proto::SplitKey& a = it->batch.header.key();
      const proto::SplitKey& b = lowest->batch.header.key();
      if (std::make_tuple(a.epoch(), a.position(), it->batch.header.batch_index()) <
          std::make_tuple(b.epoch(), b.position(), lowest->batch.header.batch_index())) {
        lowest = it;
      }
    }
    std::rotate(q.batches.begin(), lowest, std::next(lowest));
    Queued& front = q.batches.front();
    if (Task* task = FindTask(front.task_id); task != nullptr)
      task->sent = std::max(task->sent, front.batch.header.batch_index() + 1);
    event.kind = StreamEvent::kBatch;
    ++q.reads;
    event.batch = std::move(front.batch);
    Charge(-service::BatchBytes(event.batch));
    --queued_batches_;
    q.batches.pop_front();
    UpdateGauge();
    space_.SignalAll();
    return event;
  }
  if (!q.error.ok()) {
    end(q.error);
    return event;
  }
  if (ConsumerDone(s->second)) {
    end(absl::OkStatus());
    return event;
  }
  event.kind = StreamEvent::kPending;
  return event;
}

void ConsumerQueues::Return(uint64_t stream_id, service::WireBatch batch) {
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream_id);
  if (s == streams_.end()) return;
  TaskKey key = KeyOf(batch.header.key());
  auto t = tasks_.find(key);
  if (t == tasks_.end()) t = tasks_.find({key.job_id, key.consumer_index, 0, 0});
  if (t == tasks_.end()) return;
  Task& task = t->second;
  task.sent = std::min(task.sent, batch.header.batch_index());
  Queue& q = queues_[s->second];
  Charge(service::BatchBytes(batch));
  ++queued_batches_;
  q.batches.push_front(Queued{task.id, std::move(batch)});
  UpdateGauge();
}

void ConsumerQueues::Close(uint64_t stream_id) {
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream_id);
  if (s == streams_.end()) return;
  Queue& q = queues_[s->second];
  if (q.reader == stream_id) {
    q.reader = 0;
    q.notify = nullptr;
  }
  streams_.erase(s);
  ended_.erase(stream_id);
}

void ConsumerQueues::Charge(int64_t delta) {
  queued_bytes_ += delta;
  if (budget_ != nullptr) budget_->Add(delta);
}

void ConsumerQueues::NotifyAllLocked(std::vector<std::function<void()>>* out) {
  for (auto& [consumer, q] : queues_) out->push_back(q.notify);
}

void ConsumerQueues::UpdateGauge() { queue_depth_.Set(static_cast<double>(queued_batches_)); }

size_t ConsumerQueues::queued_batches() const {
  absl::MutexLock lock(&mu_);
  return queued_batches_;
}
int64_t ConsumerQueues::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}
size_t ConsumerQueues::queue_capacity() const {
  absl::MutexLock lock(&mu_);
  return queues_.size() * queue_batches_;
}
size_t ConsumerQueues::open_streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}
int ConsumerQueues::blocked_producers() const {
  absl::MutexLock lock(&mu_);
  return blocked_;
}
uint64_t ConsumerQueues::elements_produced() const {
  absl::MutexLock lock(&mu_);
  return elements_produced_;
}

}  // namespace sluice::data_worker
