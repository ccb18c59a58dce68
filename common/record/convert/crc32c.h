// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as used by TFRecord
// framing, and TensorFlow's "masked" variant. Table-driven, one byte per step;
// thread-safe.
//
//   Crc32c("123456789") == 0xe3069283
#ifndef SLUICE_COMMON_RECORD_CONVERT_CRC32C_H_
#define SLUICE_COMMON_RECORD_CONVERT_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace sluice::record {

// Continues a CRC-32C: Crc32c(ab) == Crc32cExtend(Crc32c(a), b). The initial
// value is 0.
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);
inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }

// TensorFlow stores CRCs masked, so that a CRC of data that itself contains
// CRCs stays strong.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8U; }
inline uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8U;
  return (rot >> 17) | (rot << 15);
}

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_CONVERT_CRC32C_H_
