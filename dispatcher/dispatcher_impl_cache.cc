// DispatcherImpl: cache nodes (docs/cache.md). A job whose pipeline has a cache node names a
// cache (created with the job); workers report the files they write in their heartbeats, and
// the first file of each split is committed through the journal (cache_catalog.h has the
// policy); every worker learns the commits from its heartbeat answers.
#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "dispatcher/cache_auto.h"
#include "dispatcher/dispatcher_impl.h"

namespace sluice::dispatcher {
namespace {

std::string Bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.1f GiB", b / double(1 << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(1 << 20));
  if (b >= (uint64_t{1} << 10)) return absl::StrFormat("%.1f KiB", b / double(1 << 10));
  return absl::StrCat(b, " B");
}

}  // namespace

std::optional<proto::Pipeline> DispatcherImpl::PipelineOfJob(
    const DispatcherState::Job& job) const {
  const DispatcherState::Dataset* dataset = state_.FindDataset(job.dataset_id);
  if (dataset == nullptr) return std::nullopt;
  proto::Pipeline pipeline;
  if (!pipeline.ParseFromString(dataset->pipeline)) return std::nullopt;
  if (job.cache_decision.has_value() && job.cache_decision->cache()) {
    absl::StatusOr<proto::Pipeline> cut =
        WithCacheAfter(pipeline, job.cache_decision->after_node(), job.cache_decision->name());
    if (cut.ok()) return *std::move(cut);
  }
  return pipeline;
}

std::optional<pipeline_spec::CacheKey> DispatcherImpl::CacheKeyOfJob(
    const DispatcherState::Job& job) const {
  std::optional<proto::Pipeline> pipeline = PipelineOfJob(job);
  if (!pipeline.has_value()) return std::nullopt;
  return pipeline_spec::CacheKeyOf(*pipeline, job.config.split_size());
}

bool DispatcherImpl::MeasuresCost(const DispatcherState::Job& job) {
  return job.config.cache() == proto::CACHE_MODE_AUTO &&
         job.config.mode() == proto::PROCESSING_MODE_DISTRIBUTED_EPOCH &&
         !job.cache_decision.has_value();
}

proto::CacheDecision DispatcherImpl::AutoCacheDecisionOf(const DispatcherState::Job& job) const {
  if (job.cache_decision.has_value()) return *job.cache_decision;
  proto::CacheDecision d;
  const DispatcherState::Dataset* dataset = state_.FindDataset(job.dataset_id);
  proto::Pipeline pipeline;
  if (dataset == nullptr || !pipeline.ParseFromString(dataset->pipeline)) {
    d.set_reason("the job's dataset is gone");
    return d;
  }
  AutoCacheInput in;
  in.pipeline = &pipeline;
  in.split_size = job.config.split_size();
  for (const record::Split& s : job.splits) in.records_per_epoch += s.size();
  in.min_records =
      options_.auto_cache_min_records > 0 ? options_.auto_cache_min_records : in.records_per_epoch;
  if (auto it = node_costs_.find(job.id); it != node_costs_.end()) {
    for (const auto& [worker, costs] : it->second) {
      in.costs.insert(in.costs.end(), costs.begin(), costs.end());
    }
  }
  if (options_.cache_budget_bytes > 0) {
    const uint64_t used = state_.caches().total_bytes();
    in.free_bytes = options_.cache_budget_bytes > used ? options_.cache_budget_bytes - used : 0;
  }
  in.read_seconds_per_byte = options_.auto_cache_read_seconds_per_byte;
  d = DecideAutoCache(in);
  if (d.decided()) {
    uint64_t epoch = 0;
    for (const DispatcherState::Consumer& c : job.consumers) epoch = std::max(epoch, c.epoch);
    d.set_from_epoch(epoch);
  }
  return d;
}

absl::Status DispatcherImpl::DecideAutoCaches(const proto::WorkerHeartbeatRequest& request) {
  std::map<uint64_t, std::vector<proto::NodeCost>> reported;
  for (const proto::NodeCost& c : request.node_costs()) reported[c.job_id()].push_back(c);
  for (auto& [job_id, costs] : reported) {
    const DispatcherState::Job* job = state_.FindJob(job_id);
    if (job == nullptr || !MeasuresCost(*job)) continue;
    node_costs_[job_id][request.worker_id()] = std::move(costs);
    const proto::CacheDecision d = AutoCacheDecisionOf(*job);
    if (!d.decided()) continue;
    proto::Update update;
    update.mutable_cache_decision()->set_job_id(job_id);
    *update.mutable_cache_decision()->mutable_decision() = d;
    RETURN_IF_ERROR(Commit(update));
    node_costs_.erase(job_id);
    logger_->info("job {} '{}': cache: auto decided from {} records: {}", job_id, job->name,
                  d.records_measured(), d.reason());
    if (d.cache()) RETURN_IF_ERROR(CreateCache(*state_.FindJob(job_id)));
  }
  // Jobs that are gone or decided keep no measurements.
  for (auto it = node_costs_.begin(); it != node_costs_.end();) {
    const DispatcherState::Job* job = state_.FindJob(it->first);
    it = job == nullptr || !MeasuresCost(*job) ? node_costs_.erase(it) : std::next(it);
  }
  return absl::OkStatus();
}

absl::Status DispatcherImpl::CreateCache(const DispatcherState::Job& job) {
  if (job.config.mode() == proto::PROCESSING_MODE_PARALLEL_EPOCHS) return absl::OkStatus();
  std::optional<pipeline_spec::CacheKey> key = CacheKeyOfJob(job);
  if (!key.has_value() || state_.caches().Find(key->fingerprint) != nullptr) {
    return absl::OkStatus();
  }
  proto::Update update;
  proto::UpdateCacheCreate* u = update.mutable_cache_create();
  u->set_fingerprint(key->fingerprint);
  u->set_name(key->name);
  u->set_total_splits(job.splits.size());
  u->set_seq(state_.caches().seq() + 1);
  RETURN_IF_ERROR(Commit(update));
  logger_->info("job {}: cache '{}' ({}), {} splits", job.id, key->name, key->fingerprint,
                job.splits.size());
  return absl::OkStatus();
}

std::map<std::string, uint64_t> DispatcherImpl::CachesInUse() const {
  std::map<std::string, uint64_t> out;
  for (const auto& [id, job] : state_.jobs()) {
    if (job.finished()) continue;
    std::optional<pipeline_spec::CacheKey> key = CacheKeyOfJob(job);
    if (key.has_value()) out.emplace(key->fingerprint, id);
  }
  return out;
}

absl::Status DispatcherImpl::CommitCacheFiles(const proto::WorkerHeartbeatRequest& request,
                                              proto::WorkerHeartbeatResponse* response) {
  if (!request.cache_files().empty()) {
    std::set<std::string> in_use;
    for (const auto& [fp, job] : CachesInUse()) in_use.insert(fp);
    for (const proto::CacheSplitFile& report : request.cache_files()) {
      response->add_cache_acked(report.path());
      const CacheCatalog::Cache* cache = state_.caches().Find(report.fingerprint());
      if (cache != nullptr) {
        auto it = cache->files.find(report.split_id());
        if (it != cache->files.end() && it->second.path() == report.path()) continue;
      }
      const CacheCatalog::CommitPlan plan =
          state_.caches().PlanCommit(report, options_.cache_budget_bytes, in_use);
      if (!plan.commit) {
        logger_->info("worker {}: cache file {} not committed: {}", request.worker_id(),
                      report.path(), plan.why);
        continue;
      }
      for (const std::string& fp : plan.evict) {
        const CacheCatalog::Cache* victim = state_.caches().Find(fp);
        logger_->warn("cache '{}' ({}, {}) evicted: {}", victim->name, fp, Bytes(victim->bytes),
                      plan.why);
        proto::Update remove;
        remove.mutable_cache_remove()->set_fingerprint(fp);
        remove.mutable_cache_remove()->set_seq(state_.caches().seq() + 1);
        remove.mutable_cache_remove()->set_reason(absl::StrCat("evicted: ", plan.why));
        RETURN_IF_ERROR(Commit(remove));
      }
      proto::Update commit;
      proto::CacheSplitFile* f = commit.mutable_cache_commit()->mutable_file();
      *f = report;
      f->set_seq(state_.caches().seq() + 1);
      RETURN_IF_ERROR(Commit(commit));
    }
  }
  state_.caches().EventsSince(request.cache_seq(), response);
  return absl::OkStatus();
}

absl::Status DispatcherImpl::DoRemoveCache(const proto::RemoveCacheRequest& request,
                                           proto::RemoveCacheResponse* response) {
  RETURN_IF_ERROR(Admit(request.protocol_version()));
  absl::MutexLock lock(&mu_);
  std::vector<const CacheCatalog::Cache*> named;
  for (const auto& [fp, c] : state_.caches().caches()) {
    if (c.name == request.name()) named.push_back(&c);
  }
  if (named.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no cache named '", request.name(), "' (see `sluice cache list`)"));
  }
  const std::map<std::string, uint64_t> in_use = CachesInUse();
  for (const CacheCatalog::Cache* c : named) {
    auto it = in_use.find(c->fingerprint);
    if (it != in_use.end()) {
      const DispatcherState::Job* job = state_.FindJob(it->second);
      return absl::FailedPreconditionError(
          absl::StrCat("cache '", request.name(), "' (", c->fingerprint, ") is used by job ",
                       it->second, " ('", job != nullptr ? job->name : "",
                       "'): remove it once that job is over (its "
                       "consumers finished or left)"));
    }
  }
  std::vector<std::string> fingerprints;
  for (const CacheCatalog::Cache* c : named) {
    fingerprints.push_back(c->fingerprint);
    response->set_files(response->files() + c->files.size());
    response->set_bytes(response->bytes() + c->bytes);
  }
  for (const std::string& fp : fingerprints) {
    proto::Update remove;
    remove.mutable_cache_remove()->set_fingerprint(fp);
    remove.mutable_cache_remove()->set_seq(state_.caches().seq() + 1);
    remove.mutable_cache_remove()->set_reason("removed by `sluice cache rm`");
    RETURN_IF_ERROR(Commit(remove));
    response->add_fingerprints(fp);
    logger_->info("cache '{}' ({}) removed: workers delete its folder", request.name(), fp);
  }
  return absl::OkStatus();
}

void DispatcherImpl::FillCacheStatus(const proto::GetStatusRequest& request,
                                     proto::GetStatusResponse* response) const {
  response->set_cache_budget_bytes(options_.cache_budget_bytes);
  std::map<std::string, std::vector<uint64_t>> users;
  for (const auto& [id, job] : state_.jobs()) {
    if (job.finished()) continue;
    std::optional<pipeline_spec::CacheKey> key = CacheKeyOfJob(job);
    if (key.has_value()) users[key->fingerprint].push_back(id);
  }
  for (const auto& [fp, c] : state_.caches().caches()) {
    proto::CacheStatus* s = response->add_caches();
    s->set_name(c.name);
    s->set_fingerprint(fp);
    s->set_splits_committed(c.files.size());
    s->set_splits_total(c.total_splits);
    s->set_bytes(c.bytes);
    for (uint64_t id : users[fp]) s->add_job_ids(id);
    if (request.cache_files()) {
      for (const auto& [split, f] : c.files) *s->add_files() = f;
    }
  }
  for (proto::JobStatus& j : *response->mutable_jobs()) {
    const DispatcherState::Job* job = state_.FindJob(j.job_id());
    if (job == nullptr) continue;
    if (job->config.cache() == proto::CACHE_MODE_AUTO) {
      *j.mutable_cache_decision() = AutoCacheDecisionOf(*job);
    }
    std::optional<pipeline_spec::CacheKey> key = CacheKeyOfJob(*job);
    if (!key.has_value()) continue;
    const CacheCatalog::Cache* c = state_.caches().Find(key->fingerprint);
    if (c == nullptr) {
      j.set_cache(absl::StrCat("cache '", key->name, "' (", key->fingerprint,
                               "): not recorded (parallel-epochs job, or removed)"));
      continue;
    }
    j.set_cache(absl::StrCat("cache '", c->name, "' (", c->fingerprint, "): ", c->files.size(), "/",
                             c->total_splits, " splits committed, ", Bytes(c->bytes)));
  }
}

}  // namespace sluice::dispatcher
