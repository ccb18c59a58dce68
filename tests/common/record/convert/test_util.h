// Helpers shared by the converter tests: temporary folders, fake images,
// reading a dataset back.
#ifndef SLUICE_TESTS_COMMON_RECORD_CONVERT_TEST_UTIL_H_
#define SLUICE_TESTS_COMMON_RECORD_CONVERT_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/random.h"
#include "common/record/convert/convert.h"
#include "common/record/dataset.h"
#include "gtest/gtest.h"

namespace sluice::record::convert_test {

// A fresh folder under the test's temporary directory, removed with its
// contents on destruction.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string pattern = ::testing::TempDir() + "/sluice_convert_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// Writes `data` to `path`, creating parent folders.
inline void WriteFile(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `size` bytes starting with a JPEG (or PNG) signature followed by seeded
// random bytes: enough for the converters, which check signatures but do not
// decode.
inline std::string FakeImage(uint64_t seed, size_t size, bool png = false) {
  std::string bytes =
      png ? std::string("\x89PNG\r\n\x1a\n", 8) : std::string("\xff\xd8\xff\xe0", 4);
  Rng rng(seed);
  while (bytes.size() < size) bytes.push_back(static_cast<char>(rng.NextU64() & 0xff));
  return bytes;
}

// One record of an image-classification dataset.
struct Item {
  std::string image;
  int64_t label = 0;
  std::string key;
  bool operator==(const Item&) const = default;
};

inline void PrintTo(const Item& item, std::ostream* os) {
  *os << "{key=" << item.key << ", label=" << item.label << ", image=" << item.image.size()
      << " bytes}";
}

// Every record of the dataset at `dir`, in global order.
// Converts `input` in `format` into a new dataset at `output`.
inline absl::StatusOr<Manifest> ConvertAs(InputFormat format, const std::string& input,
                                          const std::string& output, int threads = 1,
                                          uint64_t shard_size = kDefaultShardSizeBytes) {
  ConvertOptions options;
  options.input = input;
  options.output = output;
  options.format = format;
  options.threads = threads;
  options.shard_size_bytes = shard_size;
  return Convert(options);
}

inline absl::StatusOr<std::vector<Item>> ReadDataset(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Dataset>> dataset = Dataset::Open(dir);
  if (!dataset.ok()) return dataset.status();
  const Schema& schema = (*dataset)->schema();
  const int image = schema.ColumnIndex("image");
  const int label = schema.ColumnIndex("label");
  const int key = schema.ColumnIndex("key");
  std::vector<Item> items;
  for (uint64_t i = 0; i < (*dataset)->size(); ++i) {
    absl::StatusOr<Record> record = (*dataset)->Read(i);
    if (!record.ok()) return record.status();
    items.push_back(Item{std::string(record->columns[image].data), record->columns[label].AsInt64(),
                         std::string(record->columns[key].data)});
  }
  return items;
}

}  // namespace sluice::record::convert_test

#endif  // SLUICE_TESTS_COMMON_RECORD_CONVERT_TEST_UTIL_H_
