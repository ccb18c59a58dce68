#include "data_worker/worker/worker_impl.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/base/logging.h"
#include "common/base/retry.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"

namespace sluice::data_worker {
namespace {

// `cache: auto` (docs/cache.md): a measuring job's stage costs as NodeCosts. Each map and filter
// runs as a stage of its own ("map[2]", "source+map[0]" with the read fused in), named by its
// ordinal among the maps or filters; a stage with the batch is no cut candidate, nor is the map
// whose tail the trainer's client runs (finish: what the worker measured is not the whole node).
void AddNodeCosts(const Job& job, const std::vector<TaskRunner::StageCost>& stages,
                  proto::WorkerHeartbeatRequest* request) {
  if (stages.empty() || stages.front().elements == 0) return;
  std::vector<int> maps, filters;  // node index by ordinal
  for (int i = 0; i < job.spec.nodes_size(); ++i) {
    if (job.spec.nodes(i).has_map()) maps.push_back(i);
    if (job.spec.nodes(i).has_filter()) filters.push_back(i);
  }
  int tail_node = -1;  // in the job's pipeline as sent: the map right before the batch
  if (job.tail.has_value()) {
    proto::Pipeline sent;
    if (!sent.ParseFromString(job.info.pipeline())) return;
    for (int i = 1; i < sent.nodes_size(); ++i) {
      if (sent.nodes(i).has_batch()) tail_node = i - 1;
    }
  }
  for (const TaskRunner::StageCost& s : stages) {
    const std::vector<absl::string_view> parts = absl::StrSplit(s.name, '+');
    if (std::find(parts.begin(), parts.end(), "batch") != parts.end()) continue;
    absl::string_view last = parts.back();
    const std::vector<int>* ordinals = nullptr;
    if (absl::ConsumePrefix(&last, "map[")) ordinals = &maps;
    if (absl::ConsumePrefix(&last, "filter[")) ordinals = &filters;
    int ordinal = -1;
    if (ordinals == nullptr || !absl::ConsumeSuffix(&last, "]") ||
        !absl::SimpleAtoi(last, &ordinal) || ordinal < 0 ||
        ordinal >= static_cast<int>(ordinals->size())) {
      continue;
    }
    if ((*ordinals)[ordinal] == tail_node) continue;
    proto::NodeCost* c = request->add_node_costs();
    c->set_job_id(job.info.job_id());
    c->set_node_index((*ordinals)[ordinal]);
    c->set_records(stages.front().elements);
    c->set_busy_seconds(s.busy_seconds);
    c->set_out_elements(s.out);
    c->set_out_bytes(static_cast<uint64_t>(s.bytes_per_element * static_cast<double>(s.out)));
  }
}

constexpr char kHeartbeatsHelp[] =
    "WorkerHeartbeat calls by what triggered them: start (the first), "
    "interval, event (a split ended, a consumer attached, the dispatcher said "
    "work waits).";

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerImpl>> WorkerImpl::Create(
    WorkerOptions options, std::unique_ptr<DispatcherClient> dispatcher) {
  ASSIGN_OR_RETURN(std::vector<std::string> roots,
                   JobRegistry::CanonicalDataRoots(options.data_roots));
  if (options.capacity == 0) return absl::InvalidArgumentError("capacity must be > 0");
  if (options.queue_batches == 0) return absl::InvalidArgumentError("queue_batches must be > 0");
  if (dispatcher == nullptr) return absl::InvalidArgumentError("no dispatcher client");
  return std::unique_ptr<WorkerImpl>(
      new WorkerImpl(std::move(options), std::move(roots), std::move(dispatcher)));
}

WorkerImpl::WorkerImpl(WorkerOptions options, std::vector<std::string> data_roots,
                       std::unique_ptr<DispatcherClient> dispatcher)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      logger_(options_.logger != nullptr ? options_.logger : NullLogger()),
      dispatcher_(std::move(dispatcher)),
      own_registry_(options_.registry == nullptr ? std::make_unique<prometheus::Registry>()
                                                 : nullptr),
      registry_(options_.registry != nullptr ? *options_.registry : *own_registry_),
      budget_(options_.queue_bytes),
      caches_(options_.cache_root, registry_, logger_),
      jobs_(std::move(data_roots), MakeExecutorOptions(), logger_, options_.limits, &caches_),
      queues_(options_.queue_batches, options_.queue_bytes, registry_, &budget_),
      runner_(&queues_, &jobs_, registry_, logger_,
              options_.threads > 0 ? options_.threads
                                   : static_cast<int>(std::thread::hardware_concurrency()),
              options_.share_detach_after, options_.pause_unread_after),
      address_(options_.address),
      heartbeat_interval_(options_.heartbeat_interval),
      start_heartbeats_(AddCounter(registry_, "sluice_worker_heartbeats_total", kHeartbeatsHelp,
                                   {{"trigger", "start"}})),
      interval_heartbeats_(AddCounter(registry_, "sluice_worker_heartbeats_total", kHeartbeatsHelp,
                                      {{"trigger", "interval"}})),
      event_heartbeats_(AddCounter(registry_, "sluice_worker_heartbeats_total", kHeartbeatsHelp,
                                   {{"trigger", "event"}})) {
  rate_since_ = clock_->Now();
  queues_.set_on_split_end([this] { HeartbeatSoon(); });
  runner_.set_on_pause_change([this] { HeartbeatSoon(); });
}

WorkerImpl::~WorkerImpl() { Stop(); }

pipeline::ExecutorOptions WorkerImpl::MakeExecutorOptions() {
  pipeline::ExecutorOptions o;
  o.cpu_budget = options_.threads;
  o.memory_budget_bytes = options_.memory_budget_bytes / std::max<uint32_t>(1, options_.capacity);
  o.registry = &registry_;
  o.worker_budget = &budget_;
  return o;
}

absl::Status WorkerImpl::Start(const std::string& address) {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::OkStatus();
    if (cancelled_) return absl::FailedPreconditionError("the worker was stopped");
    if (!address.empty()) address_ = address;
  }
  RETURN_IF_ERROR(Register());
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  runner_.Start(static_cast<int>(options_.capacity));
  if (options_.heartbeat_thread) {
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
    watch_thread_ = std::thread([this] { WatchLoop(); });
  }
  return absl::OkStatus();
}

void WorkerImpl::Stop() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    stop_.SignalAll();
  }
  dispatcher_->CancelWatch();
  queues_.Stop();
  runner_.Stop();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
}

absl::Status WorkerImpl::Register() {
  proto::WorkerRegisterRequest request;
  request.set_protocol_version(kProtocolVersion);
  {
    absl::MutexLock lock(&mu_);
    request.set_address(address_);
  }
  if (request.address().empty()) {
    return absl::InvalidArgumentError("the worker's data-plane address is empty");
  }
  request.set_capacity(options_.capacity);
  proto::WorkerRegisterResponse response;
  absl::Status status = dispatcher_->WorkerRegister(request, &response);
  if (!status.ok()) {
    logger_->error("WorkerRegister failed: {}", status.ToString());
    return status;
  }
  bool new_incarnation;
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = response.worker_id();
    new_incarnation = incarnation_ != 0 && response.incarnation() != incarnation_;
    incarnation_ = response.incarnation();
    if (response.heartbeat_interval_seconds() > 0) {
      heartbeat_interval_ = absl::Seconds(response.heartbeat_interval_seconds());
    }
    logger_->info("registered with the dispatcher as worker {} ({})", worker_id_, address_);
  }
  if (new_incarnation) ForgetEverything();
  return absl::OkStatus();
}

void WorkerImpl::ForgetEverything() {
  logger_->warn(
      "a new dispatcher incarnation: forgetting every cached job and held "
      "split");
  queues_.DropAll();
  jobs_.Clear();
  caches_.Reset();
}

absl::Status WorkerImpl::Heartbeat() {
  bool registered;
  {
    absl::MutexLock lock(&mu_);
    registered = worker_id_ != 0;
  }
  if (!registered) RETURN_IF_ERROR(Register());
  proto::WorkerHeartbeatRequest request;
  const std::vector<TaskProgress> progress = queues_.Progress();
  const std::set<uint64_t> detached = runner_.waiting_detached();
  const uint64_t elements = queues_.elements_produced();
  {
    absl::MutexLock lock(&mu_);
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker_id_);
    request.set_incarnation(incarnation_);
    // A production group's same slot is one production (docs/sharing.md).
    std::set<std::tuple<uint64_t, uint64_t, uint32_t, uint64_t, uint64_t>> producing_slots;
    bool parallel = false;
    for (const TaskProgress& p : progress) {
      parallel = parallel || p.parallel;
      if (p.parallel || p.finished || p.failed || detached.contains(p.task_id)) continue;
      producing_slots.insert({p.share_group, p.share_group != 0 ? 0 : p.key.job_id(),
                              p.key.consumer_index(), p.key.epoch(), p.key.position()});
    }
    const uint32_t producing = static_cast<uint32_t>(producing_slots.size());
    wants_splits_ =
        !parallel && !draining_ && producing < options_.capacity && queues_.open_streams() > 0;
    if (!wants_splits_) idle_wait_ = absl::ZeroDuration();
    for (const TaskProgress& p : progress) {
      if (p.parallel) {
        proto::ParallelTask* t = request.add_parallel_tasks();
        t->set_job_id(p.key.job_id());
        t->set_consumer_index(p.key.consumer_index());
        continue;
      }
      proto::WorkerSplitProgress* out = request.add_splits();
      *out->mutable_key() = p.key;
      out->set_produced_batches(p.produced_batches);
      out->set_finished_producing(p.finished || p.failed);
      out->set_detached(detached.contains(p.task_id));
    }
    request.set_queue_depth(queues_.queued_batches());
    request.set_queue_capacity(queues_.queue_capacity());
    request.set_blocked_producers(static_cast<uint32_t>(queues_.blocked_producers()));
    const TaskRunner::Busy totals = runner_.busy();
    request.set_elements_total(totals.elements);
    request.set_busy_seconds_total(totals.busy_seconds);
    for (const auto& [job_id, busy] : totals.by_job) {
      proto::JobBusy* b = request.add_job_busy();
      b->set_job_id(job_id);
      b->set_elements_total(busy.elements);
      b->set_busy_seconds_total(busy.busy_seconds);
    }
    // The rate over at least kMinRateSpan: a heartbeat sent early (a split
    // ended) would divide one batch, or none, by a few milliseconds (`sluice
    // status` showed 0 and 2,700 el/s in turn for a worker making 160).
    const absl::Time now = clock_->Now();
    if (now - rate_since_ >= kMinRateSpan) {
      elements_per_second_ = static_cast<double>(elements - elements_at_rate_since_) /
                             absl::ToDoubleSeconds(now - rate_since_);
      rate_since_ = now;
      elements_at_rate_since_ = elements;
    }
    request.set_elements_per_second(elements_per_second_);
    const std::map<uint64_t, std::vector<TaskRunner::StageCost>> costs = runner_.stage_costs();
    for (uint64_t id : jobs_.ids()) {
      request.add_known_job_ids(id);
      const std::shared_ptr<const Job> job = jobs_.Get(id);
      if (job == nullptr) continue;
      if (job->info.cache_decision().decided()) request.add_cache_decided_job_ids(id);
      if (auto it = costs.find(id); job->measuring && it != costs.end()) {
        AddNodeCosts(*job, it->second, &request);
      }
    }
    for (proto::DatasetDescription& d : described_) *request.add_described() = std::move(d);
    described_.clear();
    caches_.Fill(&request);
    last_request_ = request;
  }
  proto::WorkerHeartbeatResponse response;
  absl::Status status = dispatcher_->WorkerHeartbeat(request, &response);
  if (absl::IsNotFound(status)) {
    logger_->warn(
        "the dispatcher lost this worker ({}): dropping every split, "
        "registering again",
        status.ToString());
    queues_.DropAll();
    {
      absl::MutexLock lock(&mu_);
      worker_id_ = 0;
    }
    return Register();
  }
  if (!status.ok()) return status;
  bool new_incarnation;
  {
    absl::MutexLock lock(&mu_);
    new_incarnation = response.incarnation() != 0 && response.incarnation() != incarnation_;
    if (new_incarnation) incarnation_ = response.incarnation();
  }
  if (new_incarnation) {
    // The response was built against a held-split list we are about to forget: act on it at
    // the next heartbeat instead.
    ForgetEverything();
    return absl::OkStatus();
  }

  // Cache commits first, so that a new job's cache starts with them.
  caches_.Apply(response);
  // New jobs: validating opens the source (I/O).
  for (const proto::JobInfo& info : response.jobs()) jobs_.Add(info);
  if (!response.describe().empty()) {
    // The dispatcher checks a dataset's shard record counts: read its manifest, answer at once.
    std::vector<proto::DatasetDescription> described;
    for (const proto::DescribeTask& task : response.describe()) {
      proto::DatasetDescription& d = described.emplace_back();
      d.set_ticket(task.ticket());
      absl::StatusOr<std::vector<uint64_t>> counts = jobs_.ShardRecordCounts(task.pipeline());
      if (counts.ok()) {
        d.mutable_shard_record_counts()->Add(counts->begin(), counts->end());
      } else {
        d.set_error_code(static_cast<int32_t>(counts.status().code()));
        d.set_error_message(std::string(counts.status().message()));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      for (proto::DatasetDescription& d : described) described_.push_back(std::move(d));
    }
    HeartbeatSoon();
  }
  for (uint64_t job_id : response.finished_job_ids()) {
    queues_.DropJob(job_id);
    jobs_.Remove(job_id);
    runner_.ForgetJob(job_id);
  }
  for (const proto::SplitKey& key : response.drop()) queues_.DropTask(KeyOf(key));
  StartTasks(response);
  if (response.draining()) queues_.SetDraining();
  absl::MutexLock lock(&mu_);
  draining_ = draining_ || response.draining();
  may_exit_ = response.may_exit();
  return absl::OkStatus();
}

void WorkerImpl::StartTasks(const proto::WorkerHeartbeatResponse& response) {
  // At once, so that the members of a production group are produced together.
  std::vector<std::pair<uint64_t, proto::SplitAssignment>> tasks;
  for (const proto::SplitAssignment& a : response.start()) {
    if (jobs_.Get(a.key().job_id()) == nullptr) {
      logger_->error("split of job {} assigned without its JobInfo", a.key().job_id());
    }
    const uint64_t id = queues_.AddTask(a, /*parallel=*/false);
    if (id != 0) tasks.emplace_back(id, a);
  }
  runner_.EnqueueGroup(std::move(tasks));
  for (const proto::ParallelTask& t : response.start_parallel()) {
    proto::SplitAssignment a;
    a.mutable_key()->set_job_id(t.job_id());
    a.mutable_key()->set_consumer_index(t.consumer_index());
    const uint64_t id = queues_.AddTask(a, /*parallel=*/true);
    if (id != 0) runner_.Enqueue(id, a, /*parallel=*/true);
  }
}

absl::Status WorkerImpl::Drain() {
  proto::DrainWorkerRequest request;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    request.set_protocol_version(kProtocolVersion);
    request.set_worker_id(worker_id_);
  }
  queues_.SetDraining();
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

bool WorkerImpl::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

absl::Status WorkerImpl::DescribeDataset(const proto::DescribeDatasetRequest& request,
                                         proto::DescribeDatasetResponse* response) const {
  RETURN_IF_ERROR(service::CheckProtocolVersion(request.protocol_version(), "client", "worker"));
  ASSIGN_OR_RETURN(std::vector<uint64_t> counts, jobs_.ShardRecordCounts(request.pipeline()));
  for (uint64_t count : counts) response->add_shard_record_counts(count);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WorkerImpl::OpenStream(const proto::GetBatchesRequest& request,
                                                const service::Identity& caller,
                                                std::function<void()> notify) {
  RETURN_IF_ERROR(service::CheckProtocolVersion(request.protocol_version(), "client", "worker"));
  if (!caller.Has(service::Role::kOperator)) {
    RETURN_IF_ERROR(service::RequireRole(caller, service::Role::kTrainer, "GetBatches"));
  }
  RETURN_IF_ERROR(
      service::CheckStreamLimit(static_cast<int64_t>(queues_.open_streams()), options_.limits));
  std::shared_ptr<const Job> job = jobs_.Get(request.job_id());
  if (job == nullptr) {
    // A consumer knows of a job this worker has not heard of yet.
    HeartbeatSoon();
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(),
                                            " is not known to this worker yet: retry after its "
                                            "next heartbeat"));
  }
  const std::string owner = service::JobOwner(job->info.job_name());
  if (!caller.MayActFor(owner)) {
    return absl::PermissionDeniedError(absl::StrCat(
        caller.Describe(), " may not call GetBatches for job ", request.job_id(),
        ": the job belongs to ", owner.empty() ? "no identity (made in development mode)" : owner,
        " (only its owner or an operator, sluice:operators, may)"));
  }
  if (!job->status.ok()) return job->status;
  const uint32_t consumers = std::max<uint32_t>(1, job->info.config().num_consumers());
  if (request.consumer_index() >= consumers) {
    return absl::InvalidArgumentError(absl::StrCat("consumer_index ", request.consumer_index(),
                                                   " >= num_consumers ", consumers, " of job ",
                                                   request.job_id()));
  }
  std::vector<proto::HeldSplit> held(request.held().begin(), request.held().end());
  // Counted per identity, so that one caller holding streams it does not read cannot take
  // every --max-streams slot. Reserved before the open, so two opens cannot both pass.
  const bool counted = !caller.all_roles;
  if (counted) {
    absl::MutexLock lock(&mu_);
    int64_t& mine = streams_per_user_[caller.user];
    if (absl::Status s = service::CheckPerIdentityLimit(
            caller.user, mine, options_.limits.max_streams_per_identity, "streams on this worker",
            "--max-streams-per-identity");
        !s.ok()) {
      if (mine == 0) streams_per_user_.erase(caller.user);
      return s;
    }
    ++mine;
  }
  ConsumerQueues::Opened opened =
      queues_.Open({request.job_id(), request.consumer_index()}, held, std::move(notify));
  if (counted) {
    absl::MutexLock lock(&mu_);
    stream_users_[opened.stream_id] = caller.user;
  }
  // A consumer attached: if this worker has room for splits it asks for them
  // sooner from now on (see wants_splits_), starting with a heartbeat now.
  HeartbeatSoon();
  for (const proto::SplitAssignment& a : opened.restart) {
    logger_->info(
        "job {} consumer {}: split at epoch {} position {} lost batches in "
        "flight; "
        "producing it again from batch {}",
        a.key().job_id(), a.key().consumer_index(), a.key().epoch(), a.key().position(),
        a.skip_batches());
    const uint64_t id = queues_.AddTask(a, /*parallel=*/false);
    if (id != 0) runner_.Enqueue(id, a, /*parallel=*/false);
  }
  return opened.stream_id;
}

void WorkerImpl::CloseStream(uint64_t stream_id) {
  queues_.Close(stream_id);
  absl::MutexLock lock(&mu_);
  const auto it = stream_users_.find(stream_id);
  if (it == stream_users_.end()) return;
  if (--streams_per_user_[it->second] <= 0) streams_per_user_.erase(it->second);
  stream_users_.erase(it);
}

uint64_t WorkerImpl::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

proto::WorkerHeartbeatRequest WorkerImpl::last_heartbeat() const {
  absl::MutexLock lock(&mu_);
  return last_request_;
}

void WorkerImpl::HeartbeatLoop() {
  // After failures in a row (the dispatcher restarts, or is unreachable) the wait doubles from
  // the interval up to 5 s, with jitter, so that a restarted dispatcher is not met by every
  // worker at once; the first success returns to the interval.
  int failures = 0;
  bool early = false;  // this heartbeat: a split ended or a consumer attached
  bool first = true;
  while (true) {
    absl::Status status = Heartbeat();
    (first ? start_heartbeats_ : (early ? event_heartbeats_ : interval_heartbeats_)).Increment();
    first = false;
    {
      absl::MutexLock lock(&mu_);
      ++heartbeats_;
    }
    if (!status.ok()) logger_->warn("WorkerHeartbeat failed: {}", status.ToString());
    failures = status.ok() ? 0 : failures + 1;
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_interval_;
      if (early) idle_wait_ = absl::ZeroDuration();  // a new idle episode
      if (failures == 0 && wants_splits_ && !watching_.load()) {
        if (idle_wait_ == absl::ZeroDuration()) {
          idle_wait_ = std::max(absl::Milliseconds(10), interval / 8);
        }
        interval = std::min(interval, idle_wait_);
        idle_wait_ = std::min(2 * idle_wait_, heartbeat_interval_);
      }
    }
    if (failures > 0) {
      RetryOptions backoff;
      backoff.initial_backoff = interval;
      backoff.max_backoff = std::max(interval, absl::Seconds(5));
      interval = JitteredBackoff(failures, backoff);
    }
    // Until the interval has passed, or a split ended (while the dispatcher answers): the
    // freed capacity gets its next split now.
    const absl::Time next = clock_->Now() + interval;
    early = false;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return;
      }
      if (failures == 0 && heartbeat_due_.exchange(false)) {
        early = true;
        break;
      }
      const absl::Time now = clock_->Now();
      if (now >= next) break;
      const absl::Duration wait = std::min(next - now, absl::Milliseconds(5));
      if (clock_ != RealClock::Get()) {
        clock_->SleepFor(wait);  // tests drive the loop through their clock
        continue;
      }
      // Woken at once by HeartbeatSoon() (a wait on a 5 ms poll cost 2.5 ms on average of
      // every new job's first batch).
      absl::MutexLock due(&due_mu_);
      if (failures > 0 || !heartbeat_due_.load()) due_cv_.WaitWithTimeout(&due_mu_, wait);
    }
  }
}

void WorkerImpl::HeartbeatSoon() {
  heartbeat_due_.store(true);
  absl::MutexLock lock(&due_mu_);
  due_cv_.Signal();
}

void WorkerImpl::AwaitHeartbeat(uint64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto passed = [this, seen]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ || heartbeats_ > seen; };
  mu_.AwaitWithTimeout(absl::Condition(&passed), timeout);
}

void WorkerImpl::WatchLoop() {
  int failures = 0;
  while (true) {
    proto::WatchAssignmentRequest request;
    absl::Duration interval;
    uint64_t seen;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      interval = heartbeat_interval_;
      seen = heartbeats_;
      request.set_protocol_version(kProtocolVersion);
      request.set_worker_id(worker_id_);
      request.set_max_wait_seconds(absl::ToDoubleSeconds(interval));
    }
    // A job of these that is over answers the call at once: its production stops now.
    for (uint64_t id : jobs_.ids()) request.add_known_job_ids(id);
    if (request.worker_id() == 0) {
      // Registering again: watch after the heartbeat that does.
      AwaitHeartbeat(seen, interval);
      continue;
    }
    proto::WatchAssignmentResponse response;
    const absl::Status status = dispatcher_->WatchAssignment(request, &response);
    if (absl::IsUnimplemented(status)) {
      watching_.store(false);
      logger_->info("{}: new splits arrive with heartbeats", std::string(status.message()));
      return;
    }
    if (status.ok()) {
      failures = 0;
      watching_.store(true);
      if (!response.work_available() && !response.jobs_over()) continue;
    } else if (absl::IsNotFound(status)) {
      failures = 0;  // the heartbeat that follows registers again
    } else {
      // Unreachable or stopping: the heartbeat loop copes; try again after an interval.
      ++failures;
      watching_.store(false);
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&cancelled_),
                           std::min(interval * failures, absl::Seconds(5)));
      continue;
    }
    // Heartbeat now; watch again once it was answered (the dispatcher would answer at once
    // while the work still waits for this worker).
    {
      absl::MutexLock lock(&mu_);
      seen = heartbeats_;
    }
    HeartbeatSoon();
    AwaitHeartbeat(seen, 2 * interval);
  }
}

}  // namespace sluice::data_worker
