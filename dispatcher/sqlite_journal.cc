#include "dispatcher/sqlite_journal.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"

namespace sluice::dispatcher {
namespace {

// A prepared statement that lives for one call.
class Statement {
 public:
  Statement() = default;
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  sqlite3_stmt** out() { return &stmt_; }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

std::string_view BlobColumn(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  if (data == nullptr || size <= 0) return {};
  return std::string_view(static_cast<const char*>(data), size);
}

int64_t ChecksumAsInt(std::string_view bytes) {
  return static_cast<int64_t>(record::Checksum(bytes));
}

// fsync()s a directory, so that the entries created in it (the work dir in
// its parent, the database and WAL in the work dir) survive a power loss.
absl::Status SyncDirectory(const std::filesystem::path& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open directory ", dir.string(), ": ", std::strerror(errno)));
  }
  const int rc = fsync(fd);
  const int error = errno;
  close(fd);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("fsync of directory ", dir.string(), ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJournal>> SqliteJournal::Open(const std::string& work_dir) {
  return Open(work_dir, Options{});
}

absl::StatusOr<std::unique_ptr<SqliteJournal>> SqliteJournal::Open(const std::string& work_dir,
                                                                   const Options& options) {
  if (work_dir.empty()) {
    return absl::InvalidArgumentError("SqliteJournal: --work-dir is empty");
  }
  std::error_code ec;
  std::filesystem::create_directories(work_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create work dir ", work_dir, ": ", ec.message()));
  }
  std::string path = (std::filesystem::path(work_dir) / kFileName).string();
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot open journal ", path, ": ", message));
  }
  std::unique_ptr<SqliteJournal> journal(new SqliteJournal(path, db));
  {
    absl::MutexLock lock(&journal->db_mu_);
    RETURN_IF_ERROR(journal->Initialize(options));
  }
  std::filesystem::path dir = std::filesystem::absolute(work_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "a/b/"
  RETURN_IF_ERROR(SyncDirectory(dir));
  RETURN_IF_ERROR(SyncDirectory(dir.parent_path()));
  return journal;
}

SqliteJournal::~SqliteJournal() {
  absl::MutexLock lock(&db_mu_);
  for (sqlite3_stmt* stmt : {insert_, begin_, commit_, rollback_}) {
    sqlite3_finalize(stmt);
  }
  // The last connection checkpoints the WAL into the database and removes it.
  sqlite3_close(db_);
}

absl::Status SqliteJournal::Error(int rc, const std::string& what) const {
  const std::string message = absl::StrCat("journal ", path_, ": ", what, ": ", sqlite3_errmsg(db_),
                                           " (SQLite code ", rc, ")");
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
      return absl::FailedPreconditionError(
          absl::StrCat(message,
                       "; the file is not an SQLite database: point --work-dir at the "
                       "dispatcher's own folder"));
    case SQLITE_CORRUPT:
      return absl::DataLossError(
          absl::StrCat(message,
                       "; the journal is corrupt: restore a backup of the work dir or "
                       "start with an empty one (all jobs are lost)"));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::FailedPreconditionError(
          absl::StrCat(message,
                       "; another process holds the journal (a second dispatcher on the "
                       "same --work-dir?)"));
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(message);
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status SqliteJournal::Exec(const char* sql) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return Error(rc, sql);
  return absl::OkStatus();
}

absl::Status SqliteJournal::Prepare(const char* sql, sqlite3_stmt** stmt) {
  const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, stmt, nullptr);
  if (rc != SQLITE_OK) return Error(rc, absl::StrCat("prepare ", sql));
  return absl::OkStatus();
}

absl::Status SqliteJournal::Initialize(const Options& options) {
  sqlite3_extended_result_codes(db_, 1);
  // Fail at once (SQLITE_BUSY) if another process holds the file.
  sqlite3_busy_timeout(db_, 0);
  // Set before the first access, so the lock is never shared and no -shm
  // file is used.
  RETURN_IF_ERROR(Exec("PRAGMA locking_mode=EXCLUSIVE"));

  // The first read: SQLITE_NOTADB for a file that is not a database.
  int64_t num_tables = 0;
  {
    Statement count;
    RETURN_IF_ERROR(Prepare("SELECT count(*) FROM sqlite_master", count.out()));
    const int rc = sqlite3_step(count.get());
    if (rc != SQLITE_ROW) return Error(rc, "reading the schema");
    num_tables = sqlite3_column_int64(count.get(), 0);
  }
  if (num_tables == 0) {
    // A new (or empty) database. auto_vacuum must be set before any table.
    RETURN_IF_ERROR(Exec("PRAGMA auto_vacuum=INCREMENTAL"));
  }
  {
    Statement mode;
    RETURN_IF_ERROR(Prepare("PRAGMA journal_mode=WAL", mode.out()));
    const int rc = sqlite3_step(mode.get());
    if (rc != SQLITE_ROW) return Error(rc, "PRAGMA journal_mode=WAL");
    const char* got = reinterpret_cast<const char*>(sqlite3_column_text(mode.get(), 0));
    if (got == nullptr || std::string_view(got) != "wal") {
      return absl::FailedPreconditionError(absl::StrCat("journal ", path_,
                                                        ": cannot switch to WAL mode (got ",
                                                        got == nullptr ? "nothing" : got, ")"));
    }
  }
  RETURN_IF_ERROR(Exec(options.sync == SyncMode::kFull ? "PRAGMA synchronous=FULL"
                                                       : "PRAGMA synchronous=NORMAL"));
  if (num_tables == 0) {
    RETURN_IF_ERROR(Exec(absl::StrCat("BEGIN EXCLUSIVE;"
                                      "CREATE TABLE meta(key TEXT PRIMARY KEY, value "
                                      "INTEGER NOT NULL);"
                                      "INSERT INTO meta VALUES('format_version', ",
                                      kFormatVersion,
                                      ");"
                                      "CREATE TABLE snapshot(id INTEGER PRIMARY KEY "
                                      "CHECK (id = 1), last_seq INTEGER NOT NULL, "
                                      "bytes BLOB NOT NULL, checksum INTEGER NOT NULL);"
                                      "CREATE TABLE updates(seq INTEGER PRIMARY KEY, "
                                      "bytes BLOB NOT NULL, checksum INTEGER NOT NULL);"
                                      "COMMIT;")
                             .c_str()));
  } else {
    // Takes the exclusive lock now, not at the first commit.
    RETURN_IF_ERROR(Exec("BEGIN EXCLUSIVE; COMMIT;"));
    {
      Statement check;
      RETURN_IF_ERROR(Prepare("PRAGMA quick_check", check.out()));
      const int rc = sqlite3_step(check.get());
      if (rc != SQLITE_ROW) return Error(rc, "PRAGMA quick_check");
      const char* got = reinterpret_cast<const char*>(sqlite3_column_text(check.get(), 0));
      if (got == nullptr || std::string_view(got) != "ok") {
        return absl::DataLossError(absl::StrCat(
            "journal ", path_, ": PRAGMA quick_check failed: ", got == nullptr ? "no answer" : got,
            "; restore a backup of the work dir or start with an empty one "
            "(all jobs are lost)"));
      }
    }
    Statement version;
    if (sqlite3_prepare_v2(db_,
                           "SELECT value FROM meta WHERE key = "
                           "'format_version'",
                           -1, version.out(), nullptr) != SQLITE_OK) {
      return absl::FailedPreconditionError(
          absl::StrCat("journal ", path_,
                       ": an SQLite database but not a sluice journal (no "
                       "table meta): point --work-dir at the dispatcher's own "
                       "folder"));
    }
    const int rc = sqlite3_step(version.get());
    if (rc == SQLITE_DONE) {
      return absl::FailedPreconditionError(
          absl::StrCat("journal ", path_, ": table meta has no format_version"));
    }
    if (rc != SQLITE_ROW) return Error(rc, "reading meta.format_version");
    const int64_t found = sqlite3_column_int64(version.get(), 0);
    if (found > kFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "journal ", path_, " was written by a newer dispatcher (format version ", found,
          "; this one reads up to ", kFormatVersion, "): run a newer sluice-dispatcher"));
    }
    if (found < 1) {
      return absl::DataLossError(
          absl::StrCat("journal ", path_, ": invalid format version ", found));
    }
  }
  RETURN_IF_ERROR(Prepare("BEGIN", &begin_));
  RETURN_IF_ERROR(Prepare("COMMIT", &commit_));
  RETURN_IF_ERROR(Prepare("ROLLBACK", &rollback_));
  RETURN_IF_ERROR(
      Prepare("INSERT INTO updates(seq, bytes, checksum) VALUES(?1, ?2, ?3)", &insert_));

  // Every row is checked once at startup.
  uint64_t last_seq = 0;
  uint64_t num_updates = 0;
  {
    Statement snapshot;
    RETURN_IF_ERROR(Prepare("SELECT last_seq FROM snapshot WHERE id = 1", snapshot.out()));
    const int rc = sqlite3_step(snapshot.get());
    if (rc == SQLITE_ROW) {
      last_seq = sqlite3_column_int64(snapshot.get(), 0);
    } else if (rc != SQLITE_DONE) {
      return Error(rc, "reading the snapshot");
    }
  }
  ASSIGN_OR_RETURN(Contents contents, ReadLocked());
  num_updates = contents.updates.size();
  // The dispatcher's first Read() (its replay) comes next: keep what was just
  // checked instead of reading and parsing every row twice.
  opened_contents_ = std::move(contents);
  next_seq_ = last_seq + num_updates + 1;
  absl::MutexLock lock(&mu_);
  updates_since_snapshot_ = num_updates;
  return absl::OkStatus();
}

absl::StatusOr<Journal::Contents> SqliteJournal::ReadLocked() {
  Contents contents;
  uint64_t expected_seq = 1;
  {
    Statement snapshot;
    RETURN_IF_ERROR(
        Prepare("SELECT last_seq, bytes, checksum FROM snapshot WHERE id = 1", snapshot.out()));
    const int rc = sqlite3_step(snapshot.get());
    if (rc == SQLITE_ROW) {
      const std::string_view bytes = BlobColumn(snapshot.get(), 1);
      if (ChecksumAsInt(bytes) != sqlite3_column_int64(snapshot.get(), 2)) {
        return absl::DataLossError(
            absl::StrCat("journal ", path_,
                         ": the snapshot fails its checksum (corrupt journal); restore a "
                         "backup of the work dir or start with an empty one"));
      }
      contents.snapshot = std::string(bytes);
      expected_seq = sqlite3_column_int64(snapshot.get(), 0) + 1;
    } else if (rc != SQLITE_DONE) {
      return Error(rc, "reading the snapshot");
    }
  }
  Statement rows;
  RETURN_IF_ERROR(Prepare("SELECT seq, bytes, checksum FROM updates ORDER BY seq", rows.out()));
  while (true) {
    const int rc = sqlite3_step(rows.get());
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) {
      return Error(rc, absl::StrCat("reading updates after seq ", expected_seq - 1));
    }
    const uint64_t seq = sqlite3_column_int64(rows.get(), 0);
    if (seq != expected_seq) {
      return absl::DataLossError(absl::StrCat(
          "journal ", path_, ": update row seq ", seq, " follows seq ", expected_seq - 1,
          " (rows missing: corrupt journal); restore a backup of the work "
          "dir or start with an empty one"));
    }
    const std::string_view bytes = BlobColumn(rows.get(), 1);
    if (ChecksumAsInt(bytes) != sqlite3_column_int64(rows.get(), 2)) {
      return absl::DataLossError(
          absl::StrCat("journal ", path_, ": update row seq ", seq,
                       " fails its checksum (corrupt journal); restore a backup of the "
                       "work dir or start with an empty one"));
    }
    proto::Update& update = contents.updates.emplace_back();
    if (!update.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError(absl::StrCat("journal ", path_, ": update row seq ", seq, " (",
                                              bytes.size(),
                                              " bytes) is not a valid sluice.proto.Update"));
    }
    ++expected_seq;
  }
  return contents;
}

absl::Status SqliteJournal::WriteQueue(const std::deque<Pending>& queue, uint64_t* after_snapshot,
                                       bool* snapshotted) {
  *after_snapshot = 0;
  *snapshotted = false;
  auto run = queue.begin();
  for (auto it = queue.begin(); it != queue.end(); ++it) {
    if (!it->snapshot) continue;
    if (run != it) RETURN_IF_ERROR(WriteBatch(run, it));
    if (absl::Status s = WriteSnapshotLocked(it->bytes); !s.ok()) {
      if (!sqlite3_get_autocommit(db_)) Exec("ROLLBACK").IgnoreError();
      return s;
    }
    *snapshotted = true;
    run = std::next(it);
  }
  if (run != queue.end()) RETURN_IF_ERROR(WriteBatch(run, queue.end()));
  *after_snapshot = static_cast<uint64_t>(queue.end() - run);
  return absl::OkStatus();
}

absl::Status SqliteJournal::WriteBatch(std::deque<Pending>::const_iterator begin,
                                       std::deque<Pending>::const_iterator end) {
  opened_contents_.reset();
  auto step = [this](sqlite3_stmt* stmt, const char* what) -> absl::Status {
    const int rc = sqlite3_step(stmt);
    sqlite3_reset(stmt);
    if (rc != SQLITE_DONE) return Error(rc, what);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(step(begin_, "BEGIN"));
  uint64_t seq = next_seq_;
  absl::Status status;
  for (auto it = begin; it != end; ++it) {
    const Pending& pending = *it;
    sqlite3_bind_int64(insert_, 1, static_cast<int64_t>(seq));
    sqlite3_bind_blob(insert_, 2, pending.bytes.data(), static_cast<int>(pending.bytes.size()),
                      SQLITE_STATIC);
    sqlite3_bind_int64(insert_, 3, ChecksumAsInt(pending.bytes));
    status = step(insert_, "INSERT INTO updates");
    sqlite3_clear_bindings(insert_);
    if (!status.ok()) break;
    ++seq;
  }
  if (status.ok()) status = step(commit_, "COMMIT");
  if (!status.ok()) {
    if (!sqlite3_get_autocommit(db_)) {
      sqlite3_step(rollback_);
      sqlite3_reset(rollback_);
    }
    return status;
  }
  next_seq_ = seq;
  return absl::OkStatus();
}

absl::Status SqliteJournal::BrokenError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("journal ", path_,
                   " unusable after an earlier write error (restart the "
                   "dispatcher): ",
                   broken_.message()));
}

absl::StatusOr<uint64_t> SqliteJournal::Enqueue(const proto::Update& update) {
  Pending pending;
  if (!update.SerializeToString(&pending.bytes)) {
    return absl::InvalidArgumentError("SqliteJournal: the update does not serialize");
  }
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return BrokenError();
  queue_.push_back(std::move(pending));
  return next_ticket_++;
}

absl::StatusOr<uint64_t> SqliteJournal::EnqueueSnapshot(std::string snapshot) {
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return BrokenError();
  queue_.push_back({std::move(snapshot), /*snapshot=*/true});
  return next_ticket_++;
}

absl::Status SqliteJournal::WaitDurable(uint64_t ticket) {
  mu_.Lock();
  while (done_ <= ticket && ticket < next_ticket_) {
    if (writing_) {
      // Another caller is committing; ours goes into the next transaction.
      mu_.Await(absl::Condition(this, &SqliteJournal::LeaderIdle));
      continue;
    }
    // Become the leader: commit everything queued by the time we hold the
    // database in one transaction.
    writing_ = true;
    mu_.Unlock();
    db_mu_.Lock();
    mu_.Lock();
    std::deque<Pending> batch;
    batch.swap(queue_);
    const uint64_t end = next_ticket_;
    const bool broken = !broken_.ok();
    mu_.Unlock();
    absl::Status status = absl::OkStatus();
    uint64_t after_snapshot = 0;
    bool snapshotted = false;
    if (broken) {
      status = absl::FailedPreconditionError("earlier write error");
    } else if (!batch.empty()) {
      status = WriteQueue(batch, &after_snapshot, &snapshotted);
    }
    mu_.Lock();
    db_mu_.Unlock();
    writing_ = false;
    done_ = std::max(done_, end);
    if (status.ok()) {
      if (snapshotted) updates_since_snapshot_ = 0;
      updates_since_snapshot_ += after_snapshot;
    } else if (broken_.ok()) {
      broken_ = status;
      first_failed_ticket_ = end - batch.size();
    }
  }
  absl::Status result = absl::OkStatus();
  if (ticket >= next_ticket_) {
    result = absl::InvalidArgumentError(absl::StrCat("SqliteJournal::WaitDurable: ticket ", ticket,
                                                     " was never returned by Enqueue"));
  } else if (!broken_.ok() && ticket >= first_failed_ticket_) {
    result = BrokenError();
  }
  mu_.Unlock();
  return result;
}

absl::StatusOr<Journal::Contents> SqliteJournal::Read() {
  absl::MutexLock lock(&db_mu_);
  if (opened_contents_.has_value()) {
    Contents contents = std::move(*opened_contents_);
    opened_contents_.reset();
    return contents;
  }
  return ReadLocked();
}

absl::Status SqliteJournal::WriteSnapshotLocked(const std::string& snapshot) {
  opened_contents_.reset();
  Statement replace;
  RETURN_IF_ERROR(Exec("BEGIN"));
  RETURN_IF_ERROR(
      Prepare("INSERT OR REPLACE INTO snapshot(id, last_seq, bytes, checksum) "
              "VALUES(1, ?1, ?2, ?3)",
              replace.out()));
  sqlite3_bind_int64(replace.get(), 1, static_cast<int64_t>(next_seq_ - 1));
  sqlite3_bind_blob(replace.get(), 2, snapshot.data(), static_cast<int>(snapshot.size()),
                    SQLITE_STATIC);
  sqlite3_bind_int64(replace.get(), 3, ChecksumAsInt(snapshot));
  if (const int rc = sqlite3_step(replace.get()); rc != SQLITE_DONE) {
    return Error(rc, "writing the snapshot");
  }
  RETURN_IF_ERROR(Exec("DELETE FROM updates"));
  RETURN_IF_ERROR(Exec("COMMIT"));
  // Free pages go back to the file system and the WAL is emptied, so the
  // files do not grow over snapshot cycles.
  RETURN_IF_ERROR(Exec("PRAGMA incremental_vacuum"));
  RETURN_IF_ERROR(Exec("PRAGMA wal_checkpoint(TRUNCATE)"));
  return absl::OkStatus();
}

uint64_t SqliteJournal::updates_since_snapshot() const {
  absl::MutexLock lock(&mu_);
  return updates_since_snapshot_;
}

}  // namespace sluice::dispatcher
