// Who may call which DispatcherService method (authorization.h).
#include "dispatcher/authorization.h"

#include "absl/strings/str_cat.h"
#include "common/record/checksum.h"
#include "common/service/limits.h"

namespace sluice::dispatcher {

using service::Identity;
using service::Role;

namespace {

// What makes two RegisterDataset calls the same dataset (DispatcherImpl answers both with one
// id), hashed.
uint64_t DatasetKey(const proto::RegisterDatasetRequest& request) {
  std::string key = absl::StrCat(request.batch_size(), ":");
  for (uint64_t n : request.shard_record_counts()) absl::StrAppend(&key, n, ",");
  absl::StrAppend(&key, ":", request.pipeline());
  return record::Checksum(key);
}

}  // namespace

absl::Status Authorization::CheckRegisterDataset(
    const Identity& caller, const proto::RegisterDatasetRequest& request) const {
  if (absl::Status s = service::RequireRole(caller, Role::kTrainer, "RegisterDataset");
      !s.ok() || caller.all_roles) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  const auto it = registered_.find(caller.user);
  if (it == registered_.end() || it->second.contains(DatasetKey(request))) {
    return absl::OkStatus();
  }
  return service::CheckPerIdentityLimit(caller.user, static_cast<int64_t>(it->second.size()),
                                        options_.max_datasets_per_identity, "datasets",
                                        "--max-datasets-per-identity");
}

void Authorization::DatasetRegistered(const Identity& caller,
                                      const proto::RegisterDatasetRequest& request,
                                      uint64_t dataset_id) {
  if (caller.all_roles) return;
  absl::MutexLock lock(&mu_);
  dataset_owners_[dataset_id].insert(caller.user);
  registered_[caller.user][DatasetKey(request)] = dataset_id;
}

void Authorization::ForgetDatasets(const std::string& user,
                                   absl::FunctionRef<bool(uint64_t)> registered) {
  absl::MutexLock lock(&mu_);
  auto it = registered_.find(user);
  if (it == registered_.end()) return;
  for (auto d = it->second.begin(); d != it->second.end();) {
    if (registered(d->second)) {
      ++d;
      continue;
    }
    dataset_owners_.erase(d->second);
    d = it->second.erase(d);
  }
}

absl::Status Authorization::CheckGetOrCreateJob(const Identity& caller,
                                                absl::string_view anonymous_id,
                                                proto::GetOrCreateJobRequest* request) const {
  if (absl::Status s = service::RequireRole(caller, Role::kTrainer, "GetOrCreateJob"); !s.ok()) {
    return s;
  }
  if (!caller.all_roles && !caller.Has(Role::kOperator)) {
    absl::MutexLock lock(&mu_);
    const auto it = dataset_owners_.find(request->dataset_id());
    if (it == dataset_owners_.end() || !it->second.contains(caller.user)) {
      return absl::PermissionDeniedError(absl::StrCat(
          caller.Describe(), " may not create a job over dataset ", request->dataset_id(),
          ": it did not register that dataset (RegisterDataset it first)"));
    }
  }
  request->set_job_name(service::ScopedJobName(caller, request->job_name(), anonymous_id));
  return absl::OkStatus();
}

void Authorization::JobCreated(const Identity& caller, uint64_t job_id) {
  if (caller.all_roles) return;
  absl::MutexLock lock(&mu_);
  job_owners_[job_id] = caller.user;
}

std::optional<std::string> Authorization::JobOwner(uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  const auto it = job_owners_.find(job_id);
  if (it == job_owners_.end()) return std::nullopt;
  return it->second;
}

void Authorization::LearnJobs(const proto::GetStatusResponse& status) {
  absl::MutexLock lock(&mu_);
  for (const proto::JobStatus& job : status.jobs())
    job_owners_[job.job_id()] = service::JobOwner(job.job_name());
}

absl::Status Authorization::CheckJobAccess(const Identity& caller, Role role,
                                           absl::string_view method, uint64_t job_id,
                                           absl::string_view owner) const {
  if (!caller.Has(Role::kOperator)) {
    if (absl::Status s = service::RequireRole(caller, role, method); !s.ok()) return s;
  }
  if (caller.MayActFor(owner)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      caller.Describe(), " may not call ", method, " for job ", job_id, ": the job belongs to ",
      owner.empty() ? std::string("no identity (made in development mode)") : std::string(owner),
      " (only its owner or an operator, sluice:operators, may)"));
}

absl::Status Authorization::CheckWorkerRegister(const Identity& caller,
                                                const proto::WorkerRegisterRequest& request,
                                                uint64_t* holder) const {
  *holder = 0;
  if (absl::Status s = service::RequireRole(caller, Role::kWorker, "WorkerRegister"); !s.ok()) {
    return s;
  }
  if (request.capacity() > options_.max_worker_capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WorkerRegister: capacity ", request.capacity(), " is more than --max-worker-capacity ",
        options_.max_worker_capacity, " (splits a worker produces at once)"));
  }
  if (caller.all_roles) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  const auto it = addresses_.find(request.address());
  if (it != addresses_.end() && it->second.first != caller.user) *holder = it->second.second;
  return absl::OkStatus();
}

void Authorization::WorkerRegistered(const Identity& caller, uint64_t worker_id,
                                     const std::string& address) {
  if (caller.all_roles) return;
  absl::MutexLock lock(&mu_);
  worker_owners_[worker_id] = caller.user;
  addresses_[address] = {caller.user, worker_id};
}

absl::Status Authorization::CheckWorker(const Identity& caller, uint64_t worker_id,
                                        absl::string_view method) {
  if (absl::Status s = service::RequireRole(caller, Role::kWorker, method); !s.ok()) {
    return s;
  }
  if (caller.all_roles) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  const auto [it, inserted] = worker_owners_.emplace(worker_id, caller.user);
  if (inserted || it->second == caller.user) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(caller.Describe(), " may not call ", method,
                                                  " for worker ", worker_id,
                                                  ": that worker was registered by ", it->second));
}

absl::Status Authorization::CheckDrainWorker(const Identity& caller) const {
  return service::RequireRole(caller, Role::kOperator, "DrainWorker");
}

absl::Status Authorization::CheckRemoveCache(const Identity& caller) const {
  return service::RequireRole(caller, Role::kOperator, "RemoveCache");
}

absl::Status Authorization::CheckGetStatus(const Identity& caller,
                                           proto::GetStatusRequest* request) const {
  if (caller.Has(Role::kOperator)) return absl::OkStatus();
  if (absl::Status s = service::RequireRole(caller, Role::kTrainer, "GetStatus"); !s.ok()) {
    return s;
  }
  request->set_starting_workers(-1);
  return absl::OkStatus();
}

void Authorization::FilterStatus(const Identity& caller, proto::GetStatusResponse* response) const {
  if (caller.Has(Role::kOperator)) return;
  auto* jobs = response->mutable_jobs();
  for (int i = jobs->size() - 1; i >= 0; --i) {
    if (!caller.MayActFor(service::JobOwner(jobs->Get(i).job_name()))) jobs->DeleteSubrange(i, 1);
  }
  response->clear_drain();
}

}  // namespace sluice::dispatcher
