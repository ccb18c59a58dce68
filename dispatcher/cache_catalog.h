// CacheCatalog: the dispatcher's record of cache nodes' files (docs/cache.md), part of
// DispatcherState and changed only through its Apply (Update cases cache_create,
// cache_commit, cache_remove). The dispatcher never opens the files: workers write them under
// their --cache-root and report them; a commit here is what makes a file the split's file.
//
// Sequence numbers. Every event takes the next number (UpdateCacheCreate.seq,
// CacheSplitFile.seq, UpdateCacheRemove.seq). A worker echoes the highest it has applied and
// gets the commits and removals after it (EventsSince), so a heartbeat carries only news, and
// a worker that starts from 0 (new, or a new incarnation) gets every live commit.
//
// Commit policy (PlanCommit), for a reported file of split s of cache C:
//   - unknown cache, split out of range, or s already committed: refused (the worker deletes
//     its file; a report of the committed path itself is answered as committed);
//   - --cache-budget-bytes B > 0 and the committed bytes of all caches plus the file's would
//     exceed B: the caches other than C that no live job uses are evicted whole, oldest
//     (created first) first, until the file fits; if it still does not fit, the commit is
//     refused and s stays computed each epoch (the job never fails for the budget).
//
// Example: B = 100 MB; cache "a" (created first, 60 MB, its job over), "b" (30 MB, in use),
// "c" (in use) reports a 20 MB split: 60 + 30 + 20 > 100, evict "a" -> 50 MB: commit.
// A 90 MB split of "c" later: 30 + 20 + 90 > 100 and "b" is in use -> refused.
//
// Not thread-safe (DispatcherImpl's mutex guards it).
#ifndef SLUICE_DISPATCHER_CACHE_CATALOG_H_
#define SLUICE_DISPATCHER_CACHE_CATALOG_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/dispatcher.pb.h"
#include "proto/worker.pb.h"

namespace sluice::dispatcher {

class CacheCatalog {
 public:
  struct Cache {
    std::string fingerprint;
    std::string name;
    uint64_t total_splits = 0;
    uint64_t created_seq = 0;
    std::map<uint64_t, proto::CacheSplitFile> files;  // by split id
    uint64_t bytes = 0;                               // of `files`
  };

  // What to do with a reported file (see the file comment).
  struct CommitPlan {
    bool commit = false;
    std::vector<std::string> evict;  // fingerprints, oldest first
    std::string why;                 // for a refusal or an eviction, for logs
  };

  // FailedPrecondition/InvalidArgument if a cache update does not fit the catalog.
  absl::Status Validate(const proto::Update& update) const;
  // REQUIRES: Validate(update) is OK and update is a cache case.
  void Apply(const proto::Update& update);
  // Updates that rebuild the catalog, for the journal's snapshot.
  void AppendSnapshot(proto::DispatcherSnapshot* snapshot) const;

  // `in_use`: fingerprints of caches live jobs use (never evicted). `budget`: 0 = unlimited.
  CommitPlan PlanCommit(const proto::CacheSplitFile& report, uint64_t budget,
                        const std::set<std::string>& in_use) const;
  // Commits with seq > `since` (and every removal after it) into a heartbeat answer, with the
  // current sequence number.
  void EventsSince(uint64_t since, proto::WorkerHeartbeatResponse* response) const;

  const Cache* Find(const std::string& fingerprint) const;
  const std::map<std::string, Cache>& caches() const { return caches_; }
  uint64_t seq() const { return seq_; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  std::map<std::string, Cache> caches_;                           // by fingerprint
  std::map<uint64_t, std::pair<std::string, uint64_t>> commits_;  // seq -> (fingerprint, split)
  std::map<uint64_t, std::string> removed_;  // seq -> fingerprint (the last kMaxRemoved)
  uint64_t seq_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace sluice::dispatcher

#endif  // SLUICE_DISPATCHER_CACHE_CATALOG_H_
