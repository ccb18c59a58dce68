// libFuzzer target for TFRecord input to `sluice convert`: the framing, both
// CRCs, gzip detection and the tf.train.Example payloads, read through
// PlanTfRecord and its sample sources. Arbitrary bytes must give samples or a
// Status (DataLoss/InvalidArgument), never a crash.
//
// The first byte picks the mode: even, the rest is the file as it is; odd, the
// rest is a list of (u16 little-endian length, payload) pairs that are framed
// as records with correct CRCs, so the fuzzer reaches the Example parser.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/record/convert/converters.h"
#include "common/record/convert/crc32c.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

std::string Frame(const uint8_t* data, size_t size) {
  using sluice::record::Crc32c;
  using sluice::record::MaskCrc32c;
  std::string out;
  size_t i = 0;
  while (i + 2 <= size) {
    size_t n = data[i] | (size_t{data[i + 1]} << 8);
    i += 2;
    if (n > size - i) n = size - i;
    const std::string_view payload(reinterpret_cast<const char*>(data + i), n);
    i += n;
    std::string length;
    AppendLe(&length, n, 8);
    out += length;
    AppendLe(&out, MaskCrc32c(Crc32c(length)), 4);
    out += payload;
    AppendLe(&out, MaskCrc32c(Crc32c(payload)), 4);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string file;
  if (data[0] & 1) {
    file = Frame(data + 1, size - 1);
  } else {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  const std::string path = sluice::fuzz::WriteInput(reinterpret_cast<const uint8_t*>(file.data()),
                                                    file.size(), "input.tfrecord");
  auto plan = sluice::record::PlanTfRecord(path);
  if (!plan.ok()) return 0;
  for (const auto& source : plan->sources) {
    const absl::Status status = source([](sluice::record::Sample sample) {
      (void)sample;
      return absl::OkStatus();
    });
    if (!status.ok()) break;
  }
  return 0;
}
