#include "common/record/convert/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace sluice::record {
namespace {

TEST(Crc32c, MatchesStandardCheckValue) { EXPECT_EQ(Crc32c("123456789"), 0xe3069283U); }

TEST(Crc32c, MatchesRfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aaU);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43U);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46dd794eU);
}

TEST(Crc32c, ExtendEqualsWholeBuffer) {
  EXPECT_EQ(Crc32cExtend(Crc32c("hello "), "world"), Crc32c("hello world"));
}

TEST(Crc32c, MaskRoundTripsAndChangesValue) {
  for (uint32_t crc : {0U, 1U, 0xe3069283U, 0xffffffffU}) {
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(crc)), crc);
  }
  // TensorFlow's mask: rotate right by 15, add a constant.
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8U);
  EXPECT_EQ(MaskCrc32c(0x8000U), 0xa282ead9U);
}

}  // namespace
}  // namespace sluice::record
