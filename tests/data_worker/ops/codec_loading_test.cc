// OpenCV's imgcodecs is loaded only by the first image that needs it: this binary links
// sluice_ops and sluice_pipeline but not the library, decodes JPEGs (whole and fused region
// decodes) and a WebP without it ever being mapped, then a PNG and a BMP, which map it and decode
// to the exact pixels encoded. One test: the process's state is the subject, so the order matters.
#include <webp/encode.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/image/imgcodecs.h"
#include "data_worker/ops/decode.h"
#include "gtest/gtest.h"
#include "opencv2/core.hpp"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"
#include "tests/data_worker/ops/test_images.h"

namespace sluice::data_worker {
namespace {

// /proc/self/maps names the file the soname links to (libopencv_imgcodecs.so.4.6.0).
bool ImgcodecsIsMapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("/libopencv_imgcodecs.so") != std::string::npos;
}

std::string EncodeWebpLossless(const cv::Mat& rgb) {
  uint8_t* out = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.ptr<uint8_t>(), rgb.cols, rgb.rows,
                                            static_cast<int>(rgb.step), &out);
  std::string webp(reinterpret_cast<char*>(out), size);
  WebPFree(out);
  return webp;
}

// The RGB pixels of `t` (H×W×3 uint8) as a Mat sharing them.
cv::Mat MatOf(const Tensor& t) {
  return cv::Mat(static_cast<int>(t.dim(0)), static_cast<int>(t.dim(1)), CV_8UC3,
                 const_cast<uint8_t*>(t.data()));
}

bool SamePixels(const cv::Mat& a, const cv::Mat& b) {
  return a.size() == b.size() && a.type() == b.type() && cv::norm(a, b, cv::NORM_INF) == 0;
}

TEST(CodecLoading, JpegAndWebpNeverMapImgcodecsAndThePngThatNeedsItLoadsIt) {
  EXPECT_EQ(image::ImgcodecsLibraryName().substr(0, 23), "libopencv_imgcodecs.so.");
  ASSERT_FALSE(ImgcodecsIsMapped()) << "a sluice library links imgcodecs";

  const cv::Mat rgb = testing::MakeRgb(48, 64);
  for (const auto& [h, v] : std::vector<std::pair<int, int>>{{2, 2}, {1, 1}}) {
    const std::string jpeg = testing::EncodeJpegSampling(rgb, h, v);
    absl::StatusOr<Tensor> full = DecodeImage(jpeg);
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_EQ(full->dim(0), 48);
    EXPECT_EQ(full->dim(1), 64);
    absl::StatusOr<Tensor> region =
        DecodeImageRegion(jpeg, [](int, int) -> absl::StatusOr<DecodePlan> {
          DecodePlan plan;
          plan.box = CropBox{.top = 8, .left = 4, .height = 32, .width = 40};
          plan.out_height = 16;
          plan.out_width = 20;
          plan.allow_dct_scaling = true;
          return plan;
        });
    ASSERT_TRUE(region.ok()) << region.status();
    EXPECT_EQ(region->dim(0), 16);
    EXPECT_EQ(region->dim(1), 20);
  }
  absl::StatusOr<Tensor> webp = DecodeImage(EncodeWebpLossless(rgb));
  ASSERT_TRUE(webp.ok()) << webp.status();
  EXPECT_TRUE(SamePixels(MatOf(*webp), rgb));
  EXPECT_FALSE(ImgcodecsIsMapped()) << "decoding JPEG or WebP loaded imgcodecs";

  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  for (const std::string ext : {".png", ".bmp"}) {
    SCOPED_TRACE(ext);
    std::vector<uint8_t> encoded;
    ASSERT_TRUE(image::Imencode(ext, bgr, {}, &encoded).ok());
    absl::StatusOr<Tensor> out = DecodeImage(std::string(encoded.begin(), encoded.end()));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(SamePixels(MatOf(*out), rgb));
  }
  EXPECT_TRUE(ImgcodecsIsMapped());
  EXPECT_TRUE(image::LoadImgcodecs().ok());
}

TEST(CodecLoading, AnEncodingOpenCvRefusesIsInvalidArgumentNamingTheExtension) {
  std::vector<uint8_t> out;
  const absl::Status status =
      image::Imencode(".nosuchformat", cv::Mat(4, 4, CV_8UC3, cv::Scalar(1, 2, 3)), {}, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(".nosuchformat"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace sluice::data_worker
