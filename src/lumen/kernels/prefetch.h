// Software prefetch for the decode products (one or a few activation rows):
// each weight row is read once per token, so the product streams the matrix
// from memory at whatever rate the loads are issued. On some machines (a
// KVM guest on an Intel Xeon, docs/reference/performance.md) the hardware
// prefetchers do not run far enough ahead of a loop that does real work per
// byte: the row kernels stalled on every new cache line and streamed
// 1.5-2.5 GB/s where a bare read loop reaches 16. Asking for the line
// kAheadBytes ahead of the one being decoded (into L2, which has room for
// many outstanding requests) keeps enough misses in flight.
#pragma once

#include <cstdint>

#include "lumen/kernels/cpu_vendor.h"

namespace lumen::kernels {

// Distance of the prefetch from the current read position. 4 KiB measured
// best of 1-16 KiB on the Xeon above (Q4_0 1B decode, 1 thread: 2.5 -> 4.4
// tok/s int8; the exact route likewise); prefetching past the end of the
// matrix is harmless (x86 prefetches never fault).
inline constexpr int64_t kAheadBytes = 4096;

// Prefetch into L2 the lines of [p + ahead, p + ahead + bytes). A kernel
// that reads its rows in segments (a K-blocked product) passes the distance
// to the same segment of a later row.
inline void PrefetchAhead(const void* p, int64_t bytes, int64_t ahead = kAheadBytes) {
  const char* c = static_cast<const char*>(p) + ahead;
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}

// The same into L1 (prefetcht0). Measured per kernel: the int8 kernel of the
// 4- and 5-bit quads decodes Q4_0 8-9% faster on one thread and 3-4% on two
// with it (1B, Xeon above), while the K-quant kernel lost 10% (Q4_K).
inline void PrefetchAheadL1(const void* p, int64_t bytes, int64_t ahead = kAheadBytes) {
  const char* c = static_cast<const char*>(p) + ahead;
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// Whether the decode rows of the int8 kernels (matmul_q8_gguf.cc,
// matmul_q8_mlx.cc: the K-quants, the 4- and 5-bit column groups, MLX)
// prefetch into L1 rather than L2: on AMD CPUs, where Zen 5 decoded Q6_K
// 1.17-1.23x and MLX 4 / 8-bit 1.15-1.39x faster with it, one thread or two
// (docs/reference/performance.md, session 47), and Q2_K 1.03x / 1.07x, Q4_K
// 1.03x / 1.02x, Q4_K_M 1.02x / 1.02x, Q5_0 1.05x / 1.09x, Q4_0 1.00x /
// 1.02x (session 52; Q8_0's and Q5_K's groups stay in L2: RowsIntoL1). Other
// CPUs keep L2: on the Xeon above an L1 prefetch cost Q4_K's rows 10%, and
// the rest are unmeasured there. Decided once, from the CPU's identity.
inline bool L1PrefetchPays() { return CpuIsAmd(); }

// PrefetchAheadL1 where into_l1 (a kernel's L1PrefetchPays, read once per
// call), else PrefetchAhead.
inline void PrefetchAheadInto(bool into_l1, const void* p, int64_t bytes,
                              int64_t ahead = kAheadBytes) {
  if (into_l1)
    PrefetchAheadL1(p, bytes, ahead);
  else
    PrefetchAhead(p, bytes, ahead);
}

}  // namespace lumen::kernels
