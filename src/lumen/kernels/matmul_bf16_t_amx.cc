#include "lumen/kernels/matmul_bf16_t_amx.h"

#include <algorithm>

#include "lumen/core/check.h"
#include "lumen/kernels/amx_target.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"

// Blocking: four C tiles (2 blocks of 16 dY rows x 2 groups of 16 columns),
// two A tiles (dY rows, loaded straight from the bf16 rows) and two B tiles
// (the VNNI panel): per 32 rows of W, 4 tile loads feed 4 `tdpbf16ps`, all
// 8 tile registers in use. The driver (matmul_bf16_t.cc) keeps one panel of
// at most 512 KiB per thread in L2; the cache blocking below keeps a slice
// of it in L1. Every output sums n in order, 32 per instruction, whatever
// block it falls in (a reduction block continues the C tiles of the previous
// one exactly): neither the thread split, M's remainder nor the cache
// blocking changes a result (MatMulBf16AmxBlocking.*).

namespace lumen::kernels {

#if defined(LUMEN_AMX_X86)

LUMEN_INTRINSICS_BEGIN

namespace {

// A 16 x 16 C tile c ([16 rows of dX][16 columns], f32) into dX rows m0.. of
// its columns col..: the first mv rows and nv columns, added when accumulate.
LUMEN_AVX512 inline void StoreRows(const float* c, float* dX, int64_t ldx, int64_t m0, int64_t col,
                                   int mv, int nv, bool accumulate) {
  const __mmask16 keep = static_cast<__mmask16>((1u << nv) - 1);
  for (int j = 0; j < mv; ++j) {
    float* out = dX + (m0 + j) * ldx + col;
    __m512 v = _mm512_load_ps(c + 16 * j);
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, out));
    _mm512_mask_storeu_ps(out, keep, v);
  }
}

// The cache blocking, chosen by measurement (docs/experiments/
// compute-precision.md, "AMX kernels blocked for the cache"): the
// reduction in blocks of 8 steps (256 rows of W), dY 8 blocks (128 rows) and
// the panel 16 groups (256 columns, the driver's whole block) at a time.
// Within a reduction block, one pair of groups (2 B tiles x 8 steps, 16
// KiB) stays in L1 while the chunk's dY pairs stream past it from L2, where
// their slice (64 KiB) is reused by every pair of groups; the chunk's C
// tiles (at most 4 x 8 pairs of pairs, 128 KiB) wait in scratch between
// blocks. Unblocked, each block streamed its full reduction of both
// operands from L2 (64 KiB of dY and 64 KiB of panel per 2 x 2 block).
constexpr int64_t kKSteps = 8;
constexpr int64_t kMBlocks = 8;
constexpr int64_t kGBlocks = 16;

// NM blocks of 16 dY rows (from block mb) x NG groups of 16 columns (from
// g), over the steps [k, k + steps) of the ld / 32: the C tiles continue
// from acc unless k = 0, and go back to acc unless the steps end the
// reduction, where they are stored (or added) into dX.
template <int NM, int NG>
LUMEN_AMX void Block(const uint16_t* dyb, int64_t ld, const uint16_t* panel, int64_t k,
                     int64_t steps, float (*acc)[16 * 16], int64_t mb, int64_t g, int64_t M,
                     int64_t kn, float* dX, int64_t ldx, int64_t k0, bool accumulate) {
  const uint16_t* a0 = dyb + mb * kAmxRows * ld + k * 32;
  const uint16_t* b0 = panel + g * kAmxTGroup * ld + k * 512;
  const bool last = k + steps == ld / 32;
  alignas(64) float c[4][16 * 16];
  AmxTileBlock<NM, NG>(a0, a0 + kAmxRows * ld, ld, b0, b0 + kAmxTGroup * ld, steps,
                       k == 0 ? nullptr : acc, last ? c : acc);
  if (!last) return;
  auto count = [](int64_t left) { return static_cast<int>(left < 16 ? left : 16); };
  const int64_t m0 = mb * kAmxRows, m1 = m0 + kAmxRows;
  const int64_t j0 = g * kAmxTGroup, j1 = j0 + kAmxTGroup;
  const int mv0 = count(M - m0), nv0 = count(kn - j0);
  StoreRows(c[0], dX, ldx, m0, k0 + j0, mv0, nv0, accumulate);
  if constexpr (NG == 2) StoreRows(c[1], dX, ldx, m0, k0 + j1, mv0, count(kn - j1), accumulate);
  if constexpr (NM == 2) {
    const int mv1 = count(M - m1);
    StoreRows(c[2], dX, ldx, m1, k0 + j0, mv1, nv0, accumulate);
    if constexpr (NG == 2) StoreRows(c[3], dX, ldx, m1, k0 + j1, mv1, count(kn - j1), accumulate);
  }
}

// Block for the dY blocks b (and b + 1 when two_m) and the groups g (and
// g + 1 when two_g).
LUMEN_AMX inline void BlockAt(bool two_m, bool two_g, const uint16_t* dyb, int64_t ld,
                              const uint16_t* panel, int64_t k, int64_t steps,
                              float (*acc)[16 * 16], int64_t b, int64_t g, int64_t M, int64_t kn,
                              float* dX, int64_t ldx, int64_t k0, bool accumulate) {
  if (two_m && two_g)
    Block<2, 2>(dyb, ld, panel, k, steps, acc, b, g, M, kn, dX, ldx, k0, accumulate);
  else if (two_m)
    Block<2, 1>(dyb, ld, panel, k, steps, acc, b, g, M, kn, dX, ldx, k0, accumulate);
  else if (two_g)
    Block<1, 2>(dyb, ld, panel, k, steps, acc, b, g, M, kn, dX, ldx, k0, accumulate);
  else
    Block<1, 1>(dyb, ld, panel, k, steps, acc, b, g, M, kn, dX, ldx, k0, accumulate);
}

// The lanes of columns [k, k + 16) still inside [0, kn).
inline __mmask16 Live(int64_t kn, int64_t k) {
  const int64_t left = kn - k;
  return left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>(left > 0 ? (1u << left) - 1 : 0);
}

// Stores 16 columns of a row pair as bf16 pairs: lane 2j takes element j of
// a, lane 2j + 1 element j of b (after the conversion a's 16 values are the
// low half, b's the high).
LUMEN_AMX inline void StorePair(__m512 a, __m512 b, uint16_t* dst) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both));
}

}  // namespace

LUMEN_AMX void AmxPackTPair(const float* r0, const float* r1, int64_t kn, int64_t groups,
                            int64_t rows, int64_t p, uint16_t* panel) {
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k = g * kAmxTGroup;
    const __mmask16 live = Live(kn, k);
    const __m512 a = r0 ? _mm512_maskz_loadu_ps(live, r0 + k) : _mm512_setzero_ps();
    const __m512 b = r1 ? _mm512_maskz_loadu_ps(live, r1 + k) : _mm512_setzero_ps();
    StorePair(a, b, panel + g * kAmxTGroup * rows + p * 32);
  }
}

LUMEN_AMX void AmxPackTPairF16(const uint16_t* h0, const uint16_t* h1, int64_t kn, int64_t groups,
                               int64_t rows, int64_t p, uint16_t* panel) {
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k = g * kAmxTGroup;
    const __mmask16 live = Live(kn, k);
    const __m512 a =
        h0 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, h0 + k)) : _mm512_setzero_ps();
    const __m512 b =
        h1 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, h1 + k)) : _mm512_setzero_ps();
    StorePair(a, b, panel + g * kAmxTGroup * rows + p * 32);
  }
}

LUMEN_AMX void AmxBf16TPanelProduct(const uint16_t* dyb, int64_t M, int64_t ld,
                                    const uint16_t* panel, int64_t kn, float* dX, int64_t ldx,
                                    int64_t k0, bool accumulate) {
  LUMEN_CHECK(ld % kBf16RowAlign == 0);
  if (M <= 0 || kn <= 0) return;
  const int64_t steps_all = ld / 32;
  const int64_t groups = (kn + kAmxTGroup - 1) / kAmxTGroup;
  const int64_t mblocks = (M + kAmxRows - 1) / kAmxRows;
  // The reduction is split only where a chunk has more than one dY pair to
  // reuse the groups' slice: otherwise splitting buys nothing and costs the
  // C tiles' trips through scratch.
  const int64_t mpairs = (std::min(mblocks, kMBlocks) + 1) / 2;
  const int64_t gpairs = (std::min(groups, kGBlocks) + 1) / 2;
  TileScratch acc(steps_all > kKSteps && mblocks > 2 ? mpairs * gpairs * 4 : 0);
  AmxConfigureTiles();
  for (int64_t m0 = 0; m0 < mblocks; m0 += kMBlocks) {
    const int64_t m1 = std::min(mblocks, m0 + kMBlocks);
    const int64_t kb = m1 - m0 > 2 ? kKSteps : steps_all;
    for (int64_t g0 = 0; g0 < groups; g0 += kGBlocks) {
      const int64_t g1 = std::min(groups, g0 + kGBlocks);
      for (int64_t k = 0; k < steps_all; k += kb) {
        const int64_t steps = std::min(kb, steps_all - k);
        for (int64_t g = g0; g < g1; g += 2)
          for (int64_t b = m0; b < m1; b += 2) {
            float(*tiles)[16 * 16] =
                acc.tiles() ? acc.tiles() + ((b - m0) / 2 * gpairs + (g - g0) / 2) * 4 : nullptr;
            BlockAt(b + 1 < m1, g + 1 < g1, dyb, ld, panel, k, steps, tiles, b, g, M, kn, dX, ldx,
                    k0, accumulate);
          }
      }
    }
  }
  AmxReleaseTiles();
}

LUMEN_INTRINSICS_END

#else  // no x86 Linux: the kernel is never taken, so these are never called

void AmxPackTPair(const float*, const float*, int64_t, int64_t, int64_t, int64_t, uint16_t*) {
  LUMEN_CHECK(false);
}
void AmxPackTPairF16(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, int64_t,
                     uint16_t*) {
  LUMEN_CHECK(false);
}
void AmxBf16TPanelProduct(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, float*,
                          int64_t, int64_t, bool) {
  LUMEN_CHECK(false);
}

#endif

}  // namespace lumen::kernels
