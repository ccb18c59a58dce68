// Converters from common training-data layouts to a Unirecord dataset
// (common/record/dataset.h). Every converter writes
// ImageClassificationSchema(): image (the encoded JPEG/PNG bytes, copied
// verbatim), label (int64, indexed) and key (where the sample came from).
//
// kImageFolder: root/<class>/.../<file>.{jpg,jpeg,png}, torchvision's layout.
//   Classes are the sorted immediate subfolders of root; label = position in
//   that order. Files are taken class by class in sorted relative-path order;
//   other extensions are skipped. key = path relative to root, e.g.
//   "n01440764/n01440764_10026.JPEG".
// kTfRecord: a TFRecord file (plain or gzip, see tfrecord.h) or a folder of
//   them (every regular file, sorted by name). Each record is a
//   tf.train.Example with features "image/encoded" (bytes) and
//   "image/class/label" (int64). key = "<file name>:<record number>", e.g.
//   "train-00000-of-01024:17".
// kWebDataset: a tar (.tar or .tar.gz, any tar dialect) or a folder of them
//   (regular files ending .tar, .tar.gz or .tgz, sorted by name). Members are
//   grouped into samples by WebDataset's key: the member path up to the first
//   '.' of its last component ("a/b/000017.seg.png" has key "a/b/000017" and
//   extension "seg.png"). A sample needs one image member (extension jpg, jpeg
//   or png) and a "cls" member holding an ASCII integer; other members are
//   ignored. key = the WebDataset key.
//
// Files, folders and tar members whose names start with '.' (e.g.
// ".ipynb_checkpoints", macOS "._x.jpg") are skipped. Every image must start
// with a JPEG or PNG signature, whatever its name says. Records are written in
// input order (file by file, record by record) whatever the thread count.
#ifndef SLUICE_COMMON_RECORD_CONVERT_CONVERT_H_
#define SLUICE_COMMON_RECORD_CONVERT_CONVERT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/record/dataset.h"

namespace sluice::record {

enum class InputFormat { kImageFolder, kTfRecord, kWebDataset };

// "imagefolder", "tfrecord" or "wds". InvalidArgument names the bad value and
// the choices.
absl::StatusOr<InputFormat> ParseInputFormat(std::string_view name);

struct ConvertOptions {
  // A folder (imagefolder), a file or folder of files (tfrecord), a tar or
  // folder of tars (wds).
  std::string input;
  // The dataset folder to create; it must not hold a manifest yet.
  std::string output;
  InputFormat format = InputFormat::kImageFolder;
  uint64_t shard_size_bytes = kDefaultShardSizeBytes;
  // Threads reading and validating input files in parallel (the calling thread
  // writes).
  int threads = 1;
  // Called on the calling thread after each record is written; `total` is 0
  // when unknown before the end (tfrecord, wds). May be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Converts `options.input` into a dataset at `options.output` and returns its
// manifest. Errors: NotFound for a missing input; InvalidArgument for bad
// options (naming the flag), an input without any sample, or a bad sample
// (naming the file, record or member); DataLoss for a corrupt input file (CRC
// mismatch, truncation; naming file, record and offset); FailedPrecondition if
// `output` already holds a dataset. On error an output folder that Convert
// created is removed again.
absl::StatusOr<Manifest> Convert(const ConvertOptions& options);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_CONVERT_CONVERT_H_
