// Prefill attention (attention.h AttendRows): one kv head and a block of
// query tokens per call, where AttendOne takes one token at a time.
//
// The call's query rows r = t * G + g (its tokens' G query heads of the kv
// head, at most kRows) share every K and V tile: keys go in tiles of kKeys
// positions at multiples of kKeys, each widened to f32 once per call and laid
// out as GemmTile panels (gemm-inl.h): K with the keys as columns, V with the
// head's dimensions as columns. Per tile:
//   S[r][j] = q_r . k_j     a GemmTile output: one FMA chain over the head dim
//   scale, soft cap, then -inf where row r does not see key j
//   online softmax per row: m' = max(m, max_j S), P = exp(S - m'),
//     l = l a + sum P and o *= a, with a = exp(m - m') (0 on a row's first tile)
//   o[r] += P[r] V          GemmTile over the tile's keys
// and out = o / l. Per-row dot products and their horizontal sums (AttendOne)
// become register tiles: 12 FMAs per 8 loads on AVX2. Tiles sit at absolute
// positions and a row's steps read only its own scores, so its bits do not
// depend on which tokens share the call or the thread.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/route.h"
#include "lumen/kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/attention_rows.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format off
#include <hwy/contrib/math/math-inl.h>  // per-target; must follow highway.h
// clang-format on

#include "lumen/kernels/attention-inl.h"
#include "lumen/kernels/gemm-inl.h"

#ifndef LUMEN_KERNELS_ATTENTION_ROWS_CC_ONCE
#define LUMEN_KERNELS_ATTENTION_ROWS_CC_ONCE
namespace lumen::kernels::attention_rows_detail {

inline constexpr int64_t kKeys = 64;      // keys per tile: a multiple of every panel width
inline constexpr int64_t kRows = 48;      // query rows per call: a multiple of every tile height
inline constexpr int64_t kMaxPanel = 32;  // the widest panel (AVX-512: 2 x 16 lanes)

// Scratch parts in floats, each starting on 64 bytes.
struct Layout {
  int64_t key_rows, key_panels, value_panels, scores, out, max, sum, zero, total;
};

inline Layout ScratchLayout(int64_t Dh) {
  Layout s;
  int64_t at = 0;
  auto take = [&at](int64_t n) {
    const int64_t p = at;
    at += (n + 15) / 16 * 16;
    return p;
  };
  s.key_rows = take(kKeys * Dh);
  s.key_panels = take(kKeys * Dh);
  s.value_panels = take(kKeys * (Dh + kMaxPanel));
  s.scores = take(kRows * kKeys);
  s.out = take(kRows * Dh);
  s.max = take(kRows);
  s.sum = take(kRows);
  s.zero = take(Dh + kMaxPanel);
  s.total = at;
  return s;
}

}  // namespace lumen::kernels::attention_rows_detail
#endif  // LUMEN_KERNELS_ATTENTION_ROWS_CC_ONCE

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {
using namespace attention_rows_detail;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// The first position a token at p sees.
HWY_INLINE int64_t FirstSeen(const AttentionRows& a, int64_t p) {
  return a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
}

// Keys [j0, j0 + kn) of kv head `off / Dh` widened into the panels: K's
// strip st (keys st * NR ..) at key_panels + st * Dh * NR, [Dh][NR]; V's strip
// s (dims s * NR ..) at value_panels + s * kKeys * NR, [kKeys][NR]. Keys
// before `lo` (no row of the call sees them; their slots may hold other
// positions) are zeros, not read.
template <DType T>
void WidenTile(const KvRing& kv, int64_t row, int64_t off, int64_t Dh, int64_t j0, int64_t kn,
               int64_t lo, const Layout& at, float* w) {
  const DF d;
  const int64_t L = hn::Lanes(d), NR = kGemmNV * L, dim_strips = (Dh + NR - 1) / NR;
  float* key_rows = w + at.key_rows;
  float* vp = w + at.value_panels;
  for (int64_t j = 0; j < kn; ++j) {
    float* k = key_rows + j * Dh;
    const bool seen = j0 + j >= lo;
    const int64_t slot_at = ((j0 + j) % kv.capacity) * row + off;
    for (int64_t e = 0; e < Dh; e += L)
      hn::StoreU(seen ? LoadKv<T>(kv.k, slot_at + e) : hn::Zero(d), d, k + e);
    for (int64_t s = 0; s < dim_strips; ++s)
      for (int v = 0; v < kGemmNV; ++v) {
        const int64_t e = s * NR + v * L;
        const VF x = seen && e < Dh ? LoadKv<T>(kv.v, slot_at + e) : hn::Zero(d);
        hn::Store(x, d, vp + s * kKeys * NR + j * NR + v * L);
      }
  }
  const float* zero = w + at.zero;
  for (int64_t st = 0; st * NR < kn; ++st)
    for (int v = 0; v < kGemmNV; ++v) {
      const float* src[hn::MaxLanes(d)];
      for (int64_t i = 0; i < L; ++i) {
        const int64_t key = st * NR + v * L + i;
        src[i] = key < kn ? key_rows + key * Dh : zero;
      }
      PackStrip(src, Dh, NR, w + at.key_panels + st * Dh * NR + v * L);
    }
}

// Row r's scores of this tile [0, kn) to probabilities against its running
// max; rescales its sum and output when the max grows. jlo < jhi: the keys it
// sees. Entries [kn, knv) are padding that ends as zeros.
HWY_INLINE void SoftmaxStep(const AttentionShape& s, float* sr, int64_t jlo, int64_t jhi,
                            int64_t knv, float& m, float& l, float* o, int64_t Dh) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t L = hn::Lanes(d);
  const VF scale = hn::Set(d, s.scale), neg_inf = hn::Set(d, kNegInf);
  const bool whole = jlo == 0 && jhi == knv;
  const auto lo = hn::Set(di, static_cast<int32_t>(jlo)),
             hi = hn::Set(di, static_cast<int32_t>(jhi));
  VF vmax = neg_inf;
  for (int64_t j = 0; j < knv; j += L) {
    VF v = hn::Mul(hn::LoadU(d, sr + j), scale);
    if (s.softcap > 0) {
      const VF cap = hn::Set(d, s.softcap), inv = hn::Set(d, 1.0f / s.softcap);
      v = hn::Mul(cap, hn::Tanh(d, hn::Mul(v, inv)));
    }
    if (!whole) {
      const auto at = hn::Iota(di, static_cast<int32_t>(j));
      v = hn::IfThenElse(hn::RebindMask(d, hn::And(hn::Not(hn::Lt(at, lo)), hn::Lt(at, hi))), v,
                         neg_inf);
    }
    hn::StoreU(v, d, sr + j);
    vmax = hn::Max(vmax, v);
  }
  const float m_new = std::max(m, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  const VF vm = hn::Set(d, m_new);
  VF vsum = hn::Zero(d);
  for (int64_t j = 0; j < knv; j += L) {
    const VF p = ExpZ(d, hn::Sub(hn::LoadU(d, sr + j), vm));
    hn::StoreU(p, d, sr + j);
    vsum = hn::Add(vsum, p);
  }
  const float part = hn::GetLane(hn::SumOfLanes(d, vsum));
  // The output and sum so far (zero before the row's first tile) rescale
  // only when the max grew.
  if (m_new > m && m != kNegInf) {
    const float a = std::exp(m - m_new);
    l = l * a + part;
    if (a != 1.0f) {
      const VF va = hn::Set(d, a);
      for (int64_t e = 0; e < Dh; e += L) hn::StoreU(hn::Mul(hn::LoadU(d, o + e), va), d, o + e);
    }
  } else {
    l += part;
  }
  m = m_new;
}

// y[r][0, cols) (first: =, else +=) x[r][0, K) times the panels, for rows
// [0, prows) (whole tiles): panel st (columns st * NR ..) at panels + st *
// stride, k-major [K][NR]. Both products of a key tile: the scores (panels
// of keys) and the output (panels of V's dimensions).
HWY_INLINE void TileProduct(const float* panels, int64_t stride, const float* const* x, int64_t K,
                            float* const* y, int64_t cols, int64_t prows, bool first) {
  const int64_t NR = kGemmNV * static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t r0 = 0; r0 < prows; r0 += kGemmMR)
    for (int64_t st = 0; st * NR < cols; ++st) {
      float* yt[kGemmMR];
      for (int i = 0; i < kGemmMR; ++i) yt[i] = y[r0 + i] + st * NR;
      GemmTile<kGemmMR, kGemmNV, false>(panels + st * stride, x + r0, 0, K, first, false, yt,
                                        std::min(NR, cols - st * NR), nullptr, nullptr, 0);
    }
}

template <DType T>
void RowsCall(const AttentionShape& s, const KvRing& kv, const AttentionRows& a, int kh, int64_t t0,
              int64_t t1, float* w) {
  const DF d;
  const int64_t L = hn::Lanes(d), NR = kGemmNV * L;
  const int G = s.n_heads / s.n_kv_heads;
  const int64_t Dh = s.head_dim, row = int64_t(s.n_kv_heads) * Dh, off = int64_t(kh) * Dh;
  const Layout at = ScratchLayout(Dh);
  const int64_t nrows = (t1 - t0) * G;
  const int64_t prows = (nrows + kGemmMR - 1) / kGemmMR * kGemmMR;  // whole tiles
  LUMEN_DCHECK(nrows > 0 && prows <= kRows);
  float* zero = w + at.zero;
  float* out = w + at.out;
  float* mx = w + at.max;
  float* sum = w + at.sum;
  std::fill(zero, zero + Dh + kMaxPanel, 0.0f);
  std::fill(out, out + prows * Dh, 0.0f);
  std::fill(mx, mx + prows, kNegInf);
  std::fill(sum, sum + prows, 0.0f);
  const float* q[kRows];
  float* sr[kRows];
  float* orow[kRows];
  int64_t tok[kRows];  // row r = t * G + g: token t (past nrows: padding, t1 - t0)
  int64_t head[kRows];
  for (int64_t r = 0, t = 0, g = 0; r < prows; ++r) {
    tok[r] = r < nrows ? t : t1 - t0;
    head[r] = int64_t(kh) * G + g;
    q[r] = r < nrows ? a.q + (t0 + t) * a.q_stride + head[r] * Dh : zero;
    sr[r] = w + at.scores + r * kKeys;
    orow[r] = out + r * Dh;
    if (++g == G) {
      g = 0;
      ++t;
    }
  }
  // FirstSeen grows with the position: the call's keys are [lo, hi).
  const int64_t lo = FirstSeen(a, a.pos0 + t0), hi = a.pos0 + t1;
  for (int64_t j0 = lo / kKeys * kKeys; j0 < hi; j0 += kKeys) {
    const int64_t kn = std::min(kKeys, hi - j0), knv = (kn + L - 1) / L * L;
    WidenTile<T>(kv, row, off, Dh, j0, kn, lo, at, w);
    TileProduct(w + at.key_panels, Dh * NR, q, Dh, sr, kn, prows, /*first=*/true);
    for (int64_t r = 0; r < prows; ++r) {
      const int64_t p = a.pos0 + t0 + tok[r];
      const int64_t jlo = std::clamp<int64_t>(FirstSeen(a, p) - j0, 0, kn);
      const int64_t jhi = r < nrows ? std::clamp<int64_t>(p + 1 - j0, 0, kn) : 0;
      if (jlo >= jhi) {
        std::fill(sr[r], sr[r] + knv, 0.0f);  // sees none of the tile (or padding)
        continue;
      }
      SoftmaxStep(s, sr[r], jlo, jhi, knv, mx[r], sum[r], orow[r], Dh);
    }
    TileProduct(w + at.value_panels, kKeys * NR, sr, kn, orow, Dh, prows, /*first=*/false);
  }
  for (int64_t r = 0; r < nrows; ++r) {
    float* dst = a.out + (t0 + tok[r]) * a.out_stride + head[r] * Dh;
    const VF inv = hn::Set(d, 1.0f / sum[r]);  // > 0: a row sees at least its own position
    for (int64_t e = 0; e < Dh; e += L)
      hn::StoreU(hn::Mul(hn::LoadU(d, orow[r] + e), inv), d, dst + e);
  }
}

}  // namespace

bool AttendRowsSupportedT(const AttentionShape& s, DType t) {
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) return false;
  if (s.n_heads / s.n_kv_heads > kRows || s.head_dim % int(hn::Lanes(DF())) != 0) return false;
  return ForKvType(t, []<DType>() { return true; });
}

void AttendRowsT(const AttentionShape& s, const KvRing& kv, const AttentionRows& a, int kh,
                 int64_t t0, int64_t t1, float* scratch) {
  const bool ok = ForKvType(kv.dtype, [&]<DType T>() {
    RowsCall<T>(s, kv, a, kh, t0, t1, scratch);
    return true;
  });
  LUMEN_CHECK(ok && "AttendRows: a KV type AttendRowsSupported refuses");
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

LUMEN_ROUTE(attn_prefill,
            {.node = "attn.prefill",
             .name = "gemm-tiles",
             .tier = Tier::kL2,
             .oracle = "AttendOneRef (attention_ref.h), one query row at a time",
             .bound = "the bound of attention_test.cc, plus 4 u per 64-key tile (the online "
                      "softmax's rescales)",
             .tests = "AttentionTest.RowsWithinBoundAndIndependentOfTheirCall;Stories260K."
                      "LogitsMatchRunC",
             .priority = 10});

HWY_EXPORT(AttendRowsSupportedT);
HWY_EXPORT(AttendRowsT);

bool AttendRowsSupported(const AttentionShape& s, DType kv) {
  return HWY_DYNAMIC_DISPATCH(AttendRowsSupportedT)(s, kv);
}

int64_t AttendRowsTokens(const AttentionShape& s) {
  return attention_rows_detail::kRows / (s.n_heads / s.n_kv_heads);
}

int64_t AttendRowsScratchFloats(const AttentionShape& s) {
  return attention_rows_detail::ScratchLayout(s.head_dim).total;
}

void AttendRows(const AttentionShape& s, const KvRing& kv, const AttentionRows& rows, int kv_head,
                int64_t t0, int64_t t1, float* scratch) {
  LUMEN_DCHECK(t0 < t1 && t1 - t0 <= AttendRowsTokens(s));
  LUMEN_DCHECK(reinterpret_cast<uintptr_t>(scratch) % 64 == 0);
  LUMEN_DCHECK(rows.pos0 + t1 - (rows.window > 0 ? rows.pos0 + t0 - rows.window + 1 : 0) <=
               kv.capacity);  // the ring holds every position the call reads
  HWY_DYNAMIC_DISPATCH(AttendRowsT)(s, kv, rows, kv_head, t0, t1, scratch);
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
