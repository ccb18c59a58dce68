#include "dispatcher/dispatcher_impl.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/record/checksum.h"

namespace sluice::dispatcher {
namespace {

absl::Status CheckVersion(uint32_t version) {
  return service::CheckProtocolVersion(version, "client", "dispatcher");
}

std::string ConfigString(const proto::JobConfig& c) {
  return absl::StrCat("{mode ", proto::ProcessingMode_Name(c.mode()), ", seed ",
                      c.seed(), ", epochs ", c.num_epochs(), ", consumers ",
                      c.num_consumers(), ", deterministic ",
                      c.deterministic() ? "true" : "false", ", remainder ",
                      proto::RemainderMode_Name(c.remainder()), ", split_size ",
                      c.split_size(), "}");
}

record::RemainderPolicy Remainder(const proto::JobConfig& c) {
  return c.remainder() == proto::REMAINDER_MODE_DROP
             ? record::RemainderPolicy::kDrop
             : record::RemainderPolicy::kPad;
}

uint64_t TotalRecords(const std::vector<uint64_t>& shard_record_counts) {
  uint64_t n = 0;
  for (uint64_t c : shard_record_counts) n += c;
  return n;
}

// The share sizes of a job over `records` records (0 in PARALLEL_EPOCHS mode).
void SetShares(const proto::JobConfig& c, uint64_t records, uint64_t num_splits,
               proto::GetOrCreateJobResponse* response) {
  response->set_splits_per_epoch(num_splits);
  if (c.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) return;
  const uint64_t share =
      record::ShareSize(records, c.num_consumers(), Remainder(c));
  response->set_records_per_consumer(share);
  response->set_splits_per_consumer((share + c.split_size() - 1) /
                                    c.split_size());
}

// Records per split (and per slot): the requested size rounded to whole batches; by default
// (requested 0) `default_size`, made smaller for small shares so that each consumer gets about
// kMinSlotsPerConsumer slots (dynamic balancing across workers needs several), never below
// one batch.
constexpr uint64_t kMinSlotsPerConsumer = 4;
uint64_t SplitSize(uint64_t requested, uint64_t default_size, uint64_t batch,
                   uint64_t share) {
  if (requested == 0) {
    requested = std::min(default_size, share / kMinSlotsPerConsumer);
    return std::max<uint64_t>(1, requested / batch) * batch;
  }
  return std::max<uint64_t>(1, (requested + batch / 2) / batch) * batch;
}

void AddPieces(const DispatcherState::Job& job,
               const record::SlotPieces& pieces,
               google::protobuf::RepeatedPtrField<proto::SplitPiece>* out) {
  for (const record::SplitPiece& piece : pieces) {
    const record::Split& split = job.splits[piece.split_id];
    proto::SplitPiece* p = out->Add();
    p->set_split_id(split.id);
    p->set_first_global(split.first_global);
    p->set_records(split.size());
    p->set_offset(piece.offset);
    p->set_count(piece.count);
  }
}

// `config` with the world size of `other` (and the split size derived from it).
proto::JobConfig WithWorldSizeOf(proto::JobConfig config,
                                 const proto::JobConfig& other) {
  config.set_num_consumers(other.num_consumers());
  config.set_split_size(other.split_size());
  return config;
}

// The value of the per-job series' sluice_job label.
std::string JobLabel(const DispatcherState::Job& job) {
  return job.name.empty() ? absl::StrCat("id-", job.id) : job.name;
}

bool SameConfig(const proto::JobConfig& a, const proto::JobConfig& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

// splitmix64 of `a` combined with `b`: versions of ClientHeartbeat's lists.
uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DispatcherImpl>> DispatcherImpl::Create(
    DispatcherOptions options) {
  std::unique_ptr<DispatcherImpl> impl(new DispatcherImpl(std::move(options)));
  ASSIGN_OR_RETURN(Journal::Contents contents, impl->journal_->Read());
  {
    std::random_device random;
    impl->view_nonce_ = (uint64_t{random()} << 32) ^ random();
  }
  DispatcherImpl* raw = impl.get();
  impl->acks_ = std::make_unique<DurableAcks>(
      impl->journal_.get(), [raw](uint64_t ticket, const absl::Status& s) {
        raw->MarkDurable(ticket, s);
      });
  {
    absl::MutexLock lock(&impl->mu_);
    const absl::Time now = impl->clock_->Now();
    const uint64_t start_micros =
        static_cast<uint64_t>(absl::ToUnixMicros(now));
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
              absl::StrCat("the journal's snapshot record ", i,
                           " does not apply: ", s.message()));
        }
      }
    }
    for (size_t i = 0; i < contents.updates.size(); ++i) {
      if (absl::Status s = impl->state_.Apply(contents.updates[i]); !s.ok()) {
        return absl::DataLossError(
            absl::StrCat("journal record ", i,
                         " after the snapshot does not apply: ", s.message()));
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
          impl->state_.jobs().size(), impl->state_.workers().size(),
          contents.updates.size());
    }
    impl->updates_since_snapshot_ = impl->journal_->updates_since_snapshot();
    impl->UpdateGauges();
  }
  RETURN_IF_ERROR(impl->WaitDurable());
  return impl;
}

DispatcherImpl::DispatcherImpl(DispatcherOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      logger_(options_.logger != nullptr ? options_.logger : NullLogger()),
      journal_(options_.journal != nullptr ? options_.journal
                                           : std::make_shared<NullJournal>()),
      own_registry_(options_.registry == nullptr
                        ? std::make_unique<prometheus::Registry>()
                        : nullptr),
      splits_assigned_(
          AddCounter(options_.registry ? *options_.registry : *own_registry_,
                     "sluice_dispatcher_splits_assigned_total",
                     "Splits handed to a worker (first assignments).")),
      splits_reassigned_(
          AddCounter(options_.registry ? *options_.registry : *own_registry_,
                     "sluice_dispatcher_splits_reassigned_total",
                     "Splits handed to another worker after a loss or drain.")),
      splits_done_(
          AddCounter(options_.registry ? *options_.registry : *own_registry_,
                     "sluice_dispatcher_splits_done_total",
                     "Splits whose consumer received every batch.")),
      workers_lost_(
          prometheus::BuildCounter()
              .Name("sluice_dispatcher_workers_lost_total")
              .Help("Workers removed, by reason: timeout (no heartbeat for "
                    "--worker-timeout), unregistered (drained and left), "
                    "restarted (registered again at the same address).")
              .Register(options_.registry ? *options_.registry
                                          : *own_registry_)),
      consumer_wait_(AddCounter(
          options_.registry ? *options_.registry : *own_registry_,
          "sluice_dispatcher_consumer_wait_seconds_total",
          "Time trainers waited for a batch, as reported by clients.")),
      workers_alive_(
          AddGauge(options_.registry ? *options_.registry : *own_registry_,
                   "sluice_dispatcher_workers", "Registered, live workers.")),
      jobs_active_(AddGauge(
          options_.registry ? *options_.registry : *own_registry_,
          "sluice_dispatcher_jobs", "Jobs with an unfinished consumer.")),
      desired_workers_gauge_(
          AddGauge(options_.registry ? *options_.registry : *own_registry_,
                   "sluice_desired_workers",
                   "Workers the autoscaling policy asks for.")),
      journal_errors_(
          AddCounter(options_.registry ? *options_.registry : *own_registry_,
                     "sluice_dispatcher_journal_errors_total",
                     "Journal appends or compactions that failed.")),
      jobs_collected_(AddCounter(
          options_.registry ? *options_.registry : *own_registry_,
          "sluice_dispatcher_jobs_collected_total",
          "Jobs forgotten because their consumers finished or left.")),
      job_batches_returned_(
          prometheus::BuildCounter()
              .Name("sluice_dispatcher_job_batches_returned_total")
              .Help("Batches returned to the job's trainers, as reported by "
                    "clients (label sluice_job).")
              .Register(options_.registry ? *options_.registry
                                          : *own_registry_)),
      job_consumer_wait_(
          prometheus::BuildCounter()
              .Name("sluice_dispatcher_job_consumer_wait_seconds_total")
              .Help("Time the job's trainers waited for a batch, as reported "
                    "by clients (label sluice_job).")
              .Register(options_.registry ? *options_.registry
                                          : *own_registry_)),
      job_splits_reassigned_(
          prometheus::BuildCounter()
              .Name("sluice_dispatcher_job_splits_reassigned_total")
              .Help("The job's splits handed to another worker after a loss "
                    "or drain (label sluice_job).")
              .Register(options_.registry ? *options_.registry
                                          : *own_registry_)),
      job_consumers_(
          prometheus::BuildGauge()
              .Name("sluice_dispatcher_consumers")
              .Help("The job's consumers (trainers) that have not finished "
                    "(label sluice_job).")
              .Register(options_.registry ? *options_.registry
                                          : *own_registry_)),
      autoscaler_(AutoscalerOptions{
          .min_workers = static_cast<int>(options_.min_workers),
          .max_workers = static_cast<int>(
              std::max(options_.min_workers, options_.max_workers)),
          .period = options_.scale_period,
          .scale_down_window = options_.scale_down_window}) {
  // Every reason's series exists from the start (at 0), so rates and dashboards have data.
  for (const char* reason : {"timeout", "unregistered", "restarted"})
    workers_lost_.Add({{"reason", reason}});
}

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
}

void DispatcherImpl::MaintenanceLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&cancelled_),
                           options_.heartbeat_interval);
      if (cancelled_) return;
    }
    if (absl::Status s = Tick(); !s.ok())
      logger_->error("dispatcher tick: {}", s.ToString());
  }
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
  if (ticket <= durable_ticket_.load(std::memory_order_acquire))
    return absl::OkStatus();
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
      journal_errors_.Increment();
      logger_->error(
          "journal commit failed; every RPC now answers Unavailable: restart "
          "the dispatcher: {}",
          status.ToString());
    }
    return;
  }
  int64_t seen = durable_ticket_.load(std::memory_order_relaxed);
  const int64_t now = static_cast<int64_t>(ticket);
  while (seen < now && !durable_ticket_.compare_exchange_weak(
                           seen, now, std::memory_order_release)) {
  }
}

template <typename Request, typename Response>
absl::Status DispatcherImpl::RunSync(Method<Request, Response> method,
                                     const Request& request,
                                     Response* response) {
  RETURN_IF_ERROR((this->*method)(request, response));
  return WaitDurable();
}

template <typename Request, typename Response>
void DispatcherImpl::RunAsync(Method<Request, Response> method,
                              const Request& request, Response* response,
                              Done done) {
  absl::Status status = (this->*method)(request, response);
  const int64_t ticket = last_ticket_.load(std::memory_order_acquire);
  if (!status.ok() ||
      ticket <= durable_ticket_.load(std::memory_order_acquire)) {
    done(std::move(status));
    return;
  }
  acks_->Add(static_cast<uint64_t>(ticket), std::move(status), std::move(done));
}

absl::Status DispatcherImpl::RegisterDataset(
    const proto::RegisterDatasetRequest& request,
    proto::RegisterDatasetResponse* response) {
  return RunSync(&DispatcherImpl::DoRegisterDataset, request, response);
}

void DispatcherImpl::RegisterDataset(
    const proto::RegisterDatasetRequest& request,
    proto::RegisterDatasetResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoRegisterDataset, request, response,
           std::move(done));
}

absl::Status DispatcherImpl::GetOrCreateJob(
    const proto::GetOrCreateJobRequest& request,
    proto::GetOrCreateJobResponse* response) {
  return RunSync(&DispatcherImpl::DoGetOrCreateJob, request, response);
}

void DispatcherImpl::GetOrCreateJob(const proto::GetOrCreateJobRequest& request,
                                    proto::GetOrCreateJobResponse* response,
                                    Done done) {
  RunAsync(&DispatcherImpl::DoGetOrCreateJob, request, response,
           std::move(done));
}

absl::Status DispatcherImpl::ClientHeartbeat(
    const proto::ClientHeartbeatRequest& request,
    proto::ClientHeartbeatResponse* response) {
  return RunSync(&DispatcherImpl::DoClientHeartbeat, request, response);
}

void DispatcherImpl::ClientHeartbeat(
    const proto::ClientHeartbeatRequest& request,
    proto::ClientHeartbeatResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoClientHeartbeat, request, response,
           std::move(done));
}

absl::Status DispatcherImpl::WorkerRegister(
    const proto::WorkerRegisterRequest& request,
    proto::WorkerRegisterResponse* response) {
  return RunSync(&DispatcherImpl::DoWorkerRegister, request, response);
}

void DispatcherImpl::WorkerRegister(const proto::WorkerRegisterRequest& request,
                                    proto::WorkerRegisterResponse* response,
                                    Done done) {
  RunAsync(&DispatcherImpl::DoWorkerRegister, request, response,
           std::move(done));
}

absl::Status DispatcherImpl::WorkerHeartbeat(
    const proto::WorkerHeartbeatRequest& request,
    proto::WorkerHeartbeatResponse* response) {
  return RunSync(&DispatcherImpl::DoWorkerHeartbeat, request, response);
}

void DispatcherImpl::WorkerHeartbeat(
    const proto::WorkerHeartbeatRequest& request,
    proto::WorkerHeartbeatResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoWorkerHeartbeat, request, response,
           std::move(done));
}

absl::Status DispatcherImpl::WorkerUnregister(
    const proto::WorkerUnregisterRequest& request,
    proto::WorkerUnregisterResponse* response) {
  return RunSync(&DispatcherImpl::DoWorkerUnregister, request, response);
}

void DispatcherImpl::WorkerUnregister(
    const proto::WorkerUnregisterRequest& request,
    proto::WorkerUnregisterResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoWorkerUnregister, request, response,
           std::move(done));
}

absl::Status DispatcherImpl::DrainWorker(
    const proto::DrainWorkerRequest& request,
    proto::DrainWorkerResponse* response) {
  return RunSync(&DispatcherImpl::DoDrainWorker, request, response);
}

void DispatcherImpl::DrainWorker(const proto::DrainWorkerRequest& request,
                                 proto::DrainWorkerResponse* response,
                                 Done done) {
  RunAsync(&DispatcherImpl::DoDrainWorker, request, response, std::move(done));
}

absl::Status DispatcherImpl::GetJobState(
    const proto::GetJobStateRequest& request,
    proto::GetJobStateResponse* response) {
  return RunSync(&DispatcherImpl::DoGetJobState, request, response);
}

void DispatcherImpl::GetJobState(const proto::GetJobStateRequest& request,
                                 proto::GetJobStateResponse* response,
                                 Done done) {
  RunAsync(&DispatcherImpl::DoGetJobState, request, response, std::move(done));
}

absl::Status DispatcherImpl::GetStatus(const proto::GetStatusRequest& request,
                                       proto::GetStatusResponse* response) {
  return RunSync(&DispatcherImpl::DoGetStatus, request, response);
}

void DispatcherImpl::GetStatus(const proto::GetStatusRequest& request,
                               proto::GetStatusResponse* response, Done done) {
  RunAsync(&DispatcherImpl::DoGetStatus, request, response, std::move(done));
}

absl::Status DispatcherImpl::Tick() {
  RETURN_IF_ERROR(DoTick());
  return WaitDurable();
}

absl::Status DispatcherImpl::Commit(const proto::Update& update) {
  if (absl::Status s = state_.Validate(update); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("dispatcher refused its own update (",
                     update.ShortDebugString(), "): ", s.message()));
  }
  absl::StatusOr<uint64_t> ticket = journal_->Enqueue(update);
  if (!ticket.ok()) {
    journal_errors_.Increment();
    return absl::UnavailableError(absl::StrCat(
        "the dispatcher cannot journal a change: ", ticket.status().message()));
  }
  last_ticket_.store(static_cast<int64_t>(*ticket), std::memory_order_release);
  if (absl::Status s = state_.Apply(update); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("dispatcher state rejected its own update (",
                     update.ShortDebugString(), "): ", s.message()));
  }
  if (++updates_since_snapshot_ >= options_.snapshot_every) {
    // Serialized here, written by the next commit outside mu_.
    absl::StatusOr<uint64_t> snapshot =
        journal_->EnqueueSnapshot(state_.Snapshot().SerializeAsString());
    if (snapshot.ok()) {
      last_ticket_.store(static_cast<int64_t>(*snapshot),
                         std::memory_order_release);
      updates_since_snapshot_ = 0;
    } else {
      journal_errors_.Increment();
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

uint64_t DispatcherImpl::SplitsVersion(
    uint64_t job_id, const DispatcherState::Consumer& consumer) const {
  // The sequence is a pure function of (job, consumer, epoch) (ConsumerSplitIds), empty once
  // the consumer finished.
  uint64_t v =
      Mix(Mix(Mix(view_nonce_ ^ 0x5a5a5a5a5a5a5a5aULL, job_id), consumer.index),
          consumer.epoch);
  v = Mix(v, consumer.finished ? 1 : 0);
  return v == 0 ? 1 : v;
}

absl::Status DispatcherImpl::ApplySoft(const proto::Update& update) {
  if (absl::Status s = state_.Apply(update); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("dispatcher state rejected its own update (",
                     update.ShortDebugString(), "): ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoRegisterDataset(
    const proto::RegisterDatasetRequest& request,
    proto::RegisterDatasetResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  // The spec's size is limited before anything else; its nodes are counted when it parses as a
  // pipeline (what clients send). Workers check both again, and validate the spec.
  if (absl::Status s = service::CheckPipelineBytes(
          static_cast<int64_t>(request.pipeline().size()), options_.limits);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterDataset: ", s.message()));
  }
  if (proto::Pipeline parsed; parsed.ParseFromString(request.pipeline())) {
    if (absl::Status s = service::CheckPipelineLimits(parsed, options_.limits);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterDataset: ", s.message()));
    }
  }
  if (request.pipeline().empty()) {
    return absl::InvalidArgumentError("RegisterDataset: pipeline is empty");
  }
  if (request.batch_size() == 0) {
    return absl::InvalidArgumentError(
        "RegisterDataset: batch_size must be > 0");
  }
  uint64_t records = 0;
  for (uint64_t n : request.shard_record_counts()) records += n;
  if (records == 0) {
    return absl::InvalidArgumentError(
        "RegisterDataset: shard_record_counts add up to 0 records (empty "
        "dataset?)");
  }
  const uint64_t fingerprint = record::Checksum(request.pipeline());
  const std::vector<uint64_t> counts(request.shard_record_counts().begin(),
                                     request.shard_record_counts().end());
  absl::MutexLock lock(&mu_);
  for (const auto& [id, d] : state_.datasets()) {
    if (d.fingerprint == fingerprint && d.pipeline == request.pipeline() &&
        d.shard_record_counts == counts &&
        d.batch_size == request.batch_size()) {
      response->set_dataset_id(id);
      response->set_fingerprint(fingerprint);
      return absl::OkStatus();
    }
  }
  proto::Update update;
  proto::UpdateRegisterDataset* u = update.mutable_register_dataset();
  u->set_dataset_id(state_.NextDatasetId());
  u->set_fingerprint(fingerprint);
  u->set_pipeline(request.pipeline());
  *u->mutable_shard_record_counts() = request.shard_record_counts();
  u->set_batch_size(request.batch_size());
  RETURN_IF_ERROR(Commit(update));
  logger_->info(
      "registered dataset {} ({} shards, {} records, batch {}, fingerprint {})",
      u->dataset_id(), counts.size(), records, request.batch_size(),
      record::ChecksumHex(fingerprint));
  response->set_dataset_id(u->dataset_id());
  response->set_fingerprint(fingerprint);
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoGetOrCreateJob(
    const proto::GetOrCreateJobRequest& request,
    proto::GetOrCreateJobResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Dataset* dataset =
      state_.FindDataset(request.dataset_id());
  if (dataset == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("dataset ", request.dataset_id(),
                     " is not registered: call RegisterDataset first"));
  }
  proto::JobConfig config = request.config();
  if (config.mode() == proto::PROCESSING_MODE_UNSPECIFIED) {
    config.set_mode(proto::PROCESSING_MODE_DISTRIBUTED_EPOCH);
  }
  if (config.remainder() == proto::REMAINDER_MODE_UNSPECIFIED) {
    config.set_remainder(proto::REMAINDER_MODE_PAD);
  }
  if (config.num_consumers() == 0) config.set_num_consumers(1);
  RETURN_IF_ERROR(
      service::CheckConsumerLimit(config.num_consumers(), options_.limits));
  const uint64_t records = TotalRecords(dataset->shard_record_counts);
  const uint64_t share =
      record::ShareSize(records, config.num_consumers(), Remainder(config));
  if (config.mode() == proto::PROCESSING_MODE_DISTRIBUTED_EPOCH && share == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset has ", records, " records, fewer than the ",
        config.num_consumers(),
        " consumers: with remainder DROP some consumer gets nothing; use "
        "remainder PAD or fewer consumers"));
  }
  config.set_split_size(SplitSize(config.split_size(),
                                  options_.default_split_size,
                                  dataset->batch_size, share));
  uint64_t first_epoch =
      0;  // a job replaced at an epoch boundary continues there

  if (const DispatcherState::Job* job =
          state_.FindJobByName(request.job_name());
      job != nullptr) {
    if (request.restore_at_boundary() &&
        job->dataset_id == request.dataset_id() &&
        job->config.num_consumers() != config.num_consumers() &&
        SameConfig(WithWorldSizeOf(job->config, config), config)) {
      // The world size changes at an epoch boundary: a new job of this name continues (new
      // id, so no worker can mistake a batch of the old layout for one of the new); its
      // consumers restore to the boundary epoch.
      RETURN_IF_ERROR(CheckResizable(*job, request.restore_epoch()));
      logger_->info(
          "job {} '{}' continues at epoch {} with {} consumers instead of {}",
          job->id, job->name, request.restore_epoch(), config.num_consumers(),
          job->config.num_consumers());
      RETURN_IF_ERROR(RemoveJob(job->id));
      first_epoch = request.restore_epoch();
    }
  }
  if (const DispatcherState::Job* job =
          state_.FindJobByName(request.job_name());
      job != nullptr) {
    if (job->dataset_id != request.dataset_id() ||
        !SameConfig(job->config, config)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", request.job_name(), "' exists with dataset ",
          job->dataset_id, " and config ", ConfigString(job->config),
          "; this request has dataset ", request.dataset_id(), " and config ",
          ConfigString(config), ": use another job name or the same settings"));
    }
    response->set_job_id(job->id);
    response->set_created(false);
    *response->mutable_config() = job->config;
    SetShares(job->config, records, job->splits.size(), response);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(service::CheckJobLimit(
      static_cast<int64_t>(state_.jobs().size()), options_.limits));
  ASSIGN_OR_RETURN(std::vector<record::Split> splits,
                   record::EnumerateSplits(dataset->shard_record_counts,
                                           config.split_size()));
  proto::Update update;
  proto::UpdateCreateJob* u = update.mutable_create_job();
  u->set_job_id(state_.NextJobId());
  u->set_job_name(request.job_name());
  u->set_dataset_id(request.dataset_id());
  *u->mutable_config() = config;
  u->set_first_epoch(first_epoch);
  RETURN_IF_ERROR(Commit(update));
  logger_->info(
      "created job {} '{}' on dataset {}: {} ({} splits, {} records per "
      "consumer)",
      u->job_id(), request.job_name(), request.dataset_id(),
      ConfigString(config), splits.size(), share);
  response->set_job_id(u->job_id());
  response->set_created(true);
  *response->mutable_config() = config;
  SetShares(config, records, splits.size(), response);
  UpdateGauges();
  return absl::OkStatus();
}

proto::SplitAssignment DispatcherImpl::MakeAssignment(
    const DispatcherState::Job& job, const SlotKey& key) const {
  proto::SplitAssignment a;
  *a.mutable_key() = key.ToProto();
  const DispatcherState::Slot* slot = state_.FindSlot(key);
  if (slot == nullptr) return a;
  AddPieces(job, slot->pieces, a.mutable_pieces());
  return a;
}

absl::Status DispatcherImpl::DoClientHeartbeat(
    const proto::ClientHeartbeatRequest& request,
    proto::ClientHeartbeatResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Job* job = state_.FindJob(request.job_id());
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("job ", request.job_id(),
                     " not found (dispatcher restarted without its "
                     "journal?): call GetOrCreateJob again"));
  }
  if (request.consumer_index() >= job->consumers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("consumer_index ", request.consumer_index(),
                     " must be < num_consumers ", job->consumers.size(),
                     " of job ", job->id));
  }
  // Signals for the autoscaler.
  const absl::Time now = clock_->Now();
  ConsumerSignal& signal =
      consumer_signals_[{job->id, request.consumer_index()}];
  double wait_delta = request.wait_seconds_total() - signal.wait_seconds_total;
  if (wait_delta < 0)
    wait_delta = request.wait_seconds_total();  // the client restarted
  JobMetrics& job_metrics = MetricsFor(*job);
  if (wait_delta > 0) {
    consumer_wait_.Increment(wait_delta);
    job_metrics.consumer_wait->Increment(wait_delta);
  }
  job_metrics.batches_returned->Increment(static_cast<double>(
      request.batches_returned_total() >= signal.batches_returned_total
          ? request.batches_returned_total() - signal.batches_returned_total
          : request.batches_returned_total()));  // the client restarted
  if (signal.last_report != absl::InfinitePast() && now > signal.last_report) {
    signal.wait_fraction = std::clamp(
        wait_delta / absl::ToDoubleSeconds(now - signal.last_report), 0.0, 1.0);
  }
  signal.wait_seconds_total = request.wait_seconds_total();
  signal.buffer_fill = request.buffer_fill();
  signal.last_report = now;
  if (request.batches_returned_total() < signal.batches_returned_total) {
    signal.window_batches = 0;  // the client restarted
    signal.window_wait = 0;
  }
  signal.batches_returned_total = request.batches_returned_total();
  if (signal.window_start == absl::InfinitePast()) {
    signal.window_start = now;
    signal.window_batches = request.batches_returned_total();
    signal.window_wait = request.wait_seconds_total();
  }

  if (request.restore()) RETURN_IF_ERROR(RestoreConsumer(*job, request));
  const DispatcherState::Consumer& consumer =
      job->consumers[request.consumer_index()];
  if (!consumer.slots.empty()) {
    int newly_done = 0;
    bool awaiting = false;
    for (const DispatcherState::Slot& slot : consumer.slots)
      awaiting =
          awaiting || slot.status == proto::SPLIT_STATUS_AWAITING_PROGRESS;
    for (const proto::ClientSplitProgress& p : request.progress()) {
      const DispatcherState::Slot* slot =
          state_.FindSlot({job->id, consumer.index, p.epoch(), p.position()});
      if (p.complete() && slot != nullptr &&
          slot->status != proto::SPLIT_STATUS_DONE)
        ++newly_done;
    }
    proto::Update update;
    proto::UpdateClientProgress* u = update.mutable_client_progress();
    u->set_job_id(job->id);
    u->set_consumer_index(consumer.index);
    *u->mutable_progress() = request.progress();
    // Only splits completing (and epochs advancing) or handed-back splits becoming assignable
    // change durable state; a report that only moves delivered prefixes is soft: the client
    // sends its cumulative progress again with every heartbeat.
    if (newly_done > 0 || awaiting) {
      RETURN_IF_ERROR(Commit(update));
    } else {
      RETURN_IF_ERROR(ApplySoft(update));
    }
    if (newly_done > 0) splits_done_.Increment(newly_done);
  }
  // `job`/`consumer` stay valid: only Tick() removes jobs.
  if (consumer.epoch > signal.epoch) {
    signal.epoch = consumer.epoch;
    signal.epoch_started = now;  // the autoscaler's epoch grace
  }
  response->set_incarnation(incarnation_);
  response->set_epoch(consumer.epoch);
  response->set_finished(consumer.finished);
  for (uint64_t pos = 0; pos < consumer.slots.size(); ++pos) {
    if (consumer.slots[pos].status == proto::SPLIT_STATUS_DONE)
      response->add_done_positions(pos);
  }
  // The two long lists only when the client does not hold them already.
  response->set_splits_version(SplitsVersion(job->id, consumer));
  if (request.splits_version() != response->splits_version()) {
    response->mutable_splits()->Reserve(
        static_cast<int>(consumer.slots.size()));
    for (uint64_t pos = 0; pos < consumer.slots.size(); ++pos) {
      *response->add_splits() =
          MakeAssignment(*job, {job->id, consumer.index, consumer.epoch, pos});
    }
  }
  response->set_tasks_version(TasksVersion());
  if (request.tasks_version() != response->tasks_version()) {
    response->mutable_tasks()->Reserve(
        static_cast<int>(state_.workers().size()));
    for (const auto& [id, worker] : state_.workers()) {
      proto::Task* task = response->add_tasks();
      task->set_worker_id(id);
      task->set_address(worker.address);
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoWorkerRegister(
    const proto::WorkerRegisterRequest& request,
    proto::WorkerRegisterResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  if (request.address().empty()) {
    return absl::InvalidArgumentError(
        "WorkerRegister: address (host:port) is empty");
  }
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> replaced;
  for (const auto& [id, worker] : state_.workers()) {
    if (worker.address == request.address()) replaced.push_back(id);
  }
  for (uint64_t id : replaced)
    RETURN_IF_ERROR(LoseWorker(id, "restarted", "re-registered (restarted)"));
  proto::Update update;
  proto::UpdateRegisterWorker* u = update.mutable_register_worker();
  u->set_worker_id(state_.NextWorkerId());
  u->set_address(request.address());
  u->set_capacity(std::max<uint32_t>(1, request.capacity()));
  RETURN_IF_ERROR(Commit(update));
  worker_signals_[u->worker_id()] = {.last_seen = clock_->Now(),
                                     .registered = clock_->Now()};
  logger_->info("worker {} registered at {} (capacity {})", u->worker_id(),
                u->address(), u->capacity());
  response->set_worker_id(u->worker_id());
  response->set_incarnation(incarnation_);
  response->set_heartbeat_interval_seconds(
      absl::ToDoubleSeconds(options_.heartbeat_interval));
  UpdateGauges();
  return absl::OkStatus();
}

absl::Status DispatcherImpl::AssignSplits(uint64_t worker_id, int free,
                                          proto::WorkerHeartbeatResponse* out) {
  // Each pick: the consumer with the fewest splits in production, ties to the
  // lowest (job, consumer); its lowest pending position. The state's indexes
  // (Consumer::pending, in_production) make a pick one pass over the consumers.
  while (free > 0) {
    const DispatcherState::Job* best_job = nullptr;
    const DispatcherState::Consumer* best = nullptr;
    for (const auto& [job_id, job] : state_.jobs()) {
      if (job.config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH)
        continue;
      for (const DispatcherState::Consumer& consumer : job.consumers) {
        if (consumer.pending.empty()) continue;
        if (best == nullptr || consumer.in_production < best->in_production) {
          best = &consumer;
          best_job = &job;
        }
      }
    }
    if (best == nullptr) break;
    const DispatcherState::Job& job = *best_job;
    const SlotKey key{job.id, best->index, best->epoch, *best->pending.begin()};
    const DispatcherState::Slot* slot = state_.FindSlot(key);
    const bool reassigned = slot->assignments > 0;
    proto::Update update;
    proto::UpdateAssignSplit* u = update.mutable_assign_split();
    *u->mutable_key() = key.ToProto();
    u->set_worker_id(worker_id);
    u->set_skip_batches(slot->skip_batches);
    RETURN_IF_ERROR(Commit(update));
    proto::SplitAssignment* a = out->add_start();
    *a = MakeAssignment(job, key);
    a->set_skip_batches(u->skip_batches());
    (reassigned ? splits_reassigned_ : splits_assigned_).Increment();
    if (reassigned) MetricsFor(job).splits_reassigned->Increment();
    --free;
  }
  return absl::OkStatus();
}

void DispatcherImpl::FillJobInfo(const DispatcherState::Job& job,
                                 proto::JobInfo* info) const {
  info->set_job_id(job.id);
  info->set_job_name(job.name);
  info->set_dataset_id(job.dataset_id);
  const DispatcherState::Dataset* dataset = state_.FindDataset(job.dataset_id);
  if (dataset != nullptr) {
    info->set_pipeline(dataset->pipeline);
    info->set_batch_size(dataset->batch_size);
  }
  *info->mutable_config() = job.config;
}

absl::Status DispatcherImpl::DoWorkerHeartbeat(
    const proto::WorkerHeartbeatRequest& request,
    proto::WorkerHeartbeatResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  if (state_.FindWorker(request.worker_id()) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("worker ", request.worker_id(),
                     " is not registered (timed out?): drop all splits "
                     "and call WorkerRegister again"));
  }
  {
    WorkerSignal& signal = worker_signals_[request.worker_id()];
    signal.last_seen = clock_->Now();
    if (signal.registered == absl::InfinitePast())
      signal.registered = signal.last_seen;
    signal.elements_per_second = request.elements_per_second();
    signal.queue_depth = request.queue_depth();
    signal.queue_capacity = request.queue_capacity();
    signal.blocked_producers = request.blocked_producers();
    if (request.elements_total() < signal.elements_total ||
        request.busy_seconds_total() < signal.busy_seconds_total) {
      signal.window_set = false;  // the worker restarted
    }
    signal.elements_total = request.elements_total();
    signal.busy_seconds_total = request.busy_seconds_total();
    if (!signal.window_set) {
      signal.window_set = true;
      signal.window_elements = signal.elements_total;
      signal.window_busy = signal.busy_seconds_total;
    }
  }
  response->set_incarnation(incarnation_);
  if (!request.splits().empty()) {
    proto::Update update;
    proto::UpdateWorkerProgress* u = update.mutable_worker_progress();
    u->set_worker_id(request.worker_id());
    *u->mutable_splits() = request.splits();
    // Production counts are soft state (reported again every heartbeat); a split that
    // finished producing changes what a drain hands back, so that is journaled.
    bool finishes = false;
    for (const proto::WorkerSplitProgress& p : request.splits()) {
      const DispatcherState::Slot* slot =
          state_.FindSlot(SlotKey::FromProto(p.key()));
      finishes = finishes ||
                 (slot != nullptr && slot->worker_id == request.worker_id() &&
                  p.finished_producing() && !slot->finished_producing);
    }
    RETURN_IF_ERROR(finishes ? Commit(update) : ApplySoft(update));
  }
  const DispatcherState::Worker& worker =
      *state_.FindWorker(request.worker_id());
  // Whatever it reports but no longer holds: done, handed back, or its job is
  // gone.
  std::set<SlotKey> reported;
  for (const proto::WorkerSplitProgress& p : request.splits()) {
    reported.insert(SlotKey::FromProto(p.key()));
    if (!worker.slots.contains(SlotKey::FromProto(p.key())))
      *response->add_drop() = p.key();
  }
  // Whatever it holds but did not report (the response that assigned it was
  // lost, or the worker restarted its pipeline): handed back like a lost
  // worker's splits.
  proto::Update release;
  for (const SlotKey& key : worker.slots) {
    if (!reported.contains(key))
      *release.mutable_release_splits()->add_keys() = key.ToProto();
  }
  if (release.has_release_splits()) {
    release.mutable_release_splits()->set_worker_id(worker.id);
    logger_->warn(
        "worker {} no longer reports {} of its splits: they are handed back",
        worker.id, release.release_splits().keys_size());
    RETURN_IF_ERROR(Commit(release));
  }
  std::set<uint64_t> referenced_jobs;
  if (!worker.draining) {
    int in_production = 0;
    for (const SlotKey& key : worker.slots) {
      const DispatcherState::Slot* slot = state_.FindSlot(key);
      if (slot != nullptr && !slot->finished_producing) ++in_production;
    }
    RETURN_IF_ERROR(AssignSplits(
        worker.id, static_cast<int>(worker.capacity) - in_production,
        response));
    for (const proto::SplitAssignment& a : response->start())
      referenced_jobs.insert(a.key().job_id());
    // PARALLEL_EPOCHS: one task per (job, consumer) that the worker is not
    // running yet.
    std::set<std::pair<uint64_t, uint32_t>> running;
    for (const proto::ParallelTask& t : request.parallel_tasks()) {
      running.insert({t.job_id(), t.consumer_index()});
    }
    for (const auto& [job_id, job] : state_.jobs()) {
      if (job.config.mode() != proto::PROCESSING_MODE_PARALLEL_EPOCHS) continue;
      for (uint32_t c = 0; c < job.consumers.size(); ++c) {
        if (running.contains({job_id, c})) continue;
        proto::ParallelTask* t = response->add_start_parallel();
        t->set_job_id(job_id);
        t->set_consumer_index(c);
        referenced_jobs.insert(job_id);
      }
    }
  }
  const std::set<uint64_t> known(request.known_job_ids().begin(),
                                 request.known_job_ids().end());
  for (uint64_t job_id : referenced_jobs) {
    if (known.contains(job_id)) continue;
    FillJobInfo(*state_.FindJob(job_id), response->add_jobs());
  }
  // Jobs the worker caches that are over: it frees their pipelines, splits and queues.
  for (uint64_t job_id : known) {
    const DispatcherState::Job* job = state_.FindJob(job_id);
    if (job == nullptr || job->finished())
      response->add_finished_job_ids(job_id);
  }
  response->set_draining(worker.draining);
  response->set_may_exit(worker.draining && worker.slots.empty());
  return absl::OkStatus();
}

absl::Status DispatcherImpl::LoseWorker(uint64_t worker_id, const char* reason,
                                        const std::string& why) {
  const DispatcherState::Worker* worker = state_.FindWorker(worker_id);
  if (worker == nullptr) return absl::OkStatus();
  logger_->warn(
      "worker {} at {} {}: {} splits wait for their consumers' progress",
      worker_id, worker->address, why, worker->slots.size());
  proto::Update update;
  update.mutable_worker_lost()->set_worker_id(worker_id);
  RETURN_IF_ERROR(Commit(update));
  worker_signals_.erase(worker_id);
  workers_lost_.Add({{"reason", reason}}).Increment();
  UpdateGauges();
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoWorkerUnregister(
    const proto::WorkerUnregisterRequest& request,
    proto::WorkerUnregisterResponse* /*response*/) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  if (state_.FindWorker(request.worker_id()) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("worker ", request.worker_id(), " is not registered"));
  }
  return LoseWorker(request.worker_id(), "unregistered", "unregistered");
}

absl::Status DispatcherImpl::DoDrainWorker(
    const proto::DrainWorkerRequest& request,
    proto::DrainWorkerResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Worker* worker =
      state_.FindWorker(request.worker_id());
  if (worker == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("worker ", request.worker_id(), " is not registered"));
  }
  uint32_t handed_back = 0;
  for (const SlotKey& key : worker->slots) {
    const DispatcherState::Slot* slot = state_.FindSlot(key);
    if (slot != nullptr && !slot->finished_producing) ++handed_back;
  }
  proto::Update update;
  update.mutable_drain_worker()->set_worker_id(request.worker_id());
  RETURN_IF_ERROR(Commit(update));
  logger_->info("worker {} drains: {} splits handed back", request.worker_id(),
                handed_back);
  response->set_handed_back(handed_back);
  UpdateGauges();
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoGetJobState(
    const proto::GetJobStateRequest& request,
    proto::GetJobStateResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Job* job = state_.FindJob(request.job_id());
  if (job == nullptr)
    return absl::NotFoundError(
        absl::StrCat("job ", request.job_id(), " not found"));
  FillJobInfo(*job, response->mutable_job());
  for (const DispatcherState::Consumer& consumer : job->consumers) {
    proto::ConsumerState* c = response->add_consumers();
    c->set_consumer_index(consumer.index);
    c->set_epoch(consumer.epoch);
    c->set_finished(consumer.finished);
    for (uint64_t pos = 0; pos < consumer.slots.size(); ++pos) {
      const DispatcherState::Slot& slot = consumer.slots[pos];
      proto::SplitState* s = c->add_splits();
      s->set_position(pos);
      AddPieces(*job, slot.pieces, s->mutable_pieces());
      s->set_status(slot.status);
      s->set_worker_id(slot.worker_id);
      s->set_delivered_batches(slot.delivered_batches);
      s->set_produced_batches(slot.produced_batches);
      s->set_skip_batches(slot.skip_batches);
      s->set_assignments(slot.assignments);
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoTick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> expired;
  for (const auto& [id, worker] : state_.workers()) {
    auto it = worker_signals_.find(id);
    if (it == worker_signals_.end() ||
        now - it->second.last_seen >= options_.worker_timeout) {
      expired.push_back(id);
    }
  }
  for (uint64_t id : expired) {
    RETURN_IF_ERROR(LoseWorker(
        id, "timeout",
        absl::StrCat("sent no heartbeat for ",
                     absl::FormatDuration(options_.worker_timeout))));
  }
  RETURN_IF_ERROR(CollectJobs(now));
  if (last_decision_ == absl::InfinitePast() ||
      now - last_decision_ >= options_.scale_period) {
    RETURN_IF_ERROR(Autoscale(now));
  }
  UpdateGauges();
  return absl::OkStatus();
}

absl::Status DispatcherImpl::CollectJobs(absl::Time now) {
  std::vector<uint64_t> gone;
  for (const auto& [id, job] : state_.jobs()) {
    bool any_alive = false;
    for (const DispatcherState::Consumer& c : job.consumers) {
      auto it = consumer_signals_.find({id, c.index});
      // A consumer that never reported yet is given the timeout from the job's creation.
      if (it == consumer_signals_.end()) {
        consumer_signals_[{id, c.index}].last_report = now;
        any_alive = true;
        continue;
      }
      if (!c.finished &&
          now - it->second.last_report < options_.consumer_timeout)
        any_alive = true;
      if (c.finished &&
          now - it->second.last_report < options_.consumer_timeout / 4)
        any_alive =
            true;  // a finished consumer may still be reading its last batches
    }
    if (!any_alive) gone.push_back(id);
  }
  for (uint64_t id : gone) {
    logger_->info(
        "job {} '{}' collected: its consumers {} (no heartbeat for {})", id,
        state_.FindJob(id)->name,
        state_.FindJob(id)->finished() ? "finished" : "are gone",
        absl::FormatDuration(options_.consumer_timeout));
    RETURN_IF_ERROR(RemoveJob(id));
    jobs_collected_.Increment();
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::RemoveJob(uint64_t job_id) {
  proto::Update update;
  update.mutable_remove_job()->set_job_id(job_id);
  RETURN_IF_ERROR(Commit(update));
  for (auto it = consumer_signals_.begin(); it != consumer_signals_.end();) {
    it =
        it->first.first == job_id ? consumer_signals_.erase(it) : std::next(it);
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::CheckResizable(const DispatcherState::Job& job,
                                            uint64_t epoch) const {
  for (const DispatcherState::Consumer& c : job.consumers) {
    if (c.finished || c.epoch > epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", job.name, "' consumer ", c.index,
                       " is already past epoch ", epoch,
                       ": the checkpoint is older than the job; restore every "
                       "consumer from checkpoints of the same step"));
    }
    if (c.epoch < epoch) continue;
    for (const DispatcherState::Slot& slot : c.slots) {
      if (slot.delivered_batches > 0 ||
          slot.status == proto::SPLIT_STATUS_DONE) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job '", job.name, "' consumer ", c.index,
            " has returned batches of epoch ", epoch, " with ",
            job.config.num_consumers(),
            " consumers: the number of consumers can change only at an "
            "epoch boundary"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::RestoreConsumer(
    const DispatcherState::Job& job,
    const proto::ClientHeartbeatRequest& request) {
  const DispatcherState::Consumer& consumer =
      job.consumers[request.consumer_index()];
  const uint64_t epoch = request.restore_epoch();
  if (job.config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) {
    return absl::FailedPreconditionError(
        "only distributed-epoch jobs can be restored");
  }
  if (job.config.num_epochs() != 0 && epoch >= job.config.num_epochs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore_state is at epoch ", epoch, " but the job has ",
                     job.config.num_epochs(), " epochs"));
  }
  ASSIGN_OR_RETURN(std::vector<record::SlotPieces> slots,
                   DispatcherState::ConsumerSlots(job.config, job.splits,
                                                  consumer.index, epoch));
  std::map<uint64_t, const proto::ClientSplitProgress*> saved;
  for (const proto::ClientSplitProgress& p : request.progress()) {
    if (p.epoch() == epoch) saved[p.position()] = &p;
  }
  proto::Update update;
  proto::UpdateConsumerState* u = update.mutable_consumer_state();
  u->set_job_id(job.id);
  u->set_consumer_index(consumer.index);
  u->set_epoch(epoch);
  for (uint64_t pos = 0; pos < slots.size(); ++pos) {
    proto::SplitState* s = u->add_slots();
    s->set_position(pos);
    auto it = saved.find(pos);
    const uint64_t returned =
        it == saved.end() ? 0 : it->second->delivered_batches();
    s->set_delivered_batches(returned);
    if (it != saved.end() && it->second->complete()) {
      s->set_status(proto::SPLIT_STATUS_DONE);
      continue;
    }
    // A worker that still holds the split keeps it: the new process's stream tells it what
    // it holds, and it produces the split again from there. Anything else is produced anew.
    const DispatcherState::Slot* live =
        consumer.epoch == epoch && pos < consumer.slots.size()
            ? &consumer.slots[pos]
            : nullptr;
    if (live != nullptr && live->status == proto::SPLIT_STATUS_ASSIGNED) {
      s->set_status(proto::SPLIT_STATUS_ASSIGNED);
      s->set_worker_id(live->worker_id);
      s->set_skip_batches(live->skip_batches);
      s->set_produced_batches(live->produced_batches);
      s->set_finished_producing(live->finished_producing);
      s->set_assignments(live->assignments);
    } else {
      s->set_status(proto::SPLIT_STATUS_PENDING);
      s->set_skip_batches(returned);
      s->set_assignments(live != nullptr ? live->assignments : 0);
    }
  }
  logger_->info(
      "job {} consumer {} continues from a checkpoint at epoch {} ({} splits "
      "returned "
      "in part or whole)",
      job.id, consumer.index, epoch, saved.size());
  return Commit(update);
}

void DispatcherImpl::UpdateGauges() {
  int alive = 0;
  for (const auto& [id, worker] : state_.workers()) {
    if (!worker.draining) ++alive;
  }
  int active_jobs = 0;
  for (const auto& [id, job] : state_.jobs()) {
    if (!job.finished()) ++active_jobs;
  }
  // Until the first decision: the workers there are, within the bounds.
  const int desired =
      decided_ ? decision_.desired_workers
               : std::clamp(alive, static_cast<int>(options_.min_workers),
                            static_cast<int>(std::max(options_.min_workers,
                                                      options_.max_workers)));
  desired_workers_ = desired;
  desired_workers_gauge_.Set(desired);
  workers_alive_.Set(static_cast<double>(state_.workers().size()));
  jobs_active_.Set(active_jobs);
  std::set<std::string> live;
  for (const auto& [id, job] : state_.jobs()) {
    const double unfinished = static_cast<double>(std::count_if(
        job.consumers.begin(), job.consumers.end(),
        [](const DispatcherState::Consumer& c) { return !c.finished; }));
    MetricsFor(job).consumers->Set(unfinished);
    live.insert(JobLabel(job));
  }
  for (auto it = job_metrics_.begin(); it != job_metrics_.end();) {
    if (live.contains(it->first)) {
      ++it;
      continue;
    }
    // The job was collected: its series go, so they stay bounded.
    job_batches_returned_.Remove(it->second.batches_returned);
    job_consumer_wait_.Remove(it->second.consumer_wait);
    job_splits_reassigned_.Remove(it->second.splits_reassigned);
    job_consumers_.Remove(it->second.consumers);
    it = job_metrics_.erase(it);
  }
}

DispatcherImpl::JobMetrics& DispatcherImpl::MetricsFor(
    const DispatcherState::Job& job) {
  auto [it, inserted] = job_metrics_.try_emplace(JobLabel(job));
  if (inserted) {
    const MetricLabels labels = {{"sluice_job", it->first}};
    it->second.batches_returned = &job_batches_returned_.Add(labels);
    it->second.consumer_wait = &job_consumer_wait_.Add(labels);
    it->second.splits_reassigned = &job_splits_reassigned_.Add(labels);
    it->second.consumers = &job_consumers_.Add(labels);
  }
  return it->second;
}

absl::Status DispatcherImpl::Autoscale(absl::Time now) {
  AutoscalerInput in;
  in.now = now;
  in.starting_workers = starting_workers_;
  for (const auto& [id, worker] : state_.workers()) {
    WorkerSample w;
    w.worker_id = id;
    w.draining = worker.draining;
    w.held_splits = static_cast<int>(worker.slots.size());
    for (const SlotKey& key : worker.slots) {
      const DispatcherState::Slot* slot = state_.FindSlot(key);
      if (slot != nullptr && slot->produced_batches > slot->delivered_batches)
        w.undelivered_batches +=
            slot->produced_batches - slot->delivered_batches;
    }
    auto it = worker_signals_.find(id);
    if (it != worker_signals_.end()) {
      WorkerSignal& signal = it->second;
      w.registered = signal.registered;
      w.last_heartbeat = signal.last_seen;
      w.queue_depth = signal.queue_depth;
      w.queue_capacity = signal.queue_capacity;
      w.blocked_producers = static_cast<int>(signal.blocked_producers);
      // Capacity over the window; a window with too little busy time to
      // measure keeps the last value and stays open.
      const double busy = signal.busy_seconds_total - signal.window_busy;
      if (signal.window_set && busy >= 0.05) {
        signal.elements_per_busy_second =
            static_cast<double>(signal.elements_total -
                                signal.window_elements) /
            busy;
        signal.window_elements = signal.elements_total;
        signal.window_busy = signal.busy_seconds_total;
      }
      if (signal.elements_per_busy_second > 0)
        w.capacity.push_back(
            {.job_id = kAllJobs,
             .elements_per_busy_second = signal.elements_per_busy_second});
    }
    in.workers.push_back(std::move(w));
  }
  for (const auto& [id, job] : state_.jobs()) {
    if (job.finished()) continue;
    const DispatcherState::Dataset* dataset =
        state_.FindDataset(job.dataset_id);
    in.jobs.push_back(
        {.job_id = id,
         .batch_size = dataset != nullptr ? dataset->batch_size : uint64_t{1}});
    for (const DispatcherState::Consumer& c : job.consumers) {
      if (c.finished) continue;
      auto it = consumer_signals_.find({id, c.index});
      if (it == consumer_signals_.end()) continue;
      ConsumerSignal& signal = it->second;
      if (signal.window_start == absl::InfinitePast() ||
          now - signal.last_report >= options_.consumer_timeout) {
        continue;  // never reported, or gone
      }
      const double dt = absl::ToDoubleSeconds(now - signal.window_start);
      if (dt > 0 && signal.last_report > signal.window_start) {
        signal.batches_per_second =
            static_cast<double>(signal.batches_returned_total -
                                signal.window_batches) /
            dt;
        signal.window_wait_fraction = std::clamp(
            (signal.wait_seconds_total - signal.window_wait) / dt, 0.0, 1.0);
        signal.window_start = now;
        signal.window_batches = signal.batches_returned_total;
        signal.window_wait = signal.wait_seconds_total;
      }
      in.consumers.push_back({.job_id = id,
                              .consumer_index = c.index,
                              .batches_per_second = signal.batches_per_second,
                              .wait_fraction = signal.window_wait_fraction,
                              .epoch_started = signal.epoch_started});
    }
  }
  AutoscalerDecision decision = autoscaler_.Decide(in);
  if (!decided_ || decision.desired_workers != decision_.desired_workers) {
    logger_->info("autoscaler: {}", decision.reason);
  }
  decision_ = std::move(decision);
  decided_ = true;
  last_decision_ = now;
  if (options_.scaler == DispatcherOptions::Scaler::kLocal) {
    for (uint64_t id : decision_.drain) {
      const DispatcherState::Worker* worker = state_.FindWorker(id);
      if (worker == nullptr || worker->draining) continue;
      proto::Update update;
      update.mutable_drain_worker()->set_worker_id(id);
      RETURN_IF_ERROR(Commit(update));
      logger_->info("autoscaler drains worker {} at {}", id, worker->address);
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoGetStatus(const proto::GetStatusRequest& request,
                                         proto::GetStatusResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (request.starting_workers() >= 0)
    starting_workers_ = request.starting_workers();
  const AutoscalerOptions& scaler = autoscaler_.options();
  for (const auto& [id, worker] : state_.workers()) {
    proto::WorkerStatus* w = response->add_workers();
    w->set_worker_id(id);
    w->set_address(worker.address);
    w->set_splits(static_cast<uint32_t>(worker.slots.size()));
    std::string state = worker.draining ? "draining" : "active";
    auto it = worker_signals_.find(id);
    if (it != worker_signals_.end()) {
      const WorkerSignal& signal = it->second;
      if (!worker.draining && now - signal.last_seen > scaler.stale_after)
        state = "stalled";
      w->set_queue_depth(signal.queue_depth);
      w->set_queue_capacity(signal.queue_capacity);
      w->set_elements_per_second(signal.elements_per_second);
      w->set_elements_per_busy_second(signal.elements_per_busy_second);
      if (signal.registered != absl::InfinitePast())
        w->set_age_seconds(absl::ToDoubleSeconds(now - signal.registered));
    }
    w->set_state(state);
  }
  int alive = 0;
  for (const auto& [id, worker] : state_.workers()) {
    if (!worker.draining) ++alive;
  }
  response->set_desired_workers(desired_workers_);
  response->set_current_workers(decided_ ? decision_.current_workers
                                         : alive + starting_workers_);
  response->set_reason(decided_ ? decision_.reason : "no decision yet");
  response->set_scaler(
      options_.scaler == DispatcherOptions::Scaler::kLocal ? "local" : "none");
  for (uint64_t id : decision_.drain) response->add_drain(id);
  response->set_min_workers(options_.min_workers);
  response->set_max_workers(options_.max_workers);
  for (const auto& [id, job] : state_.jobs()) {
    proto::JobStatus* j = response->add_jobs();
    j->set_job_id(id);
    j->set_job_name(job.name);
    const DispatcherState::Dataset* dataset =
        state_.FindDataset(job.dataset_id);
    j->set_batch_size(dataset != nullptr ? dataset->batch_size : 0);
    j->set_num_epochs(job.config.num_epochs());
    for (const JobEstimate& e : decision_.jobs) {
      if (e.job_id != id) continue;
      j->set_demand_elements_per_second(e.demand);
      j->set_capacity_elements_per_second(e.capacity);
      j->set_need_workers(e.need);
    }
    for (const DispatcherState::Consumer& c : job.consumers) {
      proto::ConsumerStatus* cs = j->add_consumers();
      cs->set_consumer_index(c.index);
      cs->set_epoch(c.epoch);
      cs->set_finished(c.finished);
      cs->set_splits_done(c.done);
      cs->set_splits(c.slots.size());
      auto it = consumer_signals_.find({id, c.index});
      if (it != consumer_signals_.end()) {
        cs->set_batches_per_second(it->second.batches_per_second);
        cs->set_wait_fraction(it->second.window_wait_fraction);
      }
    }
  }
  return absl::OkStatus();
}

int DispatcherImpl::desired_workers() const {
  absl::MutexLock lock(&mu_);
  return desired_workers_;
}

}  // namespace sluice::dispatcher
