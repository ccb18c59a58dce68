#include "common/image/imgcodecs.h"

#include <dlfcn.h>

#include <string>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "opencv2/imgcodecs.hpp"

namespace sluice::image {
namespace {

// The functions' types, checked against OpenCV's header at compile time (decltype does not
// reference the symbols, so nothing links against the library).
using ImdecodeFn = decltype(static_cast<cv::Mat (*)(cv::InputArray, int)>(&cv::imdecode));
using ImencodeFn =
    decltype(static_cast<bool (*)(const cv::String&, cv::InputArray, std::vector<uchar>&,
                                  const std::vector<int>&)>(&cv::imencode));

// Their symbols (Itanium C++ ABI, libstdc++'s std::string), as `nm -D` lists them.
constexpr char kImdecodeSymbol[] = "_ZN2cv8imdecodeERKNS_11_InputArrayEi";
constexpr char kImencodeSymbol[] =
    "_ZN2cv8imencodeERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKNS_11_InputArrayERSt6"
    "vectorIhSaIhEERKSB_IiSaIiEE";

// The library, loaded once and never unloaded (OpenCV's codecs keep static state).
struct Library {
  absl::Status status;
  ImdecodeFn imdecode = nullptr;
  ImencodeFn imencode = nullptr;
};

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status LoadError(std::string_view reason) {
  return absl::FailedPreconditionError(absl::StrCat(
      "OpenCV's image codecs library ", SLUICE_OPENCV_IMGCODECS_SONAME, " could not be loaded (",
      Sv(reason),
      "); sluice needs it for PNG and BMP images (and `sluice datagen`): install it (Debian: "
      "libopencv-imgcodecs406) or convert the dataset's images to JPEG"));
}

void Load(Library* lib) {
  void* handle = dlopen(SLUICE_OPENCV_IMGCODECS_SONAME, RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    lib->status = LoadError(reason != nullptr ? reason : "dlopen failed");
    return;
  }
  lib->imdecode = reinterpret_cast<ImdecodeFn>(dlsym(handle, kImdecodeSymbol));
  lib->imencode = reinterpret_cast<ImencodeFn>(dlsym(handle, kImencodeSymbol));
  if (lib->imdecode == nullptr || lib->imencode == nullptr) {
    lib->status = LoadError(absl::StrCat("it lacks ",
                                         lib->imdecode == nullptr ? "cv::imdecode" : "cv::imencode",
                                         ": another OpenCV version than the one sluice was built "
                                         "with?"));
  }
}

const Library& GetLibrary() {
  static absl::once_flag once;
  static Library* lib = new Library;
  absl::call_once(once, Load, lib);
  return *lib;
}

}  // namespace

std::string_view ImgcodecsLibraryName() { return SLUICE_OPENCV_IMGCODECS_SONAME; }

absl::Status LoadImgcodecs() { return GetLibrary().status; }

absl::StatusOr<cv::Mat> Imdecode(std::string_view encoded, int flags) {
  const Library& lib = GetLibrary();
  if (!lib.status.ok()) return lib.status;
  try {
    const cv::Mat buf(1, static_cast<int>(encoded.size()), CV_8UC1,
                      const_cast<char*>(encoded.data()));
    return lib.imdecode(buf, flags);
  } catch (const cv::Exception& e) {
    return absl::DataLossError(e.what());
  }
}

absl::Status Imencode(std::string_view ext, const cv::Mat& image, const std::vector<int>& params,
                      std::vector<uint8_t>* out) {
  const Library& lib = GetLibrary();
  if (!lib.status.ok()) return lib.status;
  try {
    if (lib.imencode(std::string(ext), image, *out, params)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("cv::imencode(\"", Sv(ext), "\") failed"));
  } catch (const cv::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cv::imencode(\"", Sv(ext), "\"): ", e.what()));
  }
}

}  // namespace sluice::image
