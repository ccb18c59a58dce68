// Test images for the op tests: smooth "photo-like" content encoded in the
// JPEG/PNG variants decoders trip over (subsampling, progressive, grayscale,
// CMYK, restart markers, EXIF, tiny).
#ifndef SLUICE_TESTS_DATA_WORKER_OPS_TEST_IMAGES_H_
#define SLUICE_TESTS_DATA_WORKER_OPS_TEST_IMAGES_H_

#include <jpeglib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "data_worker/ops/op.h"
#include "data_worker/ops/tensor.h"
#include "opencv2/core.hpp"
#include "opencv2/imgcodecs.hpp"
#include "opencv2/imgproc.hpp"

namespace sluice::data_worker::testing {

// Smooth RGB content (blurred noise + gradients), like a photo at the scale of
// a few pixels.
inline cv::Mat MakeRgb(int height, int width, int seed = 1) {
  cv::RNG rng(seed);
  cv::Mat noise(std::max(2, height / 16), std::max(2, width / 16), CV_8UC3);
  rng.fill(noise, cv::RNG::UNIFORM, 0, 256);
  cv::Mat img;
  cv::resize(noise, img, cv::Size(width, height), 0, 0, cv::INTER_CUBIC);
  cv::GaussianBlur(img, img, cv::Size(0, 0), std::max(0.5, width / 200.0));
  for (int r = 0; r < height; ++r) {
    for (int c = 0; c < width; ++c) {
      cv::Vec3b& px = img.at<cv::Vec3b>(r, c);
      px[0] = cv::saturate_cast<uint8_t>(px[0] * 0.7 + 70.0 * r / height);
      px[1] = cv::saturate_cast<uint8_t>(px[1] * 0.7 + 70.0 * c / width);
    }
  }
  return img;  // RGB order by convention of these tests
}

inline std::string Encode(const cv::Mat& mat, const std::string& ext,
                          const std::vector<int>& params = {}) {
  std::vector<uint8_t> buf;
  cv::imencode(ext, mat, buf, params);
  return std::string(buf.begin(), buf.end());
}

// JPEG of an RGB image (imencode expects BGR, so the channels are swapped
// first).
inline std::string EncodeJpegRgb(const cv::Mat& rgb, std::vector<int> params = {}) {
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  params.insert(params.end(), {cv::IMWRITE_JPEG_QUALITY, 92});
  return Encode(bgr, ".jpg", params);
}

// An Adobe CMYK JPEG written with libjpeg directly (OpenCV cannot write CMYK).
inline std::string EncodeCmykJpeg(int height, int width) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 92, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const cv::Mat rgb = MakeRgb(height, width, 7);
  std::vector<uint8_t> row(4 * width);
  while (cinfo.next_scanline < cinfo.image_height) {
    const uint8_t* src = rgb.ptr<uint8_t>(cinfo.next_scanline);
    for (int c = 0; c < width; ++c) {
      row[4 * c] = src[3 * c];
      row[4 * c + 1] = src[3 * c + 1];
      row[4 * c + 2] = src[3 * c + 2];
      row[4 * c + 3] = static_cast<uint8_t>(200 + c % 50);
    }
    JSAMPROW ptr = row.data();
    jpeg_write_scanlines(&cinfo, &ptr, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string result(reinterpret_cast<char*>(out), size);
  free(out);
  return result;
}

// An RGB JPEG written with libjpeg, luma sampling factors h×v (2×2 = 4:2:0, 2×1
// = 4:2:2, 1×1 = 4:4:4; OpenCV 4.6 has no IMWRITE_JPEG_SAMPLING_FACTOR).
inline std::string EncodeJpegSampling(const cv::Mat& rgb, int h_samp, int v_samp,
                                      bool progressive = false) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = rgb.cols;
  cinfo.image_height = rgb.rows;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 92, TRUE);
  cinfo.comp_info[0].h_samp_factor = h_samp;
  cinfo.comp_info[0].v_samp_factor = v_samp;
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW ptr = const_cast<uint8_t*>(rgb.ptr<uint8_t>(cinfo.next_scanline));
    jpeg_write_scanlines(&cinfo, &ptr, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string result(reinterpret_cast<char*>(out), size);
  free(out);
  return result;
}

// Inserts a minimal EXIF APP1 segment (orientation 6) right after SOI.
inline std::string WithExif(const std::string& jpeg) {
  const std::string tiff = std::string("II*\0\x08\0\0\0", 8) +
                           std::string("\x01\0\x12\x01\x03\0\x01\0\0\0\x06\0\0\0", 14) +
                           std::string("\0\0\0\0", 4);
  const std::string payload = std::string("Exif\0\0", 6) + tiff;
  const size_t len = payload.size() + 2;
  std::string seg = "\xFF\xE1";
  seg += static_cast<char>(len >> 8);
  seg += static_cast<char>(len & 0xFF);
  return jpeg.substr(0, 2) + seg + payload + jpeg.substr(2);
}

// Reference decode: full cv::imdecode, BGR → RGB.
inline cv::Mat ReferenceDecode(const std::string& encoded) {
  cv::Mat bgr = cv::imdecode(
      cv::Mat(1, static_cast<int>(encoded.size()), CV_8UC1, const_cast<char*>(encoded.data())),
      cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  cv::Mat rgb;
  if (!bgr.empty()) cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

struct Diff {
  double mean = 0;
  double max = 0;
};
inline Diff Compare(const cv::Mat& a, const cv::Mat& b) {
  cv::Mat d;
  cv::absdiff(a.reshape(1), b.reshape(1), d);
  Diff out;
  out.mean = cv::mean(d)[0];
  cv::minMaxLoc(d, nullptr, &out.max);
  return out;
}

inline Tensor Bytes(const std::string& s) { return Tensor::FromBytes(s); }

inline Tensor FromRgb(const cv::Mat& rgb) { return Tensor::FromMat(rgb); }

}  // namespace sluice::data_worker::testing

#endif  // SLUICE_TESTS_DATA_WORKER_OPS_TEST_IMAGES_H_
