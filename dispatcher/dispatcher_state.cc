#include "dispatcher/dispatcher_state.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"
#include "common/service/position_runs.h"

namespace sluice::dispatcher {
namespace {

// The layout of a re-partitioned epoch, checked: it names every consumer of the job and reads
// only pieces of the job's splits.
absl::StatusOr<Layout> CheckedResizedLayout(const proto::UpdateCreateJob& u,
                                            const std::vector<record::Split>& splits,
                                            uint64_t batch_size) {
  const proto::ResizedEpoch& r = u.resized();
  if (r.epoch() != u.first_epoch() || LayoutConsumers(r) != u.config().num_consumers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the re-partitioned epoch ", r.epoch(), " has ", LayoutConsumers(r),
                     " consumers; the job starts at epoch ", u.first_epoch(), " with ",
                     u.config().num_consumers()));
  }
  ASSIGN_OR_RETURN(Layout layout,
                   DispatcherState::ResizedLayout(r, u.config(), splits, batch_size));
  uint64_t slots = 0;
  for (const std::vector<SlotSource>& consumer : layout) {
    slots += consumer.size();
    for (const SlotSource& s : consumer) {
      if (s.pieces.empty() || (s.end_batch != 0 && s.end_batch <= s.first_batch))
        return absl::InvalidArgumentError("a re-partitioned slot is empty");
      for (const record::SplitPiece& p : s.pieces) {
        if (p.split_id >= splits.size() || p.count == 0 || p.offset > splits[p.split_id].size() ||
            p.count > splits[p.split_id].size() - p.offset) {
          return absl::InvalidArgumentError(
              absl::StrCat("a re-partitioned slot reads split ", p.split_id, " [", p.offset, ", +",
                           p.count, "), which the job's ", splits.size(), " splits do not have"));
        }
      }
    }
  }
  if (slots > kMaxJobSplits)
    return absl::InvalidArgumentError("the re-partitioned epoch has too many slots");
  return layout;
}

}  // namespace

SlotKey SlotKey::FromProto(const proto::SplitKey& key) {
  return {key.job_id(), key.consumer_index(), key.epoch(), key.position()};
}

void DispatcherState::Slot::ToProto(uint64_t position, proto::SplitState* out) const {
  out->set_position(position);
  out->set_status(status);
  out->set_worker_id(worker_id);
  out->set_delivered_batches(delivered_batches);
  out->set_produced_batches(produced_batches);
  out->set_skip_batches(skip_batches);
  out->set_assignments(assignments);
}

proto::SplitKey SlotKey::ToProto() const {
  proto::SplitKey key;
  key.set_job_id(job_id);
  key.set_consumer_index(consumer);
  key.set_epoch(epoch);
  key.set_position(position);
  return key;
}

DispatcherState::Consumer* DispatcherState::Consumer::OfEpoch(uint64_t of) {
  if (of == epoch) return this;
  return next != nullptr && next->epoch == of ? next.get() : nullptr;
}

const DispatcherState::Consumer* DispatcherState::Consumer::OfEpoch(uint64_t of) const {
  return const_cast<Consumer*>(this)->OfEpoch(of);
}

bool DispatcherState::Job::finished() const {
  return std::all_of(consumers.begin(), consumers.end(),
                     [](const Consumer& c) { return c.finished; });
}

absl::StatusOr<std::vector<record::SlotPieces>> DispatcherState::ConsumerSlots(
    const proto::JobConfig& config, const std::vector<record::Split>& splits, uint32_t consumer,
    uint64_t epoch) {
  const record::RemainderPolicy policy = config.remainder() == proto::REMAINDER_MODE_DROP
                                             ? record::RemainderPolicy::kDrop
                                             : record::RemainderPolicy::kPad;
  return record::ConsumerSlots(splits, config.num_consumers(), consumer, config.seed(), epoch,
                               policy, config.split_size(), config.slots_follow_splits());
}

absl::StatusOr<std::vector<SlotSource>> DispatcherState::SlotsOf(const Job& job, uint32_t consumer,
                                                                 uint64_t epoch) {
  if (job.resized.has_value() && job.resized->epoch() == epoch) {
    if (consumer >= job.resized_layout.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer ", consumer, " is not in the re-partitioned layout"));
    }
    return job.resized_layout[consumer];
  }
  ASSIGN_OR_RETURN(std::vector<record::SlotPieces> pieces,
                   ConsumerSlots(job.config, job.splits, consumer, epoch));
  std::vector<SlotSource> out(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) out[i].pieces = std::move(pieces[i]);
  return out;
}

absl::StatusOr<Layout> DispatcherState::ResizedLayout(const proto::ResizedEpoch& resized,
                                                      const proto::JobConfig& config,
                                                      const std::vector<record::Split>& splits,
                                                      uint64_t batch_size) {
  if (resized.num_consumers() == 0) return LayoutFromProto(resized);  // the listed form
  if (resized.num_consumers() > kMaxJobConsumers || resized.from_consumers() == 0 ||
      resized.from_consumers() > kMaxJobConsumers || batch_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a re-partitioned epoch from ", resized.from_consumers(), " to ", resized.num_consumers(),
        " consumers (batch ", batch_size, ") is out of range"));
  }
  Layout old;
  if (resized.has_previous()) {
    const proto::ResizedEpoch& previous = resized.previous();
    if (previous.epoch() != resized.epoch() ||
        LayoutConsumers(previous) != resized.from_consumers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a re-partitioned epoch ", resized.epoch(), " of ", resized.from_consumers(),
                       " consumers continues one of epoch ", previous.epoch(), " with ",
                       LayoutConsumers(previous)));
    }
    ASSIGN_OR_RETURN(old, ResizedLayout(previous, config, splits, batch_size));
  } else {
    proto::JobConfig old_config = config;
    old_config.set_num_consumers(resized.from_consumers());
    for (uint32_t k = 0; k < resized.from_consumers(); ++k) {
      ASSIGN_OR_RETURN(std::vector<record::SlotPieces> pieces,
                       ConsumerSlots(old_config, splits, k, resized.epoch()));
      std::vector<SlotSource>& slots = old.emplace_back();
      slots.reserve(pieces.size());
      for (record::SlotPieces& p : pieces) slots.push_back({.pieces = std::move(p)});
    }
  }
  ASSIGN_OR_RETURN(Returned returned, ReturnedFromProto(resized, old));
  return Repartition(old, returned, resized.num_consumers(), batch_size);
}

absl::Status DispatcherState::Apply(const proto::Update& update) {
  switch (update.kind_case()) {
    case proto::Update::kRegisterDataset:
      return ApplyRegisterDataset(update.register_dataset());
    case proto::Update::kCreateJob:
      return ApplyCreateJob(update.create_job());
    case proto::Update::kRegisterWorker:
      return ApplyRegisterWorker(update.register_worker());
    case proto::Update::kAssignSplit:
      return ApplyAssignSplit(update.assign_split());
    case proto::Update::kClientProgress:
      return ApplyClientProgress(update.client_progress());
    case proto::Update::kWorkerProgress:
      return ApplyWorkerProgress(update.worker_progress());
    case proto::Update::kWorkerLost:
      return ApplyWorkerLost(update.worker_lost());
    case proto::Update::kDrainWorker:
      return ApplyDrainWorker(update.drain_worker());
    case proto::Update::kReleaseSplits:
      return ApplyReleaseSplits(update.release_splits());
    case proto::Update::kConsumerState:
      return ApplyConsumerState(update.consumer_state());
    case proto::Update::kRemoveJob:
      return ApplyRemoveJob(update.remove_job());
    case proto::Update::kIdFloor:
      return ApplyIdFloor(update.id_floor());
    case proto::Update::kRemoveDataset:
      return ApplyRemoveDataset(update.remove_dataset());
    case proto::Update::kCacheDecision: {
      auto it = jobs_.find(update.cache_decision().job_id());
      if (it == jobs_.end()) {
        return absl::NotFoundError(
            absl::StrCat("job ", update.cache_decision().job_id(), " not found"));
      }
      it->second.cache_decision = update.cache_decision().decision();
      return absl::OkStatus();
    }
    case proto::Update::kCacheCreate:
    case proto::Update::kCacheCommit:
    case proto::Update::kCacheRemove:
      RETURN_IF_ERROR(caches_.Validate(update));
      caches_.Apply(update);
      return absl::OkStatus();
    case proto::Update::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "update has no kind set (journal written by a newer dispatcher?)");
}

const DispatcherState::Dataset* DispatcherState::FindDataset(uint64_t id) const {
  auto it = datasets_.find(id);
  return it == datasets_.end() ? nullptr : &it->second;
}

const DispatcherState::Job* DispatcherState::FindJob(uint64_t id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const DispatcherState::Job* DispatcherState::FindJobByName(const std::string& name) const {
  if (name.empty()) return nullptr;
  for (const auto& [id, job] : jobs_) {
    if (job.name == name) return &job;
  }
  return nullptr;
}

const DispatcherState::Worker* DispatcherState::FindWorker(uint64_t id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const DispatcherState::Slot* DispatcherState::FindSlot(const SlotKey& key) const {
  return const_cast<DispatcherState*>(this)->MutableSlot(key);
}

DispatcherState::SlotClass DispatcherState::Classify(const Slot& slot) {
  const bool assigned = slot.status == proto::SPLIT_STATUS_ASSIGNED;
  return {.pending = slot.status == proto::SPLIT_STATUS_PENDING,
          .awaiting = slot.status == proto::SPLIT_STATUS_AWAITING_PROGRESS,
          .detached = assigned && slot.detached,
          .producing = assigned && !slot.finished_producing};
}

void DispatcherState::Reindex(Consumer& consumer) {
  consumer.pending.clear();
  consumer.awaiting.clear();
  consumer.detached.clear();
  consumer.in_production = 0;
  for (uint64_t pos = 0; pos < consumer.slots.size(); ++pos) {
    Reindex(consumer, pos, SlotClass{});
  }
}

void DispatcherState::Reindex(Consumer& consumer, uint64_t position, const SlotClass& before) {
  const SlotClass now = Classify(consumer.slots[position]);
  if (now == before) return;
  const auto move = [&](std::set<uint64_t>& index, bool was, bool is) {
    if (was && !is) index.erase(position);
    if (is && !was) index.insert(index.end(), position);
  };
  move(consumer.pending, before.pending, now.pending);
  move(consumer.awaiting, before.awaiting, now.awaiting);
  move(consumer.detached, before.detached, now.detached);
  if (before.producing && !now.producing) --consumer.in_production;
  if (now.producing && !before.producing) ++consumer.in_production;
}

void DispatcherState::Reindex(const SlotKey& key, const SlotClass& before) {
  auto it = jobs_.find(key.job_id);
  if (it == jobs_.end() || key.consumer >= it->second.consumers.size()) return;
  Consumer* of_epoch = it->second.consumers[key.consumer].OfEpoch(key.epoch);
  if (of_epoch != nullptr) Reindex(*of_epoch, key.position, before);
}

uint64_t DispatcherState::WorkerHash(uint64_t id, const std::string& address) {
  // splitmix64 of the id, mixed with the address's checksum.
  uint64_t z = id + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return z ^ record::Checksum(address);
}

DispatcherState::Slot* DispatcherState::MutableSlot(const SlotKey& key) {
  auto it = jobs_.find(key.job_id);
  if (it == jobs_.end() || key.consumer >= it->second.consumers.size()) return nullptr;
  Consumer& consumer = it->second.consumers[key.consumer];
  Consumer* of_epoch = consumer.finished ? nullptr : consumer.OfEpoch(key.epoch);
  if (of_epoch == nullptr || key.position >= of_epoch->slots.size()) return nullptr;
  return &of_epoch->slots[key.position];
}

absl::Status DispatcherState::ApplyRegisterDataset(const proto::UpdateRegisterDataset& u) {
  if (u.dataset_id() == 0 || datasets_.contains(u.dataset_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset id ", u.dataset_id(), " is zero or already registered"));
  }
  Dataset& d = datasets_[u.dataset_id()];
  d.id = u.dataset_id();
  d.fingerprint = u.fingerprint();
  d.pipeline = u.pipeline();
  d.shard_record_counts.assign(u.shard_record_counts().begin(), u.shard_record_counts().end());
  d.batch_size = u.batch_size();
  next_dataset_id_ = std::max(next_dataset_id_, u.dataset_id() + 1);
  return absl::OkStatus();
}

absl::Status DispatcherState::StartEpoch(Job& job, Consumer& consumer) {
  consumer.slots.clear();
  consumer.done = 0;
  Reindex(consumer);
  if (job.config.num_epochs() != 0 && consumer.epoch >= job.config.num_epochs()) {
    consumer.finished = true;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<SlotSource> slots, SlotsOf(job, consumer.index, consumer.epoch));
  // A re-partitioned epoch may leave a consumer nothing: it starts at the next one.
  if (slots.empty() && job.resized.has_value() && job.resized->epoch() == consumer.epoch) {
    ++consumer.epoch;
    return StartEpoch(job, consumer);
  }
  consumer.slots.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    consumer.slots[i].pieces = std::move(slots[i].pieces);
    consumer.slots[i].first_batch = slots[i].first_batch;
    consumer.slots[i].end_batch = slots[i].end_batch;
  }
  Reindex(consumer);
  return absl::OkStatus();
}

absl::Status DispatcherState::OpenNextEpoch(Job& job, Consumer& consumer) {
  if (consumer.finished || consumer.next != nullptr || consumer.slots.empty() ||
      !consumer.pending.empty() || !consumer.awaiting.empty()) {
    return absl::OkStatus();
  }
  if (job.config.num_epochs() != 0 && consumer.epoch + 1 >= job.config.num_epochs()) {
    return absl::OkStatus();
  }
  auto next = std::make_unique<Consumer>();
  next->index = consumer.index;
  next->epoch = consumer.epoch + 1;
  RETURN_IF_ERROR(StartEpoch(job, *next));
  if (!next->finished && !next->slots.empty()) consumer.next = std::move(next);
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyCreateJob(const proto::UpdateCreateJob& u) {
  if (u.job_id() == 0 || jobs_.contains(u.job_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job id ", u.job_id(), " is zero or already exists"));
  }
  if (FindJobByName(u.job_name()) != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("job name '", u.job_name(), "' is taken"));
  }
  const Dataset* dataset = FindDataset(u.dataset_id());
  if (dataset == nullptr) {
    return absl::NotFoundError(absl::StrCat("dataset ", u.dataset_id(), " is not registered"));
  }
  if (u.config().num_consumers() == 0 || u.config().num_consumers() > kMaxJobConsumers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_consumers must be in [1, ", kMaxJobConsumers, "], got ", u.config().num_consumers()));
  }
  if (u.config().split_size() == 0 ||
      record::CountSplits(dataset->shard_record_counts, u.config().split_size()) > kMaxJobSplits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split_size ", u.config().split_size(), " gives no splits or more than ", kMaxJobSplits));
  }
  Job job;
  job.id = u.job_id();
  job.name = u.job_name();
  job.dataset_id = u.dataset_id();
  job.config = u.config();
  ASSIGN_OR_RETURN(job.splits,
                   record::EnumerateSplits(dataset->shard_record_counts, u.config().split_size()));
  if (u.has_resized()) {
    ASSIGN_OR_RETURN(job.resized_layout, CheckedResizedLayout(u, job.splits, dataset->batch_size));
    job.resized = u.resized();
  }
  job.consumers.resize(u.config().num_consumers());
  for (uint32_t i = 0; i < job.consumers.size(); ++i) {
    job.consumers[i].index = i;
    job.consumers[i].epoch = u.first_epoch();
    if (job.config.mode() != proto::PROCESSING_MODE_PARALLEL_EPOCHS) {
      RETURN_IF_ERROR(StartEpoch(job, job.consumers[i]));
    }
  }
  next_job_id_ = std::max(next_job_id_, u.job_id() + 1);
  jobs_.emplace(job.id, std::move(job));
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyRegisterWorker(const proto::UpdateRegisterWorker& u) {
  if (u.worker_id() == 0 || workers_.contains(u.worker_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker id ", u.worker_id(), " is zero or already registered"));
  }
  Worker& w = workers_[u.worker_id()];
  w.id = u.worker_id();
  w.address = u.address();
  w.capacity = std::max<uint32_t>(1, u.capacity());
  workers_digest_ ^= WorkerHash(w.id, w.address);
  next_worker_id_ = std::max(next_worker_id_, u.worker_id() + 1);
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyAssignSplit(const proto::UpdateAssignSplit& u) {
  const SlotKey key = SlotKey::FromProto(u.key());
  auto wit = workers_.find(u.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", u.worker_id(), " is not registered"));
  }
  if (wit->second.draining) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", u.worker_id(), " is draining"));
  }
  Slot* slot = MutableSlot(key);
  if (slot == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", key.job_id, " consumer ", key.consumer,
                                            " has no split at epoch ", key.epoch, " position ",
                                            key.position));
  }
  if (slot->status != proto::SPLIT_STATUS_PENDING) {
    return absl::FailedPreconditionError(absl::StrCat("split at position ", key.position, " is ",
                                                      proto::SplitStatus_Name(slot->status),
                                                      ", not pending"));
  }
  const SlotClass before = Classify(*slot);
  slot->status = proto::SPLIT_STATUS_ASSIGNED;
  slot->worker_id = u.worker_id();
  slot->skip_batches = u.skip_batches();
  slot->produced_batches = u.skip_batches();
  slot->finished_producing = false;
  ++slot->assignments;
  wit->second.slots.insert(key);
  Reindex(key, before);
  Job& job = jobs_.at(key.job_id);
  return OpenNextEpoch(job, job.consumers[key.consumer]);
}

absl::Status DispatcherState::ApplyClientProgress(const proto::UpdateClientProgress& u) {
  auto jit = jobs_.find(u.job_id());
  if (jit == jobs_.end())
    return absl::NotFoundError(absl::StrCat("job ", u.job_id(), " not found"));
  Job& job = jit->second;
  if (u.consumer_index() >= job.consumers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("consumer ", u.consumer_index(), " >= ", job.consumers.size(), " consumers"));
  }
  Consumer& consumer = job.consumers[u.consumer_index()];
  if (consumer.finished || consumer.slots.empty()) return absl::OkStatus();
  ApplyProgress(job, consumer, u.progress());
  if (consumer.next != nullptr) ApplyProgress(job, *consumer.next, u.progress());
  while (!consumer.finished && !consumer.slots.empty() && consumer.done == consumer.slots.size()) {
    if (consumer.next != nullptr) {
      std::unique_ptr<Consumer> next = std::move(consumer.next);
      consumer = std::move(*next);
    } else {
      ++consumer.epoch;
      RETURN_IF_ERROR(StartEpoch(job, consumer));
    }
  }
  return OpenNextEpoch(job, consumer);
}

void DispatcherState::ApplyProgress(
    const Job& job, Consumer& target,
    const google::protobuf::RepeatedPtrField<proto::ClientSplitProgress>& progress) {
  for (const proto::ClientSplitProgress& p : progress) {
    // Reports about an earlier epoch are stale (that epoch is done); those about the other
    // open epoch are the other call's.
    if (p.epoch() != target.epoch || p.position() >= target.slots.size()) continue;
    Slot& slot = target.slots[p.position()];
    if (slot.status == proto::SPLIT_STATUS_DONE) continue;
    const SlotClass before = Classify(slot);
    slot.delivered_batches = std::max(slot.delivered_batches, p.delivered_batches());
    if (p.complete()) {
      if (slot.status == proto::SPLIT_STATUS_ASSIGNED) {
        auto wit = workers_.find(slot.worker_id);
        if (wit != workers_.end()) {
          wit->second.slots.erase({job.id, target.index, target.epoch, p.position()});
        }
      }
      slot.status = proto::SPLIT_STATUS_DONE;
      slot.worker_id = 0;
      ++target.done;
      Reindex(target, p.position(), before);
    }
  }
  // The consumer has now said how far it got: released splits may go to another
  // worker.
  const std::set<uint64_t> awaiting = std::move(target.awaiting);
  target.awaiting.clear();
  for (uint64_t position : awaiting) {
    Slot& slot = target.slots[position];
    slot.status = proto::SPLIT_STATUS_PENDING;
    slot.skip_batches = slot.delivered_batches;
    Reindex(target, position, SlotClass{});
  }
}

absl::Status DispatcherState::ApplyWorkerProgress(const proto::UpdateWorkerProgress& u) {
  if (!workers_.contains(u.worker_id())) {
    return absl::NotFoundError(absl::StrCat("worker ", u.worker_id(), " is not registered"));
  }
  for (const proto::WorkerSplitProgress& p : u.splits()) {
    Slot* slot = MutableSlot(SlotKey::FromProto(p.key()));
    // Splits it no longer holds (done, handed back) are dropped by the
    // heartbeat response.
    if (slot == nullptr || slot->status != proto::SPLIT_STATUS_ASSIGNED ||
        slot->worker_id != u.worker_id()) {
      continue;
    }
    const SlotClass before = Classify(*slot);
    slot->produced_batches = std::max(slot->produced_batches, p.produced_batches());
    slot->detached = p.detached();
    if (p.finished_producing()) slot->finished_producing = true;
    Reindex(SlotKey::FromProto(p.key()), before);
  }
  return absl::OkStatus();
}

void DispatcherState::Release(Worker& worker, const SlotKey& key) {
  worker.slots.erase(key);
  Slot* slot = MutableSlot(key);
  if (slot == nullptr || slot->status != proto::SPLIT_STATUS_ASSIGNED) return;
  const SlotClass before = Classify(*slot);
  slot->status = proto::SPLIT_STATUS_AWAITING_PROGRESS;
  slot->worker_id = 0;
  slot->finished_producing = false;
  slot->detached = false;
  Reindex(key, before);
}

absl::Status DispatcherState::ApplyWorkerLost(const proto::UpdateWorkerLost& u) {
  auto wit = workers_.find(u.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", u.worker_id(), " is not registered"));
  }
  const std::set<SlotKey> held = wit->second.slots;
  for (const SlotKey& key : held) Release(wit->second, key);
  workers_digest_ ^= WorkerHash(wit->second.id, wit->second.address);
  workers_.erase(wit);
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyDrainWorker(const proto::UpdateDrainWorker& u) {
  auto wit = workers_.find(u.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", u.worker_id(), " is not registered"));
  }
  Worker& worker = wit->second;
  worker.draining = true;
  const std::set<SlotKey> held = worker.slots;
  for (const SlotKey& key : held) {
    const Slot* slot = FindSlot(key);
    if (slot != nullptr && !slot->finished_producing) Release(worker, key);
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyReleaseSplits(const proto::UpdateReleaseSplits& u) {
  auto wit = workers_.find(u.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", u.worker_id(), " is not registered"));
  }
  for (const proto::SplitKey& key : u.keys()) {
    if (wit->second.slots.contains(SlotKey::FromProto(key))) {
      Release(wit->second, SlotKey::FromProto(key));
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::Validate(const proto::Update& update) const {
  auto need_job = [&](uint64_t id) -> absl::Status {
    return jobs_.contains(id) ? absl::OkStatus()
                              : absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  };
  auto need_worker = [&](uint64_t id) -> absl::Status {
    return workers_.contains(id)
               ? absl::OkStatus()
               : absl::NotFoundError(absl::StrCat("worker ", id, " is not registered"));
  };
  switch (update.kind_case()) {
    case proto::Update::kRegisterDataset:
      if (update.register_dataset().dataset_id() == 0 ||
          datasets_.contains(update.register_dataset().dataset_id())) {
        return absl::FailedPreconditionError("dataset id is zero or taken");
      }
      return absl::OkStatus();
    case proto::Update::kCreateJob: {
      const proto::UpdateCreateJob& u = update.create_job();
      if (u.job_id() == 0 || jobs_.contains(u.job_id()))
        return absl::FailedPreconditionError("job id is zero or taken");
      if (FindJobByName(u.job_name()) != nullptr)
        return absl::FailedPreconditionError(
            absl::StrCat("job name '", u.job_name(), "' is taken"));
      if (!datasets_.contains(u.dataset_id()))
        return absl::NotFoundError(absl::StrCat("dataset ", u.dataset_id(), " is not registered"));
      if (u.config().num_consumers() == 0)
        return absl::InvalidArgumentError("num_consumers must be > 0");
      if (u.config().mode() != proto::PROCESSING_MODE_PARALLEL_EPOCHS) {
        uint64_t records = 0;
        for (uint64_t c : datasets_.at(u.dataset_id()).shard_record_counts) records += c;
        const record::RemainderPolicy policy = u.config().remainder() == proto::REMAINDER_MODE_DROP
                                                   ? record::RemainderPolicy::kDrop
                                                   : record::RemainderPolicy::kPad;
        if (record::ShareSize(records, u.config().num_consumers(), policy) == 0)
          return absl::InvalidArgumentError("a consumer's share is empty");
        if (u.config().split_size() == 0)
          return absl::InvalidArgumentError("split_size must be > 0");
      }
      if (u.has_resized()) {
        ASSIGN_OR_RETURN(std::vector<record::Split> splits,
                         record::EnumerateSplits(datasets_.at(u.dataset_id()).shard_record_counts,
                                                 u.config().split_size()));
        RETURN_IF_ERROR(
            CheckedResizedLayout(u, splits, datasets_.at(u.dataset_id()).batch_size).status());
      }
      return absl::OkStatus();
    }
    case proto::Update::kRegisterWorker:
      if (update.register_worker().worker_id() == 0 ||
          workers_.contains(update.register_worker().worker_id())) {
        return absl::FailedPreconditionError("worker id is zero or taken");
      }
      return absl::OkStatus();
    case proto::Update::kAssignSplit: {
      const proto::UpdateAssignSplit& u = update.assign_split();
      RETURN_IF_ERROR(need_worker(u.worker_id()));
      if (workers_.at(u.worker_id()).draining)
        return absl::FailedPreconditionError(absl::StrCat("worker ", u.worker_id(), " drains"));
      const Slot* slot = FindSlot(SlotKey::FromProto(u.key()));
      if (slot == nullptr || slot->status != proto::SPLIT_STATUS_PENDING)
        return absl::FailedPreconditionError("the split is not pending");
      return absl::OkStatus();
    }
    case proto::Update::kClientProgress:
      RETURN_IF_ERROR(need_job(update.client_progress().job_id()));
      if (update.client_progress().consumer_index() >=
          jobs_.at(update.client_progress().job_id()).consumers.size()) {
        return absl::InvalidArgumentError("consumer index out of range");
      }
      return absl::OkStatus();
    case proto::Update::kWorkerProgress:
      return need_worker(update.worker_progress().worker_id());
    case proto::Update::kWorkerLost:
      return need_worker(update.worker_lost().worker_id());
    case proto::Update::kDrainWorker:
      return need_worker(update.drain_worker().worker_id());
    case proto::Update::kReleaseSplits:
      return need_worker(update.release_splits().worker_id());
    case proto::Update::kConsumerState: {
      const proto::UpdateConsumerState& u = update.consumer_state();
      RETURN_IF_ERROR(need_job(u.job_id()));
      const Job& job = jobs_.at(u.job_id());
      if (u.consumer_index() >= job.consumers.size())
        return absl::InvalidArgumentError("consumer index out of range");
      if (u.finished()) {
        return u.slots_size() == 0 && u.num_slots() == 0
                   ? absl::OkStatus()
                   : absl::InvalidArgumentError("a finished consumer has no slots");
      }
      ASSIGN_OR_RETURN(std::vector<SlotSource> slots, SlotsOf(job, u.consumer_index(), u.epoch()));
      return CheckSlots(u, job, slots.size());
    }
    case proto::Update::kRemoveJob:
      return need_job(update.remove_job().job_id());
    case proto::Update::kIdFloor:
      return absl::OkStatus();
    case proto::Update::kRemoveDataset:
      return CheckRemoveDataset(update.remove_dataset());
    case proto::Update::kCacheDecision:
      return need_job(update.cache_decision().job_id());
    case proto::Update::kCacheCreate:
    case proto::Update::kCacheCommit:
    case proto::Update::kCacheRemove:
      return caches_.Validate(update);
    case proto::Update::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("update has no kind set");
}

absl::Status DispatcherState::ApplyConsumerState(const proto::UpdateConsumerState& u) {
  auto jit = jobs_.find(u.job_id());
  if (jit == jobs_.end())
    return absl::NotFoundError(absl::StrCat("job ", u.job_id(), " not found"));
  Job& job = jit->second;
  if (u.consumer_index() >= job.consumers.size())
    return absl::InvalidArgumentError("consumer index out of range");
  Consumer& consumer = job.consumers[u.consumer_index()];
  if (u.lookahead() && (consumer.finished || u.finished() || u.epoch() != consumer.epoch + 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("consumer ", consumer.index, " of job ", job.id, " is at epoch ",
                     consumer.epoch, ": it has no following epoch ", u.epoch(), " to restore"));
  }
  // The slots' pieces follow from (config, consumer, epoch): the update only carries state.
  std::vector<SlotSource> pieces;
  if (!u.finished()) {
    ASSIGN_OR_RETURN(pieces, SlotsOf(job, consumer.index, u.epoch()));
    RETURN_IF_ERROR(CheckSlots(u, job, pieces.size()));
  } else if (u.slots_size() != 0 || u.num_slots() != 0) {
    return absl::InvalidArgumentError("a finished consumer has no slots");
  }
  // Whatever workers held of this consumer (of that epoch, for the following one) is replaced.
  for (auto& [id, worker] : workers_) {
    for (auto it = worker.slots.begin(); it != worker.slots.end();) {
      const bool replaced = it->job_id == job.id && it->consumer == consumer.index &&
                            (!u.lookahead() || it->epoch == u.epoch());
      it = replaced ? worker.slots.erase(it) : std::next(it);
    }
  }
  if (u.lookahead()) {
    consumer.next = std::make_unique<Consumer>();
    consumer.next->index = consumer.index;
    consumer.next->epoch = u.epoch();
    RestoreSlots(job, *consumer.next, u, std::move(pieces));
    return absl::OkStatus();
  }
  consumer.epoch = u.epoch();
  consumer.finished = u.finished();
  consumer.next.reset();
  RestoreSlots(job, consumer, u, std::move(pieces));
  // A consumer restored into a re-partitioned epoch that left it nothing starts the next one.
  if (!consumer.finished && consumer.slots.empty() && job.resized.has_value() &&
      job.resized->epoch() == consumer.epoch) {
    ++consumer.epoch;
    return StartEpoch(job, consumer);
  }
  return OpenNextEpoch(job, consumer);
}

absl::Status DispatcherState::CheckSlots(const proto::UpdateConsumerState& u, const Job& job,
                                         uint64_t num_slots) {
  const uint64_t described =
      u.num_slots() != 0 ? u.num_slots() : static_cast<uint64_t>(u.slots_size());
  if (described != num_slots) {
    return absl::InvalidArgumentError(absl::StrCat("consumer ", u.consumer_index(), " of job ",
                                                   job.id, " has ", num_slots, " slots in epoch ",
                                                   u.epoch(), ", the update ", described));
  }
  if (u.num_slots() == 0) {
    return u.done_ranges_size() == 0
               ? absl::OkStatus()
               : absl::InvalidArgumentError("done_ranges without num_slots (the compact form)");
  }
  const auto& ranges = u.done_ranges();
  for (int i = 0; i < ranges.size(); i += 2) {
    if (i + 1 >= ranges.size() || ranges[i + 1] <= ranges[i] || ranges[i + 1] > num_slots ||
        (i > 0 && ranges[i] < ranges[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "done_ranges must be ascending [begin, end) pairs within ", num_slots, " slots"));
    }
  }
  for (const proto::SplitState& slot : u.slots()) {
    if (slot.position() >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("a listed slot's position ", slot.position(), " is not below ", num_slots));
    }
  }
  return absl::OkStatus();
}

void DispatcherState::RestoreSlots(const Job& job, Consumer& target,
                                   const proto::UpdateConsumerState& u,
                                   std::vector<SlotSource> pieces) {
  target.done = 0;
  target.slots.assign(pieces.size(), Slot{});
  for (size_t i = 0; i < pieces.size(); ++i) {
    target.slots[i].pieces = std::move(pieces[i].pieces);
    target.slots[i].first_batch = pieces[i].first_batch;
    target.slots[i].end_batch = pieces[i].end_batch;
  }
  const auto& ranges = u.done_ranges();
  for (int i = 0; i + 1 < ranges.size(); i += 2) {
    for (uint64_t pos = ranges[i]; pos < ranges[i + 1]; ++pos) {
      target.slots[pos].status = proto::SPLIT_STATUS_DONE;
    }
  }
  for (int i = 0; i < u.slots_size(); ++i) {
    const proto::SplitState& in = u.slots(i);
    const uint64_t position = u.num_slots() != 0 ? in.position() : static_cast<uint64_t>(i);
    Slot& slot = target.slots[position];
    slot.status = in.status();
    slot.worker_id = in.worker_id();
    slot.delivered_batches = in.delivered_batches();
    slot.produced_batches = in.produced_batches();
    slot.skip_batches = in.skip_batches();
    slot.assignments = in.assignments();
    slot.finished_producing = in.finished_producing();
    if (slot.status == proto::SPLIT_STATUS_ASSIGNED) {
      auto wit = workers_.find(slot.worker_id);
      if (wit == workers_.end()) {
        slot.status = proto::SPLIT_STATUS_AWAITING_PROGRESS;
        slot.worker_id = 0;
      } else {
        wit->second.slots.insert({job.id, target.index, target.epoch, position});
      }
    }
  }
  for (const Slot& slot : target.slots) {
    if (slot.status == proto::SPLIT_STATUS_DONE) ++target.done;
  }
  Reindex(target);
}

absl::Status DispatcherState::ApplyRemoveJob(const proto::UpdateRemoveJob& u) {
  auto jit = jobs_.find(u.job_id());
  if (jit == jobs_.end())
    return absl::NotFoundError(absl::StrCat("job ", u.job_id(), " not found"));
  for (auto& [id, worker] : workers_) {
    for (auto it = worker.slots.begin(); it != worker.slots.end();) {
      it = it->job_id == u.job_id() ? worker.slots.erase(it) : std::next(it);
    }
  }
  jobs_.erase(jit);
  return absl::OkStatus();
}

absl::Status DispatcherState::CheckRemoveDataset(const proto::UpdateRemoveDataset& u) const {
  if (!datasets_.contains(u.dataset_id())) {
    return absl::NotFoundError(absl::StrCat("dataset ", u.dataset_id(), " is not registered"));
  }
  for (const auto& [id, job] : jobs_) {
    if (job.dataset_id == u.dataset_id()) {
      return absl::FailedPreconditionError(
          absl::StrCat("dataset ", u.dataset_id(), " is still used by job ", id));
    }
  }
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyRemoveDataset(const proto::UpdateRemoveDataset& u) {
  RETURN_IF_ERROR(CheckRemoveDataset(u));
  datasets_.erase(u.dataset_id());
  return absl::OkStatus();
}

absl::Status DispatcherState::ApplyIdFloor(const proto::UpdateIdFloor& u) {
  next_dataset_id_ = std::max(next_dataset_id_, u.next_dataset_id());
  next_job_id_ = std::max(next_job_id_, u.next_job_id());
  next_worker_id_ = std::max(next_worker_id_, u.next_worker_id());
  if (incarnation_ == 0) incarnation_ = u.incarnation();
  return absl::OkStatus();
}

void DispatcherState::SnapshotConsumer(uint64_t job_id, const Consumer& c, bool lookahead,
                                       proto::UpdateConsumerState* out) {
  out->set_job_id(job_id);
  out->set_consumer_index(c.index);
  out->set_epoch(c.epoch);
  out->set_finished(c.finished);
  out->set_lookahead(lookahead);
  // Compact: fresh slots are left out, DONE ones without counters go as runs.
  out->set_num_slots(c.slots.size());
  for (size_t pos = 0; pos < c.slots.size(); ++pos) {
    const Slot& slot = c.slots[pos];
    const bool counters = slot.worker_id != 0 || slot.delivered_batches != 0 ||
                          slot.produced_batches != 0 || slot.skip_batches != 0 ||
                          slot.assignments != 0 || slot.finished_producing;
    if (slot.status == proto::SPLIT_STATUS_PENDING && !counters) continue;
    if (slot.status != proto::SPLIT_STATUS_DONE || counters) {
      proto::SplitState* s = out->add_slots();
      slot.ToProto(pos, s);
      s->set_finished_producing(slot.finished_producing);
      continue;
    }
    service::AppendToRuns(out->mutable_done_ranges(), pos);
  }
}

proto::DispatcherSnapshot DispatcherState::Snapshot() const {
  proto::DispatcherSnapshot snapshot;
  auto add = [&]() { return snapshot.add_updates(); };
  proto::UpdateIdFloor* floor = add()->mutable_id_floor();
  floor->set_next_dataset_id(next_dataset_id_);
  floor->set_next_job_id(next_job_id_);
  floor->set_next_worker_id(next_worker_id_);
  floor->set_incarnation(incarnation_);
  for (const auto& [id, d] : datasets_) {
    proto::UpdateRegisterDataset* u = add()->mutable_register_dataset();
    u->set_dataset_id(id);
    u->set_fingerprint(d.fingerprint);
    u->set_pipeline(d.pipeline);
    u->mutable_shard_record_counts()->Add(d.shard_record_counts.begin(),
                                          d.shard_record_counts.end());
    u->set_batch_size(d.batch_size);
  }
  for (const auto& [id, w] : workers_) {
    proto::UpdateRegisterWorker* u = add()->mutable_register_worker();
    u->set_worker_id(id);
    u->set_address(w.address);
    u->set_capacity(w.capacity);
  }
  for (const auto& [id, job] : jobs_) {
    proto::UpdateCreateJob* u = add()->mutable_create_job();
    u->set_job_id(id);
    u->set_job_name(job.name);
    u->set_dataset_id(job.dataset_id);
    *u->mutable_config() = job.config;
    if (job.resized.has_value()) {
      *u->mutable_resized() = *job.resized;
      u->set_first_epoch(job.resized->epoch());
    }
    if (job.cache_decision.has_value()) {
      proto::UpdateCacheDecision* d = add()->mutable_cache_decision();
      d->set_job_id(id);
      *d->mutable_decision() = *job.cache_decision;
    }
    for (const Consumer& c : job.consumers) {
      SnapshotConsumer(id, c, /*lookahead=*/false, add()->mutable_consumer_state());
      if (c.next != nullptr) {
        SnapshotConsumer(id, *c.next, /*lookahead=*/true, add()->mutable_consumer_state());
      }
    }
  }
  // Draining comes after the consumers' states: a drain hands back what is not finished.
  for (const auto& [id, w] : workers_) {
    if (w.draining) add()->mutable_drain_worker()->set_worker_id(id);
  }
  caches_.AppendSnapshot(&snapshot);
  return snapshot;
}

}  // namespace sluice::dispatcher
