// OpenCV's image codecs (libopencv_imgcodecs), loaded when first needed.
//
// sluice decodes JPEG with libjpeg-turbo and WebP with libwebp directly; only PNG and BMP (and the
// JPEG encoder of `sluice datagen` and the synthetic source) go through OpenCV's imgcodecs. That
// library maps ~140 further shared libraries (GDAL, GDCM, OpenEXR, ...) whose loading and symbol
// binding cost every process ~80 ms of CPU at start, so no sluice binary links it: the first call
// below dlopen()s it (RTLD_LAZY | RTLD_LOCAL, once per process, thread-safe) and later calls
// reuse it. A process that only reads JPEGs never maps it.
//
// If the library cannot be loaded, every call returns FailedPrecondition naming the library and
// the package that provides it (the deployment must install it where PNG/BMP input is expected;
// docs/deploy.md). The functions are otherwise cv::imdecode / cv::imencode, with OpenCV's
// exceptions turned into a Status.
#ifndef SLUICE_COMMON_IMAGE_IMGCODECS_H_
#define SLUICE_COMMON_IMAGE_IMGCODECS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "opencv2/core.hpp"

namespace sluice::image {

// The file name (soname) of the library this build loads, e.g. "libopencv_imgcodecs.so.406".
std::string_view ImgcodecsLibraryName();

// Loads the library if this process has not yet. OK once loaded; FailedPrecondition naming the
// library, the loader's reason and the package to install otherwise (the same on every call).
absl::Status LoadImgcodecs();

// cv::imdecode(encoded, flags). An empty Mat when OpenCV finds no decoder or the data is corrupt
// (as cv::imdecode); DataLoss with OpenCV's message when it throws; FailedPrecondition as
// LoadImgcodecs.
absl::StatusOr<cv::Mat> Imdecode(std::string_view encoded, int flags);

// cv::imencode(ext, image, *out, params). InvalidArgument when OpenCV cannot encode (it returns
// false or throws; the message names `ext`); FailedPrecondition as LoadImgcodecs.
absl::Status Imencode(std::string_view ext, const cv::Mat& image, const std::vector<int>& params,
                      std::vector<uint8_t>* out);

}  // namespace sluice::image

#endif  // SLUICE_COMMON_IMAGE_IMGCODECS_H_
