// Authorization: who may call which DispatcherService method, on what. The gRPC adapter
// (grpc_dispatcher_service.cc) learns the caller (service::IdentityOf) and asks here before it
// forwards a call to DispatcherImpl, which knows nothing of identities.
//
//   method            role               and
//   RegisterDataset   sluice:trainers    the caller becomes one of the dataset's owners
//   GetOrCreateJob    sluice:trainers    owns the dataset; the job name is scoped "user/name"
//   ClientHeartbeat   sluice:trainers    owns the job
//   GetJobState       trainers/operators owns the job (or is an operator)
//   GetStatus         trainers/operators a trainer sees only its own jobs, and cannot set
//                                        starting_workers
//   WorkerRegister    sluice:workers     capacity <= --max-worker-capacity; the address is not
//                                        held by a live worker of another identity
//   WorkerHeartbeat,  sluice:workers     the worker id was registered by the caller
//   WorkerUnregister
//   DrainWorker       sluice:operators
//   RemoveCache       sluice:operators
// Operators may act on every job; the development identity (no client authentication, or the
// one --auth-token-file token) holds every role.
//
// Owners. A job's owner is in its stored name (service::ScopedJobName), so it survives a
// restart with the job; the adapter learns names it has not seen from GetStatus (LearnJobs).
// Dataset and worker owners live in memory: after a restart a dataset is owned by whoever
// registers it again (clients register before they create a job), and a worker id by the first
// identity that heartbeats for it.
//
// Thread-safety: thread-safe (one mutex).
#ifndef SLUICE_DISPATCHER_AUTHORIZATION_H_
#define SLUICE_DISPATCHER_AUTHORIZATION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/service/identity.h"
#include "proto/dispatcher.pb.h"

namespace sluice::dispatcher {

class Authorization {
 public:
  struct Options {
    // --max-worker-capacity: the most splits a worker may say it produces at once.
    uint32_t max_worker_capacity = 64;
    // --max-datasets-per-identity: the most distinct datasets (pipeline, shard counts, batch
    // size) one identity holds: registered since this process started and not forgotten
    // since (ForgetDatasets).
    int64_t max_datasets_per_identity = 256;
  };

  explicit Authorization(Options options) : options_(options) {}

  // RegisterDataset: the role, and --max-datasets-per-identity (RESOURCE_EXHAUSTED naming it;
  // registering a dataset the caller registered before always passes). DatasetRegistered
  // records the caller as an owner.
  absl::Status CheckRegisterDataset(const service::Identity& caller,
                                    const proto::RegisterDatasetRequest& request) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void DatasetRegistered(const service::Identity& caller,
                         const proto::RegisterDatasetRequest& request, uint64_t dataset_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops what `user` registered that the dispatcher no longer holds (`registered(id)` false:
  // forgotten after --dataset-ttl), so the quota counts the datasets the user holds now.
  void ForgetDatasets(const std::string& user, absl::FunctionRef<bool(uint64_t)> registered)
      ABSL_LOCKS_EXCLUDED(mu_);

  // GetOrCreateJob: the role and the dataset's ownership (PERMISSION_DENIED "register the
  // dataset first"); rewrites request->job_name to its scoped form. `anonymous_id` names an
  // anonymous job uniquely. JobCreated records the owner of the answer's job.
  absl::Status CheckGetOrCreateJob(const service::Identity& caller, absl::string_view anonymous_id,
                                   proto::GetOrCreateJobRequest* request) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void JobCreated(const service::Identity& caller, uint64_t job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // The owner of `job_id` as far as known; nullopt when the adapter must LearnJobs first.
  std::optional<std::string> JobOwner(uint64_t job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Records the owner of every job in `status` (a full GetStatus answer).
  void LearnJobs(const proto::GetStatusResponse& status) ABSL_LOCKS_EXCLUDED(mu_);
  // ClientHeartbeat / GetJobState of a job whose owner is `owner`: `role` (an operator passes
  // too) and ownership. PERMISSION_DENIED naming the job and the method.
  absl::Status CheckJobAccess(const service::Identity& caller, service::Role role,
                              absl::string_view method, uint64_t job_id,
                              absl::string_view owner) const;

  // WorkerRegister: the role and the capacity (INVALID_ARGUMENT naming
  // --max-worker-capacity). Sets *holder to the id of a worker of another identity registered
  // at the same address (0: none): the adapter refuses the call while that worker is live.
  absl::Status CheckWorkerRegister(const service::Identity& caller,
                                   const proto::WorkerRegisterRequest& request,
                                   uint64_t* holder) const ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerRegistered(const service::Identity& caller, uint64_t worker_id,
                        const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // WorkerHeartbeat / WorkerUnregister: the role, and `worker_id` registered by the caller (an
  // id not seen since this process started is bound to its first caller).
  absl::Status CheckWorker(const service::Identity& caller, uint64_t worker_id,
                           absl::string_view method) ABSL_LOCKS_EXCLUDED(mu_);

  // DrainWorker: operators.
  absl::Status CheckDrainWorker(const service::Identity& caller) const;
  // RemoveCache: operators.
  absl::Status CheckRemoveCache(const service::Identity& caller) const;

  // GetStatus: trainers or operators; a trainer's request loses starting_workers.
  absl::Status CheckGetStatus(const service::Identity& caller,
                              proto::GetStatusRequest* request) const;
  // What `caller` may see of a full answer: a non-operator keeps only its own jobs and no
  // drain list.
  void FilterStatus(const service::Identity& caller, proto::GetStatusResponse* response) const;

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::set<std::string>> dataset_owners_ ABSL_GUARDED_BY(mu_);
  // user -> the datasets it registered: content (DatasetKey) -> dataset id.
  std::map<std::string, std::map<uint64_t, uint64_t>> registered_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> job_owners_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> worker_owners_ ABSL_GUARDED_BY(mu_);
  // address -> (identity, worker id) of the last registration there.
  std::map<std::string, std::pair<std::string, uint64_t>> addresses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_AUTHORIZATION_H_
