// The data caches' sizes, as the OS reports them, for kernels that block
// their work to fit a level (the exact GEMM's row blocks). Read once per
// process; where the OS says nothing (0 or -1) or under 64 KiB, the value a
// current x86 core has at least, so a block sized by it still fits; at most
// 4 MiB (a figure above that is a shared cache's).
#pragma once

#include <cstdint>

namespace lumen {

// Per-core L2 size in bytes (Zen 2: 512 KiB, Zen 5: 1 MiB, Sapphire Rapids: 2 MiB).
int64_t L2CacheBytes();

}  // namespace lumen
