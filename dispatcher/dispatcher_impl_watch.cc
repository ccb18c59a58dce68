// DispatcherImpl, continued: the assignment channel (WatchAssignment, a long poll held
// without a thread; the protocol is in dispatcher_impl.h "Assignment channel").

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatcher/dispatcher_impl.h"

namespace sluice::dispatcher {
namespace {

// The newest PARALLEL_EPOCHS job's id (0: none).
uint64_t NewestParallelJob(const DispatcherState& state) {
  for (auto it = state.jobs().rbegin(); it != state.jobs().rend(); ++it) {
    if (it->second.config.mode() == proto::PROCESSING_MODE_PARALLEL_EPOCHS) return it->first;
  }
  return 0;
}

}  // namespace

bool DispatcherImpl::AnyAssignableSlot() const {
  for (const auto& [job_id, job] : state_.jobs()) {
    if (job.config.mode() != proto::PROCESSING_MODE_DISTRIBUTED_EPOCH) continue;
    for (const DispatcherState::Consumer& consumer : job.consumers) {
      if (Assignable(job, consumer) != nullptr) return true;
    }
  }
  return false;
}

bool DispatcherImpl::KnownJobOver(const Watch& watch) const {
  for (uint64_t job_id : watch.known_job_ids) {
    const DispatcherState::Job* job = state_.FindJob(job_id);
    if (job == nullptr || job->finished()) return true;
  }
  return false;
}

bool DispatcherImpl::WorkWaitsFor(const Watch& watch, bool any_pending,
                                  uint64_t newest_parallel) const {
  const DispatcherState::Worker* worker = state_.FindWorker(watch.worker_id);
  if (worker == nullptr || worker->draining) return false;
  if (newest_parallel > watch.max_job_id) return true;
  if (VerificationToHand(clock_->Now())) return true;
  if (!any_pending) return false;
  return SlotsInProduction(*worker) < worker->capacity;
}

void DispatcherImpl::WatchAssignment(const proto::WatchAssignmentRequest& request,
                                     proto::WatchAssignmentResponse* response, Done done) {
  if (absl::Status s = Admit(request.protocol_version()); !s.ok()) {
    done(std::move(s));
    return;
  }
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      status =
          absl::UnavailableError("the dispatcher is stopping: heartbeat at the usual interval");
    } else if (state_.FindWorker(request.worker_id()) == nullptr) {
      status = absl::NotFoundError(absl::StrCat("worker ", request.worker_id(),
                                                " is not registered (timed out?): call "
                                                "WorkerRegister again"));
    } else {
      absl::Duration wait = options_.heartbeat_interval;
      if (request.max_wait_seconds() > 0)
        wait = std::min(wait, absl::Seconds(request.max_wait_seconds()));
      Watch watch{.worker_id = request.worker_id(),
                  .max_job_id = state_.jobs().empty() ? 0 : state_.jobs().rbegin()->first,
                  .known_job_ids = {request.known_job_ids().begin(), request.known_job_ids().end()},
                  .deadline = clock_->Now() + wait,
                  .response = response};
      const bool over = KnownJobOver(watch);
      const bool work = WorkWaitsFor(watch, AnyAssignableSlot(), NewestParallelJob(state_));
      if (over || work) {
        response->set_jobs_over(over);
        response->set_work_available(work);
        metrics_.assignment_wakeups.Increment();
      } else {
        watch.done = std::move(done);
        watches_.push_back(std::move(watch));
        return;
      }
    }
  }
  done(std::move(status));
}

void DispatcherImpl::AnswerWatches(bool stopping) {
  std::vector<std::pair<Done, absl::Status>> answers;
  {
    absl::MutexLock lock(&mu_);
    if (watches_.empty()) return;
    const absl::Time now = clock_->Now();
    const bool any_pending = AnyAssignableSlot();
    const uint64_t newest_parallel = NewestParallelJob(state_);
    std::vector<Watch> held;
    for (Watch& watch : watches_) {
      if (stopping) {
        answers.emplace_back(std::move(watch.done),
                             absl::UnavailableError("the dispatcher is stopping"));
        continue;
      }
      if (state_.FindWorker(watch.worker_id) == nullptr) {
        answers.emplace_back(std::move(watch.done),
                             absl::NotFoundError(absl::StrCat(
                                 "worker ", watch.worker_id,
                                 " is no longer registered: call WorkerRegister again")));
        continue;
      }
      const bool over = KnownJobOver(watch);
      const bool work = WorkWaitsFor(watch, any_pending, newest_parallel);
      if (over || work) {
        watch.response->set_jobs_over(over);
        watch.response->set_work_available(work);
        metrics_.assignment_wakeups.Increment();
        answers.emplace_back(std::move(watch.done), absl::OkStatus());
      } else if (now >= watch.deadline) {
        answers.emplace_back(std::move(watch.done), absl::OkStatus());
      } else {
        held.push_back(std::move(watch));
      }
    }
    watches_ = std::move(held);
  }
  for (auto& [done, status] : answers) done(std::move(status));
}

}  // namespace sluice::dispatcher
