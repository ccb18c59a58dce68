// Journal: where the dispatcher makes each state Update durable before
// acknowledging it (docs/architecture.md). A restarted dispatcher replays Read():
// it restores `snapshot` (if any), then DispatcherState::Apply()s `updates` in
// order.
//
// Updates are enqueued under the caller's lock, which fixes their order, and
// waited for outside it, so concurrent callers share one commit (group commit;
// see sqlite_journal.h for figures):
//
//   mu.Lock();   ASSIGN_OR_RETURN(ticket, journal->Enqueue(u));  Apply(u);
//   mu.Unlock(); RETURN_IF_ERROR(journal->WaitDurable(ticket));  // ack now
//
// Compaction: the caller serializes its state into a snapshot now and then
// (its policy, e.g. when updates_since_snapshot() passes a threshold) and
// EnqueueSnapshot()s it; once written it replaces the snapshot and every update
// enqueued before it, so replay time stays bounded.
//
//   Enqueue(u1) Enqueue(u2) EnqueueSnapshot(S12) Enqueue(u3) WaitDurable(4)
//   Read() -> {snapshot: S12, updates: [u3]}
//
// Implementations: NullJournal (keeps nothing, the default), InMemoryJournal
// (tests of replay), SqliteJournal (dispatcher/sqlite_journal.h, durable,
// under --work-dir).
#ifndef SLUICE_DISPATCHER_JOURNAL_H_
#define SLUICE_DISPATCHER_JOURNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/dispatcher.pb.h"

namespace sluice::dispatcher {

// Implementations are thread-safe.
class Journal {
 public:
  struct Contents {
    std::string snapshot;                // latest snapshot; empty: none
    std::vector<proto::Update> updates;  // every update appended after it, in order
  };

  virtual ~Journal() = default;
  // Queues `update` behind every update enqueued before it and returns its
  // ticket. Never blocks on I/O.
  virtual absl::StatusOr<uint64_t> Enqueue(const proto::Update& update) = 0;
  // Returns once update `ticket` and every update enqueued before it would
  // survive a crash (which crash — process or power loss — the implementation
  // states). An error means they may not: the caller must not acknowledge the
  // change.
  virtual absl::Status WaitDurable(uint64_t ticket) = 0;
  // Queues a snapshot: `snapshot` must reflect exactly the updates enqueued
  // before this call (take it under the same lock as Enqueue); once written it
  // replaces them, so the caller's lock is not held across the write. The
  // ticket is waited for like an update's.
  virtual absl::StatusOr<uint64_t> EnqueueSnapshot(std::string snapshot) = 0;
  // What a restarted dispatcher replays.
  virtual absl::StatusOr<Contents> Read() = 0;
  // Updates written since the last snapshot (for the caller's compaction
  // policy).
  virtual uint64_t updates_since_snapshot() const = 0;
};

// Keeps nothing: a dispatcher restart starts empty. The default.
class NullJournal : public Journal {
 public:
  absl::StatusOr<uint64_t> Enqueue(const proto::Update&) override { return 0; }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> EnqueueSnapshot(std::string) override { return 0; }
  absl::StatusOr<Contents> Read() override { return Contents{}; }
  uint64_t updates_since_snapshot() const override { return 0; }
};

// Keeps the snapshot and the updates after it in memory (unbounded between
// snapshots): for tests of replay. Survives only what the object survives.
class InMemoryJournal : public Journal {
 public:
  absl::StatusOr<uint64_t> Enqueue(const proto::Update& update) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    contents_.updates.push_back(update);
    return next_ticket_++;
  }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> EnqueueSnapshot(std::string snapshot) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    contents_.snapshot = std::move(snapshot);
    contents_.updates.clear();
    return next_ticket_++;
  }
  absl::StatusOr<Contents> Read() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return contents_;
  }
  uint64_t updates_since_snapshot() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return contents_.updates.size();
  }

 private:
  mutable absl::Mutex mu_;
  Contents contents_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_JOURNAL_H_
