#include "common/record/checksum.h"

#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace sluice::record {

uint64_t Checksum(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string ChecksumHex(uint64_t checksum) { return absl::StrFormat("%016x", checksum); }

}  // namespace sluice::record
