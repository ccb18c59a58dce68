// Writes to a Journal and waits, one call each: the way a test sets up a
// journal's contents. (The dispatcher enqueues under its lock and waits outside
// it; see dispatcher/journal.h.)
#ifndef SLUICE_TESTS_TESTING_JOURNAL_TESTING_H_
#define SLUICE_TESTS_TESTING_JOURNAL_TESTING_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dispatcher/journal.h"
#include "proto/dispatcher.pb.h"

namespace sluice::testonly {

// Enqueue(update), then WaitDurable for it.
inline absl::Status AppendDurably(dispatcher::Journal& journal, const proto::Update& update) {
  absl::StatusOr<uint64_t> ticket = journal.Enqueue(update);
  if (!ticket.ok()) return ticket.status();
  return journal.WaitDurable(*ticket);
}

// EnqueueSnapshot(snapshot), then WaitDurable for it.
inline absl::Status SnapshotDurably(dispatcher::Journal& journal, std::string snapshot) {
  absl::StatusOr<uint64_t> ticket = journal.EnqueueSnapshot(std::move(snapshot));
  if (!ticket.ok()) return ticket.status();
  return journal.WaitDurable(*ticket);
}

}  // namespace sluice::testonly

#endif  // SLUICE_TESTS_TESTING_JOURNAL_TESTING_H_
