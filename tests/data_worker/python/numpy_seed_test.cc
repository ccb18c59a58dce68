// NumpyPcg64State against numpy itself: the expected states were printed by
// numpy 1.24 (Debian 12's python3-numpy):
//   python3 -c 'import numpy as np; s = np.random.PCG64(SEED).state["state"];
//               print(hex(s["state"]), hex(s["inc"]))'
// Seeds cover the entropy lengths SeedSequence distinguishes: 0 (one zero
// word), one word, two words, all ones.
#include "data_worker/python/numpy_seed.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace sluice::data_worker::python {
namespace {

struct Expected {
  uint64_t seed;
  const char* state;
  const char* inc;
};

constexpr Expected kNumpy[] = {
    {0, "1aa1b5345996452d09585eb7a69561e3", "418ddadb3af71a82588133bc447873a9"},
    {1, "9c5b484bfedb756c2a6e7d6f320fbc7e", "922af2da2645f895a19857b95740937b"},
    {7, "9d0aecc4e7b188919ae2415a6b292038", "c4751896ce8acebf66887f5ac070d959"},
    {4294967295, "4c233832246aa48cc57a3ce19c86ba9a", "da9580daf0fe872cad12d969e7b701fb"},
    {4294967296, "24d060cf1520dbdd21bbf7fbff1ac5d4", "77ff3ed86c5c56337b62eea7340ca9c7"},
    {12345678901234567, "1fe5d8dcaead774d6edf07b8c4ce7ecb", "3a85f7734176fecbe11b8dd1ac295e89"},
    {18446744073709551615u, "ddc419442aebde794d8b0a3b048acdb0", "37762aacb3cc854f4ed623c7d18951ed"},
};

TEST(NumpySeed, EqualsNumpysPcg64StateForEachEntropyLength) {
  for (const Expected& e : kNumpy) {
    const Pcg64State s = NumpyPcg64State(e.seed);
    EXPECT_EQ(Hex128(s.state), e.state) << e.seed;
    EXPECT_EQ(Hex128(s.inc), e.inc) << e.seed;
  }
}

TEST(NumpySeed, Hex128PrintsAll32DigitsHighFirst) {
  EXPECT_EQ(Hex128(0), "00000000000000000000000000000000");
  EXPECT_EQ(Hex128((static_cast<unsigned __int128>(0xabc) << 64) | 0x12),
            "0000000000000abc0000000000000012");
}

}  // namespace
}  // namespace sluice::data_worker::python
