#include "data_worker/worker/job_registry.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice::data_worker {
namespace {

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

}  // namespace

JobRegistry::JobRegistry(std::vector<std::string> data_roots,
                         pipeline::ExecutorOptions executor_options,
                         std::shared_ptr<spdlog::logger> logger,
                         service::ServiceLimits limits)
    : data_roots_(std::move(data_roots)),
      executor_options_(std::move(executor_options)),
      logger_(std::move(logger)),
      limits_(limits) {}

absl::StatusOr<std::vector<std::string>> JobRegistry::CanonicalDataRoots(
    std::vector<std::string> roots) {
  if (roots.empty())
    return absl::InvalidArgumentError(
        "the worker needs at least one --data-root");
  for (std::string& root : roots) {
    if (root.empty())
      return absl::InvalidArgumentError("--data-root: empty path");
    root = Canonical(root);
  }
  return roots;
}

absl::Status JobRegistry::CheckDataRoot(const proto::Pipeline& spec) const {
  std::string path;
  if (spec.source().has_dataset()) path = spec.source().dataset().path();
  if (spec.source().has_image_folder())
    path = spec.source().image_folder().path();
  if (path.empty())
    return absl::OkStatus();  // synthetic, or unset (the validator says so)
  const std::string canonical = Canonical(path);
  for (const std::string& root : data_roots_) {
    if (IsUnder(canonical, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "pipeline source '", path, "'",
      canonical != path ? absl::StrCat(" (resolved: '", canonical, "')") : "",
      " is outside the worker's --data-root (",
      absl::StrJoin(data_roots_, ", "), ")"));
}

std::shared_ptr<Job> JobRegistry::Build(const proto::JobInfo& info) const {
  auto job = std::make_shared<Job>();
  job->info = info;
  job->status = service::CheckPipelineBytes(
      static_cast<int64_t>(info.pipeline().size()), limits_);
  if (job->status.ok() && !job->spec.ParseFromString(info.pipeline())) {
    job->status = absl::InvalidArgumentError(
        absl::StrCat("job ", info.job_id(),
                     ": its pipeline does not parse as sluice.proto.Pipeline "
                     "(client and worker "
                     "versions differ?)"));
  }
  if (job->status.ok())
    job->status = service::CheckPipelineLimits(job->spec, limits_);
  if (job->status.ok()) job->status = CheckDataRoot(job->spec);
  if (job->status.ok()) {
    absl::StatusOr<std::unique_ptr<pipeline::Executor>> ex =
        pipeline::Executor::Create(job->spec, executor_options_);
    if (!ex.ok()) {
      job->status = absl::IsNotFound(ex.status())
                        ? absl::FailedPreconditionError(ex.status().message())
                        : ex.status();
    } else {
      const pipeline::LogicalPipeline& lp = (*ex)->logical();
      job->column_names = lp.column_names;
      job->shuffle = lp.shuffle;
      job->batched = lp.batch.has_value();
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

void JobRegistry::Add(const proto::JobInfo& info) {
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.contains(info.job_id())) return;
  }
  std::shared_ptr<Job> job = Build(info);
  absl::MutexLock lock(&mu_);
  jobs_.emplace(info.job_id(), std::move(job));
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

absl::StatusOr<std::unique_ptr<pipeline::Executor>>
JobRegistry::AcquireExecutor(uint64_t job_id) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end())
      return absl::NotFoundError(absl::StrCat("job ", job_id, " is gone"));
    job = it->second;
    if (!job->status.ok()) return job->status;
    if (!job->idle.empty()) {
      std::unique_ptr<pipeline::Executor> ex = std::move(job->idle.back());
      job->idle.pop_back();
      return ex;
    }
  }
  return pipeline::Executor::Create(job->spec, executor_options_);
}

void JobRegistry::ReleaseExecutor(
    uint64_t job_id, std::unique_ptr<pipeline::Executor> executor) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->idle.push_back(std::move(executor));
}

}  // namespace sluice::data_worker
