// XXH3-64 compiled for AVX2 inside the benchmark, to measure what an AVX2 build
// of record::Checksum would gain (Debian's libxxhash is built for the SSE2
// baseline).
#ifndef SLUICE_BENCH_XXH3_AVX2_H_
#define SLUICE_BENCH_XXH3_AVX2_H_

#include <cstddef>
#include <cstdint>

namespace sluice::bench {

// Same value as record::Checksum. REQUIRES: the CPU has AVX2
// (__builtin_cpu_supports("avx2")).
uint64_t Xxh3Avx2(const char* data, size_t size);

}  // namespace sluice::bench

#endif  // SLUICE_BENCH_XXH3_AVX2_H_
