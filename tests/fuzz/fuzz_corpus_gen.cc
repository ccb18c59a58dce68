// Writes the seed corpora for the fuzzers: fuzz_corpus_gen <shard_reader_dir>
// <manifest_dir>. Shard seeds are small valid shards prefixed with the fuzzer's
// mode byte (0: bytes as they are, 1: repair checksums; see
// shard_reader_fuzzer.cc); manifest seeds are real manifest.json files.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/status_macros.h"
#include "common/record/dataset.h"
#include "common/record/schema.h"
#include "common/record/shard.h"

namespace sluice::record {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Spit(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

Schema TensorSchema() {
  return Schema{{
      {.name = "pixels", .dtype = DType::kUint8, .shape = {2, -1}},
      {.name = "score", .dtype = DType::kFloat32, .indexed = true},
      {.name = "label", .dtype = DType::kInt32, .indexed = true},
      {.name = "text", .dtype = DType::kString},
  }};
}

absl::Status WriteShard(const fs::path& path, const Schema& schema,
                        const std::vector<std::vector<Tensor>>& records) {
  ASSIGN_OR_RETURN(auto writer, ShardWriter::Create(path.string(), schema));
  for (const auto& r : records) RETURN_IF_ERROR(writer->Add(r));
  return writer->Finish();
}

absl::Status Run(const fs::path& shard_dir, const fs::path& manifest_dir) {
  fs::create_directories(shard_dir);
  fs::create_directories(manifest_dir);
  const fs::path tmp =
      fs::temp_directory_path() / ("sluice-fuzz-seeds-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  const std::vector<std::vector<Tensor>> images = {
      {Tensor::Bytes("\xff\xd8jpeg"), Tensor::Int64(3), Tensor::Bytes("cat/1.jpg")},
      {Tensor::Bytes("\x89PNG"), Tensor::Int64(7), Tensor::Bytes("dog/2.png")},
  };
  const std::vector<std::vector<Tensor>> tensors = {
      {Tensor::Of<uint8_t>({2, 3}, {1, 2, 3, 4, 5, 6}), Tensor::Of<float>({}, {0.5f}),
       Tensor::Of<int32_t>({}, {-1}), Tensor::Bytes("a")},
      {Tensor::Of<uint8_t>({2, 0}, {}), Tensor::Of<float>({}, {2.0f}), Tensor::Of<int32_t>({}, {9}),
       Tensor::Bytes("")},
  };
  RETURN_IF_ERROR(WriteShard(tmp / "images.urec", ImageClassificationSchema(), images));
  RETURN_IF_ERROR(WriteShard(tmp / "tensors.urec", TensorSchema(), tensors));
  for (const char* name : {"images", "tensors"}) {
    const std::string shard = Slurp(tmp / (std::string(name) + ".urec"));
    Spit(shard_dir / (std::string(name) + "-asis"), std::string(1, '\0') + shard);
    Spit(shard_dir / (std::string(name) + "-repair"), std::string(1, '\1') + shard);
  }

  // Two datasets: one shard, and three shards (tiny shard size).
  for (uint64_t shard_size : {uint64_t{1} << 20, uint64_t{200}}) {
    const fs::path dir = tmp / ("dataset-" + std::to_string(shard_size));
    ASSIGN_OR_RETURN(auto writer, DatasetWriter::Create(dir.string(), ImageClassificationSchema(),
                                                        {.shard_size_bytes = shard_size}));
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(writer->Add(images[i % 2]));
    RETURN_IF_ERROR(writer->Finish().status());
    Spit(manifest_dir / ("manifest-" + std::to_string(shard_size) + ".json"),
         Slurp(dir / kManifestName));
  }
  fs::remove_all(tmp);
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice::record

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: fuzz_corpus_gen <shard_reader_corpus_dir> "
                 "<manifest_corpus_dir>\n");
    return 2;
  }
  const absl::Status status = sluice::record::Run(argv[1], argv[2]);
  if (!status.ok()) {
    std::fprintf(stderr, "fuzz_corpus_gen: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
