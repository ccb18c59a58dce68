// libFuzzer target for the image-folder source as a worker opens and reads it: the input is a
// folder tree (class directories, file names, file bytes, symlinks with any target) written
// under the worker's --data-root; JobRegistry then builds a job whose source is that folder
// (listing it: classes, sorted files, hidden names skipped), and every image is read.
// A strange tree must be an error Status for that job (a file that is a symlink out of the
// folder: PERMISSION_DENIED), never a crash, a hang or a read outside the folder.
//
// Input: entries until the bytes run out, each
//   kind (1 byte: 0 file, 1 directory, 2 symlink) | name length (1 byte) | name
//   file: size (2 bytes, little-endian, at most 4096) | bytes
//   symlink: target length (1 byte) | target
// A name is a path under the folder; its components lose NUL bytes, "", "." and "..".
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "data_worker/pipeline/source.h"
#include "data_worker/worker/job_registry.h"
#include "proto/pipeline.pb.h"
#include "proto/worker.pb.h"

namespace {

namespace fs = std::filesystem;

const fs::path& DataRoot() {
  static const fs::path* root = [] {
    // tmpfs when there is one: every input writes its tree anew.
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    auto dir = base / ("sluice-fuzz-images-" + std::to_string(getpid()));
    fs::create_directories(dir / "root");
    fs::create_directories(dir / "outside");
    std::ofstream(dir / "outside" / "secret.jpg") << "not for the worker";
    return new fs::path(dir / "root");
  }();
  return *root;
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// `name` as a relative path without NUL bytes, empty, "." or ".." components.
fs::path Relative(const std::string& name) {
  fs::path out;
  std::string component;
  auto flush = [&] {
    if (!component.empty() && component != "." && component != "..") out /= component;
    component.clear();
  };
  for (char c : name) {
    if (c == '/') {
      flush();
    } else if (c != '\0') {
      component += c;
    }
  }
  flush();
  return out;
}

void Write(Input& in, const fs::path& folder) {
  std::error_code ec;
  for (int entries = 0; !in.empty() && entries < 32; ++entries) {
    const int kind = in.Byte() % 3;
    const fs::path relative = Relative(in.Bytes(in.Byte()));
    if (relative.empty()) continue;
    const fs::path path = folder / relative;
    fs::create_directories(path.parent_path(), ec);
    if (kind == 0) {
      const size_t n = (in.Byte() | (size_t{in.Byte()} << 8)) % 4097;
      std::ofstream(path, std::ios::binary) << in.Bytes(n);
    } else if (kind == 1) {
      fs::create_directories(path, ec);
    } else {
      fs::create_symlink(in.Bytes(in.Byte()), path, ec);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::data_worker::JobRegistry;
  const fs::path folder = DataRoot() / "images";
  std::error_code ec;
  fs::remove_all(folder, ec);
  fs::create_directories(folder);
  Input in(data, size);
  Write(in, folder);

  sluice::proto::Pipeline spec;
  spec.mutable_source()->mutable_image_folder()->set_path(folder.string());
  spec.add_nodes()->mutable_batch()->set_size(2);
  auto roots = JobRegistry::CanonicalDataRoots({DataRoot().string()});
  if (!roots.ok()) std::abort();
  sluice::data_worker::pipeline::ExecutorOptions options;
  options.cpu_budget = 1;
  JobRegistry registry(*roots, options, sluice::NullLogger());
  sluice::proto::JobInfo info;
  info.set_job_id(7);
  info.set_job_name("fuzz");
  info.set_pipeline(spec.SerializeAsString());
  registry.Add(info);
  auto job = registry.Get(7);
  if (job == nullptr) std::abort();  // Add never fails: a bad job is refused
  if (!job->status.ok()) return 0;
  auto executor = registry.AcquireExecutor(7);
  if (!executor.ok()) std::abort();
  // Every image (at most 32 files were written), read as the pipeline's source stage reads
  // them; a whole split through the executor costs its threads for every input, and the
  // decoding after the read is decode_fuzzer's.
  const sluice::data_worker::pipeline::Source& source = *(*executor)->logical().source;
  for (uint64_t i = 0; i < source.size(); ++i) {
    (void)source.Read(i, {0, 1, 2});
    (void)source.Describe(i);
  }
  return 0;
}
