// SqliteJournal: the dispatcher's durable Journal, one SQLite database
// `<work_dir>/journal.sqlite3` in WAL mode.
//
// Durability (the default, SyncMode::kFull = PRAGMA synchronous=FULL): every
// commit is a transaction whose WAL frames are fsync()ed before WaitDurable()
// returns. An update whose WaitDurable() returned OK survives a crash of the
// dispatcher process (SIGKILL, OOM kill) AND an OS crash or power loss,
// provided the storage honours fsync (a disk whose volatile write cache
// ignores flushes defeats any database). SyncMode::kNormal
// (synchronous=NORMAL) skips that fsync: acknowledged updates survive a process
// crash, but the last ones before an OS crash or power loss can be lost. In
// both modes the journal after any crash is a clean prefix of what was
// appended: no torn or reordered record (SQLite's WAL commit is atomic).
// Open() fsyncs the work dir and its parent, so a new journal's directory
// entries survive a power loss too.
// FULL is the default because an acknowledged split completion or job must
// not come back after a power cut; NORMAL is for deployments whose work dir
// is not on a disk that outlives the machine anyway (e.g. an emptyDir).
//
// Schema (format version 1, in table `meta`):
//
//   meta(key TEXT PRIMARY KEY, value INTEGER)  -- ('format_version', 1)
//   snapshot(id INTEGER PRIMARY KEY CHECK (id = 1),
//            last_seq INTEGER,                  -- seq of the last update in it
//            bytes BLOB, checksum INTEGER)
//   updates(seq INTEGER PRIMARY KEY,           -- 1, 2, 3, ... never reused
//           bytes BLOB,                        -- serialized proto::Update
//           checksum INTEGER)                  -- XXH3-64 of bytes, as int64
//
// Example: Enqueue(u1) Enqueue(u2) EnqueueSnapshot(S) Enqueue(u3), then
// WaitDurable(3), leaves snapshot = (1, last_seq 2, S) and updates = {(3, u3)}.
//
// Group commit: the first WaitDurable() caller commits everything enqueued so
// far in one transaction (one fsync for all); updates enqueued while it writes
// go into the next one. Each WaitDurable() returns only once its own row is
// durable. This pays when several threads enqueue at once; a caller that waits
// for each update before enqueueing the next gets one transaction, one fsync,
// per update.
// EnqueueSnapshot() puts a snapshot in the same queue: the leader writes the
// updates before it, then the snapshot (which deletes them), then the rest.
//
// Measured (bench/dispatcher_scale.sh, journal_bench, 2-core VM, load ~13):
// synchronous=FULL, 1 thread: ~250-550 appends/s, p50 0.4-3.8 ms (one fsync
// of the virtual disk); 32 threads: ~750-1,600 appends/s. NORMAL: ~35,000
// appends/s, p50 7 us. See docs/BENCHMARKS.md.
//
// Startup checks (Open): a file that is not an SQLite database
// (FailedPrecondition), a database that is not a sluice journal
// (FailedPrecondition), a journal written by a newer format version
// (FailedPrecondition), `PRAGMA quick_check` failures, a row whose checksum
// does not match or whose bytes do not parse (DataLoss naming the file and
// the seq). Nothing is ever reset silently: the operator decides (restore a
// backup, or start with an empty --work-dir).
//
// The journal holds an exclusive lock on the database while it is open: a
// second dispatcher on the same --work-dir fails in Open (FailedPrecondition),
// and so does the sqlite3 shell (inspect a copy, or the file once the
// dispatcher has stopped). A snapshot is at most 1 GB (SQLite's blob limit).
//
// Thread-safe. After a failed write the journal refuses every later Enqueue
// and EnqueueSnapshot (the caller must restart and replay what did reach the
// disk): after a failed fsync the file's state is not known.
#ifndef SLUICE_DISPATCHER_SQLITE_JOURNAL_H_
#define SLUICE_DISPATCHER_SQLITE_JOURNAL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dispatcher/journal.h"

struct sqlite3;
struct sqlite3_stmt;

namespace sluice::dispatcher {

class SqliteJournal : public Journal {
 public:
  // The on-disk format this build writes and the newest it reads.
  static constexpr int64_t kFormatVersion = 1;
  static constexpr char kFileName[] = "journal.sqlite3";

  enum class SyncMode {
    kFull,    // fsync per commit: survives power loss (the default)
    kNormal,  // no fsync per commit: survives a process crash only
  };
  struct Options {
    SyncMode sync = SyncMode::kFull;
  };

  // Opens `work_dir/journal.sqlite3`, creating the folder and the database if
  // absent, and checks it (see the header comment for the error codes).
  static absl::StatusOr<std::unique_ptr<SqliteJournal>> Open(const std::string& work_dir);
  static absl::StatusOr<std::unique_ptr<SqliteJournal>> Open(const std::string& work_dir,
                                                             const Options& options);
  ~SqliteJournal() override;

  SqliteJournal(const SqliteJournal&) = delete;
  SqliteJournal& operator=(const SqliteJournal&) = delete;

  // Errors: DataLoss naming the seq of a row that fails its checksum or does
  // not parse.
  absl::StatusOr<Contents> Read() override ABSL_LOCKS_EXCLUDED(mu_, db_mu_);
  // Never blocks on I/O. Errors: FailedPrecondition after an earlier failed
  // write.
  absl::StatusOr<uint64_t> Enqueue(const proto::Update& update) override ABSL_LOCKS_EXCLUDED(mu_);
  // Commits the queue (as the leader) or waits for the commit in progress.
  // Errors: Internal or Unavailable (disk full: ResourceExhausted) from
  // SQLite; FailedPrecondition after an earlier failed write.
  absl::Status WaitDurable(uint64_t ticket) override ABSL_LOCKS_EXCLUDED(mu_, db_mu_);
  // Queues the snapshot behind the updates enqueued so far; the leader of the
  // next commit writes those updates, then the snapshot (which deletes them),
  // then what follows it, each a transaction. Never blocks on I/O.
  absl::StatusOr<uint64_t> EnqueueSnapshot(std::string snapshot) override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t updates_since_snapshot() const override ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  struct Pending {
    std::string bytes;
    bool snapshot = false;  // `bytes` is a snapshot, not an update
  };

  SqliteJournal(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  absl::Status Initialize(const Options& options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  absl::Status Prepare(const char* sql, sqlite3_stmt** stmt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Status for SQLite result `rc` of `what`, with the file name and SQLite's
  // message.
  absl::Status Error(int rc, const std::string& what) const;
  absl::StatusOr<Contents> ReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Writes updates [begin, end) (rows next_seq_, ...) in one transaction.
  absl::Status WriteBatch(std::deque<Pending>::const_iterator begin,
                          std::deque<Pending>::const_iterator end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Writes a leader's queue: runs of updates (WriteBatch) and snapshots in
  // order. *after_snapshot: updates written after the last snapshot in it;
  // *snapshotted: it held one.
  absl::Status WriteQueue(const std::deque<Pending>& queue, uint64_t* after_snapshot,
                          bool* snapshotted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // One transaction: replaces the snapshot, deletes the updates, then hands
  // the freed pages back to the file system (the file does not grow over
  // snapshot cycles) and truncates the WAL.
  absl::Status WriteSnapshotLocked(const std::string& snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  absl::Status BrokenError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LeaderIdle() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_; }

  const std::string path_;

  // Lock order: db_mu_ before mu_. db_mu_ is held across SQLite calls
  // (including fsync); mu_ only for the group-commit queue, never across I/O.
  absl::Mutex db_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  sqlite3* const db_ ABSL_PT_GUARDED_BY(db_mu_);
  sqlite3_stmt* insert_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  sqlite3_stmt* begin_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  sqlite3_stmt* commit_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  sqlite3_stmt* rollback_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  uint64_t next_seq_ ABSL_GUARDED_BY(db_mu_) = 1;
  // What Open() read and checked, handed to the first Read() if nothing was
  // written in between.
  std::optional<Contents> opened_contents_ ABSL_GUARDED_BY(db_mu_);

  mutable absl::Mutex mu_;
  // Group commit: each Enqueue takes a ticket and queues its bytes; the first
  // one that finds no leader becomes the leader and commits the whole queue.
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // Tickets < done_ have been written, successfully unless broken_ is set
  // and the ticket >= first_failed_ticket_.
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a leader is committing
  // Set by the first failed write; every later write fails with it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t first_failed_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t updates_since_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_SQLITE_JOURNAL_H_
