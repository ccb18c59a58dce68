// libFuzzer target for the dispatcher's journal as it is read back at start: a journal whose
// rows are well-formed SQLite and carry valid checksums but whose contents are anything (a
// file restored from a bad backup, a bug of an older version, a hand-edited database). The
// input is a sequence of records
//
//   u16 little-endian length | length bytes
//
// The first record is the snapshot's bytes (empty: no snapshot), stored as they are; every
// later record that parses as a proto::Update is appended after it. The rows go into a real
// SqliteJournal (synchronous=NORMAL, in a temporary folder), which is closed, opened again
// and handed to DispatcherImpl::Create: replaying it must give a dispatcher or a Status
// (DataLoss naming what does not replay), never a crash, a hang or an allocation sized by a
// number in the journal. Seeds: tests/fuzz/corpus/journal_fuzzer/ (tests/fuzz/make_seeds.sh).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/base/clock.h"
#include "dispatcher/dispatcher_impl.h"
#include "dispatcher/sqlite_journal.h"
#include "proto/dispatcher.pb.h"

namespace sluice::dispatcher {
namespace {

// One folder per process, emptied before each input.
const std::string& WorkDir() {
  static const std::string* dir = [] {
    std::string base = std::filesystem::exists("/dev/shm")
                           ? "/dev/shm"
                           : std::filesystem::temp_directory_path().string();
    auto* d = new std::string(base + "/sluice_journal_fuzzer_" + std::to_string(::getpid()));
    return d;
  }();
  return *dir;
}

// The next record of `data`, or false at the end.
bool NextRecord(const uint8_t* data, size_t size, size_t* at, std::string* record) {
  if (*at + 2 > size) return false;
  size_t n = data[*at] | (size_t{data[*at + 1]} << 8);
  *at += 2;
  if (n > size - *at) n = size - *at;
  record->assign(reinterpret_cast<const char*>(data + *at), n);
  *at += n;
  return true;
}

void Run(const uint8_t* data, size_t size) {
  std::filesystem::remove_all(WorkDir());
  const SqliteJournal::Options sync{.sync = SqliteJournal::SyncMode::kNormal};
  {
    auto journal = SqliteJournal::Open(WorkDir(), sync);
    if (!journal.ok()) {
      std::fprintf(stderr, "open: %s\n", journal.status().ToString().c_str());
      std::abort();
    }
    size_t at = 0;
    std::string record;
    uint64_t last = 0;
    bool ok = true;
    if (NextRecord(data, size, &at, &record) && !record.empty()) {
      auto ticket = (*journal)->EnqueueSnapshot(record);
      ok = ticket.ok();
      if (ok) last = *ticket;
    }
    while (ok && NextRecord(data, size, &at, &record)) {
      proto::Update update;
      if (!update.ParseFromString(record)) continue;
      auto ticket = (*journal)->Enqueue(update);
      ok = ticket.ok();
      if (ok) last = *ticket;
    }
    // A snapshot over SQLite's blob limit is refused by the journal itself: nothing to replay.
    if (!ok || !(*journal)->WaitDurable(last).ok()) return;
  }
  auto journal = SqliteJournal::Open(WorkDir(), sync);
  if (!journal.ok()) return;  // DataLoss naming the row: a refusal, not a crash
  FakeClock clock(absl::FromUnixSeconds(1000));
  DispatcherOptions options{.clock = &clock, .journal = std::move(*journal)};
  auto dispatcher = DispatcherImpl::Create(options);
  if (dispatcher.ok()) (void)(*dispatcher)->Tick();
}

}  // namespace
}  // namespace sluice::dispatcher

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::dispatcher::Run(data, size);
  return 0;
}
