// dispatcher_scale: control-plane load on one real sluice-dispatcher process.
//
// Simulated data workers (WorkerRegister, then WorkerHeartbeat every
// 1/--worker-hz seconds) and simulated consumers (ClientHeartbeat every
// 1/--consumer-hz seconds) make real gRPC calls (callback API, many peers per
// driver thread, phases spread evenly over the period). Heartbeats carry real
// progress: a worker produces --batches-per-beat batches of each split it
// holds per heartbeat, its consumer reports those batches delivered and the
// split complete once all are produced, the dispatcher marks it done, tells
// the worker to drop it and hands out the next one; consumers move through
// epochs.
//
// For each step of --workers (250,500,...) a fresh dispatcher is started
// (with --work-dir under --work-root when given), the dataset and --jobs jobs
// are registered, the workers register, then heartbeats run for --warmup
// (not measured) and --duration (measured). Per step it prints heartbeat
// latency p50/p99/max per kind, achieved rates, errors, missed beats (the
// previous call of that peer still in flight), offered (beats due) and
// answered (OK) rates, the dispatcher's CPU (from /proc/PID/stat, in cores),
// RSS and thread count, and this process's CPU (it shares the machine).
// Consumers echo the versions of the lists they hold, as the client does
// (--full-lists: as clients before versions).
//
// One file (~820 lines): simulated peers, the phase schedule and the report are one driver
// that nothing else links.
//
//   dispatcher_scale --dispatcher build/bin/sluice-dispatcher
//       --workers 250,500,1000,1500,2000,3000 --consumers 200 --duration 15s
//
// One file on purpose (~780 lines): a benchmark is read and rerun as a whole,
// and nothing here is used by anything else. Its parts, each marked `// ----`:
// the shared production progress, call statistics, the simulated peers, the
// driver threads, /proc readings, one step, main().
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <queue>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/duration_flag.h"
#include "common/base/process.h"
#include "common/service/protocol.h"
#include "grpcpp/grpcpp.h"
#include "proto/dispatcher.grpc.pb.h"

namespace sluice::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
using proto::DispatcherService;

constexpr uint32_t kVersion = service::kProtocolVersion;

struct Flags {
  std::string dispatcher_bin = "build/bin/sluice-dispatcher";
  std::string work_root;  // empty: no --work-dir
  std::string log_dir = "/tmp/dispatcher_scale";
  std::vector<int> workers = {250, 500, 1000, 1500, 2000, 3000};
  int consumers = 200;
  int jobs = 4;
  double worker_hz = 1;
  double consumer_hz = 5;
  absl::Duration warmup = absl::Seconds(5);
  absl::Duration duration = absl::Seconds(20);
  absl::Duration deadline = absl::Seconds(5);
  int threads = 2;
  int channels = 64;
  uint32_t capacity = 2;
  uint64_t batches_per_beat = 8;
  bool full_lists = false;  // consumers echo no list versions (old clients)
  int perf_workers = 0;     // perf record the dispatcher in this step
  std::string perf_out = "/tmp/dispatcher_scale/perf.data";
};

// ---- Shared production progress: what workers produced, per split key. ----

using Key = std::tuple<uint64_t, uint32_t, uint64_t, uint64_t>;
Key KeyOf(const proto::SplitKey& k) {
  return {k.job_id(), k.consumer_index(), k.epoch(), k.position()};
}

struct Produced {
  uint64_t produced = 0;
  uint64_t total = 0;
};

class ProgressBoard {
 public:
  void Set(const Key& key, Produced p) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    map_[key] = p;
  }
  void Erase(const Key& key) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    map_.erase(key);
  }
  bool Get(const Key& key, Produced* p) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    *p = it->second;
    return true;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, Produced> map_ ABSL_GUARDED_BY(mu_);
};

// ---- Latency and error statistics of one kind of call. ----

class Stats {
 public:
  void Record(double ms, size_t response_bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    latencies_ms_.push_back(ms);
    response_bytes_ += response_bytes;
  }
  void Error(grpc::StatusCode code, const std::string& message) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (errors_[code]++ == 0) first_error_[code] = message;
  }
  void Missed() { missed_.fetch_add(1); }
  void Offered() { offered_.fetch_add(1); }

  struct Summary {
    size_t count = 0;
    double p50 = 0, p99 = 0, max = 0;
    double avg_response_bytes = 0;
    size_t errors = 0;
    size_t missed = 0;
    size_t offered = 0;  // beats due in the window (sent or missed)
    std::string error_text;
  };
  Summary Summarize() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Summary s;
    s.count = latencies_ms_.size();
    s.missed = missed_.load();
    s.offered = offered_.load();
    for (const auto& [code, n] : errors_) {
      s.errors += n;
      absl::StrAppend(&s.error_text, " [code ", static_cast<int>(code), " x", n, ": ",
                      first_error_[code], "]");
    }
    if (s.count == 0) return s;
    std::vector<double> v = latencies_ms_;
    std::sort(v.begin(), v.end());
    auto at = [&](double p) {
      return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
    };
    s.p50 = at(0.5);
    s.p99 = at(0.99);
    s.max = v.back();
    s.avg_response_bytes = static_cast<double>(response_bytes_) / s.count;
    return s;
  }

 private:
  absl::Mutex mu_;
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  uint64_t response_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<grpc::StatusCode, size_t> errors_ ABSL_GUARDED_BY(mu_);
  std::map<grpc::StatusCode, std::string> first_error_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> missed_{0};
  std::atomic<size_t> offered_{0};
};

// The measurement window, shared by all peers.
struct Window {
  std::atomic<int64_t> begin_ns{INT64_MAX};
  std::atomic<int64_t> end_ns{INT64_MAX};
  bool Contains(SteadyClock::time_point t) const {
    const int64_t ns = t.time_since_epoch().count();
    return ns >= begin_ns.load() && ns < end_ns.load();
  }
};

// Calls in flight, so the step waits for all callbacks before tearing down.
std::atomic<int64_t> g_in_flight{0};

// ---- Simulated peers. At most one call in flight per peer: the driver ----
// ---- thread builds the request only when `busy_` is false; the callback ----
// ---- owns the peer until it clears `busy_`.                             ----

class Peer {
 public:
  virtual ~Peer() = default;
  // Called by the driver thread when the peer's beat is due.
  void Beat(DispatcherService::Stub* stub, Stats* stats, const Window* window,
            absl::Duration deadline) {
    const bool measured = window->Contains(SteadyClock::now());
    if (measured) stats->Offered();
    if (busy_.load(std::memory_order_acquire)) {
      if (measured) stats->Missed();
      return;
    }
    busy_.store(true, std::memory_order_relaxed);
    g_in_flight.fetch_add(1);
    Start(stub, stats, window, deadline);
  }

 protected:
  virtual void Start(DispatcherService::Stub* stub, Stats* stats, const Window* window,
                     absl::Duration deadline) = 0;
  void Done() {
    busy_.store(false, std::memory_order_release);
    g_in_flight.fetch_sub(1);
  }

 private:
  std::atomic<bool> busy_{false};
};

template <typename Request, typename Response>
struct Call {
  grpc::ClientContext context;
  Request request;
  Response response;
  SteadyClock::time_point start;
};

class SimWorker : public Peer {
 public:
  SimWorker(uint64_t id, uint64_t batch_size, uint64_t batches_per_beat, ProgressBoard* board)
      : id_(id), batch_size_(batch_size), batches_per_beat_(batches_per_beat), board_(board) {}

 protected:
  void Start(DispatcherService::Stub* stub, Stats* stats, const Window* window,
             absl::Duration deadline) override {
    auto* call = new Call<proto::WorkerHeartbeatRequest, proto::WorkerHeartbeatResponse>();
    proto::WorkerHeartbeatRequest& req = call->request;
    req.set_protocol_version(kVersion);
    req.set_worker_id(id_);
    uint64_t depth = 0;
    for (Held& h : held_) {
      h.produced = std::min(h.total, h.produced + batches_per_beat_);
      board_->Set(KeyOf(h.key), {h.produced, h.total});
      proto::WorkerSplitProgress* p = req.add_splits();
      *p->mutable_key() = h.key;
      p->set_produced_batches(h.produced);
      p->set_finished_producing(h.produced == h.total);
      depth += 2;
    }
    req.set_queue_depth(depth);
    req.set_queue_capacity(16);
    req.set_elements_per_second(batches_per_beat_ * batch_size_ * held_.size());
    for (uint64_t job : known_jobs_) req.add_known_job_ids(job);
    call->context.set_deadline(std::chrono::system_clock::now() +
                               absl::ToChronoNanoseconds(deadline));
    call->start = SteadyClock::now();
    stub->async()->WorkerHeartbeat(
        &call->context, &call->request, &call->response,
        [this, call, stats, window](grpc::Status status) {
          const auto end = SteadyClock::now();
          if (window->Contains(call->start)) {
            if (status.ok()) {
              stats->Record(std::chrono::duration<double, std::milli>(end - call->start).count(),
                            call->response.ByteSizeLong());
            } else {
              stats->Error(status.error_code(), status.error_message());
            }
          }
          if (status.ok()) Apply(call->response);
          delete call;
          Done();
        });
  }

 private:
  struct Held {
    proto::SplitKey key;
    uint64_t total = 0;
    uint64_t produced = 0;
  };

  void Apply(const proto::WorkerHeartbeatResponse& response) {
    for (const proto::SplitKey& drop : response.drop()) {
      const Key key = KeyOf(drop);
      held_.erase(std::remove_if(held_.begin(), held_.end(),
                                 [&](const Held& h) { return KeyOf(h.key) == key; }),
                  held_.end());
      board_->Erase(key);
    }
    for (const proto::SplitAssignment& a : response.start()) {
      uint64_t records = 0;
      for (const proto::SplitPiece& p : a.pieces()) records += p.count();
      held_.push_back({a.key(), (records + batch_size_ - 1) / batch_size_, a.skip_batches()});
    }
    for (const proto::JobInfo& job : response.jobs()) {
      known_jobs_.push_back(job.job_id());
    }
  }

  const uint64_t id_;
  const uint64_t batch_size_;
  const uint64_t batches_per_beat_;
  ProgressBoard* const board_;
  std::vector<Held> held_;
  std::vector<uint64_t> known_jobs_;
};

class SimConsumer : public Peer {
 public:
  SimConsumer(uint64_t job_id, uint32_t index, ProgressBoard* board, bool full_lists)
      : job_id_(job_id), index_(index), board_(board), full_lists_(full_lists) {}

  uint64_t epoch() const { return epoch_.load(); }

 protected:
  void Start(DispatcherService::Stub* stub, Stats* stats, const Window* window,
             absl::Duration deadline) override {
    auto* call = new Call<proto::ClientHeartbeatRequest, proto::ClientHeartbeatResponse>();
    proto::ClientHeartbeatRequest& req = call->request;
    req.set_protocol_version(kVersion);
    req.set_job_id(job_id_);
    req.set_consumer_index(index_);
    req.set_buffer_fill(0.5);
    // Like the client: echo the versions of the lists held, so unchanged ones
    // are omitted (--full-lists: never, as clients before versions).
    if (!full_lists_) {
      req.set_tasks_version(tasks_version_);
      req.set_splits_version(splits_version_);
    }
    const uint64_t epoch = epoch_.load();
    for (uint64_t pos = 0; pos < done_.size(); ++pos) {
      if (done_[pos]) continue;
      Produced p;
      if (!board_->Get({job_id_, index_, epoch, pos}, &p) || p.produced == 0) continue;
      proto::ClientSplitProgress* progress = req.add_progress();
      progress->set_epoch(epoch);
      progress->set_position(pos);
      progress->set_delivered_batches(p.produced);
      progress->set_complete(p.produced == p.total);
    }
    call->context.set_deadline(std::chrono::system_clock::now() +
                               absl::ToChronoNanoseconds(deadline));
    call->start = SteadyClock::now();
    stub->async()->ClientHeartbeat(
        &call->context, &call->request, &call->response,
        [this, call, stats, window](grpc::Status status) {
          const auto end = SteadyClock::now();
          if (window->Contains(call->start)) {
            if (status.ok()) {
              stats->Record(std::chrono::duration<double, std::milli>(end - call->start).count(),
                            call->response.ByteSizeLong());
            } else {
              stats->Error(status.error_code(), status.error_message());
            }
          }
          if (status.ok()) Apply(call->response);
          delete call;
          Done();
        });
  }

 private:
  void Apply(const proto::ClientHeartbeatResponse& response) {
    epoch_.store(response.epoch());
    const bool splits_kept = response.splits_version() != 0 &&
                             response.splits_version() == splits_version_ &&
                             response.splits().empty();
    if (!splits_kept) num_splits_ = response.splits_size();
    splits_version_ = response.splits_version();
    tasks_version_ = response.tasks_version();
    done_.assign(num_splits_, false);
    for (uint64_t pos : response.done_positions()) {
      if (pos < done_.size()) done_[pos] = true;
    }
  }

  const uint64_t job_id_;
  const uint32_t index_;
  ProgressBoard* const board_;
  const bool full_lists_;
  std::atomic<uint64_t> epoch_{0};
  std::vector<bool> done_;  // per position of the current epoch
  uint64_t tasks_version_ = 0;
  uint64_t splits_version_ = 0;
  size_t num_splits_ = 0;
};

// ---- Driver threads: each beats its share of the peers on schedule. ----

struct Scheduled {
  SteadyClock::time_point due;
  size_t peer;
  bool operator>(const Scheduled& o) const { return due > o.due; }
};

struct PeerSlot {
  Peer* peer;
  DispatcherService::Stub* stub;
  Stats* stats;
  SteadyClock::duration period;
  SteadyClock::duration phase;
};

void Drive(const std::vector<PeerSlot>& slots, size_t first, size_t stride,
           SteadyClock::time_point start, const Window* window, absl::Duration deadline,
           const std::atomic<bool>* stop) {
  std::priority_queue<Scheduled, std::vector<Scheduled>, std::greater<>> heap;
  for (size_t i = first; i < slots.size(); i += stride) {
    heap.push({start + slots[i].phase, i});
  }
  while (!stop->load() && !heap.empty()) {
    const auto now = SteadyClock::now();
    while (!heap.empty() && heap.top().due <= now) {
      Scheduled s = heap.top();
      heap.pop();
      const PeerSlot& slot = slots[s.peer];
      slot.peer->Beat(slot.stub, slot.stats, window, deadline);
      heap.push({s.due + slot.period, s.peer});
    }
    std::this_thread::sleep_until(std::min(heap.top().due, now + std::chrono::milliseconds(50)));
  }
}

// ---- /proc readings of a process. ----

struct ProcSample {
  double cpu_seconds = 0;  // utime + stime
  double rss_mb = 0;
  int threads = 0;
  SteadyClock::time_point at;
};

ProcSample ReadProc(pid_t pid) {
  ProcSample s;
  s.at = SteadyClock::now();
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return s;
  std::vector<std::string> fields = absl::StrSplit(text.substr(paren + 2), ' ');
  // fields[0] is field 3 (state): utime = field 14, stime = 15, rss = 24.
  if (fields.size() < 22) return s;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  s.cpu_seconds = (std::stod(fields[11]) + std::stod(fields[12])) / tick;
  s.rss_mb = std::stod(fields[21]) * sysconf(_SC_PAGESIZE) / 1e6;
  s.threads = std::stoi(fields[17]);  // field 20
  return s;
}

double CoresBetween(const ProcSample& a, const ProcSample& b) {
  const double wall = std::chrono::duration<double>(b.at - a.at).count();
  return wall > 0 ? (b.cpu_seconds - a.cpu_seconds) / wall : 0;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

// ---- One step. ----

struct StepResult {
  int workers = 0;
  double setup_seconds = 0;
  Stats::Summary worker_hb, consumer_hb;
  double worker_rate = 0, consumer_rate = 0;
  double dispatcher_cores = 0, dispatcher_rss_mb = 0, bench_cores = 0;
  int dispatcher_threads = 0;
  uint64_t min_epoch = 0, max_epoch = 0;
  std::string load_before, load_after;
};

absl::StatusOr<StepResult> RunStep(const Flags& flags, int num_workers) {
  StepResult result;
  result.workers = num_workers;
  result.load_before = LoadAverage();
  std::filesystem::create_directories(flags.log_dir);
  const std::string tag = absl::StrCat("w", num_workers);
  const std::string address_file = absl::StrCat(flags.log_dir, "/address-", tag);
  std::filesystem::remove(address_file);
  std::vector<std::string> argv = {flags.dispatcher_bin, "--port", "0", "--address-file",
                                   address_file, "--metrics-port", "-1", "--log-level", "warn",
                                   // The simulated workers read no manifests.
                                   "--verify-shard-counts", "false"};
  if (!flags.work_root.empty()) {
    const std::string work_dir = absl::StrCat(flags.work_root, "/", tag);
    std::filesystem::remove_all(work_dir);
    argv.push_back("--work-dir");
    argv.push_back(work_dir);
  }
  auto dispatcher = Subprocess::Start(
      argv, {.log_file = absl::StrCat(flags.log_dir, "/dispatcher-", tag, ".log")});
  if (!dispatcher.ok()) return dispatcher.status();
  auto address = WaitForAddressFile(address_file, **dispatcher, absl::Seconds(20));
  if (!address.ok()) return address.status();

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<DispatcherService::Stub>> stubs;
  for (int i = 0; i < flags.channels; ++i) {
    grpc::ChannelArguments args;
    // Its own TCP connection per channel, as separate processes would have
    // (service::CreateChannel() shares one connection between channels to
    // the same address).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("sluice.bench.channel", i);
    channels.push_back(
        grpc::CreateCustomChannel(*address, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(DispatcherService::NewStub(channels.back()));
  }
  auto call_context = [&]() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  };

  // The dataset: 1.28 M records in 128 shards of 10,000 (ImageNet-sized),
  // batch 32, default split size 1024: 1,280 splits per epoch.
  const auto setup_start = SteadyClock::now();
  constexpr uint64_t kBatch = 32;
  proto::RegisterDatasetRequest dataset;
  dataset.set_protocol_version(kVersion);
  dataset.set_pipeline("dispatcher_scale synthetic pipeline (opaque)");
  for (int i = 0; i < 128; ++i) dataset.add_shard_record_counts(10000);
  dataset.set_batch_size(kBatch);
  proto::RegisterDatasetResponse dataset_response;
  if (grpc::Status s = stubs[0]->RegisterDataset(call_context().get(), dataset, &dataset_response);
      !s.ok()) {
    return absl::InternalError("RegisterDataset: " + s.error_message());
  }
  ProgressBoard board;
  std::vector<std::unique_ptr<SimConsumer>> consumers;
  for (int j = 0; j < flags.jobs; ++j) {
    const int n = flags.consumers / flags.jobs + (j < flags.consumers % flags.jobs ? 1 : 0);
    if (n == 0) continue;
    proto::GetOrCreateJobRequest job;
    job.set_protocol_version(kVersion);
    job.set_job_name(absl::StrCat("scale-", j));
    job.set_dataset_id(dataset_response.dataset_id());
    job.mutable_config()->set_num_consumers(n);
    job.mutable_config()->set_seed(j + 1);
    job.mutable_config()->set_num_epochs(0);  // repeat
    proto::GetOrCreateJobResponse job_response;
    if (grpc::Status s = stubs[0]->GetOrCreateJob(call_context().get(), job, &job_response);
        !s.ok()) {
      return absl::InternalError("GetOrCreateJob: " + s.error_message());
    }
    for (int c = 0; c < n; ++c) {
      consumers.push_back(std::make_unique<SimConsumer>(
          job_response.job_id(), static_cast<uint32_t>(c), &board, flags.full_lists));
    }
  }
  // Workers register from 16 threads (blocking calls).
  std::vector<std::unique_ptr<SimWorker>> workers(num_workers);
  {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    std::string failure;
    absl::Mutex failure_mu;
    std::vector<std::thread> pool;
    for (int t = 0; t < 16; ++t) {
      pool.emplace_back([&] {
        while (true) {
          const int i = next.fetch_add(1);
          if (i >= num_workers || failed.load()) return;
          proto::WorkerRegisterRequest req;
          req.set_protocol_version(kVersion);
          req.set_address(absl::StrCat("sim-worker-", i, ":7000"));
          req.set_capacity(flags.capacity);
          proto::WorkerRegisterResponse resp;
          grpc::Status s =
              stubs[i % stubs.size()]->WorkerRegister(call_context().get(), req, &resp);
          if (!s.ok()) {
            absl::MutexLock lock(&failure_mu);
            failure = s.error_message();
            failed.store(true);
            return;
          }
          workers[i] =
              std::make_unique<SimWorker>(resp.worker_id(), kBatch, flags.batches_per_beat, &board);
        }
      });
    }
    for (auto& thread : pool) thread.join();
    if (failed.load()) {
      absl::MutexLock lock(&failure_mu);
      return absl::InternalError("WorkerRegister: " + failure);
    }
  }
  result.setup_seconds = std::chrono::duration<double>(SteadyClock::now() - setup_start).count();

  // Schedule: peers of one kind spread evenly over their period.
  Stats worker_stats, consumer_stats;
  std::vector<PeerSlot> slots;
  const auto worker_period = std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double>(1.0 / flags.worker_hz));
  const auto consumer_period = std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double>(1.0 / flags.consumer_hz));
  for (int i = 0; i < num_workers; ++i) {
    slots.push_back({workers[i].get(), stubs[i % stubs.size()].get(), &worker_stats, worker_period,
                     worker_period * i / num_workers});
  }
  for (size_t i = 0; i < consumers.size(); ++i) {
    slots.push_back(
        {consumers[i].get(), stubs[(num_workers + i) % stubs.size()].get(), &consumer_stats,
         consumer_period,
         consumer_period * static_cast<int64_t>(i) / static_cast<int64_t>(consumers.size())});
  }
  Window window;
  std::atomic<bool> stop{false};
  const auto start = SteadyClock::now();
  const auto measure_begin = start + absl::ToChronoNanoseconds(flags.warmup);
  const auto measure_end = measure_begin + absl::ToChronoNanoseconds(flags.duration);
  window.begin_ns = measure_begin.time_since_epoch().count();
  window.end_ns = measure_end.time_since_epoch().count();
  std::vector<std::thread> drivers;
  for (int t = 0; t < flags.threads; ++t) {
    drivers.emplace_back(Drive, std::cref(slots), t, flags.threads, start, &window, flags.deadline,
                         &stop);
  }
  std::this_thread::sleep_until(measure_begin);
  const pid_t pid = (*dispatcher)->pid();
  std::unique_ptr<Subprocess> perf;
  if (flags.perf_workers == num_workers) {
    auto p = Subprocess::Start({"/usr/bin/perf", "record", "-e", "cpu-clock", "-F", "499", "-g",
                                "-p", std::to_string(pid), "-o", flags.perf_out},
                               {.log_file = absl::StrCat(flags.log_dir, "/perf.log")});
    if (p.ok()) perf = std::move(*p);
  }
  const ProcSample d0 = ReadProc(pid), b0 = ReadProc(getpid());
  std::this_thread::sleep_until(measure_end);
  const ProcSample d1 = ReadProc(pid), b1 = ReadProc(getpid());
  if (perf != nullptr) {
    perf->Signal(SIGINT);
    (void)perf->Wait(absl::Seconds(30));
  }
  stop.store(true);
  for (auto& thread : drivers) thread.join();
  // Let the calls in flight finish (each has a deadline).
  const auto drain_until =
      SteadyClock::now() + absl::ToChronoNanoseconds(flags.deadline) + std::chrono::seconds(1);
  while (g_in_flight.load() > 0 && SteadyClock::now() < drain_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double window_seconds = absl::ToDoubleSeconds(flags.duration);
  result.worker_hb = worker_stats.Summarize();
  result.consumer_hb = consumer_stats.Summarize();
  result.worker_rate = result.worker_hb.count / window_seconds;
  result.consumer_rate = result.consumer_hb.count / window_seconds;
  result.dispatcher_cores = CoresBetween(d0, d1);
  result.dispatcher_rss_mb = d1.rss_mb;
  result.dispatcher_threads = d1.threads;
  result.bench_cores = CoresBetween(b0, b1);
  result.min_epoch = UINT64_MAX;
  for (const auto& c : consumers) {
    result.min_epoch = std::min(result.min_epoch, c->epoch());
    result.max_epoch = std::max(result.max_epoch, c->epoch());
  }
  result.load_after = LoadAverage();
  if (g_in_flight.load() > 0) {
    return absl::DeadlineExceededError("calls still in flight after the step");
  }
  (*dispatcher)->Stop(absl::Seconds(5));
  return result;
}

std::string Summary(const char* name, const Stats::Summary& s, double rate, double window_seconds) {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "%s offered %6.0f/s answered %6.0f/s p50 %6.2f ms p99 %7.2f ms "
                "max %7.1f ms errors %zu missed %zu resp %6.0f B",
                name, s.offered / window_seconds, rate, s.p50, s.p99, s.max, s.errors, s.missed,
                s.avg_response_bytes);
  return buf;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  using sluice::bench::Flags;
  Flags flags;
  CLI::App app(
      "dispatcher_scale: simulated workers and consumers heartbeating one "
      "sluice-dispatcher");
  app.add_option("--dispatcher", flags.dispatcher_bin, "sluice-dispatcher binary")
      ->capture_default_str();
  app.add_option("--work-root", flags.work_root,
                 "pass --work-dir <work-root>/w<N> to each dispatcher "
                 "(durable journal); empty: none");
  app.add_option("--log-dir", flags.log_dir, "dispatcher logs, address files")
      ->capture_default_str();
  app.add_option("--workers", flags.workers, "simulated workers, per step")->delimiter(',');
  app.add_option("--consumers", flags.consumers, "simulated consumers")->capture_default_str();
  app.add_option("--jobs", flags.jobs, "jobs the consumers are spread over")->capture_default_str();
  app.add_option("--worker-hz", flags.worker_hz, "worker heartbeats per second")
      ->capture_default_str();
  app.add_option("--consumer-hz", flags.consumer_hz, "consumer heartbeats per second")
      ->capture_default_str();
  sluice::AddDurationOption(app, "--warmup", &flags.warmup, "unmeasured heartbeats first");
  sluice::AddDurationOption(app, "--duration", &flags.duration, "measured window");
  sluice::AddDurationOption(app, "--deadline", &flags.deadline, "deadline of every heartbeat call");
  app.add_option("--threads", flags.threads, "driver threads")->capture_default_str();
  app.add_option("--channels", flags.channels,
                 "gRPC channels (TCP connections) shared by the peers")
      ->capture_default_str();
  app.add_option("--capacity", flags.capacity, "splits per worker")->capture_default_str();
  app.add_option("--batches-per-beat", flags.batches_per_beat,
                 "batches a worker produces per split per heartbeat")
      ->capture_default_str();
  app.add_flag("--full-lists", flags.full_lists,
               "consumers echo no list versions: every answer carries the "
               "whole task list and split sequence (clients before versions)");
  app.add_option("--perf-workers", flags.perf_workers,
                 "perf record the dispatcher during the step with this many "
                 "workers");
  app.add_option("--perf-out", flags.perf_out, "perf.data path")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);

  std::printf(
      "# %d consumers at %.1f Hz over %d jobs, workers at %.1f Hz "
      "(capacity %u), %d driver threads, %d channels, warmup %s, window %s\n",
      flags.consumers, flags.consumer_hz, flags.jobs, flags.worker_hz, flags.capacity,
      flags.threads, flags.channels, absl::FormatDuration(flags.warmup).c_str(),
      absl::FormatDuration(flags.duration).c_str());
  int failures = 0;
  for (int n : flags.workers) {
    auto r = sluice::bench::RunStep(flags, n);
    if (!r.ok()) {
      std::printf("workers %5d: FAILED %s\n", n, r.status().ToString().c_str());
      std::fflush(stdout);
      ++failures;
      continue;
    }
    std::printf(
        "workers %5d | setup %5.1f s | %s | %s | dispatcher %.2f cores "
        "RSS %.0f MB %d threads | bench %.2f cores | epochs %llu..%llu | load "
        "%s -> %s\n",
        n, r->setup_seconds,
        sluice::bench::Summary("worker hb", r->worker_hb, r->worker_rate,
                               absl::ToDoubleSeconds(flags.duration))
            .c_str(),
        sluice::bench::Summary("consumer hb", r->consumer_hb, r->consumer_rate,
                               absl::ToDoubleSeconds(flags.duration))
            .c_str(),
        r->dispatcher_cores, r->dispatcher_rss_mb, r->dispatcher_threads, r->bench_cores,
        static_cast<unsigned long long>(r->min_epoch),
        static_cast<unsigned long long>(r->max_epoch), r->load_before.c_str(),
        r->load_after.c_str());
    if (!r->worker_hb.error_text.empty() || !r->consumer_hb.error_text.empty()) {
      std::printf("  errors:%s%s\n", r->worker_hb.error_text.c_str(),
                  r->consumer_hb.error_text.c_str());
    }
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}
