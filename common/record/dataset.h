// A Unirecord dataset: a folder with `manifest.json` and shard files.
//
// manifest.json (example):
//   {"format":"unirecord","version":1,"schema":{...},"total_records":3000,
//    "shards":[{"file":"shard-00000.urec","records":3000,"bytes":134217728,
//               "index_checksum":"9a3f0c4e5d1b2a77"}],
//    "checksum":"0c1d2e3f4a5b6c7d"}
// `checksum` is XXH3-64 of the manifest without its checksum field, serialized
// compactly with sorted keys; a reader recomputes it. Records are numbered
// globally across shards in manifest order: that number is the record's *global
// index*.
#ifndef SLUICE_COMMON_RECORD_DATASET_H_
#define SLUICE_COMMON_RECORD_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/record/record.h"
#include "common/record/schema.h"
#include "common/record/shard.h"

namespace sluice::record {

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr uint64_t kDefaultShardSizeBytes = 1ULL << 30;

// OK when `path`, with every symlink and ".." resolved, is inside the folder `dir` (also
// resolved). PermissionDenied naming both otherwise; NotFound when they cannot be resolved.
// Dataset::Open applies it to every shard.
absl::Status CheckInsideFolder(const std::string& dir, const std::string& path);

struct ShardInfo {
  std::string file;  // relative to the dataset folder
  uint64_t records = 0;
  uint64_t bytes = 0;
  uint64_t index_checksum = 0;

  bool operator==(const ShardInfo&) const = default;
};

struct Manifest {
  Schema schema;
  std::vector<ShardInfo> shards;
  uint64_t total_records = 0;

  std::string ToJson() const;
  // DataLoss for invalid JSON, missing fields or a checksum mismatch; the
  // message names `source`.
  static absl::StatusOr<Manifest> FromJson(std::string_view json, const std::string& source);
  static absl::StatusOr<Manifest> ReadFile(const std::string& path);
};

// Writes a dataset folder, starting a new shard when the next record would push
// the current one past `shard_size_bytes` (a record larger than the limit gets
// a shard of its own). Not thread-safe.
class DatasetWriter {
 public:
  struct Options {
    uint64_t shard_size_bytes = kDefaultShardSizeBytes;
  };
  // Creates `dir` if needed. FailedPrecondition if it already holds a manifest.
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(const std::string& dir,
                                                               const Schema& schema,
                                                               Options options);
  absl::Status Add(const std::vector<Tensor>& values);
  // Closes the last shard and writes manifest.json. InvalidArgument if no
  // record was added.
  absl::StatusOr<Manifest> Finish();

  uint64_t record_count() const { return total_records_; }

 private:
  DatasetWriter(std::string dir, Schema schema, Options options)
      : dir_(std::move(dir)), schema_(std::move(schema)), options_(options) {}
  absl::Status CloseShard();

  const std::string dir_;
  const Schema schema_;
  const Options options_;
  std::unique_ptr<ShardWriter> shard_;
  std::vector<ShardInfo> shards_;
  uint64_t total_records_ = 0;
};

// Reads a dataset folder with random access by global index. Open() verifies
// the manifest and that every shard exists and agrees with it (record count,
// index checksum). Thread-safe.
class Dataset {
 public:
  // NotFound for a missing folder, manifest or shard; DataLoss for corruption;
  // InvalidArgument for a dataset without records.
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const Schema& schema() const { return manifest_.schema; }
  uint64_t size() const { return manifest_.total_records; }
  size_t num_shards() const { return shards_.size(); }
  const ShardReader& shard(size_t i) const { return *shards_[i]; }
  // Global index of the first record of each shard.
  const std::vector<uint64_t>& shard_starts() const { return starts_; }
  // (shard, index within shard) of a global index. REQUIRES: global < size().
  std::pair<size_t, uint64_t> Locate(uint64_t global) const;

  // As ShardReader's: a verified zero-copy view (valid while this Dataset
  // lives), a copy of it, and a decoded copy. OutOfRange past the end.
  absl::StatusOr<std::string_view> ReadView(uint64_t global) const;
  absl::StatusOr<std::string> ReadEncoded(uint64_t global) const;
  absl::StatusOr<Record> Read(uint64_t global) const;

 private:
  Dataset(std::string dir, Manifest manifest)
      : dir_(std::move(dir)), manifest_(std::move(manifest)) {}
  absl::Status CheckIndex(uint64_t global) const;

  const std::string dir_;
  const Manifest manifest_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::vector<uint64_t> starts_;
};

// Reads every record of every shard and checks every checksum. Returns one line
// per problem, each naming the shard file and, where it applies, the record
// index; empty when the dataset is sound.
std::vector<std::string> VerifyDataset(const std::string& dir);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_DATASET_H_
