// Shared by the worker tests: a scripted fake dispatcher and helpers to build
// jobs and splits.
#ifndef SLUICE_TESTS_DATA_WORKER_WORKER_WORKER_TEST_UTIL_H_
#define SLUICE_TESTS_DATA_WORKER_WORKER_WORKER_TEST_UTIL_H_

#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/pipeline_spec/parse.h"
#include "data_worker/pipeline/spec.h"
#include "data_worker/worker/worker_impl.h"
#include "gtest/gtest.h"

namespace sluice::data_worker::testing {

// Records every request; WorkerHeartbeat answers with the next scripted
// response (or an empty one). Thread-safe.
class FakeDispatcher : public DispatcherClient {
 public:
  struct Shared {
    absl::Mutex mu;
    int registers ABSL_GUARDED_BY(mu) = 0;
    int drains ABSL_GUARDED_BY(mu) = 0;
    std::vector<proto::WorkerHeartbeatRequest> heartbeats ABSL_GUARDED_BY(mu);
    std::deque<absl::StatusOr<proto::WorkerHeartbeatResponse>> script ABSL_GUARDED_BY(mu);
    // WatchAssignment: Unimplemented unless `watch` (an older dispatcher); otherwise each call
    // waits for the next scripted work_available, or until CancelWatch.
    bool watch ABSL_GUARDED_BY(mu) = false;
    std::deque<bool> watch_script ABSL_GUARDED_BY(mu);
    std::vector<proto::WatchAssignmentRequest> watches ABSL_GUARDED_BY(mu);
    bool watch_cancelled ABSL_GUARDED_BY(mu) = false;
  };
  explicit FakeDispatcher(Shared* shared) : s_(shared) {}

  absl::Status WorkerRegister(const proto::WorkerRegisterRequest& request,
                              proto::WorkerRegisterResponse* response) override {
    absl::MutexLock lock(&s_->mu);
    EXPECT_EQ(request.protocol_version(), kProtocolVersion);
    response->set_worker_id(++s_->registers + 100);
    return absl::OkStatus();
  }
  absl::Status WorkerHeartbeat(const proto::WorkerHeartbeatRequest& request,
                               proto::WorkerHeartbeatResponse* response) override {
    absl::MutexLock lock(&s_->mu);
    s_->heartbeats.push_back(request);
    if (s_->script.empty()) return absl::OkStatus();
    auto next = std::move(s_->script.front());
    s_->script.pop_front();
    if (!next.ok()) return next.status();
    *response = *next;
    return absl::OkStatus();
  }
  absl::Status DrainWorker(const proto::DrainWorkerRequest&, proto::DrainWorkerResponse*) override {
    absl::MutexLock lock(&s_->mu);
    ++s_->drains;
    return absl::OkStatus();
  }
  absl::Status WorkerUnregister(const proto::WorkerUnregisterRequest&,
                                proto::WorkerUnregisterResponse*) override {
    return absl::OkStatus();
  }
  absl::Status WatchAssignment(const proto::WatchAssignmentRequest& request,
                               proto::WatchAssignmentResponse* response) override {
    absl::MutexLock lock(&s_->mu);
    if (!s_->watch) return absl::UnimplementedError("WatchAssignment");
    s_->watches.push_back(request);
    auto answer = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_->mu) {
      return s_->watch_cancelled || !s_->watch_script.empty();
    };
    s_->mu.Await(absl::Condition(&answer));
    if (s_->watch_cancelled) return absl::CancelledError("stopping");
    response->set_work_available(s_->watch_script.front());
    s_->watch_script.pop_front();
    return absl::OkStatus();
  }
  void CancelWatch() override {
    absl::MutexLock lock(&s_->mu);
    s_->watch_cancelled = true;
  }

 private:
  Shared* s_;
};

inline proto::JobInfo MakeJob(uint64_t job_id, const std::string& yaml, uint64_t batch_size,
                              uint64_t seed = 7, uint32_t consumers = 1) {
  auto spec = sluice::pipeline_spec::ParsePipelineSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  proto::JobInfo info;
  info.set_job_id(job_id);
  info.set_job_name("test");
  info.set_pipeline(spec.ok() ? spec->SerializeAsString() : "");
  info.set_batch_size(batch_size);
  info.mutable_config()->set_seed(seed);
  info.mutable_config()->set_num_consumers(consumers);
  return info;
}

inline proto::SplitAssignment MakeSplit(uint64_t job_id, uint32_t consumer, uint64_t position,
                                        uint64_t split_id, uint64_t begin, uint64_t end,
                                        uint64_t first_global, uint64_t skip_batches,
                                        uint64_t epoch = 0) {
  proto::SplitAssignment a;
  a.mutable_key()->set_job_id(job_id);
  a.mutable_key()->set_consumer_index(consumer);
  a.mutable_key()->set_epoch(epoch);
  a.mutable_key()->set_position(position);
  // A slot that reads one whole split.
  proto::SplitPiece* piece = a.add_pieces();
  piece->set_split_id(split_id);
  piece->set_first_global(first_global);
  piece->set_records(end - begin);
  piece->set_offset(0);
  piece->set_count(end - begin);
  a.set_skip_batches(skip_batches);
  return a;
}

// Time that moves only when the test calls Advance(). Unlike FakeClock, SleepFor
// does not wait for time to be advanced: it counts the call, yields for a
// millisecond of real time and returns, so a loop that polls a flag between
// sleeps (the worker's heartbeat thread) keeps polling, but no period passes
// that the test did not advance. Thread-safe.
class ManualClock : public Clock {
 public:
  absl::Time Now() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void SleepFor(absl::Duration) override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      ++sleeps_;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  // SleepFor calls so far.
  int64_t sleeps() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }
  // Waits (up to 20 s) until SleepFor was called more than `n` times: a thread
  // that polls between sleeps has gone once more round its loop.
  bool AwaitSleepsAbove(int64_t n) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto above = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sleeps_ > n; };
    return mu_.AwaitWithTimeout(absl::Condition(&above), absl::Seconds(20));
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::UnixEpoch();
  int64_t sleeps_ ABSL_GUARDED_BY(mu_) = 0;
};

// Polls `cond` until it holds or 20 s pass (synchronization with the worker's
// threads, not timing).
template <typename F>
bool Eventually(F cond) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return cond();
}

}  // namespace sluice::data_worker::testing

#endif  // SLUICE_TESTS_DATA_WORKER_WORKER_WORKER_TEST_UTIL_H_
