#include "data_worker/worker/job_registry.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/record/dataset.h"
#include "data_worker/ops/op.h"

namespace sluice::data_worker {
namespace {

std::string Canonical(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) return std::filesystem::absolute(path, ec).lexically_normal().string();
  return p.string();
}

bool IsUnder(const std::string& path, const std::string& root) {
  if (path == root) return true;
  std::string prefix = root;
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  return path.compare(0, prefix.size(), prefix) == 0;
}

// Cuts the tail the client can run (kernels::ClientTailLength) off the map right before the
// batch: `spec` is then the pipeline without it. Only when the batch is followed by nothing but
// prefetch and the map works on one column in place. Returns the cut ops (empty: no cut), sets
// `column` to the map's column and `position` to the pipeline-wide position of the first cut op
// (map ops are numbered in pipeline order; the numbers seed their draws).
std::vector<proto::OpSpec> CutClientTail(proto::Pipeline* spec, std::string* column,
                                         int* position) {
  int batch = -1;
  for (int i = 0; i < spec->nodes_size(); ++i) {
    if (spec->nodes(i).has_batch()) {
      batch = i;
    } else if (batch >= 0 && !spec->nodes(i).has_prefetch()) {
      return {};
    }
  }
  if (batch < 1 || !spec->nodes(batch - 1).has_map()) return {};
  proto::MapNode* map = spec->mutable_nodes(batch - 1)->mutable_map();
  if (map->input_columns_size() != 1 ||
      (map->output_columns_size() != 0 &&
       (map->output_columns_size() != 1 || map->output_columns(0) != map->input_columns(0)))) {
    return {};
  }
  const std::vector<proto::OpSpec> ops(map->ops().begin(), map->ops().end());
  const size_t n = kernels::ClientTailLength(ops);
  if (n == 0) return {};
  *column = map->input_columns(0);
  *position = static_cast<int>(ops.size() - n);
  for (int i = 0; i < batch - 1; ++i) {
    if (spec->nodes(i).has_map()) *position += spec->nodes(i).map().ops_size();
  }
  std::vector<proto::OpSpec> tail(ops.end() - n, ops.end());
  if (n == ops.size()) {
    spec->mutable_nodes()->DeleteSubrange(batch - 1, 1);
  } else {
    map->mutable_ops()->DeleteSubrange(static_cast<int>(ops.size() - n), static_cast<int>(n));
  }
  return tail;
}

}  // namespace

JobRegistry::JobRegistry(std::vector<std::string> data_roots,
                         pipeline::ExecutorOptions executor_options,
                         std::shared_ptr<spdlog::logger> logger, service::ServiceLimits limits,
                         CacheStore* caches)
    : data_roots_(std::move(data_roots)),
      executor_options_(std::move(executor_options)),
      logger_(std::move(logger)),
      limits_(limits),
      caches_(caches) {}

pipeline::ExecutorOptions JobRegistry::OptionsFor(const Job& job) const {
  pipeline::ExecutorOptions o = executor_options_;
  o.cache = job.cache;
  o.job_seed = job.info.config().seed();
  if (job.measuring) {
    o.optimizer.map_fusion = false;
    o.optimizer.map_batch_fusion = false;
    o.optimizer.vectorization = false;
    o.optimizer.pipeline_parallel = false;
  }
  return o;
}

absl::StatusOr<std::vector<std::string>> JobRegistry::CanonicalDataRoots(
    std::vector<std::string> roots) {
  if (roots.empty()) return absl::InvalidArgumentError("the worker needs at least one --data-root");
  for (std::string& root : roots) {
    if (root.empty()) return absl::InvalidArgumentError("--data-root: empty path");
    root = Canonical(root);
  }
  return roots;
}

absl::Status JobRegistry::CheckDataRoot(const proto::Pipeline& spec) const {
  std::string path;
  if (spec.source().has_dataset()) path = spec.source().dataset().path();
  if (spec.source().has_image_folder()) path = spec.source().image_folder().path();
  if (path.empty()) return absl::OkStatus();  // synthetic, or unset (the validator says so)
  const std::string canonical = Canonical(path);
  for (const std::string& root : data_roots_) {
    if (IsUnder(canonical, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "pipeline source '", path, "'",
      canonical != path ? absl::StrCat(" (resolved: '", canonical, "')") : "",
      " is outside the worker's --data-root (", absl::StrJoin(data_roots_, ", "), ")"));
}

absl::StatusOr<std::vector<uint64_t>> JobRegistry::ShardRecordCounts(
    const std::string& pipeline) const {
  RETURN_IF_ERROR(service::CheckPipelineBytes(static_cast<int64_t>(pipeline.size()), limits_));
  proto::Pipeline spec;
  if (!spec.ParseFromString(pipeline)) {
    return absl::InvalidArgumentError("pipeline: not a serialized Pipeline");
  }
  if (!spec.source().has_dataset()) {
    return absl::InvalidArgumentError("DescribeDataset: the pipeline's source is not a dataset");
  }
  RETURN_IF_ERROR(CheckDataRoot(spec));
  const std::string& dir = spec.source().dataset().path();
  absl::StatusOr<record::Manifest> manifest =
      record::Manifest::ReadFile((std::filesystem::path(dir) / record::kManifestName).string());
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat("pipeline source '", dir,
                                     "' is not a readable Unirecord dataset folder (convert it "
                                     "first with `sluice record convert`): ",
                                     manifest.status().message()));
  }
  std::vector<uint64_t> counts;
  for (const record::ShardInfo& shard : manifest->shards) counts.push_back(shard.records);
  return counts;
}

std::shared_ptr<Job> JobRegistry::Build(const proto::JobInfo& info) const {
  auto job = std::make_shared<Job>();
  job->info = info;
  job->status = service::CheckPipelineBytes(static_cast<int64_t>(info.pipeline().size()), limits_);
  if (job->status.ok() && !job->spec.ParseFromString(info.pipeline())) {
    job->status = absl::InvalidArgumentError(
        absl::StrCat("job ", info.job_id(),
                     ": its pipeline does not parse as sluice.proto.Pipeline "
                     "(client and worker "
                     "versions differ?)"));
  }
  if (job->status.ok()) job->status = service::CheckPipelineLimits(job->spec, limits_);
  if (job->status.ok()) job->status = CheckDataRoot(job->spec);
  job->measuring = info.config().cache() == proto::CACHE_MODE_AUTO &&
                   info.config().mode() == proto::PROCESSING_MODE_DISTRIBUTED_EPOCH &&
                   !info.cache_decision().decided();
  if (job->status.ok()) {
    absl::StatusOr<std::unique_ptr<pipeline::Executor>> ex =
        pipeline::Executor::Create(job->spec, OptionsFor(*job));
    if (!ex.ok()) {
      job->status = absl::IsNotFound(ex.status())
                        ? absl::FailedPreconditionError(ex.status().message())
                        : ex.status();
    } else {
      job->cache_key = pipeline_spec::CacheKeyOf(job->spec, info.config().split_size());
      const std::optional<pipeline::LogicalCache>& lc = (*ex)->logical().cache;
      if (job->cache_key.has_value() && lc.has_value() && caches_ != nullptr &&
          caches_->enabled()) {
        job->cache = caches_->Get(job->cache_key->fingerprint, lc->name, lc->column_types);
        absl::StatusOr<std::unique_ptr<pipeline::Executor>> cached =
            pipeline::Executor::Create(job->spec, OptionsFor(*job));
        if (cached.ok()) {
          *ex = std::move(*cached);
        } else {
          job->cache = nullptr;
        }
      }
      job->finish = *kernels::ParseFinishMode(job->spec.finish());  // validated
      if (job->finish != kernels::FinishMode::kWorker) {
        absl::Status cut = CutTail(job.get(), &*ex);
        if (!cut.ok()) {
          // The full pipeline ran validation; a failing cut is ours: finish on the worker.
          logger_->warn("job {}: finishing on the worker: {}", info.job_id(), cut.ToString());
          job->tail.reset();
        }
      }
      const pipeline::LogicalPipeline& lp = (*ex)->logical();
      job->column_names = lp.column_names;
      job->shuffle = lp.shuffle;
      job->batched = lp.batch.has_value();
      job->batch_size = info.batch_size() > 0  ? info.batch_size()
                        : lp.batch.has_value() ? static_cast<uint64_t>(lp.batch->size)
                                               : 1;
      job->idle.push_back(std::move(*ex));
    }
  }
  if (job->status.ok()) {
    logger_->info("job {} ('{}'): pipeline ready", info.job_id(), info.job_name());
  } else {
    logger_->warn("job {} ('{}') refused: {}", info.job_id(), info.job_name(),
                  job->status.ToString());
  }
  return job;
}

absl::Status JobRegistry::CutTail(Job* job, std::unique_ptr<pipeline::Executor>* executor) const {
  proto::Pipeline cut = job->spec;
  std::string column;
  int position = 0;
  std::vector<proto::OpSpec> specs = CutClientTail(&cut, &column, &position);
  if (specs.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Op>> ops, BuildOps(specs, position, /*fuse=*/true));
  ASSIGN_OR_RETURN(std::unique_ptr<pipeline::Executor> ex,
                   pipeline::Executor::Create(cut, OptionsFor(*job)));
  const std::vector<std::string>& names = ex->logical().column_names;
  auto it = std::find(names.begin(), names.end(), column);
  if (it == names.end()) {
    return absl::InternalError(
        absl::StrCat("column '", column, "' is not in the pipeline's output"));
  }
  Job::Tail tail;
  tail.column = static_cast<int>(it - names.begin());
  tail.specs = std::move(specs);
  tail.seed = ex->logical().seed;
  for (auto& op : ops) {
    if (op->mirrors() && tail.ops.empty() && tail.mirror == nullptr) {
      tail.mirror = std::move(op);
    } else {
      tail.ops.push_back(std::move(op));
    }
  }
  job->tail = std::move(tail);
  job->spec = std::move(cut);  // the executors run the pipeline without the tail
  *executor = std::move(ex);
  return absl::OkStatus();
}

void JobRegistry::Add(const proto::JobInfo& info) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(info.job_id());
    if (it != jobs_.end() &&
        (it->second->info.cache_decision().decided() || !info.cache_decision().decided())) {
      return;
    }
  }
  std::shared_ptr<Job> job = Build(info);
  std::shared_ptr<Job> replaced;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Job>& slot = jobs_[info.job_id()];
  if (slot != nullptr &&
      (slot->info.cache_decision().decided() || !info.cache_decision().decided())) {
    return;  // another heartbeat's Add came first
  }
  if (slot != nullptr) {
    logger_->info("job {}: cache auto decided ({}): pipeline built again", info.job_id(),
                  info.cache_decision().reason());
  }
  replaced = std::move(slot);
  slot = std::move(job);
}

std::shared_ptr<const Job> JobRegistry::Get(uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::vector<uint64_t> JobRegistry::ids() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out;
  for (const auto& [id, job] : jobs_) out.push_back(id);
  return out;
}

void JobRegistry::Remove(uint64_t job_id) {
  std::shared_ptr<Job> gone;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  gone = std::move(it->second);
  jobs_.erase(it);
}

void JobRegistry::Clear() {
  std::map<uint64_t, std::shared_ptr<Job>> gone;
  absl::MutexLock lock(&mu_);
  gone.swap(jobs_);
}

absl::StatusOr<std::unique_ptr<pipeline::Executor>> JobRegistry::AcquireExecutor(
    uint64_t job_id, std::shared_ptr<const Job>* built_for) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is gone"));
    job = it->second;
    if (built_for != nullptr) *built_for = job;
    if (!job->status.ok()) return job->status;
    if (!job->idle.empty()) {
      std::unique_ptr<pipeline::Executor> ex = std::move(job->idle.back());
      job->idle.pop_back();
      return ex;
    }
  }
  return pipeline::Executor::Create(job->spec, OptionsFor(*job));
}

void JobRegistry::ReleaseExecutor(uint64_t job_id, std::unique_ptr<pipeline::Executor> executor,
                                  const Job* built_for) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  if (built_for != nullptr && built_for != it->second.get()) return;  // built again since
  it->second->idle.push_back(std::move(executor));
}

}  // namespace sluice::data_worker
