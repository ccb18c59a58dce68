// journal_bench: Append latency and throughput of the dispatcher's SQLite
// journal (dispatcher/sqlite_journal.h), with `--threads` appending at once
// (group commit) and either sync mode.
//
//   journal_bench --work-dir /tmp/j --threads 1 --appends 2000 --sync full
//
// Prints one line: threads, sync, appends/s, Append p50/p99/max in ms.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "dispatcher/sqlite_journal.h"
#include "proto/dispatcher.pb.h"

namespace {

// A typical worker heartbeat's update: progress of 4 splits.
sluice::proto::Update HeartbeatUpdate(uint64_t worker, uint64_t n) {
  sluice::proto::Update update;
  auto* progress = update.mutable_worker_progress();
  progress->set_worker_id(worker);
  for (uint64_t i = 0; i < 4; ++i) {
    auto* split = progress->add_splits();
    split->mutable_key()->set_job_id(1);
    split->mutable_key()->set_consumer_index(static_cast<uint32_t>(worker % 200));
    split->mutable_key()->set_epoch(0);
    split->mutable_key()->set_position(i);
    split->set_produced_batches(n);
  }
  return update;
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("SQLite journal Append latency/throughput");
  std::string work_dir;
  int threads = 1;
  int appends = 2000;
  std::string sync = "full";
  app.add_option("--work-dir", work_dir, "folder for journal.sqlite3 (emptied)")->required();
  app.add_option("--threads", threads, "threads appending at once");
  app.add_option("--appends", appends, "appends in total");
  app.add_option("--sync", sync, "full | normal")->check(CLI::IsMember({"full", "normal"}));
  CLI11_PARSE(app, argc, argv);

  std::filesystem::remove_all(work_dir);
  auto journal = sluice::dispatcher::SqliteJournal::Open(
      work_dir, {.sync = sync == "full" ? sluice::dispatcher::SqliteJournal::SyncMode::kFull
                                        : sluice::dispatcher::SqliteJournal::SyncMode::kNormal});
  if (!journal.ok()) {
    std::fprintf(stderr, "%s\n", journal.status().ToString().c_str());
    return 1;
  }
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> latencies(threads);
  const int per_thread = appends / threads;
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        const auto update = HeartbeatUpdate(t, i);
        const auto before = Clock::now();
        absl::StatusOr<uint64_t> ticket = (*journal)->Enqueue(update);
        absl::Status s = ticket.ok() ? (*journal)->WaitDurable(*ticket) : ticket.status();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          std::exit(1);
        }
        latencies[t].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - before).count());
      }
    });
  }
  for (auto& thread : pool) thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (const auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  const double max = *std::max_element(all.begin(), all.end());
  std::printf(
      "threads=%d sync=%s appends=%zu appends_per_s=%.0f p50_ms=%.3f "
      "p99_ms=%.3f max_ms=%.3f",
      threads, sync.c_str(), all.size(), all.size() / seconds, Percentile(all, 0.5),
      Percentile(all, 0.99), max);
  // What a restart pays: Open (checks every row) + Read (what is replayed).
  journal->reset();
  const auto open_start = Clock::now();
  auto reopened = sluice::dispatcher::SqliteJournal::Open(work_dir);
  const auto read_start = Clock::now();
  auto contents = reopened.ok()
                      ? (*reopened)->Read()
                      : absl::StatusOr<sluice::dispatcher::Journal::Contents>(reopened.status());
  const auto read_end = Clock::now();
  if (!contents.ok()) {
    std::fprintf(stderr, "\n%s\n", contents.status().ToString().c_str());
    return 1;
  }
  std::printf(" reopen_open_ms=%.1f reopen_read_ms=%.1f\n",
              std::chrono::duration<double, std::milli>(read_start - open_start).count(),
              std::chrono::duration<double, std::milli>(read_end - read_start).count());
  return 0;
}
