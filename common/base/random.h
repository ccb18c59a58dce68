// Deterministic random numbers defined by sluice's own code (not by a standard
// library's distributions), so every node, worker and thread computes the same
// values from the same seed.
//
// Seeds are derived with MixSeed, e.g. the augmentation of one element:
//   Rng rng(MixSeed({JobPipelineSeed(pipeline_seed, job_seed), epoch, global_index,
//                    op_position}));
#ifndef SLUICE_COMMON_BASE_RANDOM_H_
#define SLUICE_COMMON_BASE_RANDOM_H_

#include <cstdint>
#include <initializer_list>

namespace sluice {

// SplitMix64's finalizer: a bijective 64-bit mix.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Combines several values into one seed; order matters.
constexpr uint64_t MixSeed(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t p : parts) h = Mix64(h ^ Mix64(p));
  return h;
}

// The seed a service job's random ops draw from (with epoch, record and op
// position): the pipeline's own `seed` mixed with the job's seed, so that jobs
// of different seeds (a new training run, or each epoch's job of the PyTorch
// dataset) draw different augmentations. A job seed of 0 leaves the
// pipeline's seed: that job draws what the pipeline draws in-process.
constexpr uint64_t JobPipelineSeed(uint64_t pipeline_seed, uint64_t job_seed) {
  return job_seed == 0 ? pipeline_seed : MixSeed({pipeline_seed, job_seed});
}

// xoshiro256** seeded through SplitMix64. Not thread-safe; cheap to create per
// element.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) s = seed = Mix64(seed);
  }

  uint64_t NextU64() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n), n > 0, without modulo bias (Lemire's method).
  uint64_t UniformInt(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(NextU64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(NextU64()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform in [0, 1) with 53 random bits.
  double UniformDouble() { return (NextU64() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * UniformDouble(); }
  bool Bernoulli(double p) { return UniformDouble() < p; }

 private:
  static constexpr uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_RANDOM_H_
