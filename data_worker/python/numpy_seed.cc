#include "data_worker/python/numpy_seed.h"

#include <vector>

namespace sluice::data_worker::python {
namespace {

// numpy/random/bit_generator.pyx (SeedSequence).
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t HashMix(uint32_t value, uint32_t* hash_const) {
  value ^= *hash_const;
  *hash_const *= kMultA;
  value *= *hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t Mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// numpy/random/src/pcg64: PCG_DEFAULT_MULTIPLIER_128.
constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

}  // namespace

Pcg64State NumpyPcg64State(uint64_t seed) {
  // SeedSequence(seed): the entropy is the seed's 32-bit words, low first (0
  // is one word).
  std::vector<uint32_t> entropy;
  for (uint64_t n = seed; n > 0; n >>= 32) entropy.push_back(static_cast<uint32_t>(n));
  if (entropy.empty()) entropy.push_back(0);
  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    pool[i] = HashMix(i < static_cast<int>(entropy.size()) ? entropy[i] : 0, &hash_const);
  }
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = Mix(pool[dst], HashMix(pool[src], &hash_const));
    }
  }
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      pool[dst] = Mix(pool[dst], HashMix(entropy[src], &hash_const));
    }
  }
  // generate_state(4, uint64): 8 words cycling over the pool, paired low
  // first.
  uint32_t words[2 * kPoolSize];
  uint32_t b = kInitB;
  for (int i = 0; i < 2 * kPoolSize; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= b;
    b *= kMultB;
    v *= b;
    v ^= v >> kXShift;
    words[i] = v;
  }
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) {
    v[i] = (static_cast<uint64_t>(words[2 * i + 1]) << 32) | words[2 * i];
  }
  const unsigned __int128 init_state = (static_cast<unsigned __int128>(v[0]) << 64) | v[1];
  const unsigned __int128 init_seq = (static_cast<unsigned __int128>(v[2]) << 64) | v[3];
  // pcg_setseq_128_srandom_r.
  Pcg64State s;
  s.inc = (init_seq << 1) | 1;
  s.state = s.state * kPcgMultiplier + s.inc;
  s.state += init_state;
  s.state = s.state * kPcgMultiplier + s.inc;
  return s;
}

std::string Hex128(unsigned __int128 v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 31; i >= 0; --i) {
    out[i] = kDigits[static_cast<int>(v & 0xf)];
    v >>= 4;
  }
  return out;
}

}  // namespace sluice::data_worker::python
