// DispatcherImpl's asynchronous RPCs answer only once what they depend on is
// durable (dispatcher/durable_acks.h), with a journal whose commits the test
// releases by hand.
#include "dispatcher/durable_acks.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sync_dispatcher.h"

namespace sluice::dispatcher {

using ::sluice::testonly::Sync;
namespace {

using ::testing::HasSubstr;

// Tickets 0, 1, 2, ...; WaitDurable(t) blocks until the test made t durable
// (MakeDurable) or failed the journal (Fail).
class GatedJournal : public InMemoryJournal {
 public:
  absl::StatusOr<uint64_t> Enqueue(const proto::Update& update) override
      ABSL_LOCKS_EXCLUDED(gate_mu_) {
    if (absl::StatusOr<uint64_t> t = InMemoryJournal::Enqueue(update); !t.ok()) {
      return t.status();
    }
    absl::MutexLock lock(&gate_mu_);
    return next_++;
  }
  absl::Status WaitDurable(uint64_t ticket) override ABSL_LOCKS_EXCLUDED(gate_mu_) {
    absl::MutexLock lock(&gate_mu_);
    ++waiting_;
    ++wait_calls_;
    cv_.SignalAll();
    while (!failed_ && durable_end_ <= ticket) cv_.Wait(&gate_mu_);
    --waiting_;
    return failed_ ? absl::InternalError("disk I/O error") : absl::OkStatus();
  }
  void MakeDurable() ABSL_LOCKS_EXCLUDED(gate_mu_) {
    absl::MutexLock lock(&gate_mu_);
    durable_end_ = next_;
    cv_.SignalAll();
  }
  void Fail() ABSL_LOCKS_EXCLUDED(gate_mu_) {
    absl::MutexLock lock(&gate_mu_);
    failed_ = true;
    cv_.SignalAll();
  }
  int wait_calls() const ABSL_LOCKS_EXCLUDED(gate_mu_) {
    absl::MutexLock lock(&gate_mu_);
    return wait_calls_;
  }
  // Blocks until a caller waits in WaitDurable.
  void AwaitWaiter() ABSL_LOCKS_EXCLUDED(gate_mu_) {
    absl::MutexLock lock(&gate_mu_);
    while (waiting_ == 0) cv_.Wait(&gate_mu_);
  }

 private:
  mutable absl::Mutex gate_mu_;
  absl::CondVar cv_;
  uint64_t next_ ABSL_GUARDED_BY(gate_mu_) = 0;
  uint64_t durable_end_ ABSL_GUARDED_BY(gate_mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(gate_mu_) = false;
  int waiting_ ABSL_GUARDED_BY(gate_mu_) = 0;
  int wait_calls_ ABSL_GUARDED_BY(gate_mu_) = 0;
};

class DurableAcksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    journal_ = std::make_shared<GatedJournal>();
    // Create() waits for its first update (the id floor) in this thread.
    std::thread release([this] {
      journal_->AwaitWaiter();
      journal_->MakeDurable();
    });
    DispatcherOptions options;
    options.clock = &clock_;
    options.journal = journal_;
    auto impl = DispatcherImpl::Create(options);
    release.join();
    ASSERT_TRUE(impl.ok()) << impl.status();
    impl_ = std::move(*impl);
  }

  static proto::WorkerRegisterRequest Register(const std::string& address) {
    proto::WorkerRegisterRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_address(address);
    return request;
  }

  FakeClock clock_;
  std::shared_ptr<GatedJournal> journal_;
  std::unique_ptr<DispatcherImpl> impl_;
};

TEST_F(DurableAcksTest, AnAnswerWaitsUntilItsChangeAndEveryEarlierOneIsDurable) {
  proto::WorkerRegisterResponse registered;
  absl::Notification registered_done;
  absl::Status registered_status;
  impl_->WorkerRegister(Register("w1:1"), &registered, [&](absl::Status s) {
    registered_status = s;
    registered_done.Notify();
  });
  // Applied (the response is filled) but not durable: not answered.
  EXPECT_GT(registered.worker_id(), 0u);
  EXPECT_FALSE(registered_done.HasBeenNotified());

  // A call that changes nothing still shows the new worker: it waits too.
  proto::GetStatusRequest status_request;
  status_request.set_protocol_version(kProtocolVersion);
  status_request.set_starting_workers(-1);
  proto::GetStatusResponse status;
  absl::Notification status_done;
  impl_->GetStatus(status_request, &status, [&](absl::Status) { status_done.Notify(); });
  EXPECT_EQ(status.workers_size(), 1);
  EXPECT_FALSE(status_done.HasBeenNotified());

  journal_->MakeDurable();
  registered_done.WaitForNotification();
  status_done.WaitForNotification();
  EXPECT_TRUE(registered_status.ok()) << registered_status;

  // Everything durable: answered at once, in the calling thread.
  absl::Notification again;
  impl_->GetStatus(status_request, &status, [&](absl::Status) { again.Notify(); });
  EXPECT_TRUE(again.HasBeenNotified());
}

TEST_F(DurableAcksTest, ManyCallsShareOneCommitRound) {
  constexpr int kCalls = 20;
  proto::WorkerRegisterResponse responses[kCalls];
  absl::Notification done[kCalls];
  for (int i = 0; i < kCalls; ++i) {
    impl_->WorkerRegister(Register(absl::StrCat("w", i, ":1")), &responses[i],
                          [&done, i](absl::Status) { done[i].Notify(); });
  }
  const int waits_before = journal_->wait_calls();
  // One release of the gate answers all of them: the DurableAcks thread waited
  // for the first call(s), the rest queued behind and share the next round.
  journal_->MakeDurable();
  for (auto& d : done) d.WaitForNotification();
  EXPECT_LE(journal_->wait_calls() - waits_before, 2);
}

TEST_F(DurableAcksTest, AFailedCommitAnswersUnavailableAndSoDoesEveryLaterRpc) {
  proto::WorkerRegisterResponse registered;
  absl::Notification done;
  absl::Status status;
  impl_->WorkerRegister(Register("w1:1"), &registered, [&](absl::Status s) {
    status = s;
    done.Notify();
  });
  journal_->Fail();
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("disk I/O error"));

  proto::WorkerRegisterResponse later;
  const absl::Status s = Sync(impl_).WorkerRegister(Register("w2:1"), &later);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("restart the dispatcher"));
}

}  // namespace
}  // namespace sluice::dispatcher
