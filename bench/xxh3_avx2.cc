// Built with -mavx2 (bench/CMakeLists.txt); callers check for AVX2 first.
#include "bench/xxh3_avx2.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace sluice::bench {

uint64_t Xxh3Avx2(const char* data, size_t size) {
  return XXH3_64bits(data, size);
}

}  // namespace sluice::bench
