// libFuzzer target for ShardReader: arbitrary bytes are written to a file,
// opened with ShardReader::Open and, if that succeeds, every record is read and
// decoded. Nothing may crash, and every record that reads OK must honour the
// schema (the contract callers rely on when they call TensorView::AsInt64 or
// walk a tensor's elements).
//
// Input: one mode byte, then the file. If bit 0 of the mode byte is set, the
// fuzzer first recomputes every checksum the format holds (header, record,
// index, footer) so that mutations get past checksum verification and reach the
// index and record decoding; with it clear the bytes are used as they are,
// which exercises the checksum rejections. Seeds: tests/fuzz/run.sh writes
// valid shards of both kinds with fuzz_corpus_gen.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "common/record/checksum.h"
#include "common/record/record.h"
#include "common/record/schema.h"
#include "common/record/shard.h"

namespace {

using sluice::record::Checksum;

uint64_t Get64(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}

void Put64(std::string& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

uint64_t Sum(const std::string& b, uint64_t begin, uint64_t size) {
  return Checksum(std::string_view(b.data() + begin, size));
}

// Rewrites the checksums of `b` where the structure they cover can be located
// (see shard.h).
void RepairChecksums(std::string& b) {
  const size_t size = b.size();
  if (size < 16) return;
  uint32_t payload;
  std::memcpy(&payload, b.data() + 12, 4);
  const uint64_t header_end = 16 + uint64_t{payload};
  if (header_end + 8 <= size) Put64(b, header_end, Sum(b, 0, header_end));
  if (size < sluice::record::kFooterSize) return;
  const size_t footer = size - sluice::record::kFooterSize;
  const uint64_t index_offset = Get64(b, footer);
  const uint64_t index_size = Get64(b, footer + 8);
  const uint64_t count = Get64(b, footer + 16);
  if (index_offset <= footer && index_size <= footer - index_offset) {
    if (count > 0 && index_size % count == 0 && index_size / count >= 24) {
      const uint64_t entry = index_size / count;
      for (uint64_t i = 0; i < count; ++i) {
        const size_t e = index_offset + i * entry;
        const uint64_t offset = Get64(b, e);
        const uint64_t length = Get64(b, e + 8);
        if (offset <= size && length <= size - offset) Put64(b, e + 16, Sum(b, offset, length));
      }
    }
    Put64(b, footer + 24, Sum(b, index_offset, index_size));
  }
  Put64(b, footer + 32, Sum(b, footer, 32));
}

[[noreturn]] void Violation(const char* what, uint64_t record, const std::string& column) {
  std::fprintf(stderr, "shard_reader_fuzzer: record %llu column '%s': %s\n",
               static_cast<unsigned long long>(record), column.c_str(), what);
  std::abort();
}

// Checks that a decoded record honours its schema: numeric columns have the
// schema's shape and exactly product(shape) * dtype-size bytes.
void CheckRecord(const sluice::record::Schema& schema, const sluice::record::Record& record,
                 uint64_t i) {
  if (record.columns.size() != schema.columns.size()) Violation("column count", i, "");
  const std::string_view buffer(*record.buffer);
  for (size_t c = 0; c < schema.columns.size(); ++c) {
    const auto& spec = schema.columns[c];
    const auto& view = record.columns[c];
    if (view.data.data() < buffer.data() ||
        view.data.data() + view.data.size() > buffer.data() + buffer.size()) {
      Violation("view outside the record buffer", i, spec.name);
    }
    if (!sluice::record::IsNumeric(spec.dtype)) continue;
    if (view.shape.size() != spec.shape.size())
      Violation("rank differs from the schema", i, spec.name);
    uint64_t elements = 1;
    for (size_t d = 0; d < view.shape.size(); ++d) {
      if (spec.shape[d] != -1 && spec.shape[d] != view.shape[d]) {
        Violation("dimension differs from the schema", i, spec.name);
      }
      if (view.shape[d] < 0) Violation("negative dimension", i, spec.name);
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(view.shape[d]), &elements)) {
        Violation("element count overflows", i, spec.name);
      }
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(elements, sluice::record::DTypeSize(spec.dtype), &bytes) ||
        bytes != view.data.size()) {
      Violation("byte size is not product(shape) * dtype size", i, spec.name);
    }
  }
}

const std::string& ScratchPath() {
  static const std::string path = [] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
    return std::string(dir != nullptr ? dir : "/tmp") + "/sluice-shard-fuzz-" +
           std::to_string(getpid()) + ".urec";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) RepairChecksums(bytes);

  const std::string& path = ScratchPath();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  if (write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) std::abort();
  close(fd);

  auto reader = sluice::record::ShardReader::Open(path);
  unlink(path.c_str());  // the reader keeps its descriptor and map; nothing is
                         // left behind
  if (!reader.ok()) return 0;
  const auto& r = **reader;
  for (uint64_t i = 0; i < r.record_count(); ++i) {
    for (size_t k = 0; k < r.indexed_columns().size(); ++k) (void)r.key(i, k);
    auto record = r.Read(i);
    if (record.ok()) CheckRecord(r.schema(), *record, i);
    auto encoded = r.ReadEncoded(i);
    if (encoded.ok() != record.ok() && record.status().code() != absl::StatusCode::kDataLoss) {
      std::abort();
    }
  }
  if (r.ReadEncoded(r.record_count()).status().code() != absl::StatusCode::kOutOfRange) {
    std::abort();
  }
  return 0;
}
