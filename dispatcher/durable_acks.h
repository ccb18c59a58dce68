// DurableAcks: answers RPCs once the journal updates they depend on are durable, from one
// thread of its own, so that gRPC threads never wait for the disk and the heartbeats of one
// moment share one journal commit (one fsync).
//
//   handler thread (under DispatcherImpl::mu_)   DurableAcks thread
//   Enqueue(u1) -> t1, Apply(u1)
//   acks.Add(t1, ok, done1)          ------>      takes [done1, done2]
//   Enqueue(u2) -> t2, Apply(u2)                  journal->WaitDurable(t2)  (one commit: u1, u2)
//   acks.Add(t2, ok, done2)                       on_durable(t2); done1(ok); done2(ok)
//
// Calls added while a commit is being written go into the next one, so the thread count is
// one whatever the load, and the commit rate adapts to the disk: one fsync per round.
//
// Thread-safe. Owned by DispatcherImpl; the destructor answers everything added, then joins.
#ifndef SLUICE_DISPATCHER_DURABLE_ACKS_H_
#define SLUICE_DISPATCHER_DURABLE_ACKS_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dispatcher/journal.h"

namespace sluice::dispatcher {

class DurableAcks {
 public:
  // Receives the RPC's status: `status` as given to Add, or Unavailable when the journal
  // could not make the updates durable.
  using Done = std::function<void(absl::Status)>;
  // Runs after the journal reported tickets up to `ticket` durable (status OK) or not
  // (its error), before the Done callbacks of that round.
  using OnDurable = std::function<void(uint64_t ticket, const absl::Status&)>;

  // `journal` must outlive this object. Starts the thread.
  DurableAcks(Journal* journal, OnDurable on_durable);
  ~DurableAcks() ABSL_LOCKS_EXCLUDED(mu_);

  DurableAcks(const DurableAcks&) = delete;
  DurableAcks& operator=(const DurableAcks&) = delete;

  // Calls done(status) once journal ticket `ticket` (and all before it) is durable. Never
  // blocks on I/O; `done` runs on this object's thread and must not block either.
  void Add(uint64_t ticket, absl::Status status, Done done) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiter {
    uint64_t ticket;
    absl::Status status;
    Done done;
  };

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  Journal* const journal_;
  const OnDurable on_durable_;
  absl::Mutex mu_;
  std::vector<Waiter> queue_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_DURABLE_ACKS_H_
