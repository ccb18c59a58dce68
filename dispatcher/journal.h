// Journal: where the dispatcher makes each state Update durable before
// acknowledging it (docs/architecture.md). A restarted dispatcher replays Read():
// it restores `snapshot` (if any), then DispatcherState::Apply()s `updates` in
// order.
//
// Compaction: the caller serializes its state into a snapshot now and then
// (its policy, e.g. when updates_since_snapshot() passes a threshold) and
// WriteSnapshot() replaces the snapshot and every update before it, so replay
// time stays bounded.
//
//   Append(u1) Append(u2) WriteSnapshot(S12) Append(u3)
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
    std::string snapshot;  // latest snapshot; empty: none
    std::vector<proto::Update>
        updates;  // every update appended after it, in order
  };

  virtual ~Journal() = default;
  // Returns once `update` would survive a crash (which crash — process or
  // power loss — the implementation states). An error means it may not: the
  // caller must not acknowledge the change.
  virtual absl::Status Append(const proto::Update& update) = 0;
  // What a restarted dispatcher replays.
  virtual absl::StatusOr<Contents> Read() = 0;
  // Atomically replaces the snapshot with `snapshot` and deletes every update
  // appended (or enqueued, below) before this call. REQUIRES: `snapshot`
  // reflects exactly those updates (no Append() in flight).
  virtual absl::Status WriteSnapshot(const std::string& snapshot) = 0;
  // Updates appended since the last snapshot (for the caller's compaction
  // policy).
  virtual uint64_t updates_since_snapshot() const = 0;

  // Append() in two halves, for a caller that fixes the order of updates
  // under its own lock but waits for durability outside it, so that
  // concurrent callers share one commit (group commit; see
  // sqlite_journal.h for figures):
  //
  //   mu.Lock();   ASSIGN_OR_RETURN(ticket, journal->Enqueue(u));  Apply(u);
  //   mu.Unlock(); RETURN_IF_ERROR(journal->WaitDurable(ticket));  // ack now
  //
  // Updates are journaled in Enqueue() order; WaitDurable(t) returns once
  // update t and every update enqueued before it would survive a crash, or
  // the error that prevents it. A WriteSnapshot() covers every update
  // enqueued before it, written or not (take the snapshot under the same
  // lock). The defaults append at once.
  virtual absl::StatusOr<uint64_t> Enqueue(const proto::Update& update) {
    if (absl::Status s = Append(update); !s.ok()) return s;
    return 0;
  }
  virtual absl::Status WaitDurable(uint64_t /*ticket*/) {
    return absl::OkStatus();
  }
  // WriteSnapshot() in Enqueue() order, for the same caller: `snapshot` must
  // reflect exactly the updates enqueued before this call; it replaces them when
  // the commit that carries it is written, so the caller's lock is not held
  // across the write. The ticket is waited for like an update's. The default
  // writes at once.
  virtual absl::StatusOr<uint64_t> EnqueueSnapshot(std::string snapshot) {
    if (absl::Status s = WriteSnapshot(snapshot); !s.ok()) return s;
    return 0;
  }
};

// Keeps nothing: a dispatcher restart starts empty. The default.
class NullJournal : public Journal {
 public:
  absl::Status Append(const proto::Update&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Contents> Read() override { return Contents{}; }
  absl::Status WriteSnapshot(const std::string&) override {
    return absl::OkStatus();
  }
  uint64_t updates_since_snapshot() const override { return 0; }
};

// Keeps the snapshot and the updates after it in memory (unbounded between
// snapshots): for tests of replay. Survives only what the object survives.
class InMemoryJournal : public Journal {
 public:
  absl::Status Append(const proto::Update& update) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    contents_.updates.push_back(update);
    return absl::OkStatus();
  }
  absl::StatusOr<Contents> Read() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return contents_;
  }
  absl::Status WriteSnapshot(const std::string& snapshot) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    contents_.snapshot = snapshot;
    contents_.updates.clear();
    return absl::OkStatus();
  }
  uint64_t updates_since_snapshot() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return contents_.updates.size();
  }

 private:
  mutable absl::Mutex mu_;
  Contents contents_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_JOURNAL_H_
