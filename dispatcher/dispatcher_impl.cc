#include "dispatcher/dispatcher_impl.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"

namespace sluice::dispatcher {
namespace {

absl::Status CheckVersion(uint32_t version) {
  return service::CheckProtocolVersion(version, "client", "dispatcher");
}

// splitmix64 of `a` combined with `b`: versions of ClientHeartbeat's lists.
uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DispatcherImpl>> DispatcherImpl::Create(DispatcherOptions options) {
  std::unique_ptr<DispatcherImpl> impl(new DispatcherImpl(std::move(options)));
  ASSIGN_OR_RETURN(Journal::Contents contents, impl->journal_->Read());
  {
    std::random_device random;
    impl->view_nonce_ = (uint64_t{random()} << 32) ^ random();
  }
  DispatcherImpl* raw = impl.get();
  impl->acks_ = std::make_unique<DurableAcks>(
      impl->journal_.get(),
      [raw](uint64_t ticket, const absl::Status& s) { raw->MarkDurable(ticket, s); });
  {
    absl::MutexLock lock(&impl->mu_);
    const absl::Time now = impl->clock_->Now();
    const uint64_t start_micros = static_cast<uint64_t>(absl::ToUnixMicros(now));
    if (!contents.snapshot.empty()) {
      proto::DispatcherSnapshot snapshot;
      if (!snapshot.ParseFromString(contents.snapshot)) {
        return absl::DataLossError(
            "the journal's snapshot does not parse (written by a newer "
            "dispatcher, or corrupt)");
      }
      for (int i = 0; i < snapshot.updates_size(); ++i) {
        if (absl::Status s = impl->state_.Apply(snapshot.updates(i)); !s.ok()) {
          return absl::DataLossError(
              absl::StrCat("the journal's snapshot record ", i, " does not apply: ", s.message()));
        }
      }
    }
    for (size_t i = 0; i < contents.updates.size(); ++i) {
      if (absl::Status s = impl->state_.Apply(contents.updates[i]); !s.ok()) {
        return absl::DataLossError(absl::StrCat(
            "journal record ", i, " after the snapshot does not apply: ", s.message()));
      }
    }
    if (impl->state_.incarnation() == 0) {
      // A fresh state (no journal, or an empty one): a new incarnation, and ids that start past
      // any an earlier, forgotten incarnation may have handed out, so a job id never names two
      // jobs.
      proto::Update floor;
      floor.mutable_id_floor()->set_next_job_id(start_micros);
      floor.mutable_id_floor()->set_next_dataset_id(start_micros);
      floor.mutable_id_floor()->set_incarnation(start_micros);
      RETURN_IF_ERROR(impl->Commit(floor));
    }
    impl->incarnation_ = impl->state_.incarnation();
    if (!impl->state_.jobs().empty() || !impl->state_.workers().empty()) {
      // The workers were sized on demand this dispatcher has not seen: none is scaled down
      // before a window of its own measurements.
      AutoscalerOptions restarted = impl->autoscaler_.options();
      restarted.restarted = true;
      impl->autoscaler_ = Autoscaler(restarted);
    }
    // Workers and consumers known from the journal get a full timeout to reconnect.
    for (const auto& [id, worker] : impl->state_.workers()) {
      impl->worker_signals_[id].last_seen = now;
      impl->worker_signals_[id].registered = now;
    }
    for (const auto& [id, job] : impl->state_.jobs()) {
      for (const DispatcherState::Consumer& c : job.consumers)
        impl->consumer_signals_[{id, c.index}].last_report = now;
    }
    if (!contents.snapshot.empty() || !contents.updates.empty()) {
      impl->logger_->info(
          "recovered {} jobs, {} workers from the journal ({} updates after "
          "the "
          "snapshot)",
          impl->state_.jobs().size(), impl->state_.workers().size(), contents.updates.size());
    }
    impl->updates_since_snapshot_ = impl->journal_->updates_since_snapshot();
    impl->last_snapshot_bytes_ = contents.snapshot.size();
    for (const proto::Update& update : contents.updates)
      impl->bytes_since_snapshot_ += update.ByteSizeLong();
    impl->UpdateGauges();
  }
  RETURN_IF_ERROR(impl->WaitDurable());
  return impl;
}

DispatcherImpl::DispatcherImpl(DispatcherOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      logger_(options_.logger != nullptr ? options_.logger : NullLogger()),
      journal_(options_.journal != nullptr ? options_.journal : std::make_shared<NullJournal>()),
      own_registry_(options_.registry == nullptr ? std::make_unique<prometheus::Registry>()
                                                 : nullptr),
      metrics_(options_.registry != nullptr ? *options_.registry : *own_registry_),
      autoscaler_(AutoscalerOptions{
          .min_workers = static_cast<int>(options_.min_workers),
          .max_workers = static_cast<int>(std::max(options_.min_workers, options_.max_workers)),
          .period = options_.scale_period,
          .scale_down_window = options_.scale_down_window}) {}

DispatcherImpl::~DispatcherImpl() { Stop(); }

absl::Status DispatcherImpl::Start() {
  absl::MutexLock lock(&mu_);
  if (maintenance_.joinable()) return absl::OkStatus();
  cancelled_ = false;
  maintenance_ = std::thread([this] { MaintenanceLoop(); });
  return absl::OkStatus();
}

void DispatcherImpl::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    thread = std::move(maintenance_);
  }
  if (thread.joinable()) thread.join();
  AnswerWatches(/*stopping=*/true);
  AnswerVerifications(/*stopping=*/true);
}

void DispatcherImpl::MaintenanceLoop() {
  absl::Time last_tick = clock_->Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&cancelled_), options_.heartbeat_interval);
      if (cancelled_) return;
      RestartLeasesAfterPause(last_tick, clock_->Now());
    }
    if (absl::Status s = Tick(); !s.ok()) logger_->error("dispatcher tick: {}", s.ToString());
    last_tick = clock_->Now();
  }
}

void DispatcherImpl::RestartLeasesAfterPause(absl::Time last_tick, absl::Time now) {
  // This loop wakes every heartbeat_interval; a much longer gap means the process was not
  // running (SIGSTOP, a paused VM, a frozen node). Nobody could reach it meanwhile: workers
  // and consumers that kept trying must not lose their leases for that time.
  const absl::Duration gap = now - last_tick;
  if (gap <= 3 * options_.heartbeat_interval + absl::Seconds(1)) return;
  for (auto& [id, signal] : worker_signals_) signal.last_seen = std::max(signal.last_seen, now);
  for (auto& [consumer, signal] : consumer_signals_) {
    if (signal.last_report != absl::InfinitePast())
      signal.last_report = std::max(signal.last_report, now);
  }
  logger_->warn(
      "the dispatcher did not run for {} (stopped or paused): every worker "
      "and consumer lease restarts now",
      absl::FormatDuration(gap));
}

absl::Status DispatcherImpl::Admit(uint32_t protocol_version) const {
  RETURN_IF_ERROR(CheckVersion(protocol_version));
  if (journal_failed_.load(std::memory_order_acquire)) {
    return absl::UnavailableError(
        "the dispatcher's journal failed (see its log): restart the "
        "dispatcher; it continues from what reached the disk");
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::WaitDurable() {
  const int64_t ticket = last_ticket_.load(std::memory_order_acquire);
  if (ticket <= durable_ticket_.load(std::memory_order_acquire)) return absl::OkStatus();
  const absl::Status s = journal_->WaitDurable(static_cast<uint64_t>(ticket));
  MarkDurable(static_cast<uint64_t>(ticket), s);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the dispatcher cannot journal a change: ", s.message()));
  }
  return absl::OkStatus();
}

void DispatcherImpl::MarkDurable(uint64_t ticket, const absl::Status& status) {
  if (!status.ok()) {
    if (!journal_failed_.exchange(true)) {
      metrics_.journal_errors.Increment();
      logger_->error(
          "journal commit failed; every RPC now answers Unavailable: restart "
          "the dispatcher: {}",
          status.ToString());
    }
    return;
  }
  int64_t seen = durable_ticket_.load(std::memory_order_relaxed);
  const int64_t now = static_cast<int64_t>(ticket);
  while (seen < now &&
         !durable_ticket_.compare_exchange_weak(seen, now, std::memory_order_release)) {
  }
}

template <typename Request, typename Response>
void DispatcherImpl::RunAsync(Method<Request, Response> method, const Request& request,
                              Response* response, Done done) {
  absl::Status status = (this->*method)(request, response);
  // The call may have made work for a watching worker.
  if (recheck_watches_.exchange(false)) AnswerWatches();
  const int64_t ticket = last_ticket_.load(std::memory_order_acquire);
  if (!status.ok() || ticket <= durable_ticket_.load(std::memory_order_acquire)) {
    done(std::move(status));
    return;
  }
  acks_->Add(static_cast<uint64_t>(ticket), std::move(status), std::move(done));
}

void DispatcherImpl::RegisterDataset(const proto::RegisterDatasetRequest& request,
                                     proto::RegisterDatasetResponse* response, Done done) {
  if (!options_.verify_shard_counts) {
    RunAsync(&DispatcherImpl::DoRegisterDataset, request, response, std::move(done));
    return;
  }
  std::string path;
  absl::Status local = CheckDatasetRequest(request);
  if (local.ok()) local = CheckCountsLocally(request, &path);
  if (absl::IsNotFound(local)) {
    // A worker must read the manifest, unless the same dataset is registered already.
    absl::MutexLock lock(&mu_);
    if (FindSameDataset(request) != 0) {
      local = absl::OkStatus();
    } else if (static_cast<int>(verifications_.size()) >= options_.max_held_verifications) {
      local = absl::ResourceExhaustedError(
          absl::StrCat("RegisterDataset: ", verifications_.size(),
                       " registrations already wait for a worker to check their shard "
                       "record counts: retry in a few seconds"));
    } else {
      // Held until a worker has read the manifest (the protocol in dispatcher_impl.h).
      const uint64_t ticket = next_verification_++;
      logger_->info(
          "RegisterDataset of '{}' waits for a worker to check its {} shard "
          "record counts (ticket {})",
          path, request.shard_record_counts_size(), ticket);
      verifications_.push_back(Verification{.ticket = ticket,
                                            .request = request,
                                            .path = path,
                                            .response = response,
                                            .done = std::move(done),
                                            .deadline = clock_->Now() + options_.verify_timeout});
    }
  }
  if (absl::IsNotFound(local)) {
    AnswerWatches();  // held: a watching worker takes the task at once
    return;
  }
  if (!local.ok()) {
    done(std::move(local));
    return;
  }
  RunAsync(&DispatcherImpl::DoRegisterDataset, request, response, std::move(done));
}

void DispatcherImpl::GetOrCreateJob(const proto::GetOrCreateJobRequest& request,
                                    proto::GetOrCreateJobResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoGetOrCreateJob, request, response, std::move(done));
}

void DispatcherImpl::ClientHeartbeat(const proto::ClientHeartbeatRequest& request,
                                     proto::ClientHeartbeatResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoClientHeartbeat, request, response, std::move(done));
}

void DispatcherImpl::WorkerRegister(const proto::WorkerRegisterRequest& request,
                                    proto::WorkerRegisterResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoWorkerRegister, request, response, std::move(done));
}

void DispatcherImpl::WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                                     proto::WorkerHeartbeatResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoWorkerHeartbeat, request, response, std::move(done));
  if (!request.described().empty()) AnswerVerifications();
}

void DispatcherImpl::WorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                      proto::WorkerUnregisterResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoWorkerUnregister, request, response, std::move(done));
}

void DispatcherImpl::DrainWorker(const proto::DrainWorkerRequest& request,
                                 proto::DrainWorkerResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoDrainWorker, request, response, std::move(done));
}

void DispatcherImpl::GetJobState(const proto::GetJobStateRequest& request,
                                 proto::GetJobStateResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoGetJobState, request, response, std::move(done));
}

void DispatcherImpl::GetStatus(const proto::GetStatusRequest& request,
                               proto::GetStatusResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoGetStatus, request, response, std::move(done));
}

void DispatcherImpl::RemoveCache(const proto::RemoveCacheRequest& request,
                                 proto::RemoveCacheResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoRemoveCache, request, response, std::move(done));
}

absl::Status DispatcherImpl::Tick() {
  absl::Status status = DoTick();
  AnswerWatches();        // work made by the tick (a lost worker's splits), and deadlines
  AnswerVerifications();  // past their deadline
  RETURN_IF_ERROR(status);
  return WaitDurable();
}

absl::Status DispatcherImpl::Commit(const proto::Update& update) {
  recheck_watches_.store(true);
  if (absl::Status s = state_.Validate(update); !s.ok()) {
    return absl::InternalError(absl::StrCat("dispatcher refused its own update (",
                                            update.ShortDebugString(), "): ", s.message()));
  }
  absl::StatusOr<uint64_t> ticket = journal_->Enqueue(update);
  if (!ticket.ok()) {
    metrics_.journal_errors.Increment();
    return absl::UnavailableError(
        absl::StrCat("the dispatcher cannot journal a change: ", ticket.status().message()));
  }
  last_ticket_.store(static_cast<int64_t>(*ticket), std::memory_order_release);
  if (absl::Status s = state_.Apply(update); !s.ok()) {
    return absl::InternalError(absl::StrCat("dispatcher state rejected its own update (",
                                            update.ShortDebugString(), "): ", s.message()));
  }
  bytes_since_snapshot_ += update.ByteSizeLong();
  if (++updates_since_snapshot_ >= options_.snapshot_every ||
      bytes_since_snapshot_ >= std::max(options_.snapshot_bytes, last_snapshot_bytes_)) {
    // Serialized here, written by the next commit outside mu_.
    std::string bytes = state_.Snapshot().SerializeAsString();
    const uint64_t size = bytes.size();
    absl::StatusOr<uint64_t> snapshot = journal_->EnqueueSnapshot(std::move(bytes));
    if (snapshot.ok()) {
      last_ticket_.store(static_cast<int64_t>(*snapshot), std::memory_order_release);
      updates_since_snapshot_ = 0;
      bytes_since_snapshot_ = 0;
      last_snapshot_bytes_ = size;
    } else {
      metrics_.journal_errors.Increment();
      logger_->warn("journal compaction failed (the journal keeps growing): {}",
                    snapshot.status().ToString());
    }
  }
  return absl::OkStatus();
}

uint64_t DispatcherImpl::TasksVersion() const {
  const uint64_t v = Mix(view_nonce_, state_.workers_digest());
  return v == 0 ? 1 : v;
}

uint64_t DispatcherImpl::SplitsVersion(uint64_t job_id,
                                       const DispatcherState::Consumer& consumer) const {
  // The sequence is a pure function of (job, consumer, epoch) (ConsumerSplitIds), empty once
  // the consumer finished.
  uint64_t v =
      Mix(Mix(Mix(view_nonce_ ^ 0x5a5a5a5a5a5a5a5aULL, job_id), consumer.index), consumer.epoch);
  v = Mix(v, consumer.finished ? 1 : 0);
  return v == 0 ? 1 : v;
}

absl::Status DispatcherImpl::ApplySoft(const proto::Update& update) {
  if (absl::Status s = state_.Apply(update); !s.ok()) {
    return absl::InternalError(absl::StrCat("dispatcher state rejected its own update (",
                                            update.ShortDebugString(), "): ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoTick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> expired;
  for (const auto& [id, worker] : state_.workers()) {
    auto it = worker_signals_.find(id);
    if (it == worker_signals_.end() || now - it->second.last_seen >= options_.worker_timeout) {
      expired.push_back(id);
    }
  }
  for (uint64_t id : expired) {
    RETURN_IF_ERROR(LoseWorker(
        id, "timeout",
        absl::StrCat("sent no heartbeat for ", absl::FormatDuration(options_.worker_timeout))));
  }
  RETURN_IF_ERROR(CollectJobs(now));
  RETURN_IF_ERROR(CollectDatasets(now));
  if (last_decision_ == absl::InfinitePast() || now - last_decision_ >= options_.scale_period ||
      DemandLeft(now)) {
    RETURN_IF_ERROR(Autoscale(now));
  }
  UpdateGauges();
  return absl::OkStatus();
}

}  // namespace sluice::dispatcher
