// DispatcherImpl, continued: workers (registration, the worker heartbeat and
// the splits it hands out, losing a worker, drains).

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "dispatcher/dispatcher_impl.h"

namespace sluice::dispatcher {

absl::Status DispatcherImpl::DoWorkerRegister(const proto::WorkerRegisterRequest& request,
                                              proto::WorkerRegisterResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  if (request.address().empty()) {
    return absl::InvalidArgumentError("WorkerRegister: address (host:port) is empty");
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
  worker_signals_[u->worker_id()] = {.last_seen = clock_->Now(), .registered = clock_->Now()};
  logger_->info("worker {} registered at {} (capacity {})", u->worker_id(), u->address(),
                u->capacity());
  response->set_worker_id(u->worker_id());
  response->set_incarnation(incarnation_);
  response->set_heartbeat_interval_seconds(absl::ToDoubleSeconds(options_.heartbeat_interval));
  UpdateGauges();
  return absl::OkStatus();
}

double DispatcherImpl::AllocationLoad(const DispatcherState::Job& job) const {
  if (allocation_.empty()) return 0;
  // A job the last decision did not see (new since) is not held back: its
  // first splits are what its demand is read from.
  auto it = allocation_.find(job.id);
  return it != allocation_.end() && it->second <= 0 ? std::numeric_limits<double>::infinity() : 0;
}

int DispatcherImpl::AffinityTier(uint64_t worker_id, const DispatcherState::Job& job,
                                 const DispatcherState::Consumer& consumer) const {
  auto it = worker_jobs_.find(worker_id);
  if (it == worker_jobs_.end() || it->second == job.id) return 0;
  const bool new_job = !allocation_.contains(job.id);
  return new_job && consumer.in_production == 0 ? 1 : 2;
}

bool DispatcherImpl::Behind(const DispatcherState::Consumer& consumer) const {
  return !consumer.detached.empty();
}

const DispatcherState::Consumer* DispatcherImpl::Assignable(
    const DispatcherState::Job& job, const DispatcherState::Consumer& consumer) const {
  if (consumer.pending.empty()) {
    // The following epoch, while this one has nothing left to hand out (a slot a lost worker
    // handed back is this epoch's work, pending after the consumer's next report).
    const DispatcherState::Consumer* next = consumer.next.get();
    if (next == nullptr || next->pending.empty() || !consumer.awaiting.empty() ||
        Behind(consumer)) {
      return nullptr;
    }
    if (!next->detached.empty() && *next->pending.begin() > *next->detached.begin()) {
      return nullptr;
    }
    return next;
  }
  // A behind consumer's next slots would only fill a queue nobody reads. But a slot before the
  // one that waits may be what its trainer waits for (deterministic order releases the waiting
  // slot's batches only after it; e.g. it was handed back by a lost worker): that one goes.
  if (!consumer.detached.empty() && *consumer.pending.begin() > *consumer.detached.begin()) {
    return nullptr;
  }
  if (!options_.first_split_alone || consumer.in_production == 0) return &consumer;
  auto it = consumer_signals_.find({job.id, consumer.index});
  return it != consumer_signals_.end() && it->second.batches_returned_total > 0 ? &consumer
                                                                                : nullptr;
}

absl::Status DispatcherImpl::AssignSplits(uint64_t worker_id, int free,
                                          proto::WorkerHeartbeatResponse* out) {
  // Each pick: the consumer with the fewest splits in production, ties to the
  // lowest (job, consumer); its lowest pending position. The state's indexes
  // (Consumer::pending, in_production) make a pick one pass over the consumers.
  // While the pool is bounded (allocation_ set), the worker serves the job it
  // is assigned to (worker_jobs_) first, then a new job's first split, then
  // the others (the pool is never idle for the sake of the allocation); among
  // those, a job allocated nothing gets splits only when no allocated job has
  // one pending. A slot of a consumer's following epoch (Assignable) comes after
  // every current epoch's slot.
  const auto in_production = [](const DispatcherState::Consumer& c) {
    return c.in_production + (c.next != nullptr ? c.next->in_production : 0);
  };
  while (free > 0) {
    const DispatcherState::Job* best_job = nullptr;
    const DispatcherState::Consumer* best = nullptr;
    const DispatcherState::Consumer* best_epoch = nullptr;
    std::tuple<bool, int, double> best_rank;
    for (const auto& [job_id, job] : state_.jobs()) {
      if (job.config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) continue;
      const double load = AllocationLoad(job);
      for (const DispatcherState::Consumer& consumer : job.consumers) {
        const DispatcherState::Consumer* epoch = Assignable(job, consumer);
        if (epoch == nullptr) continue;
        const std::tuple<bool, int, double> rank{epoch != &consumer,
                                                 AffinityTier(worker_id, job, consumer), load};
        if (best == nullptr || rank < best_rank ||
            (rank == best_rank && in_production(consumer) < in_production(*best))) {
          best = &consumer;
          best_epoch = epoch;
          best_job = &job;
          best_rank = rank;
        }
      }
    }
    if (best == nullptr) break;
    const DispatcherState::Job& job = *best_job;
    if (best_epoch != best) {
      // The following epoch's lowest pending slot, for this job alone (its peers' epochs need
      // not be aligned).
      const SlotKey key{job.id, best->index, best_epoch->epoch, *best_epoch->pending.begin()};
      RETURN_IF_ERROR(AssignSlot(job, key, worker_id, /*share_group=*/0, out));
      --free;
      continue;
    }
    const DispatcherState::Consumer& consumer = *best;
    const uint64_t group = ShareGroupOf(job);
    const std::vector<const DispatcherState::Job*> peers = SharePeers(job);
    // The peers' consumers at the same index and epoch: they read the same slots. One that is
    // Behind (its trainer stopped reading: its worker detached it) joins nothing, so that it
    // never holds the group's productions back.
    std::vector<std::pair<const DispatcherState::Job*, const DispatcherState::Consumer*>> aligned;
    for (const DispatcherState::Job* peer : peers) {
      if (consumer.index >= peer->consumers.size()) continue;
      const DispatcherState::Consumer& c = peer->consumers[consumer.index];
      if (!c.finished && c.epoch == consumer.epoch && !c.pending.empty() && !Behind(c)) {
        aligned.emplace_back(peer, &c);
      }
    }
    // Its lowest pending position; a job that does not keep the split sequence's order
    // takes, rather, the lowest one a peer also has pending: a job that joined late (or fell
    // behind) reads from where the group is and comes back to what it passed at the end.
    uint64_t position = *consumer.pending.begin();
    if (!job.config.deterministic() && !aligned.empty()) {
      for (uint64_t p : consumer.pending) {
        if (std::any_of(aligned.begin(), aligned.end(),
                        [&](const auto& a) { return a.second->pending.contains(p); })) {
          position = p;
          break;
        }
      }
    }
    RETURN_IF_ERROR(AssignSlot(job, SlotKey{job.id, consumer.index, consumer.epoch, position},
                               worker_id, group, out));
    for (const auto& [peer, c] : aligned) {
      if (!c->pending.contains(position)) continue;
      RETURN_IF_ERROR(AssignSlot(*peer, SlotKey{peer->id, consumer.index, consumer.epoch, position},
                                 worker_id, group, out));
    }
    --free;
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::AssignSlot(const DispatcherState::Job& job, const SlotKey& key,
                                        uint64_t worker_id, uint64_t share_group,
                                        proto::WorkerHeartbeatResponse* out) {
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
  a->set_share_group(share_group);
  (reassigned ? metrics_.splits_reassigned : metrics_.splits_assigned).Increment();
  if (reassigned) metrics_.ForJob(job.id, job.name).splits_reassigned->Increment();
  return absl::OkStatus();
}

std::vector<const DispatcherState::Job*> DispatcherImpl::SharePeers(
    const DispatcherState::Job& job) const {
  std::vector<const DispatcherState::Job*> peers;
  const uint64_t group = ShareGroupOf(job);
  if (group == 0) return peers;
  for (const auto& [id, other] : state_.jobs()) {
    if (id != job.id && !other.finished() && ShareGroupOf(other) == group) peers.push_back(&other);
  }
  return peers;
}

uint32_t DispatcherImpl::SlotsInProduction(const DispatcherState::Worker& worker) const {
  // (group, job if it does not share, consumer, epoch, position)
  std::set<std::tuple<uint64_t, uint64_t, uint32_t, uint64_t, uint64_t>> units;
  for (const SlotKey& key : worker.slots) {
    const DispatcherState::Slot* slot = state_.FindSlot(key);
    if (slot == nullptr || slot->finished_producing || slot->detached) continue;
    const DispatcherState::Job* job = state_.FindJob(key.job_id);
    const uint64_t group = job != nullptr ? ShareGroupOf(*job) : 0;
    units.insert({group, group != 0 ? 0 : key.job_id, key.consumer, key.epoch, key.position});
  }
  return static_cast<uint32_t>(units.size());
}

void DispatcherImpl::FillJobInfo(const DispatcherState::Job& job, proto::JobInfo* info) const {
  info->set_job_id(job.id);
  info->set_job_name(job.name);
  info->set_dataset_id(job.dataset_id);
  const DispatcherState::Dataset* dataset = state_.FindDataset(job.dataset_id);
  if (dataset != nullptr) {
    info->set_pipeline(dataset->pipeline);
    info->set_batch_size(dataset->batch_size);
  }
  *info->mutable_config() = job.config;
  if (job.cache_decision.has_value()) {
    // `cache: auto` decided: the pipeline with its cache node, if it caches (docs/cache.md).
    *info->mutable_cache_decision() = *job.cache_decision;
    std::optional<proto::Pipeline> pipeline = PipelineOfJob(job);
    if (dataset != nullptr && pipeline.has_value()) {
      info->set_pipeline(pipeline->SerializeAsString());
    }
  }
}

absl::Status DispatcherImpl::DoWorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                                               proto::WorkerHeartbeatResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  metrics_.worker_heartbeats.Increment();
  absl::MutexLock lock(&mu_);
  if (state_.FindWorker(request.worker_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(),
                                            " is not registered (timed out?): drop all splits "
                                            "and call WorkerRegister again"));
  }
  {
    WorkerSignal& signal = worker_signals_[request.worker_id()];
    signal.last_seen = clock_->Now();
    if (signal.registered == absl::InfinitePast()) signal.registered = signal.last_seen;
    signal.elements_per_second = request.elements_per_second();
    signal.queue_depth = request.queue_depth();
    signal.queue_capacity = request.queue_capacity();
    signal.blocked_producers = request.blocked_producers();
    signal.all.Report(request.elements_total(), request.busy_seconds_total());
    std::map<uint64_t, BusyCounter> jobs;
    for (const proto::JobBusy& b : request.job_busy()) {
      auto it = signal.jobs.find(b.job_id());
      BusyCounter& counter = jobs[b.job_id()];
      if (it != signal.jobs.end()) counter = it->second;
      counter.Report(b.elements_total(), b.busy_seconds_total());
    }
    // Jobs the worker no longer reports (over, forgotten) go.
    signal.jobs = std::move(jobs);
  }
  response->set_incarnation(incarnation_);
  RETURN_IF_ERROR(DecideAutoCaches(request));
  if (!request.splits().empty()) {
    proto::Update update;
    proto::UpdateWorkerProgress* u = update.mutable_worker_progress();
    u->set_worker_id(request.worker_id());
    *u->mutable_splits() = request.splits();
    // Production counts are soft state (reported again every heartbeat); a split that
    // finished producing changes what a drain hands back, so that is journaled.
    bool finishes = false;
    for (const proto::WorkerSplitProgress& p : request.splits()) {
      const DispatcherState::Slot* slot = state_.FindSlot(SlotKey::FromProto(p.key()));
      finishes = finishes || (slot != nullptr && slot->worker_id == request.worker_id() &&
                              p.finished_producing() && !slot->finished_producing);
    }
    RETURN_IF_ERROR(finishes ? Commit(update) : ApplySoft(update));
  }
  const DispatcherState::Worker& worker = *state_.FindWorker(request.worker_id());
  // Whatever it reports but no longer holds: done, handed back, or its job is
  // gone.
  std::set<SlotKey> reported;
  for (const proto::WorkerSplitProgress& p : request.splits()) {
    reported.insert(SlotKey::FromProto(p.key()));
    if (!worker.slots.contains(SlotKey::FromProto(p.key()))) *response->add_drop() = p.key();
  }
  // Whatever it holds but did not report (the response that assigned it was
  // lost, or the worker restarted its pipeline): handed back like a lost
  // worker's splits.
  proto::Update release;
  for (const SlotKey& key : worker.slots) {
    if (!reported.contains(key)) *release.mutable_release_splits()->add_keys() = key.ToProto();
  }
  if (release.has_release_splits()) {
    release.mutable_release_splits()->set_worker_id(worker.id);
    logger_->warn("worker {} no longer reports {} of its splits: they are handed back", worker.id,
                  release.release_splits().keys_size());
    RETURN_IF_ERROR(Commit(release));
  }
  std::set<uint64_t> referenced_jobs;
  if (!worker.draining) {
    const int in_production = static_cast<int>(SlotsInProduction(worker));
    RETURN_IF_ERROR(
        AssignSplits(worker.id, static_cast<int>(worker.capacity) - in_production, response));
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
  const std::set<uint64_t> known(request.known_job_ids().begin(), request.known_job_ids().end());
  for (uint64_t job_id : referenced_jobs) {
    if (known.contains(job_id)) continue;
    FillJobInfo(*state_.FindJob(job_id), response->add_jobs());
  }
  // `cache: auto` jobs decided since the worker got their JobInfo: it builds them again.
  const std::set<uint64_t> decided(request.cache_decided_job_ids().begin(),
                                   request.cache_decided_job_ids().end());
  for (uint64_t job_id : known) {
    const DispatcherState::Job* job = state_.FindJob(job_id);
    if (job == nullptr || job->finished() || !job->cache_decision.has_value() ||
        decided.contains(job_id)) {
      continue;
    }
    FillJobInfo(*job, response->add_jobs());
  }
  // Jobs the worker caches that are over: it frees their pipelines, splits and queues.
  for (uint64_t job_id : known) {
    const DispatcherState::Job* job = state_.FindJob(job_id);
    if (job == nullptr || job->finished()) response->add_finished_job_ids(job_id);
  }
  ExchangeDescriptions(request, worker, response);
  response->set_draining(worker.draining);
  response->set_may_exit(worker.draining && worker.slots.empty());
  return CommitCacheFiles(request, response);
}

absl::Status DispatcherImpl::LoseWorker(uint64_t worker_id, const char* reason,
                                        const std::string& why) {
  const DispatcherState::Worker* worker = state_.FindWorker(worker_id);
  if (worker == nullptr) return absl::OkStatus();
  logger_->warn("worker {} at {} {}: {} splits wait for their consumers' progress", worker_id,
                worker->address, why, worker->slots.size());
  proto::Update update;
  update.mutable_worker_lost()->set_worker_id(worker_id);
  RETURN_IF_ERROR(Commit(update));
  worker_signals_.erase(worker_id);
  metrics_.workers_lost.Add({{"reason", reason}}).Increment();
  UpdateGauges();
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoWorkerUnregister(const proto::WorkerUnregisterRequest& request,
                                                proto::WorkerUnregisterResponse* /*response*/) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  if (state_.FindWorker(request.worker_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(), " is not registered"));
  }
  return LoseWorker(request.worker_id(), "unregistered", "unregistered");
}

absl::Status DispatcherImpl::DoDrainWorker(const proto::DrainWorkerRequest& request,
                                           proto::DrainWorkerResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  const DispatcherState::Worker* worker = state_.FindWorker(request.worker_id());
  if (worker == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker ", request.worker_id(), " is not registered"));
  }
  uint32_t handed_back = 0;
  for (const SlotKey& key : worker->slots) {
    const DispatcherState::Slot* slot = state_.FindSlot(key);
    if (slot != nullptr && !slot->finished_producing) ++handed_back;
  }
  proto::Update update;
  update.mutable_drain_worker()->set_worker_id(request.worker_id());
  RETURN_IF_ERROR(Commit(update));
  logger_->info("worker {} drains: {} splits handed back", request.worker_id(), handed_back);
  response->set_handed_back(handed_back);
  UpdateGauges();
  return absl::OkStatus();
}

}  // namespace sluice::dispatcher
