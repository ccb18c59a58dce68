// TFRecord files: the framing TensorFlow's tf.io.TFRecordWriter writes. A file
// holds records back to back, each (integers little-endian; CRCs are masked
// CRC-32C, see crc32c.h):
//
//   u64 length | u32 crc(length bytes) | data | u32 crc(data)
//
// e.g. the record "abc" is 03 00 00 00 00 00 00 00 | crc | 61 62 63 | crc.
// A file written with TFRecordOptions(compression_type="GZIP") is this byte
// stream gzipped; TfRecordReader detects it by the gzip magic (1f 8b) and reads
// it through zlib.
#ifndef SLUICE_COMMON_RECORD_CONVERT_TFRECORD_H_
#define SLUICE_COMMON_RECORD_CONVERT_TFRECORD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::record {

// Reads the records of one TFRecord file (plain or gzip) in order, verifying
// both CRCs of each. Not thread-safe; use one reader per thread.
class TfRecordReader {
 public:
  // NotFound if `path` does not exist; other open errors map from errno.
  static absl::StatusOr<std::unique_ptr<TfRecordReader>> Open(const std::string& path);
  ~TfRecordReader();

  // Replaces *record with the next record's data. Returns false at a clean end
  // of file. DataLoss for a CRC mismatch, a truncated record or a corrupt gzip
  // stream; the message names the file, the record number (0-based) and the
  // byte offset of the record (in the uncompressed stream for gzip files).
  // After an error the reader is unusable.
  absl::StatusOr<bool> Next(std::string* record);

  // Records returned so far.
  uint64_t records_read() const { return records_; }
  bool gzipped() const { return gzipped_; }
  const std::string& path() const { return path_; }

  class Source;  // A byte stream: a plain file or a gzip stream.

 private:
  TfRecordReader(std::string path, std::unique_ptr<Source> source, bool gzipped);
  absl::Status Corrupt(const std::string& what) const;
  // Reads exactly `n` bytes or fails as truncated, naming `what` was being
  // read.
  absl::Status ReadExactly(char* out, size_t n, const std::string& what);

  const std::string path_;
  const std::unique_ptr<Source> source_;
  const bool gzipped_;
  uint64_t records_ = 0;
  uint64_t record_offset_ = 0;  // where the current record starts
  uint64_t offset_ = 0;         // bytes consumed so far
};

// The framed bytes of one record (length, both CRCs, data): append them to
// write a TFRecord file.
std::string EncodeTfRecord(std::string_view data);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_CONVERT_TFRECORD_H_
