#include "common/record/convert/tfrecord.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/record/convert/converters.h"
#include "common/record/convert/crc32c.h"
#include "proto/tf_example.pb.h"

namespace sluice::record {

class TfRecordReader::Source {
 public:
  virtual ~Source() = default;
  // Reads up to `n` bytes; fewer only at end of stream.
  virtual absl::StatusOr<size_t> Read(char* out, size_t n) = 0;
};

namespace {

constexpr size_t kHeaderSize = 12;  // u64 length + u32 length CRC
// Record data is read in chunks of this size, so a huge length field cannot
// allocate more than the file holds plus one chunk.
constexpr size_t kReadChunk = 64 << 20;
constexpr unsigned char kGzipMagic[2] = {0x1f, 0x8b};

uint64_t DecodeU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint32_t DecodeU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

class PlainSource : public TfRecordReader::Source {
 public:
  explicit PlainSource(std::FILE* file) : file_(file) {}
  ~PlainSource() override { std::fclose(file_); }

  absl::StatusOr<size_t> Read(char* out, size_t n) override {
    const size_t got = std::fread(out, 1, n, file_);
    if (got < n && std::ferror(file_)) return absl::ErrnoToStatus(errno, "read failed");
    return got;
  }

 private:
  std::FILE* const file_;
};

class GzipSource : public TfRecordReader::Source {
 public:
  explicit GzipSource(gzFile file) : file_(file) {}
  ~GzipSource() override { gzclose(file_); }

  absl::StatusOr<size_t> Read(char* out, size_t n) override {
    size_t total = 0;
    while (total < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30));
      const int got = gzread(file_, out + total, want);
      if (got < 0) {
        int errnum = 0;
        const char* message = gzerror(file_, &errnum);
        return absl::DataLossError(absl::StrCat("corrupt gzip stream: ", message));
      }
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    return total;
  }

 private:
  const gzFile file_;
};

}  // namespace

TfRecordReader::TfRecordReader(std::string path, std::unique_ptr<Source> source, bool gzipped)
    : path_(std::move(path)), source_(std::move(source)), gzipped_(gzipped) {}

TfRecordReader::~TfRecordReader() = default;

absl::StatusOr<std::unique_ptr<TfRecordReader>> TfRecordReader::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  // A plain file whose first record length happens to start with 1f 8b is told
  // apart from a gzip file by its length CRC, which only a plain file satisfies
  // (but for a 2^-32 coincidence).
  char head[kHeaderSize];
  const size_t got = std::fread(head, 1, kHeaderSize, file);
  const bool plain_header =
      got == kHeaderSize && MaskCrc32c(Crc32c(std::string_view(head, 8))) == DecodeU32(head + 8);
  const bool gzipped = !plain_header && got >= 2 && std::memcmp(head, kGzipMagic, 2) == 0;
  if (!gzipped) {
    std::rewind(file);
    return std::unique_ptr<TfRecordReader>(
        new TfRecordReader(path, std::make_unique<PlainSource>(file), /*gzipped=*/false));
  }
  std::fclose(file);
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  gzbuffer(gz, 1 << 20);
  return std::unique_ptr<TfRecordReader>(
      new TfRecordReader(path, std::make_unique<GzipSource>(gz), /*gzipped=*/true));
}

absl::Status TfRecordReader::Corrupt(const std::string& what) const {
  return absl::DataLossError(absl::StrCat("TFRecord file ", path_, ": record ", records_,
                                          " at byte offset ", record_offset_,
                                          gzipped_ ? " (uncompressed)" : "", ": ", what));
}

absl::Status TfRecordReader::ReadExactly(char* out, size_t n, const std::string& what) {
  absl::StatusOr<size_t> got = source_->Read(out, n);
  if (!got.ok()) return Corrupt(std::string(got.status().message()));
  offset_ += *got;
  if (*got < n) {
    return Corrupt(absl::StrCat("file truncated in the ", what));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TfRecordReader::Next(std::string* record) {
  record_offset_ = offset_;
  char header[kHeaderSize];
  absl::StatusOr<size_t> got = source_->Read(header, kHeaderSize);
  if (!got.ok()) return Corrupt(std::string(got.status().message()));
  offset_ += *got;
  if (*got == 0) return false;
  if (*got < kHeaderSize) {
    return Corrupt(absl::StrCat("file truncated: expected a ", kHeaderSize,
                                "-byte record header, found ", *got, " bytes"));
  }
  if (MaskCrc32c(Crc32c(std::string_view(header, 8))) != DecodeU32(header + 8)) {
    return Corrupt(records_ == 0 ? "length checksum mismatch: not a TFRecord file, or "
                                   "corrupt (GZIP-compressed files are read, ZLIB ones "
                                   "are not)"
                                 : "length checksum mismatch (corrupt file)");
  }
  const uint64_t length = DecodeU64(header);
  record->clear();
  uint64_t remaining = length;
  while (remaining > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(remaining, kReadChunk));
    const size_t start = record->size();
    record->resize(start + chunk);
    RETURN_IF_ERROR(ReadExactly(record->data() + start, chunk,
                                absl::StrCat("record data (length ", length, ")")));
    remaining -= chunk;
  }
  char footer[4];
  RETURN_IF_ERROR(ReadExactly(footer, sizeof footer, "data checksum"));
  if (MaskCrc32c(Crc32c(*record)) != DecodeU32(footer)) {
    return Corrupt("data checksum mismatch (corrupt file)");
  }
  ++records_;
  return true;
}

std::string EncodeTfRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  AppendU64(&out, data.size());
  AppendU32(&out, MaskCrc32c(Crc32c(out)));
  out.append(data);
  AppendU32(&out, MaskCrc32c(Crc32c(data)));
  return out;
}

// ---- Conversion of tf.train.Example records (see convert.h) ----

namespace {

constexpr char kImageFeature[] = "image/encoded";
constexpr char kLabelFeature[] = "image/class/label";

const char* KindName(tf::Feature::KindCase kind) {
  switch (kind) {
    case tf::Feature::kBytesList:
      return "bytes_list";
    case tf::Feature::kFloatList:
      return "float_list";
    case tf::Feature::kInt64List:
      return "int64_list";
    case tf::Feature::KIND_NOT_SET:
      break;
  }
  return "empty";
}

// The feature `name` of `example`, checked to be of `kind` with exactly one
// value.
absl::StatusOr<tf::Feature*> SingleValueFeature(tf::Example& example, const char* name,
                                                tf::Feature::KindCase kind,
                                                const std::string& where) {
  auto& features = *example.mutable_features()->mutable_feature();
  auto it = features.find(name);
  if (it == features.end() || it->second.kind_case() == tf::Feature::KIND_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": feature \"", name, "\" is missing"));
  }
  tf::Feature& feature = it->second;
  if (feature.kind_case() != kind) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": feature \"", name, "\" is a ",
                                                   KindName(feature.kind_case()), ", expected ",
                                                   KindName(kind)));
  }
  const int values = kind == tf::Feature::kBytesList ? feature.bytes_list().value_size()
                                                     : feature.int64_list().value_size();
  if (values != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": feature \"", name, "\" holds ", values, " values, expected 1"));
  }
  return &feature;
}

absl::Status ReadTfRecordFile(const std::string& path, const SampleSink& sink) {
  const std::string name = std::filesystem::path(path).filename().string();
  ASSIGN_OR_RETURN(std::unique_ptr<TfRecordReader> reader, TfRecordReader::Open(path));
  std::string data;
  tf::Example example;
  for (;;) {
    ASSIGN_OR_RETURN(const bool more, reader->Next(&data));
    if (!more) return absl::OkStatus();
    const uint64_t number = reader->records_read() - 1;
    const std::string where = absl::StrCat("TFRecord file ", path, ": record ", number);
    if (!example.ParseFromString(data)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a tf.train.Example"));
    }
    ASSIGN_OR_RETURN(tf::Feature * image,
                     SingleValueFeature(example, kImageFeature, tf::Feature::kBytesList, where));
    Sample sample;
    sample.image = std::move(*image->mutable_bytes_list()->mutable_value(0));
    if (!HasImageSignature(sample.image)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": feature \"", kImageFeature, "\" is not a JPEG or PNG image"));
    }
    ASSIGN_OR_RETURN(tf::Feature * label,
                     SingleValueFeature(example, kLabelFeature, tf::Feature::kInt64List, where));
    sample.label = label->int64_list().value(0);
    sample.key = absl::StrCat(name, ":", number);
    RETURN_IF_ERROR(sink(std::move(sample)));
  }
}

}  // namespace

absl::StatusOr<ConversionPlan> PlanTfRecord(const std::string& input) {
  ASSIGN_OR_RETURN(std::vector<std::string> files,
                   ListInputFiles(input, [](std::string_view) { return true; }));
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input folder ", input, " holds no TFRecord files"));
  }
  ConversionPlan plan;
  for (std::string& file : files) {
    plan.sources.push_back(
        [file = std::move(file)](const SampleSink& sink) { return ReadTfRecordFile(file, sink); });
  }
  return plan;
}

}  // namespace sluice::record
