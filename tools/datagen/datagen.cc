#include "tools/datagen/datagen.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>  // constants only: the codecs load through common/image
#include <opencv2/imgproc.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/base/random.h"
#include "common/image/imgcodecs.h"

namespace sluice::tools {
namespace fs = std::filesystem;

namespace {

constexpr int kJpegQuality = 90;
constexpr int kMinLongSide = 300;
constexpr int kMaxLongSide = 600;

cv::Vec3f RandomColor(Rng& rng) {
  return cv::Vec3f(static_cast<float>(rng.Uniform(0, 255)), static_cast<float>(rng.Uniform(0, 255)),
                   static_cast<float>(rng.Uniform(0, 255)));
}

// A smooth random field in [-1, 1]: uniform noise on a grid with `cell`-pixel
// spacing, upsampled bicubically to `size`.
cv::Mat SmoothNoise(Rng& rng, cv::Size size, int cell, int channels) {
  const cv::Size grid(size.width / cell + 2, size.height / cell + 2);
  cv::Mat coarse(grid, CV_32FC(channels));
  float* p = coarse.ptr<float>();
  for (size_t i = 0; i < coarse.total() * channels; ++i)
    p[i] = static_cast<float>(rng.Uniform(-1, 1));
  if (cell == 1) return coarse(cv::Rect(0, 0, size.width, size.height)).clone();
  cv::Mat fine;
  cv::resize(coarse, fine, cv::Size(grid.width * cell, grid.height * cell), 0, 0, cv::INTER_CUBIC);
  return fine(cv::Rect(0, 0, size.width, size.height)).clone();
}

// Background: a few random colours on a coarse grid, interpolated into smooth
// gradients.
cv::Mat Background(Rng& rng, cv::Size size) {
  const int gw = 2 + static_cast<int>(rng.UniformInt(3));
  const int gh = 2 + static_cast<int>(rng.UniformInt(3));
  const cv::Vec3f base = RandomColor(rng);
  cv::Mat grid(gh, gw, CV_32FC3);
  for (int y = 0; y < gh; ++y) {
    for (int x = 0; x < gw; ++x) {
      cv::Vec3f c;
      for (int k = 0; k < 3; ++k) c[k] = base[k] + static_cast<float>(rng.Uniform(-70, 70));
      grid.at<cv::Vec3f>(y, x) = c;
    }
  }
  cv::Mat background;
  cv::resize(grid, background, size, 0, 0, cv::INTER_LINEAR);
  return background;
}

// Blends a blurred, randomly coloured ellipse or polygon into `image`.
void AddShape(Rng& rng, cv::Mat& image) {
  const cv::Size size = image.size();
  const int long_side = std::max(size.width, size.height);
  const cv::Point center(static_cast<int>(rng.UniformInt(size.width)),
                         static_cast<int>(rng.UniformInt(size.height)));
  const double radius = rng.Uniform(0.04, 0.35) * long_side;
  cv::Mat mask = cv::Mat::zeros(size, CV_32F);
  if (rng.Bernoulli(0.5)) {
    const cv::Size axes(static_cast<int>(radius), static_cast<int>(radius * rng.Uniform(0.3, 1.0)));
    cv::ellipse(mask, center, axes, rng.Uniform(0, 180), 0, 360, cv::Scalar(1), cv::FILLED,
                cv::LINE_AA);
  } else {
    const int n = 3 + static_cast<int>(rng.UniformInt(4));
    std::vector<cv::Point> points;
    for (int i = 0; i < n; ++i) {
      const double angle = (i + rng.Uniform(0, 0.8)) * 2 * M_PI / n;
      const double r = radius * rng.Uniform(0.5, 1.0);
      points.emplace_back(center.x + static_cast<int>(r * std::cos(angle)),
                          center.y + static_cast<int>(r * std::sin(angle)));
    }
    cv::fillPoly(mask, std::vector<std::vector<cv::Point>>{points}, cv::Scalar(1), cv::LINE_AA);
  }
  // Sharp edges are rarer than soft ones, as with depth of field.
  const double sigma = rng.Bernoulli(0.3) ? rng.Uniform(0.5, 1.5) : rng.Uniform(2, 12);
  const int margin = static_cast<int>(radius + 3 * sigma) + 2;
  const cv::Rect roi = cv::Rect(center.x - margin, center.y - margin, 2 * margin, 2 * margin) &
                       cv::Rect(0, 0, size.width, size.height);
  cv::Mat m = mask(roi);
  cv::GaussianBlur(m, m, cv::Size(0, 0), sigma);
  const cv::Vec3f color = RandomColor(rng);
  const float alpha = static_cast<float>(rng.Uniform(0.6, 1.0));
  cv::Mat target = image(roi);
  for (int y = 0; y < roi.height; ++y) {
    const float* a = m.ptr<float>(y);
    cv::Vec3f* px = target.ptr<cv::Vec3f>(y);
    for (int x = 0; x < roi.width; ++x) {
      const float w = alpha * a[x];
      px[x] = px[x] * (1 - w) + color * w;
    }
  }
}

// Multi-scale texture: smoothed noise at several scales, mostly in luminance.
void AddTexture(Rng& rng, cv::Mat& image) {
  const cv::Size size = image.size();
  const float strength = static_cast<float>(rng.Uniform(0.6, 1.4));
  struct Octave {
    int cell;
    float amplitude;
  };
  static constexpr Octave kOctaves[] = {{64, 30}, {24, 18}, {8, 12}, {3, 10}, {1, 7}};
  cv::Mat luma = cv::Mat::zeros(size, CV_32F);
  for (const Octave& octave : kOctaves) {
    cv::scaleAdd(SmoothNoise(rng, size, octave.cell, 1), octave.amplitude * strength, luma, luma);
  }
  cv::Mat chroma = SmoothNoise(rng, size, 48, 3) * (12 * strength);
  cv::Mat luma3;
  cv::merge(std::vector<cv::Mat>{luma, luma, luma}, luma3);
  image += luma3 + chroma;
}

cv::Mat SyntheticImage(uint64_t seed, uint64_t index) {
  Rng rng(MixSeed({seed, index}));
  const int long_side =
      kMinLongSide + static_cast<int>(rng.UniformInt(kMaxLongSide - kMinLongSide + 1));
  const int short_side = static_cast<int>(std::lround(long_side * rng.Uniform(0.55, 1.0)));
  const cv::Size size =
      rng.Bernoulli(0.75) ? cv::Size(long_side, short_side) : cv::Size(short_side, long_side);
  cv::Mat image = Background(rng, size);
  const int shapes = 4 + static_cast<int>(rng.UniformInt(9));
  for (int i = 0; i < shapes; ++i) AddShape(rng, image);
  AddTexture(rng, image);
  cv::Mat out;
  image.convertTo(out, CV_8UC3);
  return out;
}

int Digits(int64_t n) { return n < 10 ? 1 : 1 + Digits(n / 10); }

absl::Status WriteFile(const std::string& path, const std::string& data) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  const bool written = std::fwrite(data.data(), 1, data.size(), file) == data.size();
  const int write_errno = errno;
  if (std::fclose(file) != 0 || !written) {
    return absl::ErrnoToStatus(written ? errno : write_errno, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const DatagenOptions& options) {
  if (options.output.empty()) return absl::InvalidArgumentError("--output must name a folder");
  if (options.images <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--images must be > 0, got ", options.images));
  }
  if (options.classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--classes must be > 0, got ", options.classes));
  }
  if (options.classes > options.images) {
    return absl::InvalidArgumentError(absl::StrCat("--classes (", options.classes,
                                                   ") must not exceed --images (", options.images,
                                                   "): every class needs an image"));
  }
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 1, got ", options.threads));
  }
  std::error_code ec;
  const fs::file_status status = fs::status(options.output, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--output ", options.output, " exists and is not a folder"));
    }
    if (!fs::is_empty(options.output, ec) || ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("--output ", options.output, " is not empty; choose a new or empty folder"));
    }
  }
  return absl::OkStatus();
}

// Generates images claimed from a shared counter on `threads` threads started
// and joined by Run.
class Generator {
 public:
  explicit Generator(const DatagenOptions& options)
      : options_(options),
        class_digits_(std::max(3, Digits(options.classes - 1))),
        image_digits_(std::max(6, Digits(options.images - 1))) {}

  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_) {
    for (int c = 0; c < options_.classes; ++c) {
      std::error_code ec;
      const std::string dir = ClassDir(c);
      if (!fs::create_directories(dir, ec) && ec) {
        return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create folder ", dir));
      }
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < options_.threads; ++i) threads.emplace_back([this] { Work(); });
    for (std::thread& t : threads) t.join();
    absl::MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  std::string ClassDir(int c) const {
    return (fs::path(options_.output) / absl::StrFormat("class_%0*d", class_digits_, c)).string();
  }

  void Work() ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      const int64_t i = next_.fetch_add(1);
      if (i >= options_.images || failed_.load()) return;
      const std::string path = (fs::path(ClassDir(static_cast<int>(i % options_.classes))) /
                                absl::StrFormat("img_%0*d.jpg", image_digits_, i))
                                   .string();
      absl::Status status;
      absl::StatusOr<std::string> jpeg = SyntheticJpeg(options_.seed, static_cast<uint64_t>(i));
      status = jpeg.ok() ? WriteFile(path, *jpeg) : jpeg.status();
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        // Report the error of the lowest image index, whatever the scheduling.
        if (first_error_.ok() || i < first_error_index_) {
          first_error_ = status;
          first_error_index_ = i;
        }
        failed_.store(true);
        return;
      }
      ++done_;
      if (options_.progress) options_.progress(done_, static_cast<uint64_t>(options_.images));
    }
  }

  const DatagenOptions& options_;
  const int class_digits_;
  const int image_digits_;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> failed_{false};
  absl::Mutex mu_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  int64_t first_error_index_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::string> SyntheticJpeg(uint64_t seed, uint64_t index) {
  cv::Mat mat;
  try {
    mat = SyntheticImage(seed, index);
  } catch (const cv::Exception& e) {
    return absl::InternalError(
        absl::StrCat("OpenCV failed on synthetic image ", index, ": ", e.what()));
  }
  std::vector<uint8_t> jpeg;
  if (absl::Status status =
          image::Imencode(".jpg", mat, {cv::IMWRITE_JPEG_QUALITY, kJpegQuality}, &jpeg);
      !status.ok()) {
    return absl::Status(status.code(), absl::StrCat("JPEG encoding of synthetic image ", index,
                                                    ": ", status.message()));
  }
  return std::string(jpeg.begin(), jpeg.end());
}

absl::Status GenerateImageFolder(const DatagenOptions& options) {
  if (absl::Status status = ValidateOptions(options); !status.ok()) return status;
  return Generator(options).Run();
}

}  // namespace sluice::tools
