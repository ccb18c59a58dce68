#include "data_worker/worker/worker_impl.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/random.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/record/sharding.h"

namespace sluice::data_worker {
namespace {

int64_t BatchBytes(const proto::Batch& batch) {
  int64_t bytes = 0;
  for (const proto::Column& c : batch.columns())
    bytes += static_cast<int64_t>(c.data().size());
  return bytes;
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec)
    return std::filesystem::absolute(path, ec).lexically_normal().string();
  return p.string();
}

bool IsUnder(const std::string& path, const std::string& root) {
  if (path == root) return true;
  std::string prefix = root;
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  return path.compare(0, prefix.size(), prefix) == 0;
}

void CallAll(std::vector<std::function<void()>>& notifies) {
  for (auto& f : notifies) {
    if (f) f();
  }
  notifies.clear();
}

}  // namespace

absl::StatusOr<proto::Batch> ToWireBatch(
    pipeline::Element element, const std::vector<std::string>& column_names) {
  if (element.columns.size() != column_names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pipeline produced ", element.columns.size(),
                     " columns but names ", column_names.size()));
  }
  proto::Batch batch;
  for (size_t i = 0; i < element.columns.size(); ++i) {
    const Tensor& t = element.columns[i];
    proto::Column* c = batch.add_columns();
    c->set_name(column_names[i]);
    c->set_dtype(
        static_cast<proto::TensorDType>(static_cast<int>(t.dtype()) + 1));
    for (int64_t d : t.shape()) c->add_shape(d);
    c->set_data(t.data(), t.num_bytes());
  }
  batch.mutable_global_indices()->Add(element.global_indices.begin(),
                                      element.global_indices.end());
  return batch;
}

WorkerImpl::TaskKey WorkerImpl::KeyOf(const proto::SplitKey& key) {
  return {key.job_id(), key.consumer_index(), key.epoch(), key.position()};
}

absl::StatusOr<std::unique_ptr<WorkerImpl>> WorkerImpl::Create(
    WorkerOptions options, std::unique_ptr<DispatcherClient> dispatcher) {
  if (options.data_roots.empty()) {
    return absl::InvalidArgumentError(
        "the worker needs at least one --data-root");
  }
  if (options.capacity == 0)
    return absl::InvalidArgumentError("capacity must be > 0");
  if (options.queue_batches == 0)
    return absl::InvalidArgumentError("queue_batches must be > 0");
  if (dispatcher == nullptr)
    return absl::InvalidArgumentError("no dispatcher client");
  for (std::string& root : options.data_roots) {
    if (root.empty())
      return absl::InvalidArgumentError("--data-root: empty path");
    root = Canonical(root);
  }
  return std::unique_ptr<WorkerImpl>(
      new WorkerImpl(std::move(options), std::move(dispatcher)));
}

WorkerImpl::WorkerImpl(WorkerOptions options,
                       std::unique_ptr<DispatcherClient> dispatcher)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      logger_(options_.logger != nullptr ? options_.logger : NullLogger()),
      dispatcher_(std::move(dispatcher)),
      own_registry_(options_.registry == nullptr
                        ? std::make_unique<prometheus::Registry>()
                        : nullptr),
      registry_(options_.registry != nullptr ? *options_.registry
                                             : *own_registry_),
      elements_total_(AddCounter(registry_, "sluice_worker_elements_total",
                                 "Elements produced into consumer queues.")),
      bytes_total_(AddCounter(registry_, "sluice_worker_bytes_total",
                              "Column bytes produced into consumer queues.")),
      batches_total_(AddCounter(registry_, "sluice_worker_batches_total",
                                "Batches produced into consumer queues.")),
      queue_depth_(
          AddGauge(registry_, "sluice_worker_queue_depth",
                   "Batches waiting in the worker's consumer queues.")),
      splits_started_(AddCounter(registry_, "sluice_worker_splits_total",
                                 "Splits by event.", {{"event", "started"}})),
      splits_finished_(AddCounter(registry_, "sluice_worker_splits_total",
                                  "Splits by event.", {{"event", "finished"}})),
      splits_dropped_(AddCounter(registry_, "sluice_worker_splits_total",
                                 "Splits by event.", {{"event", "dropped"}})),
      address_(options_.address),
      heartbeat_interval_(options_.heartbeat_interval) {
  last_heartbeat_time_ = clock_->Now();
}

WorkerImpl::~WorkerImpl() { Stop(); }

absl::Status WorkerImpl::Start(const std::string& address) {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::OkStatus();
    if (cancelled_)
      return absl::FailedPreconditionError("the worker was stopped");
    if (!address.empty()) address_ = address;
  }
  RETURN_IF_ERROR(Register());
  absl::MutexLock lock(&mu_);
  started_ = true;
  for (uint32_t i = 0; i < options_.capacity; ++i) {
    threads_.emplace_back([this] { ProducerLoop(); });
  }
  if (options_.heartbeat_thread)
    threads_.emplace_back([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void WorkerImpl::Stop() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  std::vector<std::function<void()>> notifies;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    cv_.SignalAll();
    NotifyAll(&notifies);
  }
  CallAll(notifies);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

absl::Status WorkerImpl::Register() {
  proto::WorkerRegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  {
    absl::MutexLock lock(&mu_);
    request.set_address(address_);
  }
  if (request.address().empty()) {
    return absl::InvalidArgumentError(
        "the worker's data-plane address is empty");
  }
  request.set_capacity(options_.capacity);
  proto::WorkerRegisterResponse response;
  absl::Status status = dispatcher_->WorkerRegister(request, &response);
  if (!status.ok()) {
    logger_->error("WorkerRegister failed: {}", status.ToString());
    return status;
  }
  absl::MutexLock lock(&mu_);
  worker_id_ = response.worker_id();
  if (response.heartbeat_interval_seconds() > 0) {
    heartbeat_interval_ = absl::Seconds(response.heartbeat_interval_seconds());
  }
  logger_->info("registered with the dispatcher as worker {} ({})", worker_id_,
                address_);
  return absl::OkStatus();
}

absl::Status WorkerImpl::Heartbeat() {
  bool registered;
  {
    absl::MutexLock lock(&mu_);
    registered = worker_id_ != 0;
  }
  if (!registered) RETURN_IF_ERROR(Register());
  proto::WorkerHeartbeatRequest request;
  {
    absl::MutexLock lock(&mu_);
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker_id_);
    for (const auto& [key, task] : tasks_) {
      if (task->parallel) continue;
      proto::WorkerSplitProgress* p = request.add_splits();
      *p->mutable_key() = task->split.key();
      p->set_produced_batches(task->produced_batches);
      p->set_finished_producing(task->finished);
    }
    for (const auto& [job, consumer] : parallel_tasks_) {
      proto::ParallelTask* t = request.add_parallel_tasks();
      t->set_job_id(job);
      t->set_consumer_index(consumer);
    }
    request.set_queue_depth(queued_batches_);
    request.set_queue_capacity(queues_.size() * options_.queue_batches);
    const absl::Time now = clock_->Now();
    const double dt = absl::ToDoubleSeconds(now - last_heartbeat_time_);
    if (dt > 0) {
      request.set_elements_per_second(
          static_cast<double>(elements_produced_ -
                              elements_at_last_heartbeat_) /
          dt);
    }
    last_heartbeat_time_ = now;
    elements_at_last_heartbeat_ = elements_produced_;
    for (const auto& [id, job] : jobs_) request.add_known_job_ids(id);
    last_request_ = request;
  }
  proto::WorkerHeartbeatResponse response;
  absl::Status status = dispatcher_->WorkerHeartbeat(request, &response);
  std::vector<std::function<void()>> notifies;
  if (absl::IsNotFound(status)) {
    logger_->warn(
        "the dispatcher lost this worker ({}): dropping every split, "
        "registering again",
        status.ToString());
    {
      absl::MutexLock lock(&mu_);
      DropEverything(&notifies);
      worker_id_ = 0;
    }
    CallAll(notifies);
    return Register();
  }
  if (!status.ok()) return status;

  // New jobs: validating opens the source (I/O), so outside the lock.
  for (const proto::JobInfo& info : response.jobs()) {
    {
      absl::MutexLock lock(&mu_);
      if (jobs_.contains(info.job_id())) continue;
    }
    std::shared_ptr<Job> job = BuildJob(info);
    absl::MutexLock lock(&mu_);
    jobs_.emplace(info.job_id(), std::move(job));
  }
  {
    absl::MutexLock lock(&mu_);
    ApplyHeartbeatResponse(response, &notifies);
  }
  CallAll(notifies);
  return absl::OkStatus();
}

void WorkerImpl::ApplyHeartbeatResponse(
    const proto::WorkerHeartbeatResponse& response,
    std::vector<std::function<void()>>* notifies) {
  for (const proto::SplitKey& key : response.drop())
    DropTask(KeyOf(key), notifies);
  for (const proto::SplitAssignment& a : response.start()) {
    const TaskKey key = KeyOf(a.key());
    if (tasks_.contains(key)) continue;
    auto task = std::make_shared<Task>();
    task->split = a;
    task->produced_batches = a.skip_batches();
    tasks_.emplace(key, task);
    pending_.push_back(task);
    if (!jobs_.contains(a.key().job_id())) {
      logger_->error("split of job {} assigned without its JobInfo",
                     a.key().job_id());
    }
  }
  for (const proto::ParallelTask& t : response.start_parallel()) {
    const ConsumerKey ck{t.job_id(), t.consumer_index()};
    if (parallel_tasks_.contains(ck)) continue;
    parallel_tasks_.insert(ck);
    auto task = std::make_shared<Task>();
    task->parallel = true;
    task->split.mutable_key()->set_job_id(t.job_id());
    task->split.mutable_key()->set_consumer_index(t.consumer_index());
    tasks_.emplace(KeyOf(task->split.key()), task);
    pending_.push_back(task);
  }
  if (response.draining() && !draining_) {
    draining_ = true;
    NotifyAll(notifies);
  }
  may_exit_ = response.may_exit();
  cv_.SignalAll();
}

void WorkerImpl::DropTask(const TaskKey& key,
                          std::vector<std::function<void()>>* notifies) {
  auto it = tasks_.find(key);
  if (it == tasks_.end()) return;
  std::shared_ptr<Task> task = it->second;
  tasks_.erase(it);
  task->dropped = true;
  if (!task->finished) splits_dropped_.Increment();
  const ConsumerKey ck{std::get<0>(key), std::get<1>(key)};
  auto q = queues_.find(ck);
  if (q != queues_.end()) {
    auto& batches = q->second.batches;
    for (auto b = batches.begin(); b != batches.end();) {
      if (KeyOf(b->key()) == key) {
        const int64_t bytes = BatchBytes(*b);
        q->second.bytes -= bytes;
        queued_bytes_ -= bytes;
        --queued_batches_;
        b = batches.erase(b);
      } else {
        ++b;
      }
    }
    notifies->push_back(q->second.notify);
  }
  queue_depth_.Set(static_cast<double>(queued_batches_));
  cv_.SignalAll();
}

void WorkerImpl::DropEverything(std::vector<std::function<void()>>* notifies) {
  std::vector<TaskKey> keys;
  for (const auto& [key, task] : tasks_) keys.push_back(key);
  for (const TaskKey& key : keys) DropTask(key, notifies);
  parallel_tasks_.clear();
  pending_.clear();
  for (auto& [ck, q] : queues_) {
    queued_bytes_ -= q.bytes;
    queued_batches_ -= q.batches.size();
    q.batches.clear();
    q.bytes = 0;
  }
  queue_depth_.Set(static_cast<double>(queued_batches_));
}

absl::Status WorkerImpl::Drain() {
  proto::DrainWorkerRequest request;
  std::vector<std::function<void()>> notifies;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker_id_);
    NotifyAll(&notifies);
  }
  CallAll(notifies);
  proto::DrainWorkerResponse response;
  absl::Status status = dispatcher_->DrainWorker(request, &response);
  if (status.ok()) {
    logger_->info("draining: the dispatcher takes back {} unfinished splits",
                  response.handed_back());
  }
  return status;
}

absl::Status WorkerImpl::Unregister() {
  proto::WorkerUnregisterRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (worker_id_ == 0) return absl::OkStatus();
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker_id_);
  }
  proto::WorkerUnregisterResponse response;
  return dispatcher_->WorkerUnregister(request, &response);
}

bool WorkerImpl::may_exit() const {
  absl::MutexLock lock(&mu_);
  return may_exit_;
}

absl::Status WorkerImpl::CheckDataRoot(const proto::Pipeline& spec) const {
  std::string path;
  if (spec.source().has_dataset()) path = spec.source().dataset().path();
  if (spec.source().has_image_folder())
    path = spec.source().image_folder().path();
  if (path.empty())
    return absl::OkStatus();  // synthetic, or unset (the validator says so)
  const std::string canonical = Canonical(path);
  for (const std::string& root : options_.data_roots) {
    if (IsUnder(canonical, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "pipeline source '", path, "'",
      canonical != path ? absl::StrCat(" (resolved: '", canonical, "')") : "",
      " is outside the worker's --data-root (",
      absl::StrJoin(options_.data_roots, ", "), ")"));
}

pipeline::ExecutorOptions WorkerImpl::MakeExecutorOptions() const {
  pipeline::ExecutorOptions o;
  o.cpu_budget = options_.threads;
  o.memory_budget_bytes =
      options_.memory_budget_bytes / std::max<uint32_t>(1, options_.capacity);
  o.registry = &registry_;
  return o;
}

std::shared_ptr<WorkerImpl::Job> WorkerImpl::BuildJob(
    const proto::JobInfo& info) {
  auto job = std::make_shared<Job>();
  job->info = info;
  if (!job->spec.ParseFromString(info.pipeline())) {
    job->status = absl::InvalidArgumentError(absl::StrCat(
        "job ", info.job_id(),
        ": its pipeline does not parse as "
        "sluice.proto.Pipeline (client and worker versions differ?)"));
  }
  if (job->status.ok()) job->status = CheckDataRoot(job->spec);
  if (job->status.ok()) {
    absl::StatusOr<std::unique_ptr<pipeline::Executor>> ex =
        pipeline::Executor::Create(job->spec, MakeExecutorOptions());
    if (!ex.ok()) {
      job->status = absl::IsNotFound(ex.status())
                        ? absl::FailedPreconditionError(ex.status().message())
                        : ex.status();
    } else {
      const pipeline::LogicalPipeline& lp = (*ex)->logical();
      job->column_names = lp.column_names;
      job->shuffle = lp.shuffle;
      job->batch_size = info.batch_size() > 0 ? info.batch_size()
                        : lp.batch.has_value()
                            ? static_cast<uint64_t>(lp.batch->size)
                            : 1;
      job->idle.push_back(std::move(*ex));
    }
  }
  if (job->status.ok()) {
    logger_->info("job {} ('{}'): pipeline ready", info.job_id(),
                  info.job_name());
  } else {
    logger_->warn("job {} ('{}') refused: {}", info.job_id(), info.job_name(),
                  job->status.ToString());
  }
  return job;
}

WorkerImpl::ConsumerQueue& WorkerImpl::QueueFor(const ConsumerKey& key) {
  return queues_[key];
}

void WorkerImpl::NotifyAll(std::vector<std::function<void()>>* notifies) {
  for (auto& [key, q] : queues_) notifies->push_back(q.notify);
}

bool WorkerImpl::ConsumerDone(const ConsumerKey& key) const {
  auto q = queues_.find(key);
  if (q != queues_.end() && !q->second.batches.empty()) return false;
  if (cancelled_) return true;
  if (parallel_tasks_.contains(key)) {
    auto t = tasks_.find(TaskKey{key.first, key.second, 0, 0});
    if (t != tasks_.end() && t->second->parallel && t->second->finished)
      return true;
  }
  if (!draining_) return false;
  for (auto it = tasks_.lower_bound(TaskKey{key.first, key.second, 0, 0});
       it != tasks_.end() && std::get<0>(it->first) == key.first &&
       std::get<1>(it->first) == key.second;
       ++it) {
    if (!it->second->finished) return false;
  }
  return true;
}

absl::StatusOr<uint64_t> WorkerImpl::OpenStream(
    const proto::GetBatchesRequest& request, std::function<void()> notify) {
  if (request.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GetBatches protocol version ", request.protocol_version(), ", worker ",
        kProtocolVersion, ": upgrade the ",
        request.protocol_version() < kProtocolVersion ? "client" : "worker"));
  }
  std::function<void()> superseded;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(request.job_id());
    if (job == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "job ", request.job_id(),
          " is not known to this worker yet: retry after its next heartbeat"));
    }
    if (!job->second->status.ok()) return job->second->status;
    const uint32_t consumers =
        std::max<uint32_t>(1, job->second->info.config().num_consumers());
    if (request.consumer_index() >= consumers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "consumer_index ", request.consumer_index(), " >= num_consumers ",
          consumers, " of job ", request.job_id()));
    }
    id = next_stream_id_++;
    const ConsumerKey ck{request.job_id(), request.consumer_index()};
    streams_[id] = Stream{ck, false};
    ConsumerQueue& q = QueueFor(ck);
    superseded = std::move(q.notify);
    q.reader = id;
    q.notify = std::move(notify);
  }
  if (superseded) superseded();
  return id;
}

StreamEvent WorkerImpl::PollStream(uint64_t stream_id) {
  StreamEvent event;
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream_id);
  if (s == streams_.end()) {
    event.kind = StreamEvent::kEnd;
    event.status = absl::NotFoundError("stream closed");
    return event;
  }
  if (s->second.ended) {
    event.kind = StreamEvent::kEnd;
    return event;
  }
  ConsumerQueue& q = QueueFor(s->second.consumer);
  auto end = [&](absl::Status status) {
    s->second.ended = true;
    event.kind = StreamEvent::kEnd;
    event.status = std::move(status);
  };
  if (q.reader != stream_id) {
    end(absl::AbortedError(
        "superseded by a newer GetBatches stream for this consumer"));
    return event;
  }
  if (!q.batches.empty()) {
    event.kind = StreamEvent::kBatch;
    event.batch = std::move(q.batches.front());
    q.batches.pop_front();
    const int64_t bytes = BatchBytes(event.batch);
    q.bytes -= bytes;
    queued_bytes_ -= bytes;
    --queued_batches_;
    queue_depth_.Set(static_cast<double>(queued_batches_));
    cv_.SignalAll();
    return event;
  }
  if (!q.error.ok()) {
    end(q.error);
    return event;
  }
  if (ConsumerDone(s->second.consumer)) {
    end(absl::OkStatus());
    return event;
  }
  event.kind = StreamEvent::kPending;
  return event;
}

void WorkerImpl::ReturnBatch(uint64_t stream_id, proto::Batch batch) {
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream_id);
  if (s == streams_.end()) return;
  TaskKey key = KeyOf(batch.key());
  if (!tasks_.contains(key))
    key = TaskKey{std::get<0>(key), std::get<1>(key), 0, 0};
  auto t = tasks_.find(key);
  if (t == tasks_.end() || t->second->dropped) return;
  ConsumerQueue& q = QueueFor(s->second.consumer);
  const int64_t bytes = BatchBytes(batch);
  q.bytes += bytes;
  queued_bytes_ += bytes;
  ++queued_batches_;
  q.batches.push_front(std::move(batch));
  queue_depth_.Set(static_cast<double>(queued_batches_));
}

void WorkerImpl::CloseStream(uint64_t stream_id) {
  absl::MutexLock lock(&mu_);
  auto s = streams_.find(stream_id);
  if (s == streams_.end()) return;
  ConsumerQueue& q = QueueFor(s->second.consumer);
  if (q.reader == stream_id) {
    q.reader = 0;
    q.notify = nullptr;
  }
  streams_.erase(s);
}

uint64_t WorkerImpl::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}
size_t WorkerImpl::queued_batches() const {
  absl::MutexLock lock(&mu_);
  return queued_batches_;
}
int64_t WorkerImpl::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}
int64_t WorkerImpl::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_bytes_;
}
int WorkerImpl::blocked_producers() const {
  absl::MutexLock lock(&mu_);
  return blocked_;
}
proto::WorkerHeartbeatRequest WorkerImpl::last_heartbeat() const {
  absl::MutexLock lock(&mu_);
  return last_request_;
}

void WorkerImpl::UpdatePeak() {
  int64_t total = queued_bytes_;
  for (const pipeline::Executor* ex : running_) total += ex->live_bytes();
  peak_bytes_ = std::max(peak_bytes_, total);
}

void WorkerImpl::HeartbeatLoop() {
  while (true) {
    absl::Status status = Heartbeat();
    if (!status.ok())
      logger_->warn("WorkerHeartbeat failed: {}", status.ToString());
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_interval_;
    }
    const absl::Time next = clock_->Now() + interval;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return;
      }
      const absl::Time now = clock_->Now();
      if (now >= next) break;
      clock_->SleepFor(std::min(next - now, absl::Milliseconds(50)));
    }
  }
}

void WorkerImpl::ProducerLoop() {
  while (true) {
    std::shared_ptr<Task> task;
    std::shared_ptr<Job> job;
    std::unique_ptr<pipeline::Executor> ex;
    {
      absl::MutexLock lock(&mu_);
      while (!cancelled_ && pending_.empty()) cv_.Wait(&mu_);
      if (cancelled_) return;
      task = std::move(pending_.front());
      pending_.pop_front();
      if (task->dropped) continue;
      auto it = jobs_.find(task->split.key().job_id());
      // A refused (or unknown) job's splits stay held and unproduced: its
      // streams carry the error.
      if (it == jobs_.end() || !it->second->status.ok()) continue;
      job = it->second;
      task->started = true;
      if (!task->parallel) splits_started_.Increment();
      if (!job->idle.empty()) {
        ex = std::move(job->idle.back());
        job->idle.pop_back();
      }
    }
    if (ex == nullptr) {
      absl::StatusOr<std::unique_ptr<pipeline::Executor>> created =
          pipeline::Executor::Create(job->spec, MakeExecutorOptions());
      if (!created.ok()) {
        FailConsumer(task, created.status());
        continue;
      }
      ex = std::move(*created);
    }
    RunTask(task, job, *ex);
    absl::MutexLock lock(&mu_);
    job->idle.push_back(std::move(ex));
  }
}

std::vector<uint64_t> WorkerImpl::TaskIndices(const Task& task, const Job& job,
                                              uint64_t /*source_size*/,
                                              uint64_t* first_batch) const {
  const proto::SplitAssignment& a = task.split;
  const uint64_t n = a.end() > a.begin() ? a.end() - a.begin() : 0;
  std::vector<uint64_t> indices(n);
  if (job.shuffle) {
    const std::vector<uint64_t> perm = record::Permutation(
        n, MixSeed({job.info.config().seed(), a.split_id()}), a.key().epoch());
    for (uint64_t i = 0; i < n; ++i) indices[i] = a.first_global() + perm[i];
  } else {
    for (uint64_t i = 0; i < n; ++i) indices[i] = a.first_global() + i;
  }
  const uint64_t skip =
      std::min<uint64_t>(n, a.skip_batches() * job.batch_size);
  indices.erase(indices.begin(),
                indices.begin() + static_cast<std::ptrdiff_t>(skip));
  *first_batch = a.skip_batches();
  return indices;
}

void WorkerImpl::RunTask(const std::shared_ptr<Task>& task,
                         const std::shared_ptr<Job>& job,
                         pipeline::Executor& ex) {
  const uint64_t epochs = task->parallel ? job->info.config().num_epochs() : 1;
  for (uint64_t e = 0; epochs == 0 || e < epochs; ++e) {
    const bool last_epoch = epochs != 0 && e + 1 == epochs;
    proto::SplitKey key = task->split.key();
    uint64_t batch_index = 0;
    absl::Status started;
    if (task->parallel) {
      key.set_epoch(e);
      started = ex.Start(e);
    } else {
      started =
          ex.Start(TaskIndices(*task, *job, ex.source_size(), &batch_index),
                   key.epoch());
    }
    if (!started.ok()) {
      FailConsumer(task, started);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      running_.push_back(&ex);
    }
    std::optional<proto::Batch>
        held;  // one batch of look-ahead to know the split's last batch
    bool ok = true;
    while (true) {
      absl::StatusOr<std::optional<pipeline::Element>> next = ex.GetNext();
      if (!next.ok()) {
        // Batches before the error still go out; the stream then ends with the
        // error.
        if (held) Push(task, std::move(*held), /*finishes_task=*/false);
        FailConsumer(task, next.status());
        ok = false;
        break;
      }
      if (!next->has_value()) {
        if (held) {
          held->set_last_in_split(true);
          ok = Push(task, std::move(*held), /*finishes_task=*/last_epoch);
        } else if (last_epoch) {
          absl::MutexLock lock(&mu_);
          task->finished = true;
        }
        break;
      }
      absl::StatusOr<proto::Batch> batch =
          ToWireBatch(std::move(**next), job->column_names);
      if (!batch.ok()) {
        FailConsumer(task, batch.status());
        ok = false;
        break;
      }
      *batch->mutable_key() = key;
      batch->set_split_id(task->split.split_id());
      batch->set_batch_index(batch_index++);
      if (held && !Push(task, std::move(*held), /*finishes_task=*/false)) {
        ok = false;
        break;
      }
      held = std::move(*batch);
    }
    ex.Stop();
    {
      absl::MutexLock lock(&mu_);
      running_.erase(std::find(running_.begin(), running_.end(), &ex));
      if (task->finished && !task->parallel) splits_finished_.Increment();
    }
    if (!ok) return;
  }
}

bool WorkerImpl::Push(const std::shared_ptr<Task>& task, proto::Batch batch,
                      bool finishes_task) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    const ConsumerKey ck{task->split.key().job_id(),
                         task->split.key().consumer_index()};
    ConsumerQueue& q = QueueFor(ck);
    UpdatePeak();
    ++blocked_;
    while (!cancelled_ && !task->dropped &&
           q.batches.size() >= options_.queue_batches) {
      cv_.Wait(&mu_);
    }
    --blocked_;
    if (cancelled_ || task->dropped) return false;
    const int64_t bytes = BatchBytes(batch);
    const uint64_t elements =
        static_cast<uint64_t>(batch.global_indices_size());
    task->produced_batches = batch.batch_index() + 1;
    if (finishes_task) task->finished = true;
    q.batches.push_back(std::move(batch));
    q.bytes += bytes;
    queued_bytes_ += bytes;
    ++queued_batches_;
    elements_produced_ += elements;
    elements_total_.Increment(static_cast<double>(elements));
    bytes_total_.Increment(static_cast<double>(bytes));
    batches_total_.Increment();
    queue_depth_.Set(static_cast<double>(queued_batches_));
    UpdatePeak();
    notify = q.notify;
  }
  if (notify) notify();
  return true;
}

void WorkerImpl::FailConsumer(const std::shared_ptr<Task>& task,
                              const absl::Status& status) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    if (task->dropped || cancelled_) return;
    logger_->error("job {} consumer {}: {}", task->split.key().job_id(),
                   task->split.key().consumer_index(), status.ToString());
    ConsumerQueue& q = QueueFor(
        {task->split.key().job_id(), task->split.key().consumer_index()});
    if (q.error.ok()) q.error = status;
    notify = q.notify;
  }
  if (notify) notify();
}

}  // namespace sluice::data_worker
