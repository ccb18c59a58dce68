// A Unirecord shard file (`*.urec`): header, records back to back, index,
// footer. The byte layout is documented with an example dump in docs/format.md.
// In short, all integers little-endian, checksums XXH3-64:
//
//   header  "SLUICEUR" | u32 version | u32 n
//           | n bytes JSON {schema, created_by, created_at} | u64 checksum
//   data    record 0 | record 1 | ...          (encoding: record.h)
//   index   per record: u64 offset | u64 size | u64 checksum
//           | one 8-byte value per indexed column
//   footer  u64 index_offset | u64 index_size | u64 record_count
//           | u64 index_checksum | u64 footer_checksum | "SLUICEUR"
//
// Random access: read the footer, load and verify the index; records are then
// read from a read-only memory map of the file, and each record's checksum is
// verified on every read. Corruption is DataLoss naming the file and the record
// index. Shards are immutable once written: a file truncated by someone else
// while a reader has it open is outside the contract.
#ifndef SLUICE_COMMON_RECORD_SHARD_H_
#define SLUICE_COMMON_RECORD_SHARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/record/record.h"
#include "common/record/schema.h"

namespace sluice::record {

inline constexpr char kShardMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'U', 'R'};
inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr size_t kFooterSize = 48;

// Where one record lies in its shard, and its checksum. Laid out as in the
// file.
struct IndexEntry {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// Writes one shard. Not thread-safe. Finish() must be called; a writer
// destroyed without it leaves a file without footer, which readers reject.
class ShardWriter {
 public:
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(const std::string& path,
                                                             const Schema& schema);
  ~ShardWriter();

  // Appends one record. InvalidArgument if it does not match the schema.
  absl::Status Add(const std::vector<Tensor>& values);
  // Appends an already encoded record (must decode under the schema).
  absl::Status AddEncoded(std::string_view encoded);
  // Writes index and footer, fsyncs and closes.
  absl::Status Finish();

  uint64_t record_count() const { return index_.size(); }
  // Bytes written so far plus what the index and footer will take.
  uint64_t projected_size() const;
  uint64_t index_checksum() const { return index_checksum_; }
  const std::string& path() const { return path_; }

 private:
  ShardWriter(std::string path, int fd, Schema schema, uint64_t data_offset);
  absl::Status WriteAll(std::string_view bytes);

  const std::string path_;
  int fd_;
  const Schema schema_;
  const std::vector<int> indexed_columns_;
  uint64_t offset_;
  std::vector<IndexEntry> index_;
  std::vector<int64_t> keys_;
  uint64_t index_checksum_ = 0;
  bool finished_ = false;
};

// Reads one shard. Open() verifies header, footer and index; each Read()
// verifies its record. Immutable after Open: thread-safe.
class ShardReader {
 public:
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(const std::string& path);
  ~ShardReader();

  uint64_t record_count() const { return index_.size(); }
  const Schema& schema() const { return schema_; }
  const std::vector<IndexEntry>& index() const { return index_; }
  const std::vector<std::string>& indexed_columns() const { return indexed_columns_; }
  // The value of indexed column `k` (position in indexed_columns()) for record
  // `i`: the int64 value of an integer column, or the bits of a double for a
  // float column.
  int64_t key(uint64_t i, size_t k) const { return keys_[i * indexed_columns_.size() + k]; }
  uint64_t index_checksum() const { return index_checksum_; }
  uint64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

  // The encoded bytes of record `i`, checksum verified, without a copy: the
  // view points into the file's memory map and is valid while this reader
  // lives. OutOfRange if i >= record_count().
  absl::StatusOr<std::string_view> ReadView(uint64_t i) const;
  // As ReadView, copied.
  absl::StatusOr<std::string> ReadEncoded(uint64_t i) const;
  // Record `i` decoded into columns, copied.
  absl::StatusOr<Record> Read(uint64_t i) const;

 private:
  ShardReader(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status Load();
  absl::Status Corrupt(const std::string& what) const;

  const std::string path_;
  const int fd_;
  const char* map_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t index_checksum_ = 0;
  Schema schema_;
  std::vector<std::string> indexed_columns_;
  std::vector<IndexEntry> index_;
  std::vector<int64_t> keys_;
};

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_SHARD_H_
