// libFuzzer target for the filter predicate parser (common/record/filter.h):
// arbitrary text against a schema with an int and a float indexed column must
// give a Filter or InvalidArgument, never a crash. A parsed filter is then
// evaluated on a few keys (the raw index values of both dtypes).
#include <cstdint>
#include <limits>
#include <string>

#include "common/record/filter.h"
#include "common/record/schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sluice::record::DType;
  static const sluice::record::Schema* schema = new sluice::record::Schema{{
      {.name = "label", .dtype = DType::kInt32, .indexed = true},
      {.name = "score", .dtype = DType::kFloat32, .indexed = true},
      {.name = "big", .dtype = DType::kInt64, .indexed = true},
      {.name = "image", .dtype = DType::kUint8, .shape = {-1}},
  }};
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto filter = sluice::record::Filter::Parse(text, *schema);
  if (!filter.ok()) return 0;
  for (int64_t key : {int64_t{0}, int64_t{-1}, int64_t{3}, int64_t{1} << 40,
                      std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
    (void)filter->Matches(key);
  }
  return 0;
}
