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

// The same attention split by position instead (one query, several threads:
// each streams a contiguous range of every kv head's K and V rows, where a
// split by head reads a few heads' slices of every row). With S = pos_end -
// pos_begin and scores[H, S] shared by the callers, in three phases:
//   AttendScores for disjoint position ranges [j0, j1) covering [0, S);
//   AttendSoftmax for disjoint q-head ranges covering [0, H) (scores become
//     probabilities);
//   AttendValues for disjoint position ranges, each into its own out[H, Dh]
//     (overwritten).
// The sum of the AttendValues outputs is AttendOne's out (tier L2, same bound).
// AttendSplitSupported says whether this CPU's kernels cover the shape and KV
// type (else use AttendHeads); the other three require it.
bool AttendSplitSupported(const AttentionShape& s, DType kv);
void AttendScores(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                  int64_t pos_end, int64_t j0, int64_t j1, float* scores);
void AttendSoftmax(int64_t S, float* scores, int h0, int h1);
void AttendValues(const AttentionShape& s, const KvRing& kv, int64_t pos_begin, int64_t pos_end,
                  int64_t j0, int64_t j1, const float* probs, float* out);

// Prefill: a run of consecutive query tokens of one sequence, token t at
// position pos0 + t (q row at q + t * q_stride, output at out + t *
// out_stride, both [H * Dh]), each seeing positions [window > 0 ? max(0, p -
// window + 1) : 0, p] of the ring (all stored before the call). A call covers
// kv head kv_head's query heads for tokens [t0, t1), t1 - t0 <=
// AttendRowsTokens(s), so callers split a chunk into (head, token block)
// units across threads. The K and V tiles are widened once per unit of 48
// query rows and the products run as GEMM tiles (attention_rows.cc), where
// AttendOne takes each row alone. A row's bits depend only on its position
// and the ring, never on the other tokens of its call or the thread count.
// Tier: L2 against AttendOneRef per row (attention_test.cc's bound).
struct AttentionRows {
  const float* q = nullptr;
  int64_t q_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t pos0 = 0;
  int64_t window = 0;
};
// Whether this CPU's kernels cover the shape and KV type (else AttendOne per row).
bool AttendRowsSupported(const AttentionShape& s, DType kv);
int64_t AttendRowsTokens(const AttentionShape& s);
// Floats of scratch one call needs (the same on every target).
int64_t AttendRowsScratchFloats(const AttentionShape& s);
void AttendRows(const AttentionShape& s, const KvRing& kv, const AttentionRows& rows, int kv_head,
                int64_t t0, int64_t t1, float* scratch);

// Stores a key/value row (f32 in) at position pos of the ring.
void StoreKv(const KvRing& kv, int64_t row_elems, int64_t pos, const float* k, const float* v);

}  // namespace lumen::kernels
