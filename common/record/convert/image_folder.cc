// ImageFolder input (see convert.h): root/<class>/.../<image>.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/record/convert/converters.h"

namespace sluice::record {
namespace fs = std::filesystem;

namespace {

// Images read by one source: small files are batched so the pipeline's
// per-source cost is small.
constexpr size_t kImagesPerSource = 64;

struct ImageFile {
  std::string key;  // path relative to the root, '/'-separated
  int64_t label = 0;
};

bool HasImageExtension(const fs::path& path) {
  const std::string ext = absl::AsciiStrToLower(path.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (file == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  std::string data;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) data.append(buffer, got);
  if (std::ferror(file.get()))
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  return data;
}

// Appends the images under `class_dir` (recursively; hidden entries skipped)
// sorted by relative path.
absl::Status ListClass(const fs::path& class_dir, const std::string& class_name, int64_t label,
                       std::vector<ImageFile>* images) {
  std::vector<ImageFile> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(class_dir, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path& path = it->path();
    std::error_code type_ec;
    if (path.filename().string().starts_with(".")) {
      if (it->is_directory(type_ec)) it.disable_recursion_pending();
      continue;
    }
    if (!HasImageExtension(path) || !it->is_regular_file(type_ec)) continue;
    found.push_back(
        {absl::StrCat(class_name, "/", path.lexically_relative(class_dir).generic_string()),
         label});
  }
  if (ec)
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot list folder ", class_dir.string()));
  std::sort(found.begin(), found.end(),
            [](const ImageFile& a, const ImageFile& b) { return a.key < b.key; });
  for (ImageFile& f : found) images->push_back(std::move(f));
  return absl::OkStatus();
}

absl::Status ReadImages(const std::string& root, const std::vector<ImageFile>& images,
                        const SampleSink& sink) {
  for (const ImageFile& image : images) {
    const std::string path = (fs::path(root) / image.key).string();
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    if (!HasImageSignature(bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("image file ", path,
                       " is not a JPEG or PNG (its first bytes are no JPEG/PNG signature); "
                       "remove or rename it"));
    }
    RETURN_IF_ERROR(sink(Sample{std::move(bytes), image.label, image.key}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConversionPlan> PlanImageFolder(const std::string& input) {
  std::error_code ec;
  const fs::file_status status = fs::status(input, ec);
  if (!fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat("input folder ", input, " does not exist"));
  }
  if (!fs::is_directory(status)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", input, " is not a folder; imagefolder expects root/<class>/<image>"));
  }
  std::vector<std::string> classes;
  fs::directory_iterator it(input, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (!name.starts_with(".") && it->is_directory(type_ec)) classes.push_back(name);
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot list folder ", input));
  std::sort(classes.begin(), classes.end());

  std::vector<ImageFile> images;
  for (size_t label = 0; label < classes.size(); ++label) {
    RETURN_IF_ERROR(ListClass(fs::path(input) / classes[label], classes[label],
                              static_cast<int64_t>(label), &images));
  }
  if (images.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input folder ", input,
                     " holds no images: expected <class>/<name>.{jpg,jpeg,png} under it"));
  }

  ConversionPlan plan;
  plan.total_samples = images.size();
  for (size_t begin = 0; begin < images.size(); begin += kImagesPerSource) {
    const size_t end = std::min(images.size(), begin + kImagesPerSource);
    auto batch = std::make_shared<const std::vector<ImageFile>>(
        std::make_move_iterator(images.begin() + begin),
        std::make_move_iterator(images.begin() + end));
    plan.sources.push_back(
        [input, batch](const SampleSink& sink) { return ReadImages(input, *batch, sink); });
  }
  return plan;
}

}  // namespace sluice::record
