#include "data_worker/pipeline/source.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/random.h"
#include "common/base/status_macros.h"
#include "common/image/imgcodecs.h"
#include "opencv2/core.hpp"
#include "opencv2/imgcodecs.hpp"  // constants only: the codecs load through common/image

namespace sluice::data_worker::pipeline {
namespace {

namespace fs = std::filesystem;

// Builds the tensors of the image-classification columns.
std::vector<Tensor> ImageRecord(std::string image, int64_t label, std::string key,
                                const std::vector<int>& columns) {
  std::vector<Tensor> out;
  out.reserve(columns.size());
  for (int c : columns) {
    if (c == 0) {
      out.push_back(Tensor::FromBytes(std::move(image)));
    } else if (c == 1) {
      out.push_back(Tensor::Scalar<int64_t>(label));
    } else {
      out.push_back(Tensor::FromBytes(std::move(key)));
    }
  }
  return out;
}

class DatasetSourceImpl final : public Source {
 public:
  explicit DatasetSourceImpl(std::unique_ptr<record::Dataset> ds) : ds_(std::move(ds)) {}
  uint64_t size() const override { return ds_->size(); }
  const record::Schema& schema() const override { return ds_->schema(); }
  const record::Dataset* dataset() const override { return ds_.get(); }
  std::string Describe(uint64_t global) const override {
    if (global >= ds_->size()) return ds_->dir();
    auto [shard, local] = ds_->Locate(global);
    return (fs::path(ds_->dir()) / ds_->manifest().shards[shard].file).string();
  }
  absl::StatusOr<std::vector<Tensor>> Read(uint64_t global,
                                           const std::vector<int>& columns) const override {
    std::vector<Tensor> out;
    RETURN_IF_ERROR(ReadInto(global, columns, &out));
    return out;
  }
  absl::Status ReadInto(uint64_t global, const std::vector<int>& columns,
                        std::vector<Tensor>* out) const override {
    // The verified record in the shard's memory map: each column is copied
    // once, into its Tensor. The views are the calling thread's scratch, so a
    // steady stream of reads allocates nothing.
    thread_local std::vector<record::TensorView> views;
    ASSIGN_OR_RETURN(std::string_view encoded, ds_->ReadView(global));
    if (absl::Status s = record::DecodeRecordInto(ds_->schema(), encoded, &views); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat(Describe(global), ": record ", global, ": ", s.message()));
    }
    out->resize(columns.size());
    for (size_t i = 0; i < columns.size(); ++i) {
      const record::ColumnSpec& spec = ds_->schema().columns[columns[i]];
      const record::TensorView& v = views[columns[i]];
      Tensor& t = (*out)[i];
      if (!record::IsNumeric(spec.dtype)) {
        t = Tensor::FromBytes(std::string(v.data));
        continue;
      }
      t.Reallocate(spec.dtype, v.shape);
      if (t.num_bytes() != v.data.size()) {
        return absl::DataLossError(absl::StrCat(Describe(global), ": record ", global, ": column '",
                                                spec.name, "' has ", v.data.size(),
                                                " bytes for shape ", ShapeToString(v.shape)));
      }
      std::memcpy(t.data(), v.data.data(), v.data.size());
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<record::Dataset> ds_;
};

bool IsImageName(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

bool Hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// The largest image file read (a 10 GB file named .jpg would otherwise be read whole).
constexpr uintmax_t kMaxImageFileBytes = uintmax_t{256} << 20;

// Whether `path` (canonical) is `root` (canonical) or inside it.
bool Inside(const std::string& path, const std::string& root) {
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          (root.back() == '/' || path[root.size()] == '/'));
}

// OK if the file at `path` resolves (symlinks followed) to a regular file inside `root`
// (canonical) and is at most kMaxImageFileBytes: a symlink must not lead a worker out of
// the folder (out of its --data-root), to a device or a FIFO that never ends, or to a file
// too large to hold.
absl::Status CheckImageFile(const fs::path& path, const std::string& root) {
  std::error_code ec;
  const fs::path resolved = fs::canonical(path, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve image file ", path.string(), ": ", ec.message()));
  }
  if (!Inside(resolved.string(), root)) {
    return absl::PermissionDeniedError(absl::StrCat("image file ", path.string(), " resolves to ",
                                                    resolved.string(),
                                                    ", outside the image folder ", root));
  }
  if (!fs::is_regular_file(resolved, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("image file ", path.string(), " is not a regular file"));
  }
  const uintmax_t bytes = fs::file_size(resolved, ec);
  if (ec || bytes > kMaxImageFileBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("image file ", path.string(), " has ",
                                                     ec ? 0 : bytes, " bytes, more than ",
                                                     kMaxImageFileBytes, " (or cannot be sized)"));
  }
  return absl::OkStatus();
}

class ImageFolderSourceImpl final : public Source {
 public:
  struct Entry {
    std::string relative;
    int64_t label;
  };
  // `canonical`: `root` resolved, which every file read must stay in.
  ImageFolderSourceImpl(std::string root, std::string canonical, std::vector<Entry> entries)
      : root_(std::move(root)),
        canonical_(std::move(canonical)),
        entries_(std::move(entries)),
        schema_(record::ImageClassificationSchema()) {}
  uint64_t size() const override { return entries_.size(); }
  const record::Schema& schema() const override { return schema_; }
  std::string Describe(uint64_t global) const override {
    if (global >= entries_.size()) return root_;
    return (fs::path(root_) / entries_[global].relative).string();
  }
  absl::StatusOr<std::vector<Tensor>> Read(uint64_t global,
                                           const std::vector<int>& columns) const override {
    const Entry& e = entries_[global];
    const std::string path = Describe(global);
    // Again at read time: the file may have been replaced since the folder was listed.
    RETURN_IF_ERROR(CheckImageFile(path, canonical_));
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open image file ", path));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read image file ", path));
    return ImageRecord(std::move(bytes), e.label, e.relative, columns);
  }

 private:
  const std::string root_;
  const std::string canonical_;
  const std::vector<Entry> entries_;
  const record::Schema schema_;
};

class SyntheticSourceImpl final : public Source {
 public:
  static constexpr int kDistinct = 8;
  SyntheticSourceImpl(uint64_t n, int h, int w, int classes, std::vector<std::string> images)
      : n_(n),
        h_(h),
        w_(w),
        classes_(classes),
        images_(std::move(images)),
        schema_(record::ImageClassificationSchema()) {}
  uint64_t size() const override { return n_; }
  const record::Schema& schema() const override { return schema_; }
  std::vector<int64_t> image_shape() const override { return {h_, w_, 3}; }
  std::string Describe(uint64_t global) const override {
    return absl::StrCat("synthetic:", global);
  }
  absl::StatusOr<std::vector<Tensor>> Read(uint64_t global,
                                           const std::vector<int>& columns) const override {
    return ImageRecord(images_[global % images_.size()], static_cast<int64_t>(global % classes_),
                       absl::StrCat("synthetic/", global), columns);
  }

 private:
  const uint64_t n_;
  const int h_, w_, classes_;
  const std::vector<std::string> images_;
  const record::Schema schema_;
};

absl::StatusOr<std::vector<std::string>> MakeSyntheticImages(int h, int w) {
  std::vector<std::string> out;
  for (int i = 0; i < SyntheticSourceImpl::kDistinct; ++i) {
    cv::Mat img(h, w, CV_8UC3);
    Rng rng(MixSeed({0x5eed, uint64_t(i)}));
    for (int y = 0; y < h; ++y) {
      auto* row = img.ptr<uint8_t>(y);
      for (int x = 0; x < w; ++x) {
        const int noise = static_cast<int>(rng.UniformInt(32));
        row[3 * x] = static_cast<uint8_t>((x * 255 / std::max(1, w - 1) + noise + 30 * i) & 255);
        row[3 * x + 1] = static_cast<uint8_t>((y * 255 / std::max(1, h - 1) + noise) & 255);
        row[3 * x + 2] = static_cast<uint8_t>(((x + y) * 2 + noise + 17 * i) & 255);
      }
    }
    std::vector<uint8_t> buf;
    if (absl::Status status = image::Imencode(".jpg", img, {cv::IMWRITE_JPEG_QUALITY, 90}, &buf);
        !status.ok()) {
      return absl::Status(status.code(), absl::StrCat("synthetic source: ", status.message()));
    }
    out.emplace_back(buf.begin(), buf.end());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Source>> OpenSource(const proto::SourceNode& node) {
  switch (node.kind_case()) {
    case proto::SourceNode::kDataset: {
      const std::string& path = node.dataset().path();
      if (path.empty()) return absl::InvalidArgumentError("source.dataset: path must be set");
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        return absl::NotFoundError(absl::StrCat("source: path '", path, "' does not exist"));
      }
      auto ds = record::Dataset::Open(path);
      if (!ds.ok()) {
        return absl::Status(ds.status().code(),
                            absl::StrCat("source: dataset '", path, "': ", ds.status().message()));
      }
      return std::make_unique<DatasetSourceImpl>(std::move(*ds));
    }
    case proto::SourceNode::kImageFolder: {
      const std::string& root = node.image_folder().path();
      if (root.empty()) return absl::InvalidArgumentError("source.image_folder: path must be set");
      std::error_code ec;
      if (!fs::is_directory(root, ec)) {
        return absl::NotFoundError(absl::StrCat("source: path '", root, "' does not exist"));
      }
      const std::string canonical = fs::canonical(root, ec).string();
      if (ec) {
        return absl::NotFoundError(
            absl::StrCat("source: cannot resolve image folder '", root, "': ", ec.message()));
      }
      // The error_code forms throughout: a symlink loop or a vanished entry is a refused job,
      // not an exception that ends the worker.
      std::vector<std::string> classes;
      for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator();
           it.increment(ec)) {
        std::error_code type_error;
        if (it->is_directory(type_error) && !Hidden(it->path()))
          classes.push_back(it->path().filename().string());
      }
      std::sort(classes.begin(), classes.end());
      std::vector<ImageFolderSourceImpl::Entry> entries;
      for (size_t label = 0; label < classes.size(); ++label) {
        std::vector<std::string> files;
        const fs::path dir = fs::path(root) / classes[label];
        for (auto it = fs::recursive_directory_iterator(dir, ec);
             !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
          std::error_code type_error;
          if (Hidden(it->path())) {
            if (it->is_directory(type_error)) it.disable_recursion_pending();
            continue;
          }
          if (!IsImageName(it->path()) || it->is_directory(type_error)) continue;
          if (!it->is_symlink(type_error) && !it->is_regular_file(type_error)) continue;
          // A dangling link or one to a FIFO is skipped like a FIFO itself; one out of the folder
          // or to a huge file refuses the source.
          if (absl::Status s = CheckImageFile(it->path(), canonical);
              absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) {
            continue;
          } else if (!s.ok()) {
            return absl::Status(s.code(), absl::StrCat("source: ", s.message()));
          }
          files.push_back(it->path().lexically_relative(root).string());
        }
        std::sort(files.begin(), files.end());
        for (auto& f : files) entries.push_back({std::move(f), static_cast<int64_t>(label)});
      }
      if (entries.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("source: image folder '", root, "' has no .jpg/.jpeg/.png files"));
      }
      return std::make_unique<ImageFolderSourceImpl>(root, canonical, std::move(entries));
    }
    case proto::SourceNode::kSynthetic: {
      const auto& s = node.synthetic();
      if (s.num_records() <= 0) {
        return absl::InvalidArgumentError("source.synthetic: num_records must be > 0");
      }
      const int h = s.height() > 0 ? s.height() : 256;
      const int w = s.width() > 0 ? s.width() : 256;
      const int classes = s.num_classes() > 0 ? s.num_classes() : 10;
      if (s.height() < 0 || s.width() < 0 || s.num_classes() < 0) {
        return absl::InvalidArgumentError(
            "source.synthetic: height, width and num_classes must be >= 0");
      }
      // Checked before anything is allocated: an image of 100000 x 100000 would take 30 GB.
      constexpr int kMaxSide = 16384;
      constexpr int64_t kMaxPixels = int64_t{4096} * 4096;
      if (h > kMaxSide || w > kMaxSide || static_cast<int64_t>(h) * w > kMaxPixels) {
        return absl::InvalidArgumentError(absl::StrCat("source.synthetic: ", h, " x ", w,
                                                       " is too large (at most ", kMaxSide,
                                                       " a side and ", kMaxPixels, " pixels)"));
      }
      ASSIGN_OR_RETURN(auto images, MakeSyntheticImages(h, w));
      return std::make_unique<SyntheticSourceImpl>(s.num_records(), h, w, classes,
                                                   std::move(images));
    }
    case proto::SourceNode::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("source: set one of dataset, image_folder, synthetic");
}

}  // namespace sluice::data_worker::pipeline
