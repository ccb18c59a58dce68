#include "data_worker/worker/task_runner.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/record/sharding.h"
#include "common/service/limits.h"
#include "common/service/wire_batch.h"

namespace sluice::data_worker {
namespace {

// The global record indices a slot reads, in order: each piece's range of its split's record
// order (record::ConsumerSlots). InvalidArgument for a piece that reaches past its split.
absl::StatusOr<std::vector<uint64_t>> SlotRecordOrder(const proto::SplitAssignment& a,
                                                      const Job& job, uint64_t epoch) {
  std::vector<uint64_t> out;
  for (const proto::SplitPiece& p : a.pieces()) {
    if (p.offset() > p.records() || p.count() > p.records() - p.offset()) {
      return absl::InvalidArgumentError(absl::StrCat("split ", p.split_id(), " has ", p.records(),
                                                     " records; the assignment reads ", p.count(),
                                                     " from ", p.offset()));
    }
    const std::vector<uint64_t> order = record::SplitRecordOrder(
        p.first_global(), p.records(), job.shuffle, job.info.config().seed(), p.split_id(), epoch);
    out.insert(out.end(), order.begin() + static_cast<ptrdiff_t>(p.offset()),
               order.begin() + static_cast<ptrdiff_t>(p.offset() + p.count()));
  }
  return out;
}

// Whether `b` is a member of `a`'s production group: the same group, slot and pieces, so the
// same bytes (skip_batches may differ: each member discards what its consumer holds).
bool SameSharedSlot(const proto::SplitAssignment& a, const proto::SplitAssignment& b) {
  if (a.share_group() == 0 || a.share_group() != b.share_group()) return false;
  if (a.key().consumer_index() != b.key().consumer_index() || a.key().epoch() != b.key().epoch() ||
      a.key().position() != b.key().position() || a.pieces_size() != b.pieces_size()) {
    return false;
  }
  for (int i = 0; i < a.pieces_size(); ++i) {
    if (a.pieces(i).SerializeAsString() != b.pieces(i).SerializeAsString()) return false;
  }
  return true;
}

// A shared batch as member `m` gets it: its own key.
service::WireBatch BatchFor(const service::WireBatch& batch, const proto::SplitAssignment& m) {
  service::WireBatch out = batch;
  *out.header.mutable_key() = m.key();
  return out;
}

uint64_t FirstSplitId(const proto::SplitAssignment& a) {
  return a.pieces().empty() ? 0 : a.pieces(0).split_id();
}

// "slot 3 (split 12 positions 0..256, split 4 positions 0..32)"
// A pipeline's busy time since `base` (each stage's busy seconds then): the
// thread-seconds of its bottleneck stage (the most busy time per thread)
// divided by that stage's threads.
double BusySince(const pipeline::PipelineStats& stats, const std::vector<double>& base) {
  double busy = 0;
  for (size_t i = 0; i < stats.stages.size(); ++i) {
    const pipeline::StageStats& stage = stats.stages[i];
    const double before = i < base.size() ? base[i] : 0;
    busy = std::max(busy, (stage.busy_seconds - before) / std::max(1, stage.threads));
  }
  return busy;
}

std::string DescribeSlot(const proto::SplitAssignment& a) {
  std::string out = absl::StrCat("slot ", a.key().position(), " (");
  for (int i = 0; i < a.pieces_size(); ++i) {
    const proto::SplitPiece& p = a.pieces(i);
    absl::StrAppend(&out, i == 0 ? "" : ", ", "split ", p.split_id(), " positions ", p.offset(),
                    "..", p.offset() + p.count());
  }
  return absl::StrCat(out, ")");
}

}  // namespace

absl::StatusOr<service::WireBatch> ToWireBatch(pipeline::Element element, const Job& job) {
  if (element.columns.size() != job.column_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the pipeline produced ", element.columns.size(),
                                                   " columns but names ", job.column_names.size()));
  }
  service::WireBatch batch;
  for (size_t i = 0; i < element.columns.size(); ++i) {
    // The tensor itself becomes the buffer's owner: no copy of its bytes.
    auto t = std::make_shared<const Tensor>(std::move(element.columns[i]));
    std::vector<int64_t> shape(t->shape().begin(), t->shape().end());
    if (!job.batched) shape.insert(shape.begin(), 1);
    service::ColumnBytes bytes{t->data(), t->num_bytes(), t};
    absl::Status s =
        service::AppendColumn(job.column_names[i], t->dtype(), shape, std::move(bytes), &batch);
    if (!s.ok()) return s;
  }
  batch.header.mutable_global_indices()->Add(element.global_indices.begin(),
                                             element.global_indices.end());
  return batch;
}

absl::StatusOr<std::optional<proto::ColumnFinish>> FinishOrShip(const Job& job,
                                                                pipeline::Element* element) {
  if (!job.tail.has_value()) return std::nullopt;
  const Job::Tail& tail = *job.tail;
  if (tail.column >= static_cast<int>(element->columns.size())) {
    return absl::InvalidArgumentError("the pipeline's output lost a column");
  }
  Tensor& column = element->columns[tail.column];
  const bool ship = job.finish == kernels::FinishMode::kClient ||
                    (job.finish == kernels::FinishMode::kAuto && column.dtype() == DType::kUint8);
  // The flip accepts images of up to 4 channels (its error otherwise comes from the loop below).
  const bool mirrorable = tail.mirror == nullptr || (column.rank() == 4 && column.dim(1) > 0 &&
                                                     column.dim(2) > 0 && column.dim(3) <= 4);
  const int64_t n = column.rank() > 0 ? column.dim(0) : 0;
  if (tail.mirror != nullptr && element->global_indices.size() != static_cast<size_t>(n)) {
    return absl::InternalError(absl::StrCat("a batch of ", n, " elements has ",
                                            element->global_indices.size(), " record ids"));
  }
  auto context = [&](int64_t i) {
    return ElementContext{tail.seed, element->epoch, element->global_indices[i]};
  };
  // The client can run it on this column (the one check both sides share).
  if (ship && mirrorable &&
      kernels::Finisher::Create(tail.specs, column.dtype(), column.shape()).ok()) {
    proto::ColumnFinish finish;
    finish.set_column(tail.column);
    finish.mutable_ops()->Add(tail.specs.begin(), tail.specs.end());
    if (tail.mirror != nullptr) {
      for (int64_t i = 0; i < n; ++i) finish.add_mirrored(tail.mirror->Mirrors(context(i)));
    }
    return finish;
  }
  if (tail.mirror != nullptr && n > 0) {
    // The flip as the executor would have run it, element by element (a rare path: a float32
    // column under finish auto, or a column the client cannot finish).
    const std::vector<int64_t> shape(column.shape().begin() + 1, column.shape().end());
    const size_t bytes = column.num_bytes() / static_cast<size_t>(n);
    for (int64_t i = 0; i < n; ++i) {
      Tensor one = Tensor::Allocate(column.dtype(), shape);
      std::memcpy(one.data(), column.data() + i * bytes, bytes);
      absl::StatusOr<Tensor> out = tail.mirror->Apply(std::move(one), context(i));
      if (!out.ok()) return out.status();
      std::memcpy(column.data() + i * bytes, out->data(), bytes);
    }
  }
  for (const std::shared_ptr<const Op>& op : tail.ops) {
    absl::StatusOr<Tensor> out = op->ApplyBatch(std::move(column));
    if (!out.ok()) return out.status();
    column = std::move(*out);
  }
  return std::nullopt;
}

TaskRunner::TaskRunner(ConsumerQueues* queues, JobRegistry* jobs, prometheus::Registry& registry,
                       std::shared_ptr<spdlog::logger> logger, int cpu_budget,
                       absl::Duration share_detach_after, absl::Duration pause_unread_after)
    : queues_(queues),
      jobs_(jobs),
      logger_(std::move(logger)),
      cpu_budget_(std::max(1, cpu_budget)),
      share_detach_after_(share_detach_after),
      pause_unread_after_(pause_unread_after),
      splits_started_(AddCounter(registry, "sluice_worker_splits_total", "Splits by event.",
                                 {{"event", "started"}})),
      shared_joined_(
          AddCounter(registry, "sluice_worker_shared_splits_total",
                     "Splits of a production group (docs/sharing.md) by event: joined = served by "
                     "another job's production of the same slot, detached = fell behind the group.",
                     {{"event", "joined"}})),
      shared_detached_(
          AddCounter(registry, "sluice_worker_shared_splits_total", "", {{"event", "detached"}})),
      paused_(AddCounter(registry, "sluice_worker_paused_splits_total",
                         "Split tasks by event: paused = its consumer read nothing for "
                         "--pause-unread-after while its queue was full (the task stopped "
                         "producing and freed its producer), resumed = taken again once the "
                         "consumer read.",
                         {{"event", "paused"}})),
      resumed_(
          AddCounter(registry, "sluice_worker_paused_splits_total", "", {{"event", "resumed"}})) {}

TaskRunner::~TaskRunner() { Stop(); }

void TaskRunner::Start(int threads) {
  absl::MutexLock lock(&mu_);
  producers_ += threads;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { ProducerLoop(); });
}

void TaskRunner::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    work_available_.SignalAll();
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void TaskRunner::Enqueue(uint64_t task_id, proto::SplitAssignment assignment, bool parallel) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(QueuedTask{task_id, std::move(assignment), parallel});
  work_available_.Signal();
}

void TaskRunner::EnqueueGroup(std::vector<std::pair<uint64_t, proto::SplitAssignment>> tasks) {
  absl::MutexLock lock(&mu_);
  for (auto& [task_id, assignment] : tasks) {
    pending_.push_back(QueuedTask{.task_id = task_id, .assignment = std::move(assignment)});
  }
  work_available_.SignalAll();
}

std::set<uint64_t> TaskRunner::waiting_detached() const {
  absl::MutexLock lock(&mu_);
  std::set<uint64_t> out;
  for (const QueuedTask& t : pending_) {
    if (t.detached) out.insert(t.task_id);
  }
  return out;
}

TaskRunner::Busy TaskRunner::busy() const {
  absl::MutexLock lock(&mu_);
  Busy out;
  out.busy_seconds = run_busy_seconds_;
  out.elements = elements_run_;
  out.by_job = run_busy_by_job_;
  for (const PipelineCounters& r : counters_) {
    const pipeline::PipelineStats stats = r.ex->stats();
    const double busy = BusySince(stats, r.busy_base);
    const uint64_t elements = stats.elements_out - r.elements_base;
    out.busy_seconds += busy;
    out.elements += elements;
    if (r.forgotten) continue;  // parked after its job ended
    if (busy <= 0 && elements == 0) continue;
    out.by_job[r.job_id].busy_seconds += busy;
    out.by_job[r.job_id].elements += elements;
  }
  const int producers = std::max(1, producers_);
  out.busy_seconds /= producers;
  for (auto& [job_id, job] : out.by_job) job.busy_seconds /= producers;
  return out;
}

std::map<uint64_t, std::vector<TaskRunner::StageCost>> TaskRunner::stage_costs() const {
  absl::MutexLock lock(&mu_);
  return stage_costs_;
}

void TaskRunner::CountBusy(PipelineCounters& r) {
  const pipeline::PipelineStats stats = r.ex->stats();
  const double busy = BusySince(stats, r.busy_base);
  const uint64_t elements = stats.elements_out - r.elements_base;
  run_busy_seconds_ += busy;
  elements_run_ += elements;
  if (!r.forgotten) {
    JobBusy& job = run_busy_by_job_[r.job_id];
    job.busy_seconds += busy;
    job.elements += elements;
    std::vector<StageCost>& costs = stage_costs_[r.job_id];
    bool same = costs.size() == stats.stages.size();
    for (size_t i = 0; same && i < costs.size(); ++i) same = costs[i].name == stats.stages[i].name;
    if (!same) {
      // The job's first runs, or its pipeline built again (`cache: auto` decided): from here.
      costs.assign(stats.stages.size(), StageCost{});
      for (size_t i = 0; i < costs.size(); ++i) costs[i].name = stats.stages[i].name;
    }
    for (size_t i = 0; i < stats.stages.size(); ++i) {
      const pipeline::StageStats& s = stats.stages[i];
      const uint64_t in =
          s.elements - (i < r.stage_elements_base.size() ? r.stage_elements_base[i] : 0);
      const uint64_t dropped =
          s.dropped - (i < r.stage_dropped_base.size() ? r.stage_dropped_base[i] : 0);
      costs[i].elements += in;
      costs[i].out += in - std::min(in, dropped);
      costs[i].busy_seconds += s.busy_seconds - (i < r.busy_base.size() ? r.busy_base[i] : 0);
      if (s.peak_queue_items > 0) {
        costs[i].bytes_per_element =
            std::max(costs[i].bytes_per_element, static_cast<double>(s.peak_queue_bytes) /
                                                     static_cast<double>(s.peak_queue_items));
      }
    }
  }
  r.stage_elements_base.assign(stats.stages.size(), 0);
  r.stage_dropped_base.assign(stats.stages.size(), 0);
  for (size_t i = 0; i < stats.stages.size(); ++i) {
    r.stage_elements_base[i] = stats.stages[i].elements;
    r.stage_dropped_base[i] = stats.stages[i].dropped;
  }
  r.busy_base.assign(stats.stages.size(), 0);
  for (size_t i = 0; i < stats.stages.size(); ++i) r.busy_base[i] = stats.stages[i].busy_seconds;
  r.elements_base = stats.elements_out;
}

void TaskRunner::ForgetJob(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  for (PipelineCounters& r : counters_) {
    if (r.job_id != job_id) continue;
    CountBusy(r);  // its last task into the totals; nothing more per job
    r.forgotten = true;
  }
  run_busy_by_job_.erase(job_id);
  stage_costs_.erase(job_id);
}

int64_t TaskRunner::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_bytes_;
}

uint64_t TaskRunner::pipeline_thread_starts() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = retired_thread_starts_;
  for (const PipelineCounters& r : counters_) n += r.ex->thread_starts();
  return n;
}

void TaskRunner::UpdatePeak() {
  const int64_t queued = queues_->queued_bytes();
  absl::MutexLock lock(&mu_);
  int64_t total = queued;
  for (const PipelineCounters& r : counters_) total += r.ex->live_bytes();
  peak_bytes_ = std::max(peak_bytes_, total);
}

std::optional<TaskRunner::QueuedTask> TaskRunner::Take(bool wait) {
  absl::MutexLock lock(&mu_);
  // The first task a producer may start: a detached one only when its queue has room (it
  // would block the producer otherwise, while others wait).
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::find_if(pending_.begin(), pending_.end(), [&](const QueuedTask& t) {
      return !t.detached || queues_->HasRoom(t.task_id);
    });
  };
  if (wait) {
    ++idle_;
    while (!cancelled_ && ready() == pending_.end()) {
      // Room in a consumer's queue is not signalled here: a detached task is looked at again.
      if (pending_.empty()) {
        work_available_.Wait(&mu_);
      } else {
        work_available_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
      }
    }
    --idle_;
  }
  // Look-ahead leaves a task to an idle producer, which starts it now instead of after this
  // producer's current run.
  if (cancelled_ || pending_.size() <= static_cast<size_t>(wait ? 0 : idle_)) {
    return std::nullopt;
  }
  auto it = ready();
  if (it == pending_.end()) return std::nullopt;
  QueuedTask task = std::move(*it);
  pending_.erase(it);
  if (!task.parallel && !task.detached && task.assignment.share_group() != 0) {
    for (auto m = pending_.begin(); m != pending_.end();) {
      if (!m->parallel && !m->detached && SameSharedSlot(task.assignment, m->assignment)) {
        task.shared.push_back(std::move(*m));
        m = pending_.erase(m);
      } else {
        ++m;
      }
    }
  }
  return task;
}

void TaskRunner::ProducerLoop() {
  Producer producer;
  while (Share(producer)) {
    if (producer.runs.empty()) {
      Retire(producer,
             /*all=*/false);  // before waiting: no parked threads of a removed job
      std::optional<QueuedTask> task = Take(/*wait=*/true);
      if (!task.has_value()) break;
      Begin(producer, *std::move(task));
      continue;
    }
    SubmittedRun& run = producer.runs.front();
    absl::StatusOr<std::optional<pipeline::Element>> next = run.pipeline->ex->Next();
    if (!next.ok()) {
      // Batches before the error have gone out; the stream then ends with the error, naming
      // the split (the cause names the record). The run's end follows.
      const proto::SplitAssignment& a = run.task.assignment;
      if (!run.stopped) {
        const absl::Status failed(
            next.status().code(),
            absl::StrCat("job ", a.key().job_id(), " ", DescribeSlot(a), " (epoch ", run.epoch,
                         "): ", next.status().message()));
        logger_->error("consumer {}: {}", a.key().consumer_index(), failed.ToString());
        FailRun(producer, run, failed);
      }
      continue;
    }
    if (!next->has_value()) {
      EndRun(producer);
      continue;
    }
    Deliver(producer, run, std::move(**next));
    Lookahead(producer);
  }
  // Cancelled: a run still in flight is dropped with its pipeline.
  for (SubmittedRun& run : producer.runs) {
    run.stopped = true;
    EndCaptures(run);
  }
  producer.runs.clear();
  Share(producer);
  Retire(producer, /*all=*/true);
}

bool TaskRunner::Share(Producer& producer) {
  int share;
  {
    absl::MutexLock lock(&mu_);
    const bool busy = !producer.runs.empty();
    if (busy != producer.busy) busy_producers_ += busy ? 1 : -1;
    producer.busy = busy;
    share = std::max(1, cpu_budget_ / std::max(1, busy_producers_));
    if (cancelled_) return false;
  }
  if (share != producer.cpu_share) {
    producer.cpu_share = share;
    for (auto& [job_id, p] : producer.pipelines) p.ex->SetCpuBudget(share);
  }
  return true;
}

void TaskRunner::Begin(Producer& producer, QueuedTask task) {
  // The threads of a removed job's pipeline end before this producer goes on.
  Retire(producer, /*all=*/false);
  // A production group: its live members whose job this worker runs, the first of them
  // producing. An unknown job's tasks stay held and unproduced. A refused job's fail with
  // its status (its streams carry it too), so that they stop holding the worker's capacity.
  std::vector<QueuedTask> members;
  if (!task.shared.empty()) {
    std::vector<QueuedTask> candidates = std::move(task.shared);
    task.shared.clear();
    candidates.insert(candidates.begin(), std::move(task));
    for (QueuedTask& m : candidates) {
      if (!queues_->IsLive(m.task_id)) continue;
      std::shared_ptr<const Job> job = jobs_->Get(m.assignment.key().job_id());
      if (job == nullptr) continue;
      if (!job->status.ok()) {
        queues_->Fail(m.task_id, job->status);
        continue;
      }
      members.push_back(std::move(m));
    }
    if (members.empty()) return;
    task = members.front();
    if (members.size() == 1) members.clear();
  }
  if (!queues_->IsLive(task.task_id)) return;
  if (task.paused) {
    resumed_.Increment();
    logger_->info("job {} consumer {}: slot {} of epoch {} resumes from batch {}",
                  task.assignment.key().job_id(), task.assignment.key().consumer_index(),
                  task.assignment.key().position(), task.assignment.key().epoch(),
                  task.assignment.skip_batches());
    if (on_pause_change_) on_pause_change_();
  }
  const uint64_t job_id = task.assignment.key().job_id();
  std::shared_ptr<const Job> job = jobs_->Get(job_id);
  if (job == nullptr) return;
  if (!job->status.ok()) {
    queues_->Fail(task.task_id, job->status);
    return;
  }
  if (!task.parallel) splits_started_.Increment();
  if (members.size() > 1) {
    shared_joined_.Increment(static_cast<double>(members.size() - 1));
  }
  absl::StatusOr<Pipeline*> pipeline = PipelineFor(producer, job_id);
  if (!pipeline.ok()) {
    queues_->Fail(task.task_id, pipeline.status());
    return;
  }
  SubmittedRun run;
  run.epoch = task.parallel ? 0 : task.assignment.key().epoch();
  run.task = std::move(task);
  // The pipeline's Job: the registry's, unless it was built again while a run of this producer
  // still uses the old one (its cache, if any, is the one its executor reads and offers to).
  run.job = (*pipeline)->job;
  run.pipeline = *pipeline;
  run.members = std::move(members);
  Submit(producer, std::move(run));
}

void TaskRunner::Submit(Producer& producer, SubmittedRun run) {
  pipeline::Executor& ex = *run.pipeline->ex;
  absl::StatusOr<uint64_t> id;
  if (run.task.parallel) {
    id = ex.Submit(ex.EpochOrder(run.epoch), run.epoch);
  } else {
    absl::StatusOr<std::vector<uint64_t>> records =
        SlotRecordOrder(run.task.assignment, *run.job, run.epoch);
    if (records.ok() && run.job->cache != nullptr) {
      for (const proto::SplitPiece& p : run.task.assignment.pieces()) {
        if (p.offset() == 0 && p.count() == p.records() &&
            run.job->cache->BeginCapture(p.split_id(), p.first_global(), p.records())) {
          run.captures.push_back(p.split_id());
        }
      }
    }
    id = records.ok() ? ex.Submit(*std::move(records), run.epoch) : records.status();
  }
  if (!id.ok()) {
    run.stopped = true;
    EndCaptures(run);
    FailTasks(run, id.status());
    return;
  }
  run.run = *id;
  producer.runs.push_back(std::move(run));
}

void TaskRunner::Lookahead(Producer& producer) {
  if (producer.runs.size() != 1) return;
  SubmittedRun& last = producer.runs.back();
  if (!last.pipeline->ex->FeedIdle()) return;
  const uint64_t epochs = last.job->info.config().num_epochs();
  if (last.task.parallel && !last.stopped && !last.continued &&
      (epochs == 0 || last.epoch + 1 < epochs)) {
    last.continued = true;
    SubmittedRun next;
    next.task = last.task;
    next.job = last.job;
    next.pipeline = last.pipeline;
    next.epoch = last.epoch + 1;
    Submit(producer, std::move(next));
    return;
  }
  std::optional<QueuedTask> task = Take(/*wait=*/false);
  if (task.has_value()) Begin(producer, *std::move(task));
}

void TaskRunner::EndCaptures(SubmittedRun& run) {
  if (run.captures.empty()) return;
  SplitCache& cache = *run.job->cache;
  for (uint64_t split : run.captures) {
    if (run.stopped) {
      cache.AbandonCapture(split);
      continue;
    }
    absl::StatusOr<proto::CacheSplitFile> file = cache.FinishCapture(split);
    if (!file.ok()) {
      // The split stays uncached: the next epoch computes it (and tries again).
      logger_->warn("job {}: {}", run.task.assignment.key().job_id(), file.status().ToString());
      continue;
    }
    if (jobs_->caches() != nullptr) jobs_->caches()->Report(*std::move(file));
  }
  run.captures.clear();
}

void TaskRunner::StopTask(Producer& producer, uint64_t task_id) {
  for (SubmittedRun& run : producer.runs) {
    if (run.task.task_id != task_id || run.stopped) continue;
    run.stopped = true;
    run.pipeline->ex->CancelRun(run.run);
  }
}

void TaskRunner::FailTasks(const SubmittedRun& run, const absl::Status& status) {
  queues_->Fail(run.task.task_id, status);
  for (const QueuedTask& m : run.members) {
    if (m.task_id != run.task.task_id) queues_->Fail(m.task_id, status);
  }
}

void TaskRunner::FailRun(Producer& producer, SubmittedRun& run, const absl::Status& status) {
  FailTasks(run, status);
  StopTask(producer, run.task.task_id);
}

void TaskRunner::Deliver(Producer& producer, SubmittedRun& run, pipeline::Element element) {
  if (run.stopped) return;
  const proto::SplitAssignment& a = run.task.assignment;
  const Job& job = *run.job;
  // A slot of a re-partitioned epoch delivers batches [first_batch, end_batch) of its pieces,
  // numbered from first_batch (proto/worker.proto).
  const uint64_t made = run.batch_index++;
  if (made < a.first_batch() || (a.end_batch() != 0 && made >= a.end_batch())) return;
  const uint64_t index = made - a.first_batch();
  const bool shared = !run.members.empty();
  const bool needed =
      shared
          ? std::any_of(run.members.begin(), run.members.end(),
                        [&](const QueuedTask& m) { return index >= m.assignment.skip_batches(); })
          : index >= a.skip_batches();
  if (!needed) {
    // The consumers hold it already.
    const bool live =
        shared ? std::any_of(run.members.begin(), run.members.end(),
                             [&](const QueuedTask& m) { return queues_->IsLive(m.task_id); })
               : queues_->IsLive(run.task.task_id);
    if (!live) StopTask(producer, run.task.task_id);
    return;
  }
  absl::StatusOr<std::optional<proto::ColumnFinish>> finish = FinishOrShip(job, &element);
  if (!finish.ok()) {
    FailRun(producer, run, finish.status());
    return;
  }
  // Refused before encoding: the consumer is told which flag, instead of a message gRPC will
  // not send.
  if (absl::Status s = service::CheckBatchLimit(pipeline::BytesOf(element), jobs_->limits());
      !s.ok()) {
    FailRun(producer, run,
            absl::Status(s.code(), absl::StrCat("job ", a.key().job_id(), " ", DescribeSlot(a),
                                                " batch ", index, ": ", s.message())));
    return;
  }
  absl::StatusOr<service::WireBatch> batch = ToWireBatch(std::move(element), job);
  if (!batch.ok()) {
    FailRun(producer, run, batch.status());
    return;
  }
  proto::Batch& header = batch->header;
  if (finish->has_value()) *header.add_finish() = std::move(**finish);
  *header.mutable_key() = a.key();
  if (run.task.parallel) header.mutable_key()->set_epoch(run.epoch);
  header.set_split_id(FirstSplitId(a));
  header.set_batch_index(index);
  UpdatePeak();
  if (shared) {
    FanOut(producer, run, *batch, index);
    UpdatePeak();
    return;
  }
  const ConsumerQueues::PushResult pushed = PushOwn(producer, run, *std::move(batch), index);
  UpdatePeak();
  if (pushed == ConsumerQueues::PushResult::kGone) StopTask(producer, run.task.task_id);
}

ConsumerQueues::PushResult TaskRunner::PushOwn(Producer& producer, const SubmittedRun& run,
                                               service::WireBatch batch, uint64_t index) {
  if (run.task.parallel || pause_unread_after_ == absl::InfiniteDuration()) {
    return queues_->Push(run.task.task_id, std::move(batch)) ? ConsumerQueues::PushResult::kPushed
                                                             : ConsumerQueues::PushResult::kGone;
  }
  const ConsumerQueues::PushResult pushed =
      queues_->PushUnlessUnread(run.task.task_id, std::move(batch), UnreadLimit(run.task));
  if (pushed == ConsumerQueues::PushResult::kFull) Pause(producer, run.task, index);
  return pushed;
}

absl::Duration TaskRunner::UnreadLimit(const QueuedTask& task) const {
  return pause_unread_after_ * (int64_t{1} << std::min<uint32_t>(task.pauses, 6));
}

void TaskRunner::Pause(Producer& producer, const QueuedTask& task, uint64_t index) {
  StopTask(producer, task.task_id);
  const proto::SplitKey& key = task.assignment.key();
  logger_->info(
      "job {} consumer {}: slot {} of epoch {} paused at batch {}: its consumer read nothing "
      "for {} with its queue full",
      key.job_id(), key.consumer_index(), key.position(), key.epoch(), index,
      absl::FormatDuration(UnreadLimit(task)));
  QueuedTask paused{.task_id = task.task_id,
                    .assignment = task.assignment,
                    .detached = true,
                    .paused = true,
                    .pauses = task.pauses + 1};
  paused.assignment.set_skip_batches(std::max(paused.assignment.skip_batches(), index));
  {
    absl::MutexLock lock(&mu_);
    pending_.push_back(std::move(paused));
    work_available_.Signal();
  }
  // Counted once the task is pending again (detached, in the heartbeat): whoever sees the
  // count sees the paused task.
  paused_.Increment();
  if (on_pause_change_) on_pause_change_();
}

void TaskRunner::FanOut(Producer& producer, SubmittedRun& run, const service::WireBatch& batch,
                        uint64_t index) {
  using Result = ConsumerQueues::PushResult;
  std::set<uint64_t> waiting;  // members (task ids) that need the batch and lack it
  for (const QueuedTask& m : run.members) {
    if (index >= m.assignment.skip_batches()) waiting.insert(m.task_id);
  }
  std::set<uint64_t> gone;
  std::set<uint64_t> behind;
  bool taken = false;  // some member took the batch
  while (!waiting.empty()) {
    std::set<uint64_t> full;
    for (const QueuedTask& m : run.members) {
      if (!waiting.contains(m.task_id)) continue;
      // The last member does not wait for anyone: it waits as a task of its own would.
      const bool alone = run.members.size() - gone.size() - behind.size() == 1;
      const Result r =
          alone
              ? (queues_->Push(m.task_id, BatchFor(batch, m.assignment)) ? Result::kPushed
                                                                         : Result::kGone)
              : queues_->PushWithin(m.task_id, BatchFor(batch, m.assignment), share_detach_after_);
      if (r == Result::kPushed) taken = true;
      if (r == Result::kGone) gone.insert(m.task_id);
      if (r == Result::kFull) full.insert(m.task_id);
    }
    // Full for the bound while another member took the batch: it is behind the group.
    if (taken) {
      behind.insert(full.begin(), full.end());
      full.clear();
    }
    waiting = std::move(full);
  }
  if (gone.empty() && behind.empty()) return;
  std::vector<QueuedTask> kept;
  for (QueuedTask& m : run.members) {
    if (gone.contains(m.task_id)) continue;
    if (!behind.contains(m.task_id)) {
      kept.push_back(std::move(m));
      continue;
    }
    // It has batches up to `index` (or holds more: its own skip); its own task produces the
    // slot again for it from there.
    shared_detached_.Increment();
    logger_->info(
        "job {} consumer {}: slot {} of epoch {} fell behind its production group at batch "
        "{}; produced again for it alone",
        m.assignment.key().job_id(), m.assignment.key().consumer_index(),
        m.assignment.key().position(), m.assignment.key().epoch(), index);
    QueuedTask alone{.task_id = m.task_id, .assignment = std::move(m.assignment), .detached = true};
    alone.assignment.set_skip_batches(std::max(alone.assignment.skip_batches(), index));
    absl::MutexLock lock(&mu_);
    pending_.push_back(std::move(alone));
    work_available_.Signal();
  }
  run.members = std::move(kept);
  if (run.members.empty()) {
    StopTask(producer, run.task.task_id);
  } else if (std::none_of(run.members.begin(), run.members.end(),
                          [&](const QueuedTask& m) { return m.task_id == run.task.task_id; })) {
    // The run goes on under a member that is still served (StopTask, markers, errors).
    run.task.task_id = run.members.front().task_id;
    run.task.assignment = run.members.front().assignment;
  }
}

void TaskRunner::EndRun(Producer& producer) {
  SubmittedRun run = std::move(producer.runs.front());
  producer.runs.pop_front();
  // Busy time of the bottleneck stage and elements since the previous run's end (runs overlap
  // at their boundaries; the sum over runs is exact).
  {
    absl::MutexLock lock(&mu_);
    CountBusy(CountersOf(run.pipeline->ex.get()));
  }
  EndCaptures(run);
  if (run.stopped || run.continued) return;
  service::WireBatch marker;
  *marker.header.mutable_key() = run.task.assignment.key();
  const proto::SplitAssignment& a = run.task.assignment;
  uint64_t made = run.batch_index;
  if (a.end_batch() != 0) made = std::min(made, a.end_batch());
  marker.header.set_batch_index(made > a.first_batch() ? made - a.first_batch() : 0);
  marker.header.set_end_of_split(true);
  if (run.task.parallel) {
    const uint64_t epochs = run.job->info.config().num_epochs();
    if (epochs == 0 || run.epoch + 1 < epochs) {
      SubmittedRun next;
      next.task = std::move(run.task);
      next.job = std::move(run.job);
      next.pipeline = run.pipeline;
      next.epoch = run.epoch + 1;
      Submit(producer, std::move(next));
      return;
    }
    marker.header.mutable_key()->set_epoch(run.epoch);
  } else {
    marker.header.set_split_id(FirstSplitId(run.task.assignment));
  }
  if (!run.members.empty()) {
    FanOut(producer, run, marker, marker.header.batch_index());
    return;
  }
  // Paused here, the task is produced again only for its marker.
  const uint64_t index = marker.header.batch_index();
  PushOwn(producer, run, std::move(marker), index);
}

absl::StatusOr<TaskRunner::Pipeline*> TaskRunner::PipelineFor(Producer& producer, uint64_t job_id) {
  auto it = producer.pipelines.find(job_id);
  if (it != producer.pipelines.end()) return &it->second;
  std::shared_ptr<const Job> built_for;
  absl::StatusOr<std::unique_ptr<pipeline::Executor>> ex =
      jobs_->AcquireExecutor(job_id, &built_for);
  if (!ex.ok()) return ex.status();
  // Its first threads fit the producer's share (no run is in flight yet when the producer was
  // idle).
  (*ex)->SetCpuBudget(producer.cpu_share > 0 ? producer.cpu_share : cpu_budget_);
  if (absl::Status s = (*ex)->Open(); !s.ok()) {
    jobs_->ReleaseExecutor(job_id, *std::move(ex), built_for.get());
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    // Counted from now: a pooled executor's stats include its earlier life.
    const pipeline::PipelineStats stats = (*ex)->stats();
    PipelineCounters r{ex->get(), job_id, {}, stats.elements_out};
    for (const pipeline::StageStats& stage : stats.stages) {
      r.busy_base.push_back(stage.busy_seconds);
      r.stage_elements_base.push_back(stage.elements);
      r.stage_dropped_base.push_back(stage.dropped);
    }
    counters_.push_back(std::move(r));
  }
  Pipeline& p = producer.pipelines[job_id];
  p.job_id = job_id;
  p.ex = *std::move(ex);
  p.job = std::move(built_for);
  return &p;
}

void TaskRunner::Retire(Producer& producer, bool all) {
  for (auto it = producer.pipelines.begin(); it != producer.pipelines.end();) {
    Pipeline& p = it->second;
    const bool used = std::any_of(producer.runs.begin(), producer.runs.end(),
                                  [&](const SubmittedRun& r) { return r.pipeline == &p; });
    // Kept while its Job is the registry's (not removed, not built again).
    if (used || (!all && jobs_->Get(p.job_id) == p.job)) {
      ++it;
      continue;
    }
    p.ex->Stop();
    {
      absl::MutexLock lock(&mu_);
      PipelineCounters& r = CountersOf(p.ex.get());
      CountBusy(r);
      counters_.erase(counters_.begin() + (&r - counters_.data()));
      retired_thread_starts_ += p.ex->thread_starts();
    }
    jobs_->ReleaseExecutor(p.job_id, std::move(p.ex), p.job.get());
    it = producer.pipelines.erase(it);
  }
}

TaskRunner::PipelineCounters& TaskRunner::CountersOf(const pipeline::Executor* ex) {
  return *std::find_if(counters_.begin(), counters_.end(),
                       [&](const PipelineCounters& r) { return r.ex == ex; });
}

}  // namespace sluice::data_worker
