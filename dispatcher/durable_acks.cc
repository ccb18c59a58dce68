#include "dispatcher/durable_acks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::dispatcher {

DurableAcks::DurableAcks(Journal* journal, OnDurable on_durable)
    : journal_(journal), on_durable_(std::move(on_durable)) {
  thread_ = std::thread([this] { Loop(); });
}

DurableAcks::~DurableAcks() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  thread_.join();
}

void DurableAcks::Add(uint64_t ticket, absl::Status status, Done done) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({ticket, std::move(status), std::move(done)});
}

void DurableAcks::Loop() {
  while (true) {
    std::vector<Waiter> round;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // cancelled, everything answered
      round.swap(queue_);
    }
    uint64_t ticket = 0;
    for (const Waiter& w : round) ticket = std::max(ticket, w.ticket);
    const absl::Status durable = journal_->WaitDurable(ticket);
    on_durable_(ticket, durable);
    for (Waiter& w : round) {
      w.done(durable.ok() ? std::move(w.status)
                          : absl::UnavailableError(absl::StrCat(
                                "the dispatcher cannot journal a change: ", durable.message())));
    }
  }
}

}  // namespace sluice::dispatcher
