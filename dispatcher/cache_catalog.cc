#include "dispatcher/cache_catalog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice::dispatcher {
namespace {

// Removals a worker that was away longer than this many removals misses; it then keeps
// reading nothing of them anyway (their commits are gone), only their folders stay.
constexpr size_t kMaxRemoved = 1024;

}  // namespace

absl::Status CacheCatalog::Validate(const proto::Update& update) const {
  switch (update.kind_case()) {
    case proto::Update::kCacheCreate: {
      const proto::UpdateCacheCreate& u = update.cache_create();
      if (u.fingerprint().empty() || caches_.contains(u.fingerprint())) {
        return absl::FailedPreconditionError(
            absl::StrCat("cache '", u.fingerprint(), "' is empty or known"));
      }
      return absl::OkStatus();
    }
    case proto::Update::kCacheCommit: {
      const proto::CacheSplitFile& f = update.cache_commit().file();
      auto it = caches_.find(f.fingerprint());
      if (it == caches_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("cache ", f.fingerprint(), " is unknown"));
      }
      if (f.split_id() >= it->second.total_splits || it->second.files.contains(f.split_id())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cache ", f.fingerprint(), " split ", f.split_id(), " is out of range or committed"));
      }
      return absl::OkStatus();
    }
    case proto::Update::kCacheRemove:
      if (!caches_.contains(update.cache_remove().fingerprint())) {
        return absl::FailedPreconditionError(
            absl::StrCat("cache ", update.cache_remove().fingerprint(), " is unknown"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("not a cache update");
  }
}

void CacheCatalog::Apply(const proto::Update& update) {
  switch (update.kind_case()) {
    case proto::Update::kCacheCreate: {
      const proto::UpdateCacheCreate& u = update.cache_create();
      Cache& c = caches_[u.fingerprint()];
      c.fingerprint = u.fingerprint();
      c.name = u.name();
      c.total_splits = u.total_splits();
      c.created_seq = u.seq();
      seq_ = std::max(seq_, u.seq());
      return;
    }
    case proto::Update::kCacheCommit: {
      const proto::CacheSplitFile& f = update.cache_commit().file();
      Cache& c = caches_.at(f.fingerprint());
      c.files[f.split_id()] = f;
      c.bytes += f.bytes();
      total_bytes_ += f.bytes();
      commits_[f.seq()] = {f.fingerprint(), f.split_id()};
      seq_ = std::max(seq_, f.seq());
      return;
    }
    case proto::Update::kCacheRemove: {
      const proto::UpdateCacheRemove& u = update.cache_remove();
      auto it = caches_.find(u.fingerprint());
      for (const auto& [split, f] : it->second.files) commits_.erase(f.seq());
      total_bytes_ -= it->second.bytes;
      caches_.erase(it);
      removed_[u.seq()] = u.fingerprint();
      while (removed_.size() > kMaxRemoved) removed_.erase(removed_.begin());
      seq_ = std::max(seq_, u.seq());
      return;
    }
    default:
      return;
  }
}

void CacheCatalog::AppendSnapshot(proto::DispatcherSnapshot* snapshot) const {
  // Removals first (their fingerprints may come back as new caches), then each cache and its
  // files in sequence order.
  for (const auto& [seq, fp] : removed_) {
    // A removed cache is replayed as created-then-removed so the removal stays an event.
    if (caches_.contains(fp)) continue;
    proto::UpdateCacheCreate* c = snapshot->add_updates()->mutable_cache_create();
    c->set_fingerprint(fp);
    c->set_seq(0);
    proto::UpdateCacheRemove* r = snapshot->add_updates()->mutable_cache_remove();
    r->set_fingerprint(fp);
    r->set_seq(seq);
  }
  std::vector<const Cache*> order;
  for (const auto& [fp, c] : caches_) order.push_back(&c);
  std::sort(order.begin(), order.end(),
            [](const Cache* a, const Cache* b) { return a->created_seq < b->created_seq; });
  for (const Cache* c : order) {
    proto::UpdateCacheCreate* u = snapshot->add_updates()->mutable_cache_create();
    u->set_fingerprint(c->fingerprint);
    u->set_name(c->name);
    u->set_total_splits(c->total_splits);
    u->set_seq(c->created_seq);
    for (const auto& [split, f] : c->files) {
      *snapshot->add_updates()->mutable_cache_commit()->mutable_file() = f;
    }
  }
}

CacheCatalog::CommitPlan CacheCatalog::PlanCommit(const proto::CacheSplitFile& report,
                                                  uint64_t budget,
                                                  const std::set<std::string>& in_use) const {
  CommitPlan plan;
  auto it = caches_.find(report.fingerprint());
  if (it == caches_.end()) {
    plan.why = absl::StrCat("cache ", report.fingerprint(), " is unknown (removed?)");
    return plan;
  }
  const Cache& cache = it->second;
  if (report.split_id() >= cache.total_splits) {
    plan.why = absl::StrCat("split ", report.split_id(), " is out of range (the cache has ",
                            cache.total_splits, " splits)");
    return plan;
  }
  if (cache.files.contains(report.split_id())) {
    plan.why = absl::StrCat("split ", report.split_id(), " is committed already");
    return plan;
  }
  if (budget == 0 || total_bytes_ + report.bytes() <= budget) {
    plan.commit = true;
    return plan;
  }
  std::vector<const Cache*> candidates;
  for (const auto& [fp, c] : caches_) {
    if (fp != report.fingerprint() && !in_use.contains(fp) && c.bytes > 0) {
      candidates.push_back(&c);
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Cache* a, const Cache* b) { return a->created_seq < b->created_seq; });
  uint64_t total = total_bytes_;
  for (const Cache* c : candidates) {
    if (total + report.bytes() <= budget) break;
    plan.evict.push_back(c->fingerprint);
    total -= c->bytes;
  }
  if (total + report.bytes() > budget) {
    plan.evict.clear();
    plan.why = absl::StrCat("over --cache-budget-bytes ", budget, ": ", total_bytes_,
                            " bytes committed, the file has ", report.bytes(),
                            " and the other caches are in use");
    return plan;
  }
  plan.commit = true;
  plan.why = absl::StrCat("evicted ", plan.evict.size(),
                          " older cache(s) to fit --cache-budget-bytes ", budget);
  return plan;
}

void CacheCatalog::EventsSince(uint64_t since, proto::WorkerHeartbeatResponse* response) const {
  response->set_cache_seq(seq_);
  if (since >= seq_) return;
  for (auto it = commits_.upper_bound(since); it != commits_.end(); ++it) {
    const auto& [fp, split] = it->second;
    *response->add_cache_commits() = caches_.at(fp).files.at(split);
  }
  for (auto it = removed_.upper_bound(since); it != removed_.end(); ++it) {
    response->add_cache_removed(it->second);
  }
}

const CacheCatalog::Cache* CacheCatalog::Find(const std::string& fingerprint) const {
  auto it = caches_.find(fingerprint);
  return it == caches_.end() ? nullptr : &it->second;
}

}  // namespace sluice::dispatcher
