// XXH3-64, the one checksum of the Unirecord format.
#ifndef SLUICE_COMMON_RECORD_CHECKSUM_H_
#define SLUICE_COMMON_RECORD_CHECKSUM_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::record {

uint64_t Checksum(std::string_view bytes);
// 16 lowercase hex digits, as the manifest stores checksums.
std::string ChecksumHex(uint64_t checksum);

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_CHECKSUM_H_
