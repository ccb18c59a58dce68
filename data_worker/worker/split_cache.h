// The worker's side of cache nodes (docs/cache.md): SplitCache is one cache's files (one
// fingerprint) as the executors of every job with that prefix see them; CacheStore holds the
// worker's SplitCaches, carries file reports to the dispatcher and applies its commits.
//
// Writing. Before a producer submits a run whose slot reads a whole split that has no committed
// file, it calls BeginCapture(split). The run's elements pass the cache step, which Offer()s
// each one: a captured split keeps a copy (by global index; a duplicate from another run of the
// same split is the same element). When the run ended without an error or a stop,
// FinishCapture writes the elements in global-index order as a Unirecord shard
// (common/record/shard.h; columns "global" (int64, indexed) then slot0, slot1, ...) to
//   <root>/<fingerprint>/split-<id>.<nonce>.partial
// fsyncs it, renames it to split-<id>.<nonce>.urec and queues its report. A run that failed or
// stopped calls AbandonCapture: nothing is written.
//
// Committing. The report travels in every heartbeat until the dispatcher lists its path in
// cache_acked. The dispatcher journals the first file reported for a split (the commit) and
// refuses later ones; every worker learns commits from cache_commits. Only committed paths are
// ever opened for reading, so a killed worker's .partial file, or a complete file whose report
// never made it, is never read: when a split's commit arrives, the worker deletes the split's
// other files in the folder (except its own capture in progress), and a refused report's file.
//
// Reading. Lookup(global) finds the committed file whose split holds `global` (opened once,
// its index verified), binary-searches the global column and decodes the record into tensors.
//
// Thread-safe: stage threads call Lookup/Offer, producers the capture calls, the heartbeat
// thread CacheStore::Fill/Apply. File I/O happens outside the lock.
#ifndef SLUICE_DATA_WORKER_WORKER_SPLIT_CACHE_H_
#define SLUICE_DATA_WORKER_WORKER_SPLIT_CACHE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/record/shard.h"
#include "data_worker/ops/registry.h"
#include "data_worker/pipeline/element_cache.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "proto/worker.pb.h"
#include "spdlog/spdlog.h"

namespace sluice::data_worker {

// The worker's cache counters (sluice_worker_cache_*), built once by CacheStore.
struct CacheMetrics {
  prometheus::Counter* read_elements = nullptr;  // elements taken from committed files
  prometheus::Counter* written_files = nullptr;  // files written and reported
  prometheus::Counter* written_bytes = nullptr;
  prometheus::Counter* discarded_files = nullptr;  // uncommitted files deleted
};

class SplitCache : public pipeline::ElementCache {
 public:
  // `root`: the worker's --cache-root. `types`: each slot's type at the cache node (the file
  // schema: dtype and rank, every dimension free). `metrics` outlives this.
  SplitCache(std::string root, std::string fingerprint, std::string name,
             std::vector<ColumnType> types, const CacheMetrics* metrics,
             std::shared_ptr<spdlog::logger> logger);

  const std::string& fingerprint() const { return fingerprint_; }

  absl::StatusOr<Found> Lookup(uint64_t global, std::vector<Tensor>* columns) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Offer(uint64_t global, const std::vector<Tensor>& columns) override ABSL_LOCKS_EXCLUDED(mu_);

  // True if the split has a committed file.
  bool IsCommitted(uint64_t split_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Starts keeping the elements of split `split_id` (records [first_global, first_global +
  // num_records)). False (nothing to do) if it is committed or already being captured.
  bool BeginCapture(uint64_t split_id, uint64_t first_global, uint64_t num_records)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the captured split (see the file comment) and returns its report (seq unset).
  // Errors: the file system's (the capture is dropped; the split stays uncached).
  absl::StatusOr<proto::CacheSplitFile> FinishCapture(uint64_t split_id) ABSL_LOCKS_EXCLUDED(mu_);
  void AbandonCapture(uint64_t split_id) ABSL_LOCKS_EXCLUDED(mu_);

  // A commit from the dispatcher: the split's file from now on. Deletes the split's other files
  // in the folder unless a capture of this worker is writing the split.
  void AddCommitted(const proto::CacheSplitFile& file) ABSL_LOCKS_EXCLUDED(mu_);
  // The cache was removed: every later Lookup misses.
  void Forget() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Committed {
    proto::CacheSplitFile file;
    std::shared_ptr<const record::ShardReader> reader;  // opened on first Lookup
  };
  struct Capture {
    uint64_t first_global = 0;
    uint64_t num_records = 0;
    std::map<uint64_t, std::vector<record::Tensor>> elements;  // by global index
  };
  // The committed file holding `global`, or null.
  const Committed* FindLocked(uint64_t global) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  record::Schema FileSchema() const;
  std::string Dir() const;

  const std::string root_;
  const std::string fingerprint_;
  const std::string name_;
  const std::vector<ColumnType> types_;
  const CacheMetrics* const metrics_;
  const std::shared_ptr<spdlog::logger> logger_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Committed> committed_ ABSL_GUARDED_BY(mu_);  // by first_global
  std::map<uint64_t, Capture> captures_ ABSL_GUARDED_BY(mu_);     // by split id
};

// The worker's caches by fingerprint, and the report/commit exchange with the dispatcher
// (heartbeat fields cache_*: proto/worker.proto). Thread-safe.
class CacheStore {
 public:
  // `root`: --cache-root; empty disables caching (jobs with a cache node compute everything).
  CacheStore(std::string root, prometheus::Registry& registry,
             std::shared_ptr<spdlog::logger> logger);

  bool enabled() const { return !root_.empty(); }
  const std::string& root() const { return root_; }
  // The cache with this fingerprint, created on first use with the commits already known.
  // Null when disabled.
  std::shared_ptr<SplitCache> Get(const std::string& fingerprint, const std::string& name,
                                  const std::vector<ColumnType>& types) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues a written file's report until the dispatcher acknowledges it.
  void Report(proto::CacheSplitFile file) ABSL_LOCKS_EXCLUDED(mu_);
  // Puts the unacknowledged reports and the applied sequence number into a heartbeat.
  void Fill(proto::WorkerHeartbeatRequest* request) const ABSL_LOCKS_EXCLUDED(mu_);
  // Applies a heartbeat answer's commits, removals and acknowledgements.
  void Apply(const proto::WorkerHeartbeatResponse& response) ABSL_LOCKS_EXCLUDED(mu_);
  // A new dispatcher incarnation: forget every commit (the new one sends its own).
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

  const CacheMetrics& metrics() const { return metrics_; }

 private:
  const std::string root_;
  const std::shared_ptr<spdlog::logger> logger_;
  CacheMetrics metrics_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<SplitCache>> caches_ ABSL_GUARDED_BY(mu_);
  // Commits of caches no job here uses yet, by fingerprint.
  std::map<std::string, std::vector<proto::CacheSplitFile>> known_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, proto::CacheSplitFile> reports_ ABSL_GUARDED_BY(mu_);  // by path
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::data_worker

#endif  // SLUICE_DATA_WORKER_WORKER_SPLIT_CACHE_H_
