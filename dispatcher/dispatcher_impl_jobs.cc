// DispatcherImpl, continued: datasets, jobs and consumers (registration, the
// consumer heartbeat, job state for resume, resizing at an epoch boundary,
// collection of finished jobs). The protocol is in dispatcher_impl.h.

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"
#include "common/service/identity.h"
#include "dispatcher/dispatcher_impl.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace sluice::dispatcher {
namespace {

// A job config's settings, in order, as (name, value).
std::vector<std::pair<std::string, std::string>> Settings(const proto::JobConfig& c) {
  const auto on_off = [](bool on) { return on ? "auto" : "off"; };
  return {{"mode", proto::ProcessingMode_Name(c.mode())},
          {"seed", absl::StrCat(c.seed())},
          {"epochs", absl::StrCat(c.num_epochs())},
          {"consumers", absl::StrCat(c.num_consumers())},
          {"deterministic", c.deterministic() ? "true" : "false"},
          {"remainder", proto::RemainderMode_Name(c.remainder())},
          {"split_size", absl::StrCat(c.split_size())},
          {"priority", absl::StrCat(c.priority())},
          {"min_workers", absl::StrCat(c.min_workers())},
          {"sharing", on_off(c.sharing() == proto::SHARING_MODE_AUTO)},
          {"cache", on_off(c.cache() == proto::CACHE_MODE_AUTO)},
          {"slots_follow_splits", c.slots_follow_splits() ? "true" : "false"}};
}

// "{mode PROCESSING_MODE_DISTRIBUTED_EPOCH, seed 1, ...}"
std::string ConfigString(const proto::JobConfig& c) {
  std::string out = "{";
  for (const auto& [name, value] : Settings(c)) {
    absl::StrAppend(&out, out.size() > 1 ? ", " : "", name, " ", value);
  }
  return out + "}";
}

// The settings that differ from `was` to `now`: "min_workers 0 -> 3, priority 0 -> 5" (in
// Settings' order).
std::string DifferingSettings(const proto::JobConfig& was, const proto::JobConfig& now) {
  const auto a = Settings(was);
  const auto b = Settings(now);
  std::string out;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].second == b[i].second) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", a[i].first, " ", a[i].second, " -> ",
                    b[i].second);
  }
  return out;
}

record::RemainderPolicy Remainder(const proto::JobConfig& c) {
  return c.remainder() == proto::REMAINDER_MODE_DROP ? record::RemainderPolicy::kDrop
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
  const uint64_t share = record::ShareSize(records, c.num_consumers(), Remainder(c));
  response->set_records_per_consumer(share);
  response->set_splits_per_consumer((share + c.split_size() - 1) / c.split_size());
}

// Records per split (and per slot): the requested size rounded to whole batches; by default
// (requested 0) `default_size`, made smaller for small shares so that each consumer gets about
// kMinSlotsPerConsumer slots (dynamic balancing across workers needs several), never below
// one batch.
constexpr uint64_t kMinSlotsPerConsumer = 4;
// The most records a dataset may have (2^48): more is a forged count, not a dataset.
constexpr uint64_t kMaxDatasetRecords = uint64_t{1} << 48;

uint64_t SplitSize(uint64_t requested, uint64_t default_size, uint64_t batch, uint64_t share) {
  if (requested == 0) {
    requested = std::min(default_size, share / kMinSlotsPerConsumer);
    return std::max<uint64_t>(1, requested / batch) * batch;
  }
  return std::max<uint64_t>(1, (requested + batch / 2) / batch) * batch;
}

void AddPieces(const DispatcherState::Job& job, const record::SlotPieces& pieces,
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
proto::JobConfig WithWorldSizeOf(proto::JobConfig config, const proto::JobConfig& other) {
  config.set_num_consumers(other.num_consumers());
  config.set_split_size(other.split_size());
  return config;
}

// The value of the per-job series' sluice_job label.

bool SameConfig(const proto::JobConfig& a, const proto::JobConfig& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

}  // namespace

uint64_t ShareGroupOf(const DispatcherState::Job& job) {
  const proto::JobConfig& c = job.config;
  // A job resumed mid-epoch on another number of consumers reads other slots (batch ranges of
  // the old layout) in that epoch: it does not share.
  if (c.sharing() != proto::SHARING_MODE_AUTO ||
      c.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH || job.resized.has_value()) {
    return 0;
  }
  const std::string what =
      absl::StrCat("dataset ", job.dataset_id, " seed ", c.seed(), " consumers ", c.num_consumers(),
                   " split_size ", c.split_size(), " remainder ", static_cast<int>(c.remainder()));
  const uint64_t group = record::Checksum(what);
  return group != 0 ? group : 1;
}

absl::Status DispatcherImpl::CheckDatasetRequest(
    const proto::RegisterDatasetRequest& request) const {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  // The spec's size is limited before anything else; its nodes are counted when it parses as a
  // pipeline (what clients send). Workers check both again, and validate the spec.
  if (absl::Status s = service::CheckPipelineBytes(static_cast<int64_t>(request.pipeline().size()),
                                                   options_.limits);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterDataset: ", s.message()));
  }
  if (proto::Pipeline parsed; parsed.ParseFromString(request.pipeline())) {
    if (absl::Status s = service::CheckPipelineLimits(parsed, options_.limits); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("RegisterDataset: ", s.message()));
    }
  }
  if (request.pipeline().empty()) {
    return absl::InvalidArgumentError("RegisterDataset: pipeline is empty");
  }
  if (request.batch_size() == 0) {
    return absl::InvalidArgumentError("RegisterDataset: batch_size must be > 0");
  }
  uint64_t records = 0;
  for (uint64_t n : request.shard_record_counts()) {
    if (n > kMaxDatasetRecords - records) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterDataset: shard_record_counts add up to more than ", kMaxDatasetRecords,
          " records, which no dataset has: send the counts the worker's "
          "DescribeDataset reports"));
    }
    records += n;
  }
  if (records == 0) {
    return absl::InvalidArgumentError(
        "RegisterDataset: shard_record_counts add up to 0 records (empty "
        "dataset?)");
  }
  return absl::OkStatus();
}

uint64_t DispatcherImpl::FindSameDataset(const proto::RegisterDatasetRequest& request) {
  const uint64_t fingerprint = record::Checksum(request.pipeline());
  const std::vector<uint64_t> counts(request.shard_record_counts().begin(),
                                     request.shard_record_counts().end());
  for (const auto& [id, d] : state_.datasets()) {
    if (d.fingerprint == fingerprint && d.pipeline == request.pipeline() &&
        d.shard_record_counts == counts && d.batch_size == request.batch_size()) {
      dataset_used_[id] = clock_->Now();
      return id;
    }
  }
  return 0;
}

absl::Status DispatcherImpl::DoRegisterDataset(const proto::RegisterDatasetRequest& request,
                                               proto::RegisterDatasetResponse* response) {
  RETURN_IF_ERROR(CheckDatasetRequest(request));
  const uint64_t fingerprint = record::Checksum(request.pipeline());
  const std::vector<uint64_t> counts(request.shard_record_counts().begin(),
                                     request.shard_record_counts().end());
  const uint64_t records = TotalRecords(counts);
  absl::MutexLock lock(&mu_);
  if (const uint64_t id = FindSameDataset(request); id != 0) {
    response->set_dataset_id(id);
    response->set_fingerprint(fingerprint);
    return absl::OkStatus();
  }
  proto::Update update;
  proto::UpdateRegisterDataset* u = update.mutable_register_dataset();
  u->set_dataset_id(state_.NextDatasetId());
  u->set_fingerprint(fingerprint);
  u->set_pipeline(request.pipeline());
  *u->mutable_shard_record_counts() = request.shard_record_counts();
  u->set_batch_size(request.batch_size());
  RETURN_IF_ERROR(Commit(update));
  dataset_used_[u->dataset_id()] = clock_->Now();
  logger_->info("registered dataset {} ({} shards, {} records, batch {}, fingerprint {})",
                u->dataset_id(), counts.size(), records, request.batch_size(),
                record::ChecksumHex(fingerprint));
  response->set_dataset_id(u->dataset_id());
  response->set_fingerprint(fingerprint);
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoGetOrCreateJob(const proto::GetOrCreateJobRequest& request,
                                              proto::GetOrCreateJobResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  response->set_restore_ranges(true);
  absl::MutexLock lock(&mu_);
  const DispatcherState::Dataset* dataset = state_.FindDataset(request.dataset_id());
  if (dataset == nullptr) {
    return absl::NotFoundError(absl::StrCat("dataset ", request.dataset_id(),
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
  if (config.sharing() == proto::SHARING_MODE_AUTO &&
      config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) {
    return absl::InvalidArgumentError(
        "sharing auto needs processing mode DISTRIBUTED_EPOCH (a PARALLEL_EPOCHS job walks "
        "the dataset for each consumer on its own): set sharing off or change the mode");
  }
  RETURN_IF_ERROR(service::CheckConsumerLimit(config.num_consumers(), options_.limits));
  if (config.min_workers() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    // The allocation counts workers in an int: a larger reservation cannot be what it asks.
    return absl::InvalidArgumentError(absl::StrCat("min_workers ", config.min_workers(),
                                                   " is more than ",
                                                   std::numeric_limits<int32_t>::max()));
  }
  const uint64_t records = TotalRecords(dataset->shard_record_counts);
  const uint64_t share = record::ShareSize(records, config.num_consumers(), Remainder(config));
  if (config.mode() == proto::PROCESSING_MODE_DISTRIBUTED_EPOCH && share == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset has ", records, " records, fewer than the ", config.num_consumers(),
        " consumers: with remainder DROP some consumer gets nothing; use "
        "remainder PAD or fewer consumers"));
  }
  config.set_split_size(
      SplitSize(config.split_size(), options_.default_split_size, dataset->batch_size, share));
  {
    // A cache node writes whole splits: slots must not span two (docs/cache.md).
    proto::Pipeline pipeline;
    // So does `cache: auto`, which may place one from the second epoch.
    config.set_slots_follow_splits(
        config.mode() == proto::PROCESSING_MODE_DISTRIBUTED_EPOCH &&
        pipeline.ParseFromString(dataset->pipeline) &&
        (config.cache() == proto::CACHE_MODE_AUTO ||
         pipeline_spec::CacheKeyOf(pipeline, config.split_size()).has_value()));
  }
  uint64_t first_epoch = 0;  // a job replaced at an epoch boundary continues there
  // A mid-epoch resume on another number of consumers (or a restore inside such an epoch).
  std::optional<proto::ResizedEpoch> resized;
  if (request.resize_from_size() > 0) {
    ASSIGN_OR_RETURN(resized, PlanResize(request, *dataset, &config));
  } else if (request.has_restore_layout()) {
    resized = request.restore_layout();
  }
  if (resized.has_value()) {
    if (config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) {
      return absl::FailedPreconditionError(
          "only distributed-epoch jobs resume on another number of consumers");
    }
    if (config.num_epochs() != 0 && resized->epoch() >= config.num_epochs()) {
      return absl::InvalidArgumentError(absl::StrCat("the restored states are at epoch ",
                                                     resized->epoch(), " but the job has ",
                                                     config.num_epochs(), " epochs"));
    }
    first_epoch = resized->epoch();
    if (const DispatcherState::Job* job = state_.FindJobByName(request.job_name());
        job != nullptr) {
      const bool same_set = job->resized.has_value() && job->resized->digest() == resized->digest();
      // The states were saved by this job (its consumers' leases still run): they replace it.
      const bool saved_by_it =
          request.resize_from_size() > 0 && job->dataset_id == request.dataset_id() &&
          job->config.num_consumers() == resized->from_consumers() &&
          (!job->resized.has_value() ||
           job->resized->digest() == request.resize_from(0).resized().digest());
      if (same_set) {
        // Another consumer of the resumed job: it attaches below.
      } else if (saved_by_it) {
        logger_->info("job {} '{}' continues mid-epoch {} with {} consumers instead of {}", job->id,
                      job->name, resized->epoch(), config.num_consumers(),
                      job->config.num_consumers());
        RETURN_IF_ERROR(RemoveJob(job->id));
      } else if (job->resized.has_value()) {
        return absl::FailedPreconditionError(ResizeMismatch(*job, *resized));
      } else {
        return absl::FailedPreconditionError(
            absl::StrCat("job '", request.job_name(), "' exists with ", job->config.num_consumers(),
                         " consumers and was not resumed from the states this consumer restores: "
                         "restore every consumer from the same states, or use another job name"));
      }
    }
  }

  if (const DispatcherState::Job* job = state_.FindJobByName(request.job_name()); job != nullptr) {
    if (request.restore_at_boundary() && job->dataset_id == request.dataset_id() &&
        job->config.num_consumers() != config.num_consumers() &&
        SameConfig(WithWorldSizeOf(job->config, config), config)) {
      // The world size changes at an epoch boundary: a new job of this name continues (new
      // id, so no worker can mistake a batch of the old layout for one of the new); its
      // consumers restore to the boundary epoch.
      RETURN_IF_ERROR(CheckResizable(*job, request.restore_epoch()));
      logger_->info("job {} '{}' continues at epoch {} with {} consumers instead of {}", job->id,
                    job->name, request.restore_epoch(), config.num_consumers(),
                    job->config.num_consumers());
      RETURN_IF_ERROR(RemoveJob(job->id));
      first_epoch = request.restore_epoch();
    }
  }
  if (const DispatcherState::Job* job = state_.FindJobByName(request.job_name()); job != nullptr) {
    if (job->dataset_id != request.dataset_id() || !SameConfig(job->config, config)) {
      std::string differs = DifferingSettings(job->config, config);
      if (job->dataset_id != request.dataset_id()) {
        differs = absl::StrCat("dataset ", job->dataset_id, " -> ", request.dataset_id(),
                               differs.empty() ? "" : ", ", differs);
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", request.job_name(), "' exists with dataset ", job->dataset_id, " and config ",
          ConfigString(job->config), "; this request has dataset ", request.dataset_id(),
          " and config ", ConfigString(config), differs.empty() ? "" : " (" + differs + ")",
          ": use another job name or the same settings"));
    }
    response->set_job_id(job->id);
    response->set_created(false);
    response->set_already_finished(job->finished());
    *response->mutable_config() = job->config;
    if (job->resized.has_value()) *response->mutable_resized() = *job->resized;
    SetShares(job->config, records, job->splits.size(), response);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(
      service::CheckJobLimit(static_cast<int64_t>(state_.jobs().size()), options_.limits));
  if (const std::string owner = service::JobOwner(request.job_name()); !owner.empty()) {
    int64_t held = 0;
    for (const auto& [id, job] : state_.jobs()) {
      if (service::JobOwner(job.name) == owner) ++held;
    }
    RETURN_IF_ERROR(service::CheckPerIdentityLimit(
        owner, held, options_.limits.max_jobs_per_identity, "jobs", "--max-jobs-per-identity"));
  }
  RETURN_IF_ERROR(service::CheckSplitLimit(
      record::CountSplits(dataset->shard_record_counts, config.split_size()), config.split_size(),
      options_.limits));
  ASSIGN_OR_RETURN(std::vector<record::Split> splits,
                   record::EnumerateSplits(dataset->shard_record_counts, config.split_size()));
  proto::Update update;
  proto::UpdateCreateJob* u = update.mutable_create_job();
  u->set_job_id(state_.NextJobId());
  u->set_job_name(request.job_name());
  u->set_dataset_id(request.dataset_id());
  *u->mutable_config() = config;
  u->set_first_epoch(first_epoch);
  if (resized.has_value()) *u->mutable_resized() = *resized;
  RETURN_IF_ERROR(Commit(update));
  if (resized.has_value()) {
    *response->mutable_resized() = *resized;
    logger_->info(
        "job {} '{}' continues epoch {} with {} consumers over what {} consumers had "
        "not returned",
        u->job_id(), request.job_name(), resized->epoch(), config.num_consumers(),
        resized->from_consumers());
  }
  RETURN_IF_ERROR(CreateCache(*state_.FindJob(u->job_id())));
  logger_->info(
      "created job {} '{}' on dataset {}: {} ({} splits, {} records per "
      "consumer)",
      u->job_id(), request.job_name(), request.dataset_id(), ConfigString(config), splits.size(),
      share);
  response->set_job_id(u->job_id());
  response->set_created(true);
  *response->mutable_config() = config;
  SetShares(config, records, splits.size(), response);
  UpdateGauges();
  return absl::OkStatus();
}

proto::SplitAssignment DispatcherImpl::MakeAssignment(const DispatcherState::Job& job,
                                                      const SlotKey& key) const {
  proto::SplitAssignment a;
  *a.mutable_key() = key.ToProto();
  const DispatcherState::Slot* slot = state_.FindSlot(key);
  if (slot == nullptr) return a;
  AddPieces(job, slot->pieces, a.mutable_pieces());
  a.set_first_batch(slot->first_batch);
  a.set_end_batch(slot->end_batch);
  return a;
}

absl::Status DispatcherImpl::DoClientHeartbeat(const proto::ClientHeartbeatRequest& request,
                                               proto::ClientHeartbeatResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Job* job = state_.FindJob(request.job_id());
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(),
                                            " not found (dispatcher restarted without its "
                                            "journal?): call GetOrCreateJob again"));
  }
  if (request.consumer_index() >= job->consumers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("consumer_index ", request.consumer_index(),
                                                   " must be < num_consumers ",
                                                   job->consumers.size(), " of job ", job->id));
  }
  RETURN_IF_ERROR(CheckConsumerOwner(*job, request));
  // Signals for the autoscaler.
  const absl::Time now = clock_->Now();
  ConsumerSignal& signal = consumer_signals_[{job->id, request.consumer_index()}];
  double wait_delta = request.wait_seconds_total() - signal.wait_seconds_total;
  if (wait_delta < 0) wait_delta = request.wait_seconds_total();  // the client restarted
  DispatcherMetrics::JobSeries& job_metrics = metrics_.ForJob(job->id, job->name);
  if (wait_delta > 0) {
    metrics_.consumer_wait.Increment(wait_delta);
    job_metrics.consumer_wait->Increment(wait_delta);
  }
  const uint64_t batches_delta =
      request.batches_returned_total() >= signal.batches_returned_total
          ? request.batches_returned_total() - signal.batches_returned_total
          : request.batches_returned_total();  // the client restarted
  job_metrics.batches_returned->Increment(static_cast<double>(batches_delta));
  // Elements (images) at the dataset's batch size: an epoch's last, smaller batch counts full.
  if (const DispatcherState::Dataset* dataset = state_.FindDataset(job->dataset_id)) {
    job_metrics.elements_returned->Increment(
        static_cast<double>(batches_delta * dataset->batch_size));
  }
  if (batches_delta > 0 || wait_delta > 0 || signal.last_active == absl::InfinitePast()) {
    signal.last_active = now;
  } else {
    signal.window_longest_idle =
        std::max(signal.window_longest_idle, absl::ToDoubleSeconds(now - signal.last_active));
  }
  if (signal.last_report != absl::InfinitePast() && now > signal.last_report) {
    signal.wait_fraction =
        std::clamp(wait_delta / absl::ToDoubleSeconds(now - signal.last_report), 0.0, 1.0);
  }
  signal.wait_seconds_total = request.wait_seconds_total();
  signal.buffer_fill = request.buffer_fill();
  // Back after a silence or a leave (LiveConsumer): its rates are read from this report on,
  // not averaged over the time it was away.
  if (signal.left || (signal.last_report != absl::InfinitePast() &&
                      now - signal.last_report >= ConsumerSilence())) {
    signal.window_start = absl::InfinitePast();
  }
  signal.last_report = now;
  if (request.batches_returned_total() < signal.batches_returned_total) {
    signal.window_batches = 0;  // the client restarted
    signal.window_wait = 0;
  }
  // The consumer's first batch: its other splits may go out now (Assignable).
  if (signal.batches_returned_total == 0 && request.batches_returned_total() > 0)
    recheck_watches_.store(true);
  signal.batches_returned_total = request.batches_returned_total();
  if (signal.window_start == absl::InfinitePast()) {
    signal.window_start = now;
    signal.window_batches = request.batches_returned_total();
    signal.window_wait = request.wait_seconds_total();
  }

  if (request.restore()) RETURN_IF_ERROR(RestoreConsumer(*job, request));
  const DispatcherState::Consumer& consumer = job->consumers[request.consumer_index()];
  if (!consumer.slots.empty()) {
    int newly_done = 0;
    const bool awaiting = !consumer.awaiting.empty() ||
                          (consumer.next != nullptr && !consumer.next->awaiting.empty());
    for (const proto::ClientSplitProgress& p : request.progress()) {
      const DispatcherState::Slot* slot =
          state_.FindSlot({job->id, consumer.index, p.epoch(), p.position()});
      if (p.complete() && slot != nullptr && slot->status != proto::SPLIT_STATUS_DONE) ++newly_done;
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
    if (newly_done > 0) metrics_.splits_done.Increment(newly_done);
  }
  // `job`/`consumer` stay valid: only Tick() and a leaving report (at the end) remove jobs.
  if (consumer.epoch > signal.epoch) {
    signal.epoch = consumer.epoch;
    // The autoscaler's epoch grace.
    signal.previous_epoch_seconds = signal.epoch_started == absl::InfinitePast()
                                        ? 0
                                        : absl::ToDoubleSeconds(now - signal.epoch_started);
    signal.epoch_started = now;
  }
  response->set_incarnation(incarnation_);
  response->set_epoch(consumer.epoch);
  response->set_finished(consumer.finished);
  AddDonePositions(request, consumer, response);
  // The two long lists only when the client does not hold them already.
  response->set_splits_version(SplitsVersion(job->id, consumer));
  if (request.splits_count_only()) {
    response->set_num_splits(consumer.slots.size());
  } else if (request.splits_version() != response->splits_version()) {
    response->mutable_splits()->Reserve(static_cast<int>(consumer.slots.size()));
    for (uint64_t pos = 0; pos < consumer.slots.size(); ++pos) {
      *response->add_splits() =
          MakeAssignment(*job, {job->id, consumer.index, consumer.epoch, pos});
    }
  }
  response->set_tasks_version(TasksVersion());
  if (request.tasks_version() != response->tasks_version()) {
    response->mutable_tasks()->Reserve(static_cast<int>(state_.workers().size()));
    for (const auto& [id, worker] : state_.workers()) {
      proto::Task* task = response->add_tasks();
      task->set_worker_id(id);
      task->set_address(worker.address);
    }
  }
  // A closed iterator: the job goes now if nobody else is there (its splits free the workers).
  signal.left = request.leaving();
  if (request.leaving() && !AnyConsumerPresent(*job, now)) {
    logger_->info(
        "job {} '{}' collected: consumer {} closed its iterator and no other "
        "consumer is there",
        job->id, job->name, request.consumer_index());
    metrics_.jobs_collected.Increment();
    RETURN_IF_ERROR(RemoveJob(job->id));
  }
  return absl::OkStatus();
}

void DispatcherImpl::AddDonePositions(const proto::ClientHeartbeatRequest& request,
                                      const DispatcherState::Consumer& consumer,
                                      proto::ClientHeartbeatResponse* response) const {
  const uint64_t n = consumer.slots.size();
  for (uint64_t pos = 0; pos < n; ++pos) {
    if (consumer.slots[pos].status != proto::SPLIT_STATUS_DONE) continue;
    if (!request.done_as_ranges()) {
      response->add_done_positions(pos);
      continue;
    }
    const uint64_t begin = pos;
    while (pos + 1 < n && consumer.slots[pos + 1].status == proto::SPLIT_STATUS_DONE) ++pos;
    response->add_done_ranges(begin);
    response->add_done_ranges(pos + 1);
  }
}

absl::Status DispatcherImpl::CheckConsumerOwner(const DispatcherState::Job& job,
                                                const proto::ClientHeartbeatRequest& request) {
  if (request.consumer_token() == 0) return absl::OkStatus();
  uint64_t& owner = consumer_owners_[{job.id, request.consumer_index()}];
  if (request.claim() || owner == 0) {
    if (owner != 0 && owner != request.consumer_token()) {
      logger_->warn(
          "job {} '{}' consumer {} claimed by another process: the previous "
          "one is fenced off",
          job.id, job.name, request.consumer_index());
    }
    owner = request.consumer_token();
    return absl::OkStatus();
  }
  if (owner == request.consumer_token()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("consumer ", request.consumer_index(), " of job '", job.name,
                   "' was claimed by another process (a second trainer started with the "
                   "same consumer index, or a restart of this one): this process is fenced "
                   "off and stops here; give every trainer its own consumer index"));
}

absl::Status DispatcherImpl::DoGetJobState(const proto::GetJobStateRequest& request,
                                           proto::GetJobStateResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Job* job = state_.FindJob(request.job_id());
  if (job == nullptr)
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  FillJobInfo(*job, response->mutable_job());
  for (const DispatcherState::Consumer& consumer : job->consumers) {
    proto::ConsumerState* c = response->add_consumers();
    c->set_consumer_index(consumer.index);
    c->set_epoch(consumer.epoch);
    c->set_finished(consumer.finished);
    for (uint64_t pos = 0; pos < consumer.slots.size(); ++pos) {
      const DispatcherState::Slot& slot = consumer.slots[pos];
      proto::SplitState* s = c->add_splits();
      slot.ToProto(pos, s);
      AddPieces(*job, slot.pieces, s->mutable_pieces());
      s->set_first_batch(slot.first_batch);
      s->set_end_batch(slot.end_batch);
    }
  }
  return absl::OkStatus();
}

bool DispatcherImpl::AnyConsumerPresent(const DispatcherState::Job& job, absl::Time now) {
  bool any_alive = false;
  for (const DispatcherState::Consumer& c : job.consumers) {
    auto it = consumer_signals_.find({job.id, c.index});
    // A consumer that never reported yet is given the timeout from the job's creation.
    if (it == consumer_signals_.end()) {
      consumer_signals_[{job.id, c.index}].last_report = now;
      any_alive = true;
      continue;
    }
    // A consumer that closed its iterator before the end is away at once (its job's splits free
    // the workers); a finished one stays present for a quarter of the timeout like before, so
    // that its job's series are still scraped after the end.
    if (it->second.left && !c.finished) continue;
    if (!c.finished && now - it->second.last_report < options_.consumer_timeout) any_alive = true;
    if (c.finished && now - it->second.last_report < options_.consumer_timeout / 4)
      any_alive = true;  // a finished consumer may still be reading its last batches
  }
  return any_alive;
}

absl::Status DispatcherImpl::CollectJobs(absl::Time now) {
  std::vector<uint64_t> gone;
  for (const auto& [id, job] : state_.jobs()) {
    if (!AnyConsumerPresent(job, now)) gone.push_back(id);
  }
  for (uint64_t id : gone) {
    logger_->info("job {} '{}' collected: its consumers {} (no heartbeat for {})", id,
                  state_.FindJob(id)->name,
                  state_.FindJob(id)->finished() ? "finished" : "are gone",
                  absl::FormatDuration(options_.consumer_timeout));
    RETURN_IF_ERROR(RemoveJob(id));
    metrics_.jobs_collected.Increment();
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::RemoveJob(uint64_t job_id) {
  if (const DispatcherState::Job* job = state_.FindJob(job_id))
    dataset_used_[job->dataset_id] = clock_->Now();
  proto::Update update;
  update.mutable_remove_job()->set_job_id(job_id);
  RETURN_IF_ERROR(Commit(update));
  for (auto it = consumer_signals_.begin(); it != consumer_signals_.end();) {
    it = it->first.first == job_id ? consumer_signals_.erase(it) : std::next(it);
  }
  consumer_owners_.erase(consumer_owners_.lower_bound({job_id, 0}),
                         consumer_owners_.lower_bound({job_id + 1, 0}));
  return absl::OkStatus();
}

absl::StatusOr<proto::ResizedEpoch> DispatcherImpl::PlanResize(
    const proto::GetOrCreateJobRequest& request, const DispatcherState::Dataset& dataset,
    proto::JobConfig* config) const {
  const auto& states = request.resize_from();
  const uint32_t n = static_cast<uint32_t>(states.size());
  const proto::ConsumerCheckpoint& first = states[0];
  std::vector<const proto::ConsumerCheckpoint*> by_index(n, nullptr);
  for (const proto::ConsumerCheckpoint& s : states) {
    auto differs = [&](const char* what) {
      return absl::InvalidArgumentError(
          absl::StrCat("the restored states differ in ", what, " (consumer ",
                       first.consumer_index(), "'s and consumer ", s.consumer_index(),
                       "'s): pass the states every consumer of one job saved at the same step"));
    };
    if (s.job_name() != request.job_name()) {
      return absl::InvalidArgumentError(absl::StrCat("a restored state belongs to job '",
                                                     s.job_name(), "', not job '",
                                                     request.job_name(), "'"));
    }
    if (s.num_consumers() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("the restored states were saved by ", s.num_consumers(), " consumers but ",
                       n, " were given: pass the states of all old consumers"));
    }
    if (s.consumer_index() >= n || by_index[s.consumer_index()] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the state of consumer ", s.consumer_index(),
                       " is given twice or is out of range: pass one state per old consumer"));
    }
    by_index[s.consumer_index()] = &s;
    if (s.epoch() != first.epoch()) return differs("epoch");
    if (s.finished() != first.finished()) return differs("being finished");
    if (s.job_fingerprint() != first.job_fingerprint()) return differs("job fingerprint");
    if (s.split_size() != first.split_size()) return differs("split size");
    if (s.resized().SerializeAsString() != first.resized().SerializeAsString())
      return differs("the re-partition they continue");
  }
  if (first.finished()) {
    return absl::FailedPreconditionError(
        "the restored states are of a finished job: nothing remains to read");
  }
  const uint64_t records = TotalRecords(dataset.shard_record_counts);
  // The old layout's records per slot: as saved, else what the dispatcher gave N consumers.
  const uint64_t old_split_size =
      first.split_size() != 0 ? first.split_size()
                              : SplitSize(0, options_.default_split_size, dataset.batch_size,
                                          record::ShareSize(records, n, Remainder(*config)));
  config->set_split_size(old_split_size);
  ASSIGN_OR_RETURN(std::vector<record::Split> splits,
                   record::EnumerateSplits(dataset.shard_record_counts, old_split_size));
  Layout old;
  if (first.has_resized()) {
    if (LayoutConsumers(first.resized()) != n || first.resized().epoch() != first.epoch()) {
      return absl::InvalidArgumentError(
          "the restored states carry a re-partitioned layout of another epoch or size");
    }
    ASSIGN_OR_RETURN(
        old, DispatcherState::ResizedLayout(first.resized(), *config, splits, dataset.batch_size));
  } else {
    proto::JobConfig old_config = *config;
    old_config.set_num_consumers(n);
    for (uint32_t k = 0; k < n; ++k) {
      ASSIGN_OR_RETURN(std::vector<record::SlotPieces> pieces,
                       DispatcherState::ConsumerSlots(old_config, splits, k, first.epoch()));
      std::vector<SlotSource>& slots = old.emplace_back();
      for (record::SlotPieces& p : pieces) slots.push_back({.pieces = std::move(p)});
    }
  }
  Returned returned(n);
  proto::ResizedEpoch out;
  out.set_epoch(first.epoch());
  out.set_from_consumers(n);
  out.set_num_consumers(config->num_consumers());
  if (first.has_resized()) *out.mutable_previous() = first.resized();
  for (uint32_t k = 0; k < n; ++k) {
    const proto::ConsumerCheckpoint& state = *by_index[k];
    std::map<uint64_t, ReturnedSlot>& r = returned[k];
    // Slots returned whole, as runs (a state of this version), then one by one (partly
    // returned ones, and every slot in a state of an older version).
    const auto& ranges = state.complete_ranges();
    uint64_t floor = 0;
    if (ranges.size() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("the restored state of consumer ", k,
                                                     " has complete ranges that are not pairs"));
    }
    for (int i = 0; i < ranges.size(); i += 2) {
      if (ranges[i] < floor || ranges[i + 1] <= ranges[i] || ranges[i + 1] > old[k].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the restored state of consumer ", k, " has complete range [", ranges[i], ", ",
            ranges[i + 1], "), not ascending or past its ", old[k].size(), " slots"));
      }
      floor = ranges[i + 1];
      for (uint64_t p = ranges[i]; p < ranges[i + 1]; ++p)
        r.emplace_hint(r.end(), p, ReturnedSlot{.complete = true});
    }
    uint64_t total = state.complete_batches();
    for (const proto::ClientSplitProgress& p : state.splits()) {
      if (p.epoch() != first.epoch()) continue;
      r[p.position()] = {.batches = p.delivered_batches(), .complete = p.complete()};
      total += p.delivered_batches();
    }
    out.add_from_returned(total);
  }
  // Computed here to refuse what does not fit now; journaled and answered as `returned` only.
  RETURN_IF_ERROR(Repartition(old, returned, config->num_consumers(), dataset.batch_size).status());
  ReturnedToProto(returned, &out);
  // The set of states, as the re-partition sees it: what each returned, in runs.
  std::string digest;
  {
    google::protobuf::io::StringOutputStream stream(&digest);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    out.SerializeToCodedStream(&coded);
  }
  digest = absl::StrCat(first.job_fingerprint(), ";", old_split_size, ";", digest);
  out.set_digest(record::Checksum(digest));
  return out;
}

std::string DispatcherImpl::ResizeMismatch(const DispatcherState::Job& job,
                                           const proto::ResizedEpoch& given) {
  const proto::ResizedEpoch& had = *job.resized;
  std::string what;
  if (had.from_consumers() != given.from_consumers()) {
    what = absl::StrCat("it was resumed from the states of ", had.from_consumers(),
                        " consumers, these are of ", given.from_consumers());
  } else if (had.epoch() != given.epoch()) {
    what = absl::StrCat("it was resumed in epoch ", had.epoch(), ", these states are of epoch ",
                        given.epoch());
  } else {
    for (int k = 0; k < had.from_returned_size() && k < given.from_returned_size(); ++k) {
      if (had.from_returned(k) != given.from_returned(k)) {
        what = absl::StrCat("old consumer ", k, "'s state returned ", given.from_returned(k),
                            " batches of epoch ", given.epoch(), " here, ", had.from_returned(k),
                            " in the states the job was resumed from");
        break;
      }
    }
    if (what.empty()) what = "the states differ in which batches each slot returned";
  }
  return absl::StrCat("job '", job.name,
                      "' continues from another set of states than this "
                      "consumer restores: ",
                      what,
                      "; every restoring consumer must pass the same states "
                      "(--restore-state FILE,FILE...)");
}

absl::Status DispatcherImpl::CollectDatasets(absl::Time now) {
  if (options_.dataset_ttl <= absl::ZeroDuration()) return absl::OkStatus();
  std::set<uint64_t> used;
  for (const auto& [id, job] : state_.jobs()) used.insert(job.dataset_id);
  std::vector<uint64_t> gone;
  for (const auto& [id, dataset] : state_.datasets()) {
    if (used.contains(id)) continue;
    // Known from the journal only: its dataset_ttl starts now.
    auto [it, inserted] = dataset_used_.emplace(id, now);
    if (now - it->second >= options_.dataset_ttl) gone.push_back(id);
  }
  for (uint64_t id : gone) {
    proto::Update update;
    update.mutable_remove_dataset()->set_dataset_id(id);
    RETURN_IF_ERROR(Commit(update));
    dataset_used_.erase(id);
    logger_->info("dataset {} forgotten: no job used it for {} (--dataset-ttl)", id,
                  absl::FormatDuration(options_.dataset_ttl));
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::CheckResizable(const DispatcherState::Job& job, uint64_t epoch) const {
  for (const DispatcherState::Consumer& c : job.consumers) {
    if (c.finished || c.epoch > epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", job.name, "' consumer ", c.index, " is already past epoch ", epoch,
                       ": the checkpoint is older than the job; restore every "
                       "consumer from checkpoints of the same step"));
    }
    if (c.epoch < epoch) continue;
    for (const DispatcherState::Slot& slot : c.slots) {
      if (slot.delivered_batches > 0 || slot.status == proto::SPLIT_STATUS_DONE) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job '", job.name, "' consumer ", c.index, " has returned batches of epoch ", epoch,
            " with ", job.config.num_consumers(),
            " consumers: the number of consumers can change only at an "
            "epoch boundary"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::RestoreConsumer(const DispatcherState::Job& job,
                                             const proto::ClientHeartbeatRequest& request) {
  const DispatcherState::Consumer& consumer = job.consumers[request.consumer_index()];
  const uint64_t epoch = request.restore_epoch();
  if (job.config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) {
    return absl::FailedPreconditionError("only distributed-epoch jobs can be restored");
  }
  if (job.config.num_epochs() != 0 && epoch >= job.config.num_epochs()) {
    return absl::InvalidArgumentError(absl::StrCat("restore_state is at epoch ", epoch,
                                                   " but the job has ", job.config.num_epochs(),
                                                   " epochs"));
  }
  ASSIGN_OR_RETURN(std::vector<SlotSource> slots,
                   DispatcherState::SlotsOf(job, consumer.index, epoch));
  std::map<uint64_t, const proto::ClientSplitProgress*> saved;
  for (const proto::ClientSplitProgress& p : request.progress()) {
    if (p.epoch() == epoch) saved[p.position()] = &p;
  }
  proto::Update update;
  proto::UpdateConsumerState* u = update.mutable_consumer_state();
  u->set_job_id(job.id);
  u->set_consumer_index(consumer.index);
  u->set_epoch(epoch);
  // Compact: the slots returned whole as runs, the others only when they are not fresh.
  u->set_num_slots(slots.size());
  const auto& ranges = request.restore_complete_ranges();
  uint64_t floor = 0, whole_count = 0;
  for (int i = 0; i < ranges.size(); i += 2) {
    if (i + 1 >= ranges.size() || ranges[i] < floor || ranges[i + 1] <= ranges[i] ||
        ranges[i + 1] > slots.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore_complete_ranges must be ascending [begin, end) pairs within the consumer's ",
          slots.size(), " slots of epoch ", epoch));
    }
    floor = ranges[i + 1];
    whole_count += ranges[i + 1] - ranges[i];
    u->add_done_ranges(ranges[i]);
    u->add_done_ranges(ranges[i + 1]);
  }
  // A worker that still holds a split keeps it: the new process's stream tells it what it holds,
  // and it produces the split again from there. Anything else is produced anew.
  const DispatcherState::Consumer* live = consumer.OfEpoch(epoch);
  int range = 0;  // the first run not entirely below `pos`
  for (uint64_t pos = 0; pos < slots.size(); ++pos) {
    while (range < ranges.size() && ranges[range + 1] <= pos) range += 2;
    if (range < ranges.size() && ranges[range] <= pos) continue;  // returned whole
    auto it = saved.find(pos);
    const uint64_t returned = it == saved.end() ? 0 : it->second->delivered_batches();
    const DispatcherState::Slot* live_slot =
        live != nullptr && pos < live->slots.size() ? &live->slots[pos] : nullptr;
    proto::SplitState s;
    s.set_position(pos);
    s.set_delivered_batches(returned);
    if (it != saved.end() && it->second->complete()) {
      s.set_status(proto::SPLIT_STATUS_DONE);
    } else if (live_slot != nullptr && live_slot->status == proto::SPLIT_STATUS_ASSIGNED) {
      s.set_status(proto::SPLIT_STATUS_ASSIGNED);
      s.set_worker_id(live_slot->worker_id);
      s.set_skip_batches(live_slot->skip_batches);
      s.set_produced_batches(live_slot->produced_batches);
      s.set_finished_producing(live_slot->finished_producing);
      s.set_assignments(live_slot->assignments);
    } else {
      s.set_status(proto::SPLIT_STATUS_PENDING);
      s.set_skip_batches(returned);
      s.set_assignments(live_slot != nullptr ? live_slot->assignments : 0);
    }
    const bool fresh =
        s.status() == proto::SPLIT_STATUS_PENDING && returned == 0 && s.assignments() == 0;
    if (!fresh) *u->add_slots() = std::move(s);
  }
  logger_->info(
      "job {} consumer {} continues from a checkpoint at epoch {} ({} splits "
      "returned "
      "in part or whole)",
      job.id, consumer.index, epoch, saved.size() + whole_count);
  return Commit(update);
}

}  // namespace sluice::dispatcher
