#include "common/record/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/record/checksum.h"
#include "common/record/json.h"

namespace sluice::record {
namespace {

constexpr size_t kHeaderPrefixSize = 16;  // magic, version, payload length
constexpr size_t kIndexEntryFixedSize = 24;
static_assert(sizeof(IndexEntry) == kIndexEntryFixedSize,
              "IndexEntry is copied from the file as is");
constexpr uint32_t kMaxHeaderPayload = 16 << 20;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  const int err = errno;
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardWriter

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(const std::string& path,
                                                                 const Schema& schema) {
  RETURN_IF_ERROR(schema.Validate());
  const nlohmann::json payload_json = {
      {"schema", nlohmann::json::parse(schema.ToJson())},
      {"created_by", "sluice"},
      {"created_at", absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone())},
  };
  const std::string payload = payload_json.dump();
  std::string header(kShardMagic, sizeof kShardMagic);
  Put<uint32_t>(header, kShardFormatVersion);
  Put<uint32_t>(header, static_cast<uint32_t>(payload.size()));
  header += payload;
  Put<uint64_t>(header, Checksum(header));

  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create shard", path);
  auto writer = std::unique_ptr<ShardWriter>(new ShardWriter(path, fd, schema, 0));
  RETURN_IF_ERROR(writer->WriteAll(header));
  return writer;
}

ShardWriter::ShardWriter(std::string path, int fd, Schema schema, uint64_t data_offset)
    : path_(std::move(path)),
      fd_(fd),
      schema_(std::move(schema)),
      indexed_columns_([this] {
        std::vector<int> columns;
        for (size_t i = 0; i < schema_.columns.size(); ++i) {
          if (schema_.columns[i].indexed) columns.push_back(static_cast<int>(i));
        }
        return columns;
      }()),
      offset_(data_offset) {}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) close(fd_);
}

absl::Status ShardWriter::WriteAll(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot write shard", path_);
    bytes.remove_prefix(static_cast<size_t>(n));
    offset_ += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::Add(const std::vector<Tensor>& values) {
  ASSIGN_OR_RETURN(std::string encoded, EncodeRecord(schema_, values));
  return AddEncoded(encoded);
}

absl::Status ShardWriter::AddEncoded(std::string_view encoded) {
  if (finished_) return absl::FailedPreconditionError("shard " + path_ + " is already finished");
  ASSIGN_OR_RETURN(std::vector<TensorView> views, DecodeRecord(schema_, encoded));
  for (int column : indexed_columns_) {
    const ColumnSpec& spec = schema_.columns[column];
    const std::string_view data = views[column].data;
    int64_t key = 0;
    switch (spec.dtype) {
      case DType::kUint8:
        key = static_cast<uint8_t>(data[0]);
        break;
      case DType::kInt32:
        key = Get<int32_t>(data.data());
        break;
      case DType::kInt64:
        key = Get<int64_t>(data.data());
        break;
      case DType::kFloat32: {
        const double d = Get<float>(data.data());
        std::memcpy(&key, &d, sizeof d);
        break;
      }
      default:
        break;
    }
    keys_.push_back(key);
  }
  index_.push_back({offset_, encoded.size(), Checksum(encoded)});
  return WriteAll(encoded);
}

uint64_t ShardWriter::projected_size() const {
  return offset_ + index_.size() * (kIndexEntryFixedSize + 8 * indexed_columns_.size()) +
         kFooterSize;
}

absl::Status ShardWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("shard " + path_ + " is already finished");
  finished_ = true;
  std::string index;
  index.reserve(index_.size() * (kIndexEntryFixedSize + 8 * indexed_columns_.size()));
  const size_t k = indexed_columns_.size();
  for (size_t i = 0; i < index_.size(); ++i) {
    Put<uint64_t>(index, index_[i].offset);
    Put<uint64_t>(index, index_[i].size);
    Put<uint64_t>(index, index_[i].checksum);
    for (size_t j = 0; j < k; ++j) Put<int64_t>(index, keys_[i * k + j]);
  }
  index_checksum_ = Checksum(index);
  std::string footer;
  Put<uint64_t>(footer, offset_);
  Put<uint64_t>(footer, index.size());
  Put<uint64_t>(footer, index_.size());
  Put<uint64_t>(footer, index_checksum_);
  Put<uint64_t>(footer, Checksum(footer));
  footer.append(kShardMagic, sizeof kShardMagic);
  RETURN_IF_ERROR(WriteAll(index));
  RETURN_IF_ERROR(WriteAll(footer));
  if (fsync(fd_) != 0) return ErrnoError("cannot sync shard", path_);
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) return ErrnoError("cannot close shard", path_);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ShardReader

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open shard", path);
  auto reader = std::unique_ptr<ShardReader>(new ShardReader(path, fd));
  RETURN_IF_ERROR(reader->Load());
  return reader;
}

ShardReader::~ShardReader() {
  if (map_ != nullptr) munmap(const_cast<char*>(map_), file_size_);
  close(fd_);
}

absl::Status ShardReader::Corrupt(const std::string& what) const {
  return absl::DataLossError(absl::StrCat("shard '", path_, "': ", what));
}

absl::Status ShardReader::Load() {
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoError("cannot stat shard", path_);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError("'" + path_ + "' is not a file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ < sizeof kShardMagic) {
    return Corrupt(absl::StrCat("file is truncated inside the header (", file_size_, " bytes)"));
  }
  void* map = mmap(nullptr, file_size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) return ErrnoError("cannot map shard", path_);
  map_ = static_cast<const char*>(map);

  // Header.
  if (std::memcmp(map_, kShardMagic, sizeof kShardMagic) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path_, "' is not a Unirecord shard (wrong magic)"));
  }
  if (file_size_ < kHeaderPrefixSize) {
    return Corrupt(absl::StrCat("file is truncated inside the header (", file_size_, " bytes)"));
  }
  const uint32_t version = Get<uint32_t>(map_ + 8);
  const uint32_t payload_size = Get<uint32_t>(map_ + 12);
  if (payload_size > kMaxHeaderPayload) {
    return Corrupt(absl::StrCat("header claims a ", payload_size, "-byte schema"));
  }
  data_offset_ = kHeaderPrefixSize + payload_size + 8;
  if (file_size_ < data_offset_) {
    return Corrupt(absl::StrCat("file is truncated inside the header (", file_size_,
                                " bytes, header needs ", data_offset_, ")"));
  }
  if (Checksum(std::string_view(map_, data_offset_ - 8)) !=
      Get<uint64_t>(map_ + data_offset_ - 8)) {
    return Corrupt("header checksum mismatch");
  }
  if (version != kShardFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("shard '", path_, "' has format version ",
                                                      version, "; this build reads version ",
                                                      kShardFormatVersion));
  }
  const auto payload = ParseJson(std::string_view(map_ + kHeaderPrefixSize, payload_size));
  if (payload.is_discarded() || !payload.is_object() || !payload.contains("schema")) {
    return Corrupt("header holds no schema");
  }
  auto schema = Schema::FromJson(payload["schema"].dump());
  if (!schema.ok())
    return Corrupt("bad schema in header: " + std::string(schema.status().message()));
  schema_ = *std::move(schema);
  indexed_columns_ = schema_.IndexedColumns();

  // Footer.
  if (file_size_ < data_offset_ + kFooterSize) {
    return Corrupt(
        absl::StrCat("file is truncated: no room for the footer (", file_size_, " bytes)"));
  }
  const char* footer = map_ + file_size_ - kFooterSize;
  if (std::memcmp(footer + kFooterSize - 8, kShardMagic, 8) != 0) {
    return Corrupt("footer magic missing: the file is truncated or was not finished");
  }
  if (Checksum(std::string_view(footer, 32)) != Get<uint64_t>(footer + 32)) {
    return Corrupt("footer checksum mismatch");
  }
  const uint64_t index_offset = Get<uint64_t>(footer);
  const uint64_t index_size = Get<uint64_t>(footer + 8);
  const uint64_t count = Get<uint64_t>(footer + 16);
  index_checksum_ = Get<uint64_t>(footer + 24);
  const uint64_t entry_size = kIndexEntryFixedSize + 8 * indexed_columns_.size();
  if (index_offset < data_offset_ || count > file_size_ / entry_size ||
      index_size != count * entry_size || index_offset + index_size + kFooterSize != file_size_) {
    return Corrupt(absl::StrCat("footer is inconsistent (index at ", index_offset, ", ", index_size,
                                " bytes, ", count, " records, file ", file_size_, " bytes)"));
  }

  // Index.
  const char* p = map_ + index_offset;
  if (Checksum(std::string_view(p, index_size)) != index_checksum_) {
    return Corrupt("index checksum mismatch");
  }
  const size_t k = indexed_columns_.size();
  index_.resize(count);
  keys_.resize(count * k);
  uint64_t expected_offset = data_offset_;
  for (uint64_t i = 0; i < count; ++i, p += entry_size) {
    IndexEntry& e = index_[i];
    std::memcpy(&e, p, kIndexEntryFixedSize);
    if (k > 0) std::memcpy(&keys_[i * k], p + kIndexEntryFixedSize, 8 * k);
    if (e.offset != expected_offset || e.size == 0 || e.size > index_offset - e.offset) {
      return Corrupt(absl::StrCat("index entry of record ", i, " is out of place (offset ",
                                  e.offset, ", size ", e.size, ")"));
    }
    expected_offset += e.size;
  }
  if (expected_offset != index_offset) {
    return Corrupt(absl::StrCat("records end at ", expected_offset, " but the index starts at ",
                                index_offset));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string_view> ShardReader::ReadView(uint64_t i) const {
  if (i >= index_.size()) {
    return absl::OutOfRangeError(absl::StrCat("record ", i, " is past the end of shard '", path_,
                                              "' (", index_.size(), " records)"));
  }
  const IndexEntry& e = index_[i];
  const std::string_view view(map_ + e.offset, e.size);
  if (Checksum(view) != e.checksum)
    return Corrupt(absl::StrCat("record ", i, " checksum mismatch"));
  return view;
}

absl::StatusOr<std::string> ShardReader::ReadEncoded(uint64_t i) const {
  ASSIGN_OR_RETURN(std::string_view view, ReadView(i));
  return std::string(view);
}

absl::StatusOr<Record> ShardReader::Read(uint64_t i) const {
  Record record;
  ASSIGN_OR_RETURN(std::string buffer, ReadEncoded(i));
  record.buffer = std::make_unique<const std::string>(std::move(buffer));
  auto columns = DecodeRecord(schema_, *record.buffer);
  if (!columns.ok()) {
    return Corrupt(absl::StrCat("record ", i, ": ", columns.status().message()));
  }
  record.columns = *std::move(columns);
  return record;
}

}  // namespace sluice::record
