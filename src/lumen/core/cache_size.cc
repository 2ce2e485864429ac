#include "lumen/core/cache_size.h"

#include <unistd.h>

namespace lumen {

namespace {

constexpr int64_t kFallbackL2 = 512 << 10;  // the smallest per-core L2 of the CPUs we dispatch for

int64_t ReadL2() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  // Below 64 KiB would be a misreport (a VM that passes an L1 figure): ignore it.
  if (bytes >= (64 << 10)) return bytes;
#endif
  return kFallbackL2;
}

}  // namespace

int64_t L2CacheBytes() {
  static const int64_t bytes = ReadL2();
  return bytes;
}

}  // namespace lumen
