#include "lumen/core/cache_size.h"

#include <unistd.h>

#include <algorithm>

namespace lumen {

namespace {

constexpr int64_t kFallbackL2 = 512 << 10;  // the smallest per-core L2 of the CPUs we dispatch for
constexpr int64_t kMaxL2 = 4 << 20;         // more than any x86 core has per core

int64_t ReadL2() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  // Below 64 KiB would be a misreport (a VM that passes an L1 figure): ignore
  // it; above kMaxL2 (a shared cache's figure) the blocks stop growing.
  if (bytes >= (64 << 10)) return std::min<int64_t>(bytes, kMaxL2);
#endif
  return kFallbackL2;
}

}  // namespace

int64_t L2CacheBytes() {
  static const int64_t bytes = ReadL2();
  return bytes;
}

}  // namespace lumen
