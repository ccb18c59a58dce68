#include "data_worker/worker/split_cache.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/metrics/metrics.h"
#include "common/record/record.h"

namespace sluice::data_worker {
namespace {

namespace fs = std::filesystem;

constexpr char kGlobalColumn[] = "global";

std::string SplitPrefix(uint64_t split_id) { return absl::StrCat("split-", split_id, "."); }

std::string Nonce() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%016x", rng());
}

}  // namespace

SplitCache::SplitCache(std::string root, std::string fingerprint, std::string name,
                       std::vector<ColumnType> types, const CacheMetrics* metrics,
                       std::shared_ptr<spdlog::logger> logger)
    : root_(std::move(root)),
      fingerprint_(std::move(fingerprint)),
      name_(std::move(name)),
      types_(std::move(types)),
      metrics_(metrics),
      logger_(std::move(logger)) {}

std::string SplitCache::Dir() const { return (fs::path(root_) / fingerprint_).string(); }

record::Schema SplitCache::FileSchema() const {
  record::Schema schema;
  schema.columns.push_back(
      record::ColumnSpec{kGlobalColumn, record::DType::kInt64, {}, /*indexed=*/true});
  for (size_t i = 0; i < types_.size(); ++i) {
    record::ColumnSpec c;
    c.name = absl::StrCat("slot", i);
    c.dtype = types_[i].dtype;
    if (record::IsNumeric(c.dtype)) c.shape.assign(types_[i].shape.size(), -1);
    if (c.dtype == record::DType::kString) c.dtype = record::DType::kBytes;
    schema.columns.push_back(std::move(c));
  }
  return schema;
}

const SplitCache::Committed* SplitCache::FindLocked(uint64_t global) const {
  auto it = committed_.upper_bound(global);
  if (it == committed_.begin()) return nullptr;
  --it;
  const proto::CacheSplitFile& f = it->second.file;
  if (global >= f.first_global() + f.num_records()) return nullptr;
  return &it->second;
}

absl::StatusOr<pipeline::ElementCache::Found> SplitCache::Lookup(uint64_t global,
                                                                 std::vector<Tensor>* columns) {
  std::shared_ptr<const record::ShardReader> reader;
  std::string path;
  {
    absl::MutexLock lock(&mu_);
    const Committed* c = FindLocked(global);
    if (c == nullptr) return Found::kMiss;
    reader = c->reader;
    path = c->file.path();
  }
  if (reader == nullptr) {
    const std::string full = (fs::path(root_) / path).string();
    absl::StatusOr<std::unique_ptr<record::ShardReader>> opened = record::ShardReader::Open(full);
    if (!opened.ok()) {
      return absl::DataLossError(absl::StrCat("cache '", name_, "': committed file ", full,
                                              " cannot be read (remove the cache with `sluice "
                                              "cache rm ",
                                              name_, "`): ", opened.status().message()));
    }
    reader = std::shared_ptr<const record::ShardReader>(std::move(*opened));
    absl::MutexLock lock(&mu_);
    if (Committed* c = const_cast<Committed*>(FindLocked(global)); c != nullptr) {
      if (c->reader == nullptr) c->reader = reader;
    }
  }
  // Records are in global-index order: binary search the indexed global column.
  uint64_t lo = 0, hi = reader->record_count();
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (static_cast<uint64_t>(reader->key(mid, 0)) < global) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == reader->record_count() || static_cast<uint64_t>(reader->key(lo, 0)) != global) {
    return Found::kAbsent;
  }
  ASSIGN_OR_RETURN(std::string_view encoded, reader->ReadView(lo));
  ASSIGN_OR_RETURN(std::vector<record::TensorView> views,
                   record::DecodeRecord(reader->schema(), encoded));
  columns->clear();
  for (size_t c = 1; c < views.size(); ++c) {
    const record::ColumnSpec& spec = reader->schema().columns[c];
    const record::TensorView& v = views[c];
    if (!record::IsNumeric(spec.dtype)) {
      columns->push_back(Tensor::FromBytes(std::string(v.data)));
      continue;
    }
    Tensor t = Tensor::Allocate(spec.dtype, v.shape);
    if (t.num_bytes() != v.data.size()) {
      return absl::DataLossError(absl::StrCat("cache file ", reader->path(), ": record ", lo,
                                              " column ", spec.name, " has ", v.data.size(),
                                              " bytes for shape ", ShapeToString(v.shape)));
    }
    std::memcpy(t.data(), v.data.data(), v.data.size());
    columns->push_back(std::move(t));
  }
  if (metrics_ != nullptr) metrics_->read_elements->Increment();
  return Found::kHit;
}

void SplitCache::Offer(uint64_t global, const std::vector<Tensor>& columns) {
  {
    absl::MutexLock lock(&mu_);
    if (captures_.empty()) return;
  }
  std::vector<record::Tensor> copy;
  copy.push_back(record::Tensor::Int64(static_cast<int64_t>(global)));
  for (const Tensor& t : columns) {
    record::Tensor r;
    if (record::IsNumeric(t.dtype())) r.shape = t.shape();
    r.data.assign(t.bytes());
    copy.push_back(std::move(r));
  }
  absl::MutexLock lock(&mu_);
  for (auto& [split, capture] : captures_) {
    if (global >= capture.first_global && global < capture.first_global + capture.num_records) {
      capture.elements.emplace(global, std::move(copy));
      return;
    }
  }
}

bool SplitCache::IsCommitted(uint64_t split_id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [first, c] : committed_) {
    if (c.file.split_id() == split_id) return true;
  }
  return false;
}

bool SplitCache::BeginCapture(uint64_t split_id, uint64_t first_global, uint64_t num_records) {
  absl::MutexLock lock(&mu_);
  if (captures_.contains(split_id)) return false;
  auto it = committed_.find(first_global);
  if (it != committed_.end()) return false;
  Capture& c = captures_[split_id];
  c.first_global = first_global;
  c.num_records = num_records;
  return true;
}

void SplitCache::AbandonCapture(uint64_t split_id) {
  absl::MutexLock lock(&mu_);
  captures_.erase(split_id);
}

absl::StatusOr<proto::CacheSplitFile> SplitCache::FinishCapture(uint64_t split_id) {
  Capture capture;
  {
    absl::MutexLock lock(&mu_);
    auto it = captures_.find(split_id);
    if (it == captures_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("split ", split_id, " is not captured"));
    }
    if (committed_.contains(it->second.first_global)) {
      // Committed while the run ran: some of its elements came from that file and were not
      // offered, so this capture may be incomplete. The committed file stands.
      captures_.erase(it);
      return absl::AlreadyExistsError(absl::StrCat("cache '", name_, "' split ", split_id,
                                                   " was committed by another worker meanwhile"));
    }
    capture = std::move(it->second);
    // Stays registered (empty) until the file is renamed, so AddCommitted spares it.
    it->second.elements.clear();
  }
  auto done = [&] {
    absl::MutexLock lock(&mu_);
    captures_.erase(split_id);
  };
  std::error_code ec;
  fs::create_directories(Dir(), ec);
  const std::string base = absl::StrCat(SplitPrefix(split_id), Nonce());
  const std::string partial = (fs::path(Dir()) / (base + ".partial")).string();
  const std::string rel = (fs::path(fingerprint_) / (base + ".urec")).string();
  const std::string final_path = (fs::path(root_) / rel).string();
  absl::Status written = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<record::ShardWriter> w,
                     record::ShardWriter::Create(partial, FileSchema()));
    for (const auto& [global, values] : capture.elements) RETURN_IF_ERROR(w->Add(values));
    RETURN_IF_ERROR(w->Finish());
    return absl::OkStatus();
  }();
  if (written.ok()) {
    fs::rename(partial, final_path, ec);
    if (ec) written = absl::InternalError(absl::StrCat("rename ", partial, ": ", ec.message()));
  }
  if (!written.ok()) {
    fs::remove(partial, ec);
    done();
    return absl::Status(written.code(), absl::StrCat("cache '", name_, "' split ", split_id, ": ",
                                                     written.message()));
  }
  absl::StatusOr<std::unique_ptr<record::ShardReader>> check =
      record::ShardReader::Open(final_path);
  done();
  if (!check.ok()) {
    fs::remove(final_path, ec);
    return check.status();
  }
  proto::CacheSplitFile file;
  file.set_fingerprint(fingerprint_);
  file.set_split_id(split_id);
  file.set_path(rel);
  file.set_bytes((*check)->file_size());
  file.set_records((*check)->record_count());
  file.set_first_global(capture.first_global);
  file.set_num_records(capture.num_records);
  file.set_index_checksum((*check)->index_checksum());
  if (metrics_ != nullptr) {
    metrics_->written_files->Increment();
    metrics_->written_bytes->Increment(static_cast<double>(file.bytes()));
  }
  return file;
}

void SplitCache::AddCommitted(const proto::CacheSplitFile& file) {
  bool capturing;
  {
    absl::MutexLock lock(&mu_);
    Committed& c = committed_[file.first_global()];
    if (c.file.path() == file.path()) return;
    c.file = file;
    c.reader = nullptr;
    capturing = captures_.contains(file.split_id());
  }
  if (capturing) return;
  // The split's other files: partial ones of killed writers, or complete ones never committed.
  std::error_code ec;
  const std::string prefix = SplitPrefix(file.split_id());
  const std::string keep = fs::path(file.path()).filename().string();
  for (fs::directory_iterator it(Dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, prefix) || name == keep) continue;
    std::error_code rm;
    if (fs::remove(it->path(), rm)) {
      logger_->info("cache '{}': deleted {}: split {} is committed as {}", name_,
                    it->path().string(), file.split_id(), file.path());
      if (metrics_ != nullptr) metrics_->discarded_files->Increment();
    }
  }
}

void SplitCache::Forget() {
  absl::MutexLock lock(&mu_);
  committed_.clear();
}

CacheStore::CacheStore(std::string root, prometheus::Registry& registry,
                       std::shared_ptr<spdlog::logger> logger)
    : root_(std::move(root)), logger_(std::move(logger)) {
  metrics_.read_elements = &AddCounter(registry, "sluice_worker_cache_read_elements_total",
                                       "Elements read from committed cache files.");
  metrics_.written_files = &AddCounter(registry, "sluice_worker_cache_written_files_total",
                                       "Cache files (one split each) written and reported.");
  metrics_.written_bytes = &AddCounter(registry, "sluice_worker_cache_written_bytes_total",
                                       "Bytes of the cache files written.");
  metrics_.discarded_files =
      &AddCounter(registry, "sluice_worker_cache_discarded_files_total",
                  "Uncommitted cache files deleted (partial, refused or superseded).");
}

std::shared_ptr<SplitCache> CacheStore::Get(const std::string& fingerprint, const std::string& name,
                                            const std::vector<ColumnType>& types) {
  if (!enabled()) return nullptr;
  std::vector<proto::CacheSplitFile> known;
  std::shared_ptr<SplitCache> cache;
  {
    absl::MutexLock lock(&mu_);
    auto it = caches_.find(fingerprint);
    if (it != caches_.end()) return it->second;
    cache = std::make_shared<SplitCache>(root_, fingerprint, name, types, &metrics_, logger_);
    caches_.emplace(fingerprint, cache);
    auto k = known_.find(fingerprint);
    if (k != known_.end()) {
      known = std::move(k->second);
      known_.erase(k);
    }
  }
  for (const proto::CacheSplitFile& f : known) cache->AddCommitted(f);
  return cache;
}

void CacheStore::Report(proto::CacheSplitFile file) {
  absl::MutexLock lock(&mu_);
  reports_[file.path()] = std::move(file);
}

void CacheStore::Fill(proto::WorkerHeartbeatRequest* request) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [path, f] : reports_) *request->add_cache_files() = f;
  request->set_cache_seq(seq_);
}

void CacheStore::Apply(const proto::WorkerHeartbeatResponse& response) {
  std::vector<std::pair<std::shared_ptr<SplitCache>, proto::CacheSplitFile>> commits;
  std::vector<std::string> refused;
  std::vector<std::string> removed;
  std::vector<std::shared_ptr<SplitCache>> forgotten;
  {
    absl::MutexLock lock(&mu_);
    if (response.cache_seq() < seq_) return;  // an answer older than one already applied
    seq_ = response.cache_seq();
    for (const proto::CacheSplitFile& f : response.cache_commits()) {
      auto it = caches_.find(f.fingerprint());
      if (it != caches_.end()) {
        commits.emplace_back(it->second, f);
      } else {
        known_[f.fingerprint()].push_back(f);
      }
    }
    for (const std::string& fp : response.cache_removed()) {
      if (auto it = caches_.find(fp); it != caches_.end()) forgotten.push_back(it->second);
      caches_.erase(fp);
      known_.erase(fp);
      removed.push_back(fp);
    }
    for (const std::string& path : response.cache_acked()) {
      if (reports_.erase(path) == 0) continue;
      bool committed = false;
      for (const proto::CacheSplitFile& f : response.cache_commits()) {
        committed = committed || f.path() == path;
      }
      if (!committed) refused.push_back(path);
    }
  }
  for (auto& [cache, f] : commits) cache->AddCommitted(f);
  for (auto& cache : forgotten) cache->Forget();
  std::error_code ec;
  for (const std::string& path : refused) {
    if (fs::remove(fs::path(root_) / path, ec)) metrics_.discarded_files->Increment();
  }
  for (const std::string& fp : removed) {
    if (fp.empty() || fp.find('/') != std::string::npos) continue;
    fs::remove_all(fs::path(root_) / fp, ec);
    logger_->info("cache {} removed by the dispatcher: deleted its folder", fp);
  }
}

void CacheStore::Reset() {
  absl::MutexLock lock(&mu_);
  caches_.clear();
  known_.clear();
  reports_.clear();
  seq_ = 0;
}

}  // namespace sluice::data_worker
