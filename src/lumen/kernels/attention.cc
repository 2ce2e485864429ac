#include "lumen/kernels/attention.h"
#include "lumen/core/route.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/kernels/sum4_avx512.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/attention.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format off
#include <hwy/contrib/math/math-inl.h>  // per-target; must follow highway.h
// clang-format on

#include "lumen/kernels/attention-inl.h"

// Decode attention is a stream over the KV ring: for each kv head, the q heads
// of its group each take one pass over that head's K (scores) and one over its
// V (weighted sum). A head's K or V slice is S * Dh * 2 bytes (1 MiB at 8k
// context, f16), so the group's later passes hit L2 and DRAM sees each byte
// once. Rows are widened to f32 in registers (no per-row conversion buffer);
// scores use a vector exp; the softmax sum is f32 and the normalization is
// applied once to the output.

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Softmax numerators of one head's scores in place (vector exp); returns 1/sum.
HWY_INLINE float SoftmaxNumerators(float* sh, int64_t S) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  auto vmax = hn::Set(d, kNegInf);
  int64_t j = 0;
  for (; j + N <= S; j += N) vmax = hn::Max(vmax, hn::LoadU(d, sh + j));
  float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; j < S; ++j) mx = std::max(mx, sh[j]);
  const auto vmx = hn::Set(d, mx);
  auto vsum = hn::Zero(d);
  float sum = 0;
  for (j = 0; j + N <= S; j += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, sh + j), vmx));
    hn::StoreU(e, d, sh + j);
    vsum = hn::Add(vsum, e);
  }
  for (; j < S; ++j) sum += (sh[j] = std::exp(sh[j] - mx));
  return 1.0f / (sum + hn::GetLane(hn::SumOfLanes(d, vsum)));
}

// One head's scores to probabilities in place.
HWY_INLINE void Softmax(float* sh, int64_t S) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const float inv = SoftmaxNumerators(sh, S);
  const auto vi = hn::Set(d, inv);
  int64_t j = 0;
  for (; j + N <= S; j += N) hn::StoreU(hn::Mul(hn::LoadU(d, sh + j), vi), d, sh + j);
  for (; j < S; ++j) sh[j] *= inv;
}

// One kv head g: q heads [g*group, (g+1)*group). CH = head_dim / lanes.
template <DType T, int CH>
void AttendGroup(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                 int64_t S, int g, float* out, float* scores) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const int Dh = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t row = int64_t(s.n_kv_heads) * Dh, off = int64_t(g) * Dh;
  const int64_t first = pos_begin % kv.capacity;
  for (int hh = 0; hh < group; ++hh) {
    const int h = g * group + hh;
    const float* qh = q + int64_t(h) * Dh;
    VF qv[CH];
    for (int c = 0; c < CH; ++c) qv[c] = hn::LoadU(d, qh + c * N);
    // Scores.
    int64_t slot = first;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t at = slot * row + off;
      VF acc = hn::Mul(qv[0], LoadKv<T>(kv.k, at));
      for (int c = 1; c < CH; ++c) acc = hn::MulAdd(qv[c], LoadKv<T>(kv.k, at + c * N), acc);
      float sc = hn::GetLane(hn::SumOfLanes(d, acc)) * s.scale;
      if (s.softcap > 0) sc = s.softcap * std::tanh(sc / s.softcap);
      scores[j] = sc;
      if (++slot == kv.capacity) slot = 0;
    }
    const float inv_sum = SoftmaxNumerators(scores, S);
    // Weighted sum of V.
    VF acc[CH];
    for (int c = 0; c < CH; ++c) acc[c] = hn::Zero(d);
    slot = first;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t at = slot * row + off;
      const auto p = hn::Set(d, scores[j]);
      for (int c = 0; c < CH; ++c) acc[c] = hn::MulAdd(p, LoadKv<T>(kv.v, at + c * N), acc[c]);
      if (++slot == kv.capacity) slot = 0;
    }
    const auto inv = hn::Set(d, inv_sum);
    for (int c = 0; c < CH; ++c) hn::StoreU(hn::Mul(acc[c], inv), d, out + int64_t(h) * Dh + c * N);
  }
}

// Blocked two-pass decode attention for group size G (q heads per kv head).
// Positions go in blocks of kBlock rows (kBlock * Hkv * Dh * 2 bytes, 64 KiB
// for Llama-3.2-1B f16): a block's K rows are streamed from memory once, in
// address order, and every kv head's G q heads are scored against it while it
// is in L1/L2; the V pass does the same with G accumulators in registers per
// vector column. So DRAM sees each KV byte once, sequentially.
constexpr int64_t kBlock = 64;

// Prefetches this head's slice of the row one block ahead. Each pass reads
// Dh elements of every Hkv * Dh row (128 of 1024 bytes for Llama-3.2-1B), a
// stride the hardware prefetchers did not follow: from DRAM the kernel ran at
// a third of its in-cache speed.
template <DType T>
HWY_INLINE void PrefetchAhead(const void* base, int64_t slot, int64_t capacity, int64_t row,
                              int64_t off, int Dh) {
  int64_t ahead = slot + kBlock;
  if (ahead >= capacity) ahead -= capacity;
  if (ahead >= capacity) return;               // ring smaller than a block: all of it is in cache
  auto bytes = [](int64_t elems) -> int64_t {  // offset of element `elems` of a row run
    if constexpr (T == DType::kQ8_0) return elems / kQK * int64_t(sizeof(BlockQ8_0));
    return elems * (T == DType::kF32 ? 4 : 2);
  };
  const char* p = static_cast<const char*>(base) + bytes(ahead * row + off);
  for (int64_t b = 0; b < bytes(Dh); b += 64) hwy::Prefetch(p + b);
}

// out[i] = sum of the lanes of a[i], i < 4: one shuffle tree on AVX-512
// (sum4_avx512.h); the scores' horizontal sums were most of the scoring work
// at head_dim 64.
HWY_INLINE void SumOfLanes4(const VF* a, float* out) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  _mm_storeu_ps(out, SumLanes4(a[0].raw, a[1].raw, a[2].raw, a[3].raw));
#else
  const DF d;
  for (int i = 0; i < 4; ++i) out[i] = hn::GetLane(hn::SumOfLanes(d, a[i]));
#endif
}

// Scores of positions [j0, j1) for kv head g's G query heads. KCH > 0: the
// head is KCH vectors and the G x KCH query vectors stay in registers (they
// were reloaded for every position); 0: any width, queries loaded per use.
// Same arithmetic in the same order either way.
template <DType T, int G, int KCH>
void ScoreRows(const float* q, const AttentionShape& s, const KvRing& kv, int64_t first, int64_t j0,
               int64_t j1, int64_t S, int g, float* scores) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const int Dh = s.head_dim, CH = KCH > 0 ? KCH : static_cast<int>(Dh / N);
  const int64_t row = int64_t(s.n_kv_heads) * Dh, off = int64_t(g) * Dh;
  const float* qg = q + int64_t(g) * G * Dh;
  constexpr int kQ = std::max(KCH, 1);
  VF qv[G][kQ];
  if constexpr (KCH > 0)
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < KCH; ++c) qv[h][c] = hn::LoadU(d, qg + h * Dh + c * N);
  int64_t slot = (first + j0) % kv.capacity;
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t at = slot * row + off;
    PrefetchAhead<T>(kv.k, slot, kv.capacity, row, off, Dh);
    VF acc[G];
    for (int h = 0; h < G; ++h) acc[h] = hn::Zero(d);
    for (int c = 0; c < CH; ++c) {
      const VF k = LoadKv<T>(kv.k, at + c * N);
      for (int h = 0; h < G; ++h) {
        if constexpr (KCH > 0) {
          acc[h] = hn::MulAdd(qv[h][c], k, acc[h]);
        } else {
          acc[h] = hn::MulAdd(hn::LoadU(d, qg + h * Dh + c * N), k, acc[h]);
        }
      }
    }
    float dots[G];
    if constexpr (G % 4 == 0) {
      for (int h = 0; h < G; h += 4) SumOfLanes4(acc + h, dots + h);
    } else {
      for (int h = 0; h < G; ++h) dots[h] = hn::GetLane(hn::SumOfLanes(d, acc[h]));
    }
    for (int h = 0; h < G; ++h) {
      float sc = dots[h] * s.scale;
      if (s.softcap > 0) sc = s.softcap * std::tanh(sc / s.softcap);
      scores[h * S + j] = sc;
    }
    if (++slot == kv.capacity) slot = 0;
  }
}

template <DType T, int G>
void ScoreBlock(const float* q, const AttentionShape& s, const KvRing& kv, int64_t first,
                int64_t j0, int64_t j1, int64_t S, int g, float* scores) {
  const int64_t CH = s.head_dim / static_cast<int64_t>(hn::Lanes(DF()));
  // Register budget: G * CH query vectors + G accumulators + 1 key of 32.
  if constexpr (G <= 4) {
    if (CH == 4) return ScoreRows<T, G, 4>(q, s, kv, first, j0, j1, S, g, scores);
    if (CH == 2) return ScoreRows<T, G, 2>(q, s, kv, first, j0, j1, S, g, scores);
  }
  if constexpr (G <= 8) {
    if (CH == 1) return ScoreRows<T, G, 1>(q, s, kv, first, j0, j1, S, g, scores);
  }
  ScoreRows<T, G, 0>(q, s, kv, first, j0, j1, S, g, scores);
}

template <DType T, int G>
void ValueBlock(const AttentionShape& s, const KvRing& kv, int64_t first, int64_t j0, int64_t j1,
                int64_t S, int g, const float* p, float* out) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const int Dh = s.head_dim, CH = static_cast<int>(Dh / N);
  const int64_t row = int64_t(s.n_kv_heads) * Dh, off = int64_t(g) * Dh;
  float* og = out + int64_t(g) * G * Dh;
  for (int c = 0; c < CH; ++c) {
    VF acc[G];
    for (int h = 0; h < G; ++h) acc[h] = hn::LoadU(d, og + h * Dh + c * N);
    int64_t slot = (first + j0) % kv.capacity;
    for (int64_t j = j0; j < j1; ++j) {
      if (c == 0) PrefetchAhead<T>(kv.v, slot, kv.capacity, row, off, Dh);
      const VF v = LoadKv<T>(kv.v, slot * row + off + c * N);
      for (int h = 0; h < G; ++h) acc[h] = hn::MulAdd(hn::Set(d, p[h * S + j]), v, acc[h]);
      if (++slot == kv.capacity) slot = 0;
    }
    for (int h = 0; h < G; ++h) hn::StoreU(acc[h], d, og + h * Dh + c * N);
  }
}

// Scores of positions [j0, j1) for kv heads [g0, g1), a block of positions
// at a time (every head of a block while its rows are in cache), into
// scores[(g - g0) * G * S + h * S + j].
template <DType T, int G>
void ScoreRange(const float* q, const AttentionShape& s, const KvRing& kv, int64_t first, int64_t S,
                int64_t j0, int64_t j1, int g0, int g1, float* scores) {
  for (int64_t b = j0; b < j1; b += kBlock) {
    const int64_t e = std::min(j1, b + kBlock);
    for (int g = g0; g < g1; ++g)
      ScoreBlock<T, G>(q, s, kv, first, b, e, S, g, scores + int64_t(g - g0) * G * S);
  }
}

// out[heads of g0..g1] += sum over positions [j0, j1) of probs * V, laid out as ScoreRange's.
template <DType T, int G>
void ValueRange(const AttentionShape& s, const KvRing& kv, int64_t first, int64_t S, int64_t j0,
                int64_t j1, int g0, int g1, const float* probs, float* out) {
  for (int64_t b = j0; b < j1; b += kBlock) {
    const int64_t e = std::min(j1, b + kBlock);
    for (int g = g0; g < g1; ++g)
      ValueBlock<T, G>(s, kv, first, b, e, S, g, probs + int64_t(g - g0) * G * S, out);
  }
}

// kv heads [g0, g1); scratch holds (g1 - g0) * G * S scores.
template <DType T, int G>
void AttendBlocked(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                   int64_t S, int g0, int g1, float* out, float* scratch) {
  const int64_t first = pos_begin % kv.capacity;
  ScoreRange<T, G>(q, s, kv, first, S, 0, S, g0, g1, scratch);
  // 1/sum folded into the probabilities, so the V pass needs no per-head epilogue.
  for (int64_t h = 0; h < int64_t(g1 - g0) * G; ++h) Softmax(scratch + h * S, S);
  std::fill(out + int64_t(g0) * G * s.head_dim, out + int64_t(g1) * G * s.head_dim, 0.0f);
  ValueRange<T, G>(s, kv, first, S, 0, S, g0, g1, scratch, out);
}

template <DType T>
bool Dispatch(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
              int64_t S, int g, float* out, float* scores) {
  const int64_t N = hn::Lanes(DF());
  if (s.head_dim % N != 0) return false;
  switch (s.head_dim / N) {
    case 1:
      AttendGroup<T, 1>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    case 2:
      AttendGroup<T, 2>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    case 4:
      AttendGroup<T, 4>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    case 8:
      AttendGroup<T, 8>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    case 16:
      AttendGroup<T, 16>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    case 32:
      AttendGroup<T, 32>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    case 64:
      AttendGroup<T, 64>(q, s, kv, pos_begin, S, g, out, scores);
      return true;
    default:
      return false;
  }
}

// Calls f.template operator()<T, G>() when the blocked kernels cover the
// shape (head_dim a multiple of the lanes, G = H / Hkv in {1, 2, 4, 8}) and
// the KV type; false otherwise.
template <class F>
bool ForBlockedShape(const AttentionShape& s, DType t, const F& f) {
  if (s.head_dim % static_cast<int>(hn::Lanes(DF())) != 0) return false;
  return ForKvType(t, [&]<DType T>() {
    switch (s.n_heads / s.n_kv_heads) {
      case 1:
        f.template operator()<T, 1>();
        return true;
      case 2:
        f.template operator()<T, 2>();
        return true;
      case 4:
        f.template operator()<T, 4>();
        return true;
      case 8:
        f.template operator()<T, 8>();
        return true;
      default:
        return false;
    }
  });
}

}  // namespace

bool AttendSplitSupportedT(const AttentionShape& s, DType t) {
  return ForBlockedShape(s, t, []<DType, int>() {});
}

void AttendScoresT(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                   int64_t pos_end, int64_t j0, int64_t j1, float* scores) {
  const bool ok = ForBlockedShape(s, kv.dtype, [&]<DType T, int G>() {
    ScoreRange<T, G>(q, s, kv, pos_begin % kv.capacity, pos_end - pos_begin, j0, j1, 0,
                     s.n_kv_heads, scores);
  });
  LUMEN_CHECK(ok);
}

void AttendSoftmaxT(int64_t S, float* scores, int h0, int h1) {
  for (int h = h0; h < h1; ++h) Softmax(scores + int64_t(h) * S, S);
}

void AttendValuesT(const AttentionShape& s, const KvRing& kv, int64_t pos_begin, int64_t pos_end,
                   int64_t j0, int64_t j1, const float* probs, float* out) {
  std::fill(out, out + int64_t(s.n_heads) * s.head_dim, 0.0f);
  const bool ok = ForBlockedShape(s, kv.dtype, [&]<DType T, int G>() {
    ValueRange<T, G>(s, kv, pos_begin % kv.capacity, pos_end - pos_begin, j0, j1, 0, s.n_kv_heads,
                     probs, out);
  });
  LUMEN_CHECK(ok);
}

// Returns false when this target has no vector route for the shape (the
// caller then runs the scalar loop).
bool AttendHeadsT(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                  int64_t pos_end, float* out, float* scratch, int g0, int g1) {
  const int64_t S = pos_end - pos_begin;
  if (ForBlockedShape(s, kv.dtype, [&]<DType T, int G>() {
        AttendBlocked<T, G>(q, s, kv, pos_begin, S, g0, g1, out, scratch);
      }))
    return true;
  // Other group sizes: one kv head's query heads at a time.
  return ForKvType(kv.dtype, [&]<DType T>() {
    for (int g = g0; g < g1; ++g)
      if (!Dispatch<T>(q, s, kv, pos_begin, S, g, out, scratch)) return false;
    return true;
  });
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

LUMEN_ROUTE(attn_head_split,
            {.node = "attn.decode",
             .name = "simd-head-split",
             .tier = Tier::kL2,
             .oracle = "AttendOneRef (attention_ref.h)",
             .bound = "the bound of attention_test.cc; splitting by head is bit-identical to whole",
             .tests = "AttentionTest.EveryTargetWithinBound;AttentionTest.HeadSplitEqualsWhole",
             .priority = 10});
LUMEN_ROUTE(attn_position_split,
            {.node = "attn.decode.long",
             .name = "simd-position-split",
             .tier = Tier::kL2,
             .oracle = "AttendOneRef (attention_ref.h)",
             .bound = "the bound of attention_test.cc (partial softmaxes merged by their maxima)",
             .tests = "AttentionTest.PositionSplitWithinBound;QuantTypes."
                      "LongContextDecodeSplitsAttentionByPosition",
             .when = "threads=many",
             .priority = 10});
LUMEN_ROUTE(attn_long_one_thread, {.node = "attn.decode.long",
                                   .name = "simd-head-split",
                                   .tier = Tier::kL2,
                                   .oracle = "AttendOneRef (attention_ref.h)",
                                   .bound = "the bound of attention_test.cc",
                                   .tests = "AttentionTest.EveryTargetWithinBound",
                                   .priority = 0});
namespace {

void LoadRow(DType t, const void* base, int64_t at, int64_t n, float* dst) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(base) + at, n * sizeof(float));
      break;
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + at;
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(p[i]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + at;
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(p[i]);
      break;
    }
    case DType::kQ8_0:  // at and n are whole blocks (KvCache checks Dh % 32 == 0)
      DequantizeRow(t, static_cast<const uint8_t*>(base) + at / kQK * sizeof(BlockQ8_0), dst, n);
      break;
    default:
      LUMEN_CHECK(false && "unsupported KV dtype");
  }
}

void StoreRow(DType t, void* base, int64_t row, int64_t n, const float* src) {
  switch (t) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(base) + row * n, src, n * sizeof(float));
      break;
    case DType::kF16: {
      uint16_t* p = static_cast<uint16_t*>(base) + row * n;
      for (int64_t i = 0; i < n; ++i) p[i] = F32ToF16(src[i]);
      break;
    }
    case DType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(base) + row * n;
      for (int64_t i = 0; i < n; ++i) p[i] = F32ToBF16(src[i]);
      break;
    }
    case DType::kQ8_0:
      QuantizeRow(t, src, static_cast<uint8_t*>(base) + row * (n / kQK) * sizeof(BlockQ8_0), n);
      break;
    default:
      LUMEN_CHECK(false && "unsupported KV dtype");
  }
}

// Scalar route for head sizes no vector width divides: kv heads [g0, g1).
void AttendScalar(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                  int64_t pos_end, float* out, float* scratch, int g0, int g1) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, Dh = s.head_dim, group = H / Hkv;
  const int64_t S = pos_end - pos_begin, row = int64_t(Hkv) * Dh;
  float* sc = scratch;       // [S]
  float* tmp = scratch + S;  // [Dh]
  for (int h = g0 * group; h < g1 * group; ++h) {
    const int64_t off = int64_t(h / group) * Dh;
    for (int64_t j = 0; j < S; ++j) {
      LoadRow(kv.dtype, kv.k, ((pos_begin + j) % kv.capacity) * row + off, Dh, tmp);
      float dot = 0;
      for (int d = 0; d < Dh; ++d) dot += q[h * Dh + d] * tmp[d];
      float v = dot * s.scale;
      if (s.softcap > 0) v = s.softcap * std::tanh(v / s.softcap);
      sc[j] = v;
    }
    const float mx = *std::max_element(sc, sc + S);
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
    float* o = out + int64_t(h) * Dh;
    std::fill(o, o + Dh, 0.0f);
    for (int64_t j = 0; j < S; ++j) {
      LoadRow(kv.dtype, kv.v, ((pos_begin + j) % kv.capacity) * row + off, Dh, tmp);
      for (int d = 0; d < Dh; ++d) o[d] += sc[j] * tmp[d];
    }
    const float inv = float(1.0 / sum);
    for (int d = 0; d < Dh; ++d) o[d] *= inv;
  }
}

}  // namespace

HWY_EXPORT(AttendHeadsT);
HWY_EXPORT(AttendSplitSupportedT);
HWY_EXPORT(AttendScoresT);
HWY_EXPORT(AttendSoftmaxT);
HWY_EXPORT(AttendValuesT);

bool AttendSplitSupported(const AttentionShape& s, DType kv) {
  return HWY_DYNAMIC_DISPATCH(AttendSplitSupportedT)(s, kv);
}
void AttendScores(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                  int64_t pos_end, int64_t j0, int64_t j1, float* scores) {
  LUMEN_DCHECK(pos_end > pos_begin && pos_end - pos_begin <= kv.capacity);
  HWY_DYNAMIC_DISPATCH(AttendScoresT)(q, s, kv, pos_begin, pos_end, j0, j1, scores);
}
void AttendSoftmax(int64_t S, float* scores, int h0, int h1) {
  HWY_DYNAMIC_DISPATCH(AttendSoftmaxT)(S, scores, h0, h1);
}
void AttendValues(const AttentionShape& s, const KvRing& kv, int64_t pos_begin, int64_t pos_end,
                  int64_t j0, int64_t j1, const float* probs, float* out) {
  HWY_DYNAMIC_DISPATCH(AttendValuesT)(s, kv, pos_begin, pos_end, j0, j1, probs, out);
}

void StoreKv(const KvRing& kv, int64_t row_elems, int64_t pos, const float* k, const float* v) {
  const int64_t slot = pos % kv.capacity;
  StoreRow(kv.dtype, const_cast<void*>(kv.k), slot, row_elems, k);
  StoreRow(kv.dtype, const_cast<void*>(kv.v), slot, row_elems, v);
}

void AttendHeads(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
                 int64_t pos_end, float* out, float* scratch, int kv_head_begin, int kv_head_end) {
  LUMEN_DCHECK(pos_end > pos_begin && pos_end - pos_begin <= kv.capacity);
  if (!HWY_DYNAMIC_DISPATCH(AttendHeadsT)(q, s, kv, pos_begin, pos_end, out, scratch, kv_head_begin,
                                          kv_head_end))
    AttendScalar(q, s, kv, pos_begin, pos_end, out, scratch, kv_head_begin, kv_head_end);
}

void AttendOne(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
               int64_t pos_end, float* out, float* scratch) {
  AttendHeads(q, s, kv, pos_begin, pos_end, out, scratch, 0, s.n_kv_heads);
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
