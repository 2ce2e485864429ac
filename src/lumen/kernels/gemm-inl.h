// Per-target pieces of the exact f32 product's outer-product GEMM (Highway):
// k-major weight panels and the register tile that runs over them. Included
// by matmul.cc inside its HWY_NAMESPACE; never outside src/lumen/kernels/.
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

#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

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

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
