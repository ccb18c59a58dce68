// Small Unirecord image datasets for pipeline tests: JPEGs made with
// cv::imencode, some of them deliberately corrupt.
#ifndef SLUICE_TESTS_DATA_WORKER_PIPELINE_TEST_DATA_H_
#define SLUICE_TESTS_DATA_WORKER_PIPELINE_TEST_DATA_H_

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/record/dataset.h"
#include "gtest/gtest.h"
#include "opencv2/core.hpp"
#include "opencv2/imgcodecs.hpp"

namespace sluice::data_worker::pipeline::testing {

inline std::string Jpeg(int i, int h, int w) {
  cv::Mat img(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      img.at<cv::Vec3b>(y, x) =
          cv::Vec3b((x * 7 + i * 13) & 255, (y * 5 + i * 3) & 255, ((x ^ y) + i * 29) & 255);
    }
  }
  std::vector<uint8_t> buf;
  cv::imencode(".jpg", img, buf, {cv::IMWRITE_JPEG_QUALITY, 85});
  return std::string(buf.begin(), buf.end());
}

// Writes `n` records (image, label = i % classes, key) to `dir`; images vary in
// size (40-72 px per side) unless `fixed` > 0. Records in `corrupt` hold a
// truncated, garbled JPEG.
inline void MakeDataset(const std::string& dir, int n, int classes = 4,
                        const std::set<int>& corrupt = {}, int fixed = 0,
                        uint64_t shard_size = 1 << 20) {
  auto w = record::DatasetWriter::Create(dir, record::ImageClassificationSchema(), {shard_size});
  ASSERT_TRUE(w.ok()) << w.status();
  for (int i = 0; i < n; ++i) {
    const int h = fixed > 0 ? fixed : 40 + (i * 7) % 33;
    const int wd = fixed > 0 ? fixed : 40 + (i * 11) % 33;
    std::string img = Jpeg(i, h, wd);
    if (corrupt.count(i)) img = std::string("\xFF\xD8\xFF\xE0", 4) + std::string(40, 'x');
    ASSERT_TRUE((*w)->Add({record::Tensor::Bytes(img), record::Tensor::Int64(i % classes),
                           record::Tensor::Bytes(absl::StrCat("img_", i, ".jpg"))})
                    .ok());
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

}  // namespace sluice::data_worker::pipeline::testing

#endif  // SLUICE_TESTS_DATA_WORKER_PIPELINE_TEST_DATA_H_
