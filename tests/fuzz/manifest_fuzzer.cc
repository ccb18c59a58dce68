// libFuzzer target for Manifest::FromJson: arbitrary text must give a Manifest
// or a Status, never a crash or an escaped exception. A manifest that parses
// must serialize and parse back equal. Seeds: tests/fuzz/run.sh writes valid
// manifests with fuzz_corpus_gen.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/record/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto manifest = sluice::record::Manifest::FromJson(json, "fuzz");
  if (!manifest.ok()) return 0;
  auto again = sluice::record::Manifest::FromJson(manifest->ToJson(), "fuzz-roundtrip");
  if (!again.ok() || !(again->schema == manifest->schema) || again->shards != manifest->shards ||
      again->total_records != manifest->total_records) {
    std::abort();
  }
  return 0;
}
