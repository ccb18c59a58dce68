// Synthetic ImageNet-like training data, for benchmarks and tests that need
// realistic JPEG decode and augmentation costs without downloading a dataset.
//
// GenerateImageFolder writes an ImageFolder tree (the layout torchvision and
// the imagefolder converter read):
//   output/class_000/img_000000.jpg, output/class_001/img_000001.jpg, ...
// Image i goes to class i % classes, so classes differ in size by at most one.
// Numbers are zero-padded (at least 3 and 6 digits) so that name order is
// numeric order. Each image is a JPEG (quality 90, long side 300-600 px, varied
// aspect ratio) of smooth gradients, blurred shapes and multi-scale texture:
// about 30-60 KB on average, like ImageNet's photos. Every byte is a function
// of (seed, image index) alone: identical for any number of threads.
#ifndef SLUICE_TOOLS_DATAGEN_DATAGEN_H_
#define SLUICE_TOOLS_DATAGEN_DATAGEN_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::tools {

struct DatagenOptions {
  std::string output;  // folder to create; must not exist or be empty
  int images = 0;      // total number of images, > 0
  int classes = 10;    // 1..images
  uint64_t seed = 0;
  int threads = 1;
  // Called after each image is written, from worker threads but never
  // concurrently, with `done` increasing. May be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Writes the tree described above. InvalidArgument names the bad flag
// (--output, --images, --classes, --threads); FailedPrecondition if --output is
// a non-empty folder; other codes for file-system errors, naming the file.
absl::Status GenerateImageFolder(const DatagenOptions& options);

// The JPEG bytes of image `index` for `seed` (the file GenerateImageFolder
// writes for it). Internal on OpenCV failure.
absl::StatusOr<std::string> SyntheticJpeg(uint64_t seed, uint64_t index);

}  // namespace sluice::tools

#endif  // SLUICE_TOOLS_DATAGEN_DATAGEN_H_
