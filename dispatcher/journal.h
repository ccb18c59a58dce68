// Journal: where the dispatcher makes each state Update durable before
// acknowledging it (ARCHITECTURE.md §6). Replay = DispatcherState::Apply of
// ReadAll() in order.
//
// Today there are only in-memory journals; the SQLite (WAL) journal under
// --work-dir implements the same interface and drops in through
// DispatcherOptions::journal.
#ifndef SLUICE_DISPATCHER_JOURNAL_H_
#define SLUICE_DISPATCHER_JOURNAL_H_

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
  virtual ~Journal() = default;
  // Returns once `update` would survive a crash. An error means it may not: the
  // caller must not acknowledge the change.
  virtual absl::Status Append(const proto::Update& update) = 0;
  // Every update appended so far, in order (what a restarted dispatcher
  // replays).
  virtual absl::StatusOr<std::vector<proto::Update>> ReadAll() = 0;
};

// Keeps nothing: a dispatcher restart starts empty. The default.
class NullJournal : public Journal {
 public:
  absl::Status Append(const proto::Update&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<proto::Update>> ReadAll() override {
    return std::vector<proto::Update>{};
  }
};

// Keeps every update in memory (unbounded): for tests of replay.
class InMemoryJournal : public Journal {
 public:
  absl::Status Append(const proto::Update& update) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    updates_.push_back(update);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<proto::Update>> ReadAll() override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return updates_;
  }

 private:
  absl::Mutex mu_;
  std::vector<proto::Update> updates_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_JOURNAL_H_
