// Attention of one query token over a range of positions in a KV cache.
//
// The cache is a ring of `capacity` rows per layer ([capacity, Hkv * Dh], row
// for position p at p % capacity), stored as f32, f16, bf16 or Q8_0 (blocks of 32 along the row,
// so head_dim must be a multiple of 32); sliding-window
// layers simply have capacity = window. The caller passes the visible range
// [pos_begin, pos_end) instead of assuming causal 0..T-1, so block masks,
// prefix sharing and batching use this same kernel. GQA: query head h reads kv
// head h / (H / Hkv). Scores are scaled, optionally soft-capped, then softmaxed.
#pragma once

#include <cstdint>

#include "lumen/core/dtype.h"

namespace lumen::kernels {

struct KvRing {
  DType dtype = DType::kF32;
  const void* k = nullptr;  // [capacity, Hkv * Dh]
  const void* v = nullptr;  // [capacity, Hkv * Dh]
  int64_t capacity = 0;
};

struct AttentionShape {
  int n_heads, n_kv_heads, head_dim;
  float scale;        // multiplies q.k
  float softcap = 0;  // > 0: scores = softcap * tanh(scores / softcap)
};

// out[H, Dh] = softmax(q K^T) V over positions [pos_begin, pos_end).
// scratch must hold (pos_end - pos_begin) * (H + 1) + 2 * Hkv * Dh floats
// (the SIMD route uses the first (pos_end - pos_begin) * (H / Hkv + 1)).
// Tier: L2 against AttendOneRef (attention_ref.h); bound in attention_test.cc.
void AttendOne(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
               int64_t pos_end, float* out, float* scratch);

// The same for kv heads [kv_head_begin, kv_head_end) only (and their groups
// of q heads): lets a caller split one token's attention across threads
// (decode has one row, so splitting rows leaves all but one thread idle).
// Each call needs its own scratch of (pos_end - pos_begin) * ((kv_head_end - kv_head_begin)
// * H / Hkv + 1) floats.
void AttendHeads(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                 int64_t pos_end, float* out, float* scratch, int kv_head_begin, int kv_head_end);

// Stores a key/value row (f32 in) at position pos of the ring.
void StoreKv(const KvRing& kv, int64_t row_elems, int64_t pos, const float* k, const float* v);

}  // namespace lumen::kernels
