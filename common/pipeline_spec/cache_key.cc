#include "common/pipeline_spec/cache_key.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/record/checksum.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace sluice::pipeline_spec {
namespace {

// Byte-stable serialization (map fields sorted), so equal messages hash alike.
std::string Deterministic(const proto::Pipeline& p) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    p.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace

std::optional<CacheKey> CacheKeyOf(const proto::Pipeline& pipeline, uint64_t split_size) {
  int at = -1;
  for (int i = 0; i < pipeline.nodes_size(); ++i) {
    if (pipeline.nodes(i).has_cache()) {
      at = i;
      break;
    }
  }
  if (at < 0) return std::nullopt;
  proto::Pipeline prefix;
  *prefix.mutable_source() = pipeline.source();
  prefix.mutable_source()->clear_num_parallel_workers();
  for (int i = 0; i < at; ++i) {
    proto::PipelineNode* n = prefix.add_nodes();
    *n = pipeline.nodes(i);
    if (n->has_map()) n->mutable_map()->clear_num_parallel_workers();
  }
  prefix.set_seed(pipeline.seed());
  prefix.set_on_error(pipeline.on_error() == "skip" ? "skip" : "fail");
  const std::string bytes = absl::StrCat(Deterministic(prefix), "/split_size=", split_size);
  CacheKey key;
  key.name = pipeline.nodes(at).cache().name();
  key.fingerprint = record::ChecksumHex(record::Checksum(bytes));
  key.node_index = at;
  return key;
}

bool DrawsPerEpochRandomness(proto::OpSpec::OpCase op_case) {
  using S = proto::OpSpec;
  switch (op_case) {
    case S::kRandomResizedCrop:
    case S::kRandomCrop:
    case S::kRandomHorizontalFlip:
    case S::kRandomRotation:
    case S::kColorJitter:
    case S::kPython:
      return true;
    default:
      return false;
  }
}

}  // namespace sluice::pipeline_spec
