#include "dispatcher/sqlite_journal.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/record/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/journal_testing.h"

namespace sluice::dispatcher {

using ::sluice::testonly::AppendDurably;
using ::sluice::testonly::SnapshotDurably;
namespace {

using ::testing::HasSubstr;

std::string MakeTempDir() {
  std::string pattern = testing::TempDir() + "/sqlite_journal_test.XXXXXX";
  char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

// A distinct, recognizable update per id.
proto::Update WorkerUpdate(uint64_t id, size_t address_bytes = 16) {
  proto::Update update;
  proto::UpdateRegisterWorker* worker = update.mutable_register_worker();
  worker->set_worker_id(id);
  std::string address = absl::StrCat("host-", id, ":");
  address.resize(std::max(address.size(), address_bytes), 'x');
  worker->set_address(address);
  worker->set_capacity(static_cast<uint32_t>(id % 7));
  return update;
}

std::vector<uint64_t> WorkerIds(const std::vector<proto::Update>& updates) {
  std::vector<uint64_t> ids;
  for (const proto::Update& u : updates) {
    ids.push_back(u.register_worker().worker_id());
  }
  return ids;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> ids;
  for (uint64_t i = first; i <= last; ++i) ids.push_back(i);
  return ids;
}

// Runs SQL on the journal file through a separate connection (the journal
// must be closed), as an operator or a bit flip would.
void RawSql(const std::string& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/journal.sqlite3").c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

int64_t RawCount(const std::string& dir, const std::string& table) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open((dir + "/journal.sqlite3").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, ("SELECT count(*) FROM " + table).c_str(), -1, &stmt, nullptr),
            SQLITE_OK);
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  const int64_t count = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return count;
}

std::string Hex(std::string_view bytes) {
  std::string hex;
  for (unsigned char c : bytes) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return hex;
}

TEST(SqliteJournal, AppendedUpdatesReadBackInOrder) {
  const std::string dir = MakeTempDir() + "/work";  // created by Open
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ((*journal)->path(), dir + "/journal.sqlite3");
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(id)).ok());
  }
  EXPECT_EQ((*journal)->updates_since_snapshot(), 3u);
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->snapshot, "");
  ASSERT_EQ(contents->updates.size(), 3u);
  for (uint64_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(contents->updates[id - 1].SerializeAsString(), WorkerUpdate(id).SerializeAsString());
  }
}

TEST(SqliteJournal, ReopenedJournalHoldsEverythingAndContinues) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    for (uint64_t id = 1; id <= 4; ++id) {
      ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(id)).ok());
    }
  }
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    EXPECT_EQ((*journal)->updates_since_snapshot(), 4u);
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(5)).ok());
  }
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(WorkerIds(contents->updates), Range(1, 5));
  EXPECT_EQ(contents->updates[4].SerializeAsString(), WorkerUpdate(5).SerializeAsString());
}

TEST(SqliteJournal, SnapshotReplacesEarlierUpdatesAndDeletesTheirRows) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    for (uint64_t id = 1; id <= 5; ++id) {
      ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(id)).ok());
    }
    ASSERT_TRUE(SnapshotDurably(**journal, "state through 5").ok());
    EXPECT_EQ((*journal)->updates_since_snapshot(), 0u);
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(6)).ok());
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(7)).ok());
    auto contents = (*journal)->Read();
    ASSERT_TRUE(contents.ok()) << contents.status();
    EXPECT_EQ(contents->snapshot, "state through 5");
    EXPECT_EQ(WorkerIds(contents->updates), Range(6, 7));
    EXPECT_EQ((*journal)->updates_since_snapshot(), 2u);
  }
  EXPECT_EQ(RawCount(dir, "updates"), 2);
  EXPECT_EQ(RawCount(dir, "snapshot"), 1);
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ((*journal)->updates_since_snapshot(), 2u);
  ASSERT_TRUE(SnapshotDurably(**journal, "state through 7").ok());
  ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(8)).ok());
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->snapshot, "state through 7");
  EXPECT_EQ(WorkerIds(contents->updates), Range(8, 8));
}

TEST(SqliteJournal, FileDoesNotGrowOverSnapshotCycles) {
  const std::string dir = MakeTempDir();
  // Size, not durability, is under test: kNormal keeps 10,000 appends quick.
  auto journal = SqliteJournal::Open(dir, {.sync = SqliteJournal::SyncMode::kNormal});
  ASSERT_TRUE(journal.ok()) << journal.status();
  const std::string db = dir + "/journal.sqlite3";
  const std::string wal = db + "-wal";
  const std::string snapshot(20000, 's');
  uint64_t id = 0;
  uintmax_t size_after_first = 0;
  for (int cycle = 0; cycle < 50; ++cycle) {
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(++id, 500)).ok());
    }
    // Between snapshots the file holds the updates: 200 x 500 B.
    ASSERT_TRUE(SnapshotDurably(**journal, snapshot).ok());
    EXPECT_EQ(std::filesystem::file_size(wal), 0u) << "cycle " << cycle;
    if (cycle == 0) size_after_first = std::filesystem::file_size(db);
  }
  EXPECT_EQ(std::filesystem::file_size(db), size_after_first);
  // Less than the 50 x 200 x 500 B appended, and less than one cycle's
  // updates: the deleted pages went back to the file system.
  EXPECT_LT(size_after_first, 200u * 500u);
}

TEST(SqliteJournal, NewerFormatVersionIsRefused) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(1)).ok());
  }
  RawSql(dir, "UPDATE meta SET value = 2 WHERE key = 'format_version'");
  auto journal = SqliteJournal::Open(dir);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(journal.status().message(),
              HasSubstr(dir + "/journal.sqlite3 was written by a newer "
                              "dispatcher (format version 2; this one reads "
                              "up to 1)"));
}

TEST(SqliteJournal, FileThatIsNotSqliteIsRefusedAndLeftAlone) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/journal.sqlite3";
  std::string garbage;
  for (int i = 0; i < 500; ++i) garbage += "this is not a database. ";
  {
    std::ofstream out(path, std::ios::binary);
    out << garbage;
  }
  auto journal = SqliteJournal::Open(dir);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(journal.status().message(), HasSubstr(path));
  EXPECT_THAT(journal.status().message(), HasSubstr("not an SQLite database"));
  std::ifstream in(path, std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, garbage);
}

TEST(SqliteJournal, SqliteDatabaseThatIsNotAJournalIsRefused) {
  const std::string dir = MakeTempDir();
  RawSql(dir, "CREATE TABLE photos(id INTEGER PRIMARY KEY, name TEXT)");
  auto journal = SqliteJournal::Open(dir);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(journal.status().message(), HasSubstr("not a sluice journal"));
  EXPECT_EQ(RawCount(dir, "photos"), 0);
}

class SqliteJournalRows : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    auto journal = SqliteJournal::Open(dir_);
    ASSERT_TRUE(journal.ok()) << journal.status();
    for (uint64_t id = 1; id <= 5; ++id) {
      ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(id)).ok());
    }
  }
  std::string dir_;
};

TEST_F(SqliteJournalRows, RowThatFailsItsChecksumIsRefusedByNumber) {
  RawSql(dir_, "UPDATE updates SET bytes = X'" + Hex(WorkerUpdate(99).SerializeAsString()) +
                   "' WHERE seq = 3");
  auto journal = SqliteJournal::Open(dir_);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(journal.status().message(),
              HasSubstr(dir_ + "/journal.sqlite3: update row seq 3 fails its "
                               "checksum"));
}

TEST_F(SqliteJournalRows, RowThatDoesNotParseIsRefusedByNumber) {
  const std::string bad("\xff\xff\xff\xff", 4);
  RawSql(dir_, absl::StrCat("UPDATE updates SET bytes = X'", Hex(bad), "', checksum = ",
                            static_cast<int64_t>(record::Checksum(bad)), " WHERE seq = 4"));
  auto journal = SqliteJournal::Open(dir_);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(journal.status().message(),
              HasSubstr(dir_ + "/journal.sqlite3: update row seq 4 (4 bytes) "
                               "is not a valid sluice.proto.Update"));
}

TEST_F(SqliteJournalRows, MissingRowIsRefusedByNumber) {
  RawSql(dir_, "DELETE FROM updates WHERE seq = 2");
  auto journal = SqliteJournal::Open(dir_);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(journal.status().message(), HasSubstr("update row seq 3 follows seq 1"));
}

TEST(SqliteJournal, CorruptPageIsRefused) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir, {.sync = SqliteJournal::SyncMode::kNormal});
    ASSERT_TRUE(journal.ok()) << journal.status();
    for (uint64_t id = 1; id <= 2000; ++id) {
      ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(id, 100)).ok());
    }
  }  // closing checkpoints everything into journal.sqlite3
  const std::string path = dir + "/journal.sqlite3";
  const uintmax_t size = std::filesystem::file_size(path);
  ASSERT_GT(size, 40u * 4096u);
  {
    // Overwrite one whole page in the middle (page size 4096).
    std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(static_cast<std::streamoff>((size / 4096 / 2) * 4096));
    const std::string junk(4096, '\xab');
    file.write(junk.data(), junk.size());
  }
  auto journal = SqliteJournal::Open(dir);
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kDataLoss) << journal.status();
  EXPECT_THAT(journal.status().message(), HasSubstr(path));
  EXPECT_EQ(std::filesystem::file_size(path), size);
}

TEST(SqliteJournal, SecondOpenOfTheSameWorkDirIsRefused) {
  const std::string dir = MakeTempDir();
  auto first = SqliteJournal::Open(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(AppendDurably(**first, WorkerUpdate(1)).ok());
  auto second = SqliteJournal::Open(dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another process"));
  // The first one is unharmed.
  ASSERT_TRUE(AppendDurably(**first, WorkerUpdate(2)).ok());
  auto contents = (*first)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(WorkerIds(contents->updates), Range(1, 2));
}

TEST(SqliteJournal, ConcurrentAppendsAreAllKeptInEachThreadsOrder) {
  const std::string dir = MakeTempDir();
  constexpr int kThreads = 8;
  constexpr uint64_t kPerThread = 100;
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&journal, t] {
        for (uint64_t i = 1; i <= kPerThread; ++i) {
          EXPECT_TRUE(AppendDurably(**journal, WorkerUpdate(t * 1000 + i)).ok());
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ((*journal)->updates_since_snapshot(), kThreads * kPerThread);
  }
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  std::vector<std::vector<uint64_t>> per_thread(kThreads);
  for (uint64_t id : WorkerIds(contents->updates)) {
    ASSERT_LT(id / 1000, static_cast<uint64_t>(kThreads));
    per_thread[id / 1000].push_back(id % 1000);
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(per_thread[t], Range(1, kPerThread)) << "thread " << t;
  }
}

TEST(SqliteJournal, EnqueuedUpdatesAreWrittenInEnqueueOrder) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    std::vector<uint64_t> tickets;
    for (uint64_t id = 1; id <= 3; ++id) {
      auto ticket = (*journal)->Enqueue(WorkerUpdate(id));
      ASSERT_TRUE(ticket.ok()) << ticket.status();
      tickets.push_back(*ticket);
    }
    EXPECT_EQ(tickets, (std::vector<uint64_t>{0, 1, 2}));
    // Waiting for the last one writes all three.
    ASSERT_TRUE((*journal)->WaitDurable(2).ok());
    ASSERT_TRUE((*journal)->WaitDurable(0).ok());
    EXPECT_EQ((*journal)->updates_since_snapshot(), 3u);
    EXPECT_EQ((*journal)->WaitDurable(7).code(), absl::StatusCode::kInvalidArgument);
  }
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(WorkerIds(contents->updates), Range(1, 3));
}

TEST(SqliteJournal, SnapshotCoversUpdatesEnqueuedBeforeIt) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(1)).ok());
    auto t2 = (*journal)->Enqueue(WorkerUpdate(2));
    auto t3 = (*journal)->Enqueue(WorkerUpdate(3));
    ASSERT_TRUE(t2.ok() && t3.ok());
    ASSERT_TRUE(SnapshotDurably(**journal, "state through 3").ok());
    auto t4 = (*journal)->Enqueue(WorkerUpdate(4));
    ASSERT_TRUE(t4.ok());
    EXPECT_TRUE((*journal)->WaitDurable(*t2).ok());
    EXPECT_TRUE((*journal)->WaitDurable(*t3).ok());
    EXPECT_TRUE((*journal)->WaitDurable(*t4).ok());
  }
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->snapshot, "state through 3");
  EXPECT_EQ(WorkerIds(contents->updates), Range(4, 4));
}

TEST(SqliteJournal, AnEnqueuedSnapshotIsWrittenInQueueOrderByTheNextCommit) {
  const std::string dir = MakeTempDir();
  {
    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    ASSERT_TRUE(AppendDurably(**journal, WorkerUpdate(1)).ok());
    auto t2 = (*journal)->Enqueue(WorkerUpdate(2));
    auto snapshot = (*journal)->EnqueueSnapshot("state through 2");
    auto t3 = (*journal)->Enqueue(WorkerUpdate(3));
    auto second = (*journal)->EnqueueSnapshot("state through 3");
    auto t4 = (*journal)->Enqueue(WorkerUpdate(4));
    auto t5 = (*journal)->Enqueue(WorkerUpdate(5));
    ASSERT_TRUE(t2.ok() && snapshot.ok() && t3.ok() && second.ok() && t4.ok() && t5.ok());
    EXPECT_LT(*t2, *snapshot);
    EXPECT_LT(*snapshot, *t3);
    // Nothing is written before a commit: the earlier state is still there.
    EXPECT_EQ((*journal)->updates_since_snapshot(), 1u);
    // One wait (the last ticket) commits the queue in order.
    ASSERT_TRUE((*journal)->WaitDurable(*t5).ok());
    EXPECT_EQ((*journal)->updates_since_snapshot(), 2u);
  }
  auto journal = SqliteJournal::Open(dir);
  ASSERT_TRUE(journal.ok()) << journal.status();
  auto contents = (*journal)->Read();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->snapshot, "state through 3");
  EXPECT_EQ(WorkerIds(contents->updates), Range(4, 5));
}

TEST(InMemoryJournal, SnapshotReplacesEarlierUpdates) {
  InMemoryJournal journal;
  ASSERT_TRUE(AppendDurably(journal, WorkerUpdate(1)).ok());
  ASSERT_TRUE(SnapshotDurably(journal, "S").ok());
  auto ticket = journal.Enqueue(WorkerUpdate(2));
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(journal.WaitDurable(*ticket).ok());
  EXPECT_EQ(journal.updates_since_snapshot(), 1u);
  auto contents = journal.Read();
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(contents->snapshot, "S");
  EXPECT_EQ(WorkerIds(contents->updates), Range(2, 2));
}

// The child appends workers 1, 2, ... and snapshots every 64 appends (the
// snapshot names how many it covers); it writes each id to `ack_fd` once its
// AppendDurably returned. Never returns.
[[noreturn]] void AppendUntilKilled(const std::string& dir, int ack_fd) {
  auto journal = SqliteJournal::Open(dir);
  if (!journal.ok()) _exit(2);
  for (uint64_t id = 1;; ++id) {
    if (!AppendDurably(**journal, WorkerUpdate(id, 300)).ok()) _exit(3);
    if (id % 64 == 0 && !SnapshotDurably(**journal, absl::StrCat(id)).ok()) {
      _exit(4);
    }
    if (write(ack_fd, &id, sizeof(id)) != sizeof(id)) _exit(5);
  }
}

TEST(SqliteJournal, SigkillLeavesACleanPrefixOfEveryAcknowledgedUpdate) {
  std::random_device device;
  const unsigned seed = device();
  std::mt19937 random(seed);
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::string dir = MakeTempDir();
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(fds[0]);
      AppendUntilKilled(dir, fds[1]);
    }
    close(fds[1]);
    const uint64_t kill_after = std::uniform_int_distribution<uint64_t>(1, 300)(random);
    uint64_t acked = 0;
    uint64_t id = 0;
    while (acked < kill_after && read(fds[0], &id, sizeof(id)) == sizeof(id)) {
      acked = id;
    }
    ASSERT_EQ(acked, kill_after) << "the child stopped early";
    ASSERT_EQ(kill(child, SIGKILL), 0);
    while (read(fds[0], &id, sizeof(id)) == sizeof(id)) acked = id;
    close(fds[0]);
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "the child exited on its own, status " << wstatus;

    auto journal = SqliteJournal::Open(dir);
    ASSERT_TRUE(journal.ok()) << journal.status();
    auto contents = (*journal)->Read();
    ASSERT_TRUE(contents.ok()) << contents.status();
    uint64_t covered = 0;
    if (!contents->snapshot.empty()) {
      covered = std::stoull(contents->snapshot);
      EXPECT_EQ(covered % 64, 0u);
    }
    const uint64_t last = covered + contents->updates.size();
    EXPECT_GE(last, acked) << "an acknowledged update is lost";
    // At most the one in flight (or the snapshot after it) beyond the acks.
    EXPECT_LE(last, acked + 1);
    EXPECT_EQ(WorkerIds(contents->updates), Range(covered + 1, last));
    for (size_t i = 0; i < contents->updates.size(); ++i) {
      ASSERT_EQ(contents->updates[i].SerializeAsString(),
                WorkerUpdate(covered + 1 + i, 300).SerializeAsString());
    }
    EXPECT_EQ((*journal)->updates_since_snapshot(), contents->updates.size());
  }
}

}  // namespace
}  // namespace sluice::dispatcher
