#include "data_worker/worker/task_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/record/sharding.h"
#include "common/service/batch_codec.h"
#include "common/service/limits.h"

namespace sluice::data_worker {
namespace {

// The global record indices a slot reads, in order: each piece's range of its split's record
// order (record::ConsumerSlots). InvalidArgument for a piece that reaches past its split.
absl::StatusOr<std::vector<uint64_t>> SlotRecordOrder(
    const proto::SplitAssignment& a, const Job& job, uint64_t epoch) {
  std::vector<uint64_t> out;
  for (const proto::SplitPiece& p : a.pieces()) {
    if (p.offset() > p.records() || p.count() > p.records() - p.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split ", p.split_id(), " has ", p.records(),
          " records; the assignment reads ", p.count(), " from ", p.offset()));
    }
    const std::vector<uint64_t> order =
        record::SplitRecordOrder(p.first_global(), p.records(), job.shuffle,
                                 job.info.config().seed(), p.split_id(), epoch);
    out.insert(out.end(), order.begin() + static_cast<ptrdiff_t>(p.offset()),
               order.begin() + static_cast<ptrdiff_t>(p.offset() + p.count()));
  }
  return out;
}

uint64_t FirstSplitId(const proto::SplitAssignment& a) {
  return a.pieces().empty() ? 0 : a.pieces(0).split_id();
}

// "slot 3 (split 12 positions 0..256, split 4 positions 0..32)"
// A run's busy time: the thread-seconds of its bottleneck stage (the most
// busy time per thread) divided by that stage's threads.
double RunBusySeconds(const pipeline::PipelineStats& stats) {
  double busy = 0;
  for (const pipeline::StageStats& stage : stats.stages) {
    busy = std::max(busy, stage.busy_seconds / std::max(1, stage.threads));
  }
  return busy;
}

std::string DescribeSlot(const proto::SplitAssignment& a) {
  std::string out = absl::StrCat("slot ", a.key().position(), " (");
  for (int i = 0; i < a.pieces_size(); ++i) {
    const proto::SplitPiece& p = a.pieces(i);
    absl::StrAppend(&out, i == 0 ? "" : ", ", "split ", p.split_id(),
                    " positions ", p.offset(), "..", p.offset() + p.count());
  }
  return absl::StrCat(out, ")");
}

}  // namespace

absl::StatusOr<service::WireBatch> ToWireBatch(pipeline::Element element,
                                               const Job& job) {
  if (element.columns.size() != job.column_names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pipeline produced ", element.columns.size(),
                     " columns but names ", job.column_names.size()));
  }
  service::WireBatch batch;
  for (size_t i = 0; i < element.columns.size(); ++i) {
    // The tensor itself becomes the buffer's owner: no copy of its bytes.
    auto t = std::make_shared<const Tensor>(std::move(element.columns[i]));
    std::vector<int64_t> shape(t->shape().begin(), t->shape().end());
    if (!job.batched) shape.insert(shape.begin(), 1);
    service::ColumnBytes bytes{t->data(), t->num_bytes(), t};
    absl::Status s = service::AppendColumn(job.column_names[i], t->dtype(),
                                           shape, std::move(bytes), &batch);
    if (!s.ok()) return s;
  }
  batch.header.mutable_global_indices()->Add(element.global_indices.begin(),
                                             element.global_indices.end());
  return batch;
}

absl::StatusOr<std::optional<proto::ColumnFinish>> FinishOrShip(
    const Job& job, pipeline::Element* element) {
  if (!job.tail.has_value()) return std::nullopt;
  const Job::Tail& tail = *job.tail;
  if (tail.column >= static_cast<int>(element->columns.size())) {
    return absl::InvalidArgumentError("the pipeline's output lost a column");
  }
  Tensor& column = element->columns[tail.column];
  const bool ship = job.finish == kernels::FinishMode::kClient ||
                    (job.finish == kernels::FinishMode::kAuto &&
                     column.dtype() == DType::kUint8);
  // The client can run it on this column (the one check both sides share).
  if (ship &&
      kernels::Finisher::Create(tail.specs, column.dtype(), column.shape())
          .ok()) {
    proto::ColumnFinish finish;
    finish.set_column(tail.column);
    finish.mutable_ops()->Add(tail.specs.begin(), tail.specs.end());
    return finish;
  }
  for (const std::shared_ptr<const Op>& op : tail.ops) {
    absl::StatusOr<Tensor> out = op->ApplyBatch(std::move(column));
    if (!out.ok()) return out.status();
    column = std::move(*out);
  }
  return std::nullopt;
}

TaskRunner::TaskRunner(ConsumerQueues* queues, JobRegistry* jobs,
                       prometheus::Registry& registry,
                       std::shared_ptr<spdlog::logger> logger)
    : queues_(queues),
      jobs_(jobs),
      logger_(std::move(logger)),
      splits_started_(AddCounter(registry, "sluice_worker_splits_total",
                                 "Splits by event.", {{"event", "started"}})) {}

TaskRunner::~TaskRunner() { Stop(); }

void TaskRunner::Start(int threads) {
  absl::MutexLock lock(&mu_);
  producers_ += threads;
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this] { ProducerLoop(); });
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

void TaskRunner::Enqueue(uint64_t task_id, proto::SplitAssignment assignment,
                         bool parallel) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(Work{task_id, std::move(assignment), parallel});
  work_available_.Signal();
}

double TaskRunner::busy_seconds() const {
  absl::MutexLock lock(&mu_);
  double busy = run_busy_seconds_;
  for (const Running& r : running_) busy += RunBusySeconds(r.ex->stats());
  return busy / std::max(1, producers_);
}

uint64_t TaskRunner::elements_run() const {
  absl::MutexLock lock(&mu_);
  uint64_t elements = elements_run_;
  for (const Running& r : running_) elements += r.ex->stats().elements_out;
  return elements;
}

std::map<uint64_t, TaskRunner::JobBusy> TaskRunner::busy_by_job() const {
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, JobBusy> out = run_busy_by_job_;
  for (const Running& r : running_) {
    const pipeline::PipelineStats stats = r.ex->stats();
    out[r.job_id].busy_seconds += RunBusySeconds(stats);
    out[r.job_id].elements += stats.elements_out;
  }
  for (auto& [job_id, busy] : out) busy.busy_seconds /= std::max(1, producers_);
  return out;
}

void TaskRunner::ForgetJob(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  run_busy_by_job_.erase(job_id);
}

int64_t TaskRunner::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_bytes_;
}

void TaskRunner::UpdatePeak() {
  const int64_t queued = queues_->queued_bytes();
  absl::MutexLock lock(&mu_);
  int64_t total = queued;
  for (const Running& r : running_) total += r.ex->live_bytes();
  peak_bytes_ = std::max(peak_bytes_, total);
}

void TaskRunner::ProducerLoop() {
  while (true) {
    Work work;
    {
      absl::MutexLock lock(&mu_);
      while (!cancelled_ && pending_.empty()) work_available_.Wait(&mu_);
      if (cancelled_) return;
      work = std::move(pending_.front());
      pending_.pop_front();
    }
    if (!queues_->IsLive(work.task_id)) continue;
    const uint64_t job_id = work.assignment.key().job_id();
    std::shared_ptr<const Job> job = jobs_->Get(job_id);
    // An unknown job's tasks stay held and unproduced. A refused job's fail with its status
    // (its streams carry it too), so that they stop holding the worker's capacity.
    if (job == nullptr) continue;
    if (!job->status.ok()) {
      queues_->Fail(work.task_id, job->status);
      continue;
    }
    if (!work.parallel) splits_started_.Increment();
    absl::StatusOr<std::unique_ptr<pipeline::Executor>> ex =
        jobs_->AcquireExecutor(job_id);
    if (!ex.ok()) {
      queues_->Fail(work.task_id, ex.status());
      continue;
    }
    Run(work, *job, **ex);
    jobs_->ReleaseExecutor(job_id, std::move(*ex));
  }
}

void TaskRunner::Run(const Work& work, const Job& job, pipeline::Executor& ex) {
  uint64_t batch_index = 0;
  if (work.parallel) {
    const uint64_t epochs = job.info.config().num_epochs();
    uint64_t epoch = 0;
    for (; epochs == 0 || epoch < epochs; ++epoch) {
      batch_index = 0;
      if (!RunEpoch(work, job, ex, epoch, &batch_index)) return;
    }
    service::WireBatch marker;
    *marker.header.mutable_key() = work.assignment.key();
    marker.header.mutable_key()->set_epoch(epoch == 0 ? 0 : epoch - 1);
    marker.header.set_batch_index(batch_index);
    marker.header.set_end_of_split(true);
    queues_->Push(work.task_id, std::move(marker));
    return;
  }
  if (!RunEpoch(work, job, ex, work.assignment.key().epoch(), &batch_index))
    return;
  service::WireBatch marker;
  *marker.header.mutable_key() = work.assignment.key();
  marker.header.set_split_id(FirstSplitId(work.assignment));
  marker.header.set_batch_index(batch_index);
  marker.header.set_end_of_split(true);
  queues_->Push(work.task_id, std::move(marker));
}

bool TaskRunner::RunEpoch(const Work& work, const Job& job,
                          pipeline::Executor& ex, uint64_t epoch,
                          uint64_t* batch_index) {
  const proto::SplitAssignment& a = work.assignment;
  absl::Status started;
  if (work.parallel) {
    started = ex.Start(epoch);
  } else {
    absl::StatusOr<std::vector<uint64_t>> records =
        SlotRecordOrder(a, job, epoch);
    started =
        records.ok() ? ex.Start(*std::move(records), epoch) : records.status();
  }
  if (!started.ok()) {
    queues_->Fail(work.task_id, started);
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    running_.push_back({&ex, a.key().job_id()});
  }
  bool ok = true;
  while (ok) {
    absl::StatusOr<std::optional<pipeline::Element>> next = ex.GetNext();
    if (!next.ok()) {
      // Batches before the error have gone out; the stream then ends with the error, naming
      // the split (the cause names the record).
      const absl::Status failed(
          next.status().code(),
          absl::StrCat("job ", a.key().job_id(), " ", DescribeSlot(a),
                       " (epoch ", epoch, "): ", next.status().message()));
      logger_->error("consumer {}: {}", a.key().consumer_index(),
                     failed.ToString());
      queues_->Fail(work.task_id, failed);
      ok = false;
      break;
    }
    if (!next->has_value()) break;
    const uint64_t index = (*batch_index)++;
    if (index < a.skip_batches()) {
      ok = queues_->IsLive(work.task_id);  // the consumer holds it already
      continue;
    }
    absl::StatusOr<std::optional<proto::ColumnFinish>> finish =
        FinishOrShip(job, &**next);
    if (!finish.ok()) {
      queues_->Fail(work.task_id, finish.status());
      ok = false;
      break;
    }
    // Refused before encoding: the consumer is told which flag, instead of a
    // message gRPC will not send.
    if (absl::Status s = service::CheckBatchLimit(pipeline::BytesOf(**next),
                                                  jobs_->limits());
        !s.ok()) {
      queues_->Fail(
          work.task_id,
          absl::Status(s.code(), absl::StrCat("job ", a.key().job_id(), " ",
                                              DescribeSlot(a), " batch ", index,
                                              ": ", s.message())));
      ok = false;
      break;
    }
    absl::StatusOr<service::WireBatch> batch =
        ToWireBatch(std::move(**next), job);
    if (!batch.ok()) {
      queues_->Fail(work.task_id, batch.status());
      ok = false;
      break;
    }
    proto::Batch& header = batch->header;
    if (finish->has_value()) *header.add_finish() = std::move(**finish);
    *header.mutable_key() = a.key();
    if (work.parallel) header.mutable_key()->set_epoch(epoch);
    header.set_split_id(FirstSplitId(a));
    header.set_batch_index(index);
    UpdatePeak();
    ok = queues_->Push(work.task_id, std::move(*batch));
    UpdatePeak();
  }
  ex.Stop();
  const pipeline::PipelineStats stats = ex.stats();
  const double busy = RunBusySeconds(stats);
  absl::MutexLock lock(&mu_);
  run_busy_seconds_ += busy;
  elements_run_ += stats.elements_out;
  JobBusy& job_busy = run_busy_by_job_[a.key().job_id()];
  job_busy.busy_seconds += busy;
  job_busy.elements += stats.elements_out;
  running_.erase(std::find_if(running_.begin(), running_.end(),
                              [&](const Running& r) { return r.ex == &ex; }));
  return ok;
}

}  // namespace sluice::data_worker
