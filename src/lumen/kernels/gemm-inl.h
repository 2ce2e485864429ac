// Per-target pieces of the exact f32 product's outer-product GEMM (Highway):
// k-major weight panels, the register tile that runs over them and the
// block sizes. Included by matmul.cc, matmul_t.cc and attention_rows.cc
// inside their HWY_NAMESPACE; never outside src/lumen/kernels/.
//
// The contract that matters to callers (matmul.h): every output is ONE f32
// FMA chain over k = 0, 1, ..., K-1 in order (acc = fma(x[m][k], w[n][k], acc)
// from +0), then, with the LoRA epilogue, r more terms of the same chain. The
// tile height, the column's place in its panel, the k-blocking (the chain is
// stored to Y and loaded back unchanged between k blocks) and the thread
// split change which outputs share a tile, never an output's chain: a row's
// bits do not depend on how many rows its call has.
#if defined(LUMEN_KERNELS_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LUMEN_KERNELS_GEMM_INL_H_
#undef LUMEN_KERNELS_GEMM_INL_H_
#else
#define LUMEN_KERNELS_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "lumen/core/cache_size.h"
#include "lumen/kernels/transpose16_avx512.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile: kGemmMR rows of X by NV vectors of W's rows (NR = NV lanes
// output columns), kGemmMR NV accumulators; NV = kGemmNV, or 1 where a
// thread has only a vector's worth of W's rows (LoRA's rank-r factors).
#if HWY_TARGET <= HWY_AVX3
constexpr int kGemmMR = 8;  // 16 accumulators + 2 panel vectors + 1 broadcast of 32 registers
#elif HWY_TARGET == HWY_AVX2
constexpr int kGemmMR = 6;  // 12 + 2 + 1 of 16
#else
constexpr int kGemmMR = 4;
#endif
constexpr int kGemmNV = 2;

// dst[j * ldd + i] = src[i][k + j] for i, j < lanes: one lanes x lanes block
// of NR row-major rows into k-major order. In registers on AVX-512 (16 x 16:
// 64 shuffles, transpose16_avx512.h) and AVX2 (8 x 8: 24); element by element elsewhere.
HWY_INLINE void TransposeBlock(const float* const* src, int64_t k, float* HWY_RESTRICT dst,
                               int64_t ldd) {
#if HWY_TARGET <= HWY_AVX3
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(_mm512_loadu_ps(src[i] + k));
  Transpose16x16(r);
  for (int j = 0; j < 16; ++j) _mm512_store_ps(dst + j * ldd, _mm512_castsi512_ps(r[j]));
#elif HWY_TARGET == HWY_AVX2
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src[i] + k);
  for (int g = 0; g < 2; ++g) {
    const __m256 a = r[4 * g], b = r[4 * g + 1], c = r[4 * g + 2], e = r[4 * g + 3];
    const __m256d lo0 = _mm256_castps_pd(_mm256_unpacklo_ps(a, b));
    const __m256d hi0 = _mm256_castps_pd(_mm256_unpackhi_ps(a, b));
    const __m256d lo1 = _mm256_castps_pd(_mm256_unpacklo_ps(c, e));
    const __m256d hi1 = _mm256_castps_pd(_mm256_unpackhi_ps(c, e));
    t[4 * g + 0] = _mm256_castpd_ps(_mm256_unpacklo_pd(lo0, lo1));
    t[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(lo0, lo1));
    t[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(hi0, hi1));
    t[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(hi0, hi1));
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_store_ps(dst + j * ldd, _mm256_permute2f128_ps(t[j], t[4 + j], 0x20));
    _mm256_store_ps(dst + (4 + j) * ldd, _mm256_permute2f128_ps(t[j], t[4 + j], 0x31));
  }
#else
  const int64_t L = hn::Lanes(hn::ScalableTag<float>());
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j) dst[j * ldd + i] = src[i][k + j];
#endif
}

// panel[k * NR + i] = rows[i][k] for i < lanes and k < kp (a multiple of the
// lanes): one vector-wide strip of columns of a k-major panel (rows of NR
// floats, 64-byte aligned) from lanes row-major rows, each readable up to kp.
HWY_INLINE void PackStrip(const float* const* rows, int64_t kp, int64_t NR,
                          float* HWY_RESTRICT panel) {
  const int64_t L = hn::Lanes(hn::ScalableTag<float>());
  for (int64_t k = 0; k < kp; k += L) TransposeBlock(rows, k, panel + k * NR, NR);
}

// The R x NR tile of outputs y[i][0, nr) over k in [k0, k1) of one k-major
// panel: each x[i][k] broadcast against the panel's NR values at k, one
// accumulator lane per output. first: the chains start at +0 (else they
// continue from y); last (with E): then the r epilogue terms, u[i][j] against
// B's k-major panel bp [r, NR]. Columns past nr go through a scratch tile, so
// Y is written only in [0, nr).
template <int R, int NV, bool E>
HWY_INLINE void GemmTile(const float* HWY_RESTRICT panel, const float* const* x, int64_t k0,
                         int64_t k1, bool first, bool last, float* const* y, int64_t nr,
                         const float* bp, const float* const* u, int64_t r) {
  using D = hn::ScalableTag<float>;
  using V = hn::Vec<D>;
  const D d;
  const int64_t L = hn::Lanes(d), NR = NV * L;
  const bool whole = nr == NR;
  HWY_ALIGN float tmp[R][NV * hn::MaxLanes(d)];
  V acc[R][NV];
  if (first) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = hn::Zero(d);
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float* src = y[i];
      if (!whole) {
        std::memcpy(tmp[i], y[i], nr * sizeof(float));
        src = tmp[i];
      }
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = hn::LoadU(d, src + v * L);
    }
  }
  const float* w = panel + k0 * NR;
  for (int64_t k = k0; k < k1; ++k, w += NR) {
    V wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) wv[v] = hn::Load(d, w + v * L);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const V xb = hn::Set(d, x[i][k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = hn::MulAdd(xb, wv[v], acc[i][v]);
    }
  }
  if constexpr (E) {
    if (last)
      for (int64_t j = 0; j < r; ++j) {
        V wv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) wv[v] = hn::LoadU(d, bp + j * NR + v * L);
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i) {
          const V ub = hn::Set(d, u[i][j]);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) acc[i][v] = hn::MulAdd(ub, wv[v], acc[i][v]);
        }
      }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    float* dst = whole ? y[i] : tmp[i];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[i][v], d, dst + v * L);
    if (!whole) std::memcpy(y[i], tmp[i], nr * sizeof(float));
  }
}

// The exact products' block sizes, per target as measured there: GemmRows'
// (bytes) and the transposed product's (MatMulTRows, MatMulTRange).
struct GemmBlocking {
  int64_t slice;        // a k block of one panel (KC NR floats), columns path
  int64_t x_rows;       // the X rows of one row block (bytes), columns path:
  bool x_per_slice;     // of one slice's KC columns (else of all K)
  int64_t panel_slice;  // a k block of one panel, panel path
  int64_t group;        // the decoded whole panels of one group, panel path
  int64_t t_cols;       // transposed: columns per block (a multiple of 512)
  int64_t t_rows;       // transposed: the dX rows of one row block (bytes)
};

// AVX-512 (Zen 5, Xeon: sessions 12-28): slices in L1, X blocks and panel
// groups of 1 MiB. AVX2 (Zen 2, a 512 KiB L2: session 35): a slice of a
// quarter of L2 (the whole K of a 2048-wide product) read from L2 keeps the
// FMAs as busy as a 16 KiB one from L1 there, and the work per slice and
// per tile (the decode and transposes once per row block, the Y tile's loads
// and stores) is paid once per panel, not once per 256 columns; X blocks of
// 4 L2 (256 rows at K = 2048) come from L3. The 512-token prefill rose 7-19%
// (performance.md, "Zen 2 a seventh time"). Those blocks are sized by the
// slice, so K = 8192 keeps 256-row blocks (not 64) and decodes each slice
// once per 256 rows, not four times (Q4_0 at M = 256, two threads: 150 ->
// 180-186 GFLOP/s; "Zen 2 a ninth time"); the AVX-512 blocks stay sized by
// K, as measured there (by the slice, their 1 MiB would grow to all of X).
// Transposed: column blocks of 2048 and dX row blocks of 1 MiB on AVX-512;
// on AVX2 a 128-row panel of a quarter of L2 where that is 512 columns or
// more, else 512 (Zen 2: 256 KiB panels, the training step 3-5% faster than
// with 2048), and half of L2.
HWY_INLINE GemmBlocking Blocking() {
#if HWY_TARGET == HWY_AVX2
  const int64_t l2 = L2CacheBytes();
  return {l2 / 4, 4 * l2, true,
          l2 / 4, l2 / 4, std::clamp<int64_t>(l2 / 4 / (128 * 4) / 512 * 512, 512, 2048),
          l2 / 2};
#else
  return {16 << 10, 1 << 20, false, 24 << 10, 1 << 20, 2048, 1 << 20};
#endif
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
