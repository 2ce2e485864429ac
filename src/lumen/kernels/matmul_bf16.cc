#include "lumen/kernels/matmul_bf16.h"

#include <algorithm>

#include "lumen/core/check.h"
#include "lumen/core/route.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/sum4_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LUMEN_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

// The microkernel is dot-shaped like the exact route's: 4 weight rows x MB
// activation rows, each accumulator a vector of partial sums along K (lane l
// of a 32-element step holds products 2l and 2l + 1), reduced at the end four
// accumulators at a time. Per 32 elements: 4 + MB loads and 4 MB dot
// instructions; MB = 6 (24 accumulators, 31 of the 32 vector registers) runs
// 15-25% faster than MB = 4 on Zen 5 (kernel bench, M = 256: Q4_0 289 -> 340
// GFLOP/s of a measured 387 peak), as each weight load feeds 6 dots, not 4.
// K runs in blocks of kBlockK so that the 6-row X group (24 KiB) stays in L1
// while the panel's rows stream from L2: at K = 8192 (FFN down) unblocked,
// the group was 96 KiB, twice L1, and the kernel ran 267 against 359 GFLOP/s
// at K = 2048 (Q4_0, M = 128, one thread; blocked: 318 at K = 8192).

namespace lumen::kernels {

LUMEN_ROUTE(
    matmul_bf16_prefill,
    {.node = "matmul.prefill",
     .name = "bf16-avx512",
     .tier = Tier::kL3,
     .oracle = "MatMulBf16Ref (both operands rounded to bf16, double accumulation); "
               "as a replacement of the exact product: no oracle",
     .bound = "KL(exact || route) below a quarter of what Q8_0 weights cost (the default gate)",
     .tests =
         "MatMulBf16.EveryTargetDtypeAndShapeWithinBound;MatMulBf16.RouteSelectionAndThreads;"
         "MatMulBf16.WithoutAmx;MatMulTest.ColumnGroupsGiveThePlainBitsOnTheExactAndBf16Routes;"
         "MatMulTest.AccumulateOverColumnSlicesContinuesTheProduct;FfnPieces."
         "GiveTheWholeWidthsLogits;"
         "RouteKl.Int8AndBf16RoutesCostAboutWhatQ8WeightsCost;RouteKl."
         "Bf16PrefillPassesTheDefaultGate",
     .measure = "docs/reference/performance.md#exactness",
     .when = "act=bf16|int8+bf16|int8x2+bf16 cpu=avx512bf16",
     .priority = 20});

#if defined(__x86_64__)

LUMEN_INTRINSICS_BEGIN

bool CpuHasBf16() {
  static const bool has = [] {  // CPU feature, fixed for the process
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}

namespace {

constexpr int64_t kBlockK = 2048;  // elements; a multiple of kBf16RowAlign

// y[j][0, nb) (+)= dot(x[j], w row i) over [k0, k1) for 4 weight rows at w
// (stride ld), MB activation rows.
template <int MB>
LUMEN_BF16 inline void Tile(const uint16_t* w, int64_t ld, int64_t k0, int64_t k1,
                            const uint16_t* const* x, float* const* y, int nb, bool accumulate) {
  __m512 acc[4][MB];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = k0; k < k1; k += kBf16RowAlign) {
    __m512bh xv[MB];
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) xv[j] = (__m512bh)_mm512_load_si512(x[j] + k);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512bh wv = (__m512bh)_mm512_load_si512(w + i * ld + k);
#pragma GCC unroll 8
      for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, xv[j]);
    }
  }
  const __mmask8 keep = static_cast<__mmask8>((1u << nb) - 1);
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j) {
    __m128 sum = SumLanes4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
    if (accumulate) sum = _mm_add_ps(sum, _mm_maskz_loadu_ps(keep, y[j]));
    _mm_mask_storeu_ps(y[j], keep, sum);
  }
}

template <int MB>
LUMEN_BF16 void Sweep(const uint16_t* panel, int64_t rows, const uint16_t* xb, int64_t m,
                      int64_t ld, int64_t k0, int64_t k1, float* Y, int64_t ldy, int64_t n0,
                      bool accumulate) {
  const uint16_t* x[MB];
  float* y[MB];
  for (int j = 0; j < MB; ++j) x[j] = xb + (m + j) * ld;
  for (int64_t i = 0; i < rows; i += 4) {
    for (int j = 0; j < MB; ++j) y[j] = Y + (m + j) * ldy + n0 + i;
    Tile<MB>(panel + i * ld, ld, k0, k1, x, y, static_cast<int>(rows - i < 4 ? rows - i : 4),
             accumulate);
  }
}

// Every activation row against the panel over [k0, k1).
LUMEN_BF16 void SweepAll(const uint16_t* panel, int64_t rows, const uint16_t* xb, int64_t M,
                         int64_t ld, int64_t k0, int64_t k1, float* Y, int64_t ldy, int64_t n0,
                         bool accumulate) {
  int64_t m = 0;
  // The 6-row X group stays in L1 while the panel's tiles stream from L2.
  for (; m + 6 <= M; m += 6) Sweep<6>(panel, rows, xb, m, ld, k0, k1, Y, ldy, n0, accumulate);
  switch (M - m) {
    case 5:
      return Sweep<5>(panel, rows, xb, m, ld, k0, k1, Y, ldy, n0, accumulate);
    case 4:
      return Sweep<4>(panel, rows, xb, m, ld, k0, k1, Y, ldy, n0, accumulate);
    case 3:
      return Sweep<3>(panel, rows, xb, m, ld, k0, k1, Y, ldy, n0, accumulate);
    case 2:
      return Sweep<2>(panel, rows, xb, m, ld, k0, k1, Y, ldy, n0, accumulate);
    case 1:
      return Sweep<1>(panel, rows, xb, m, ld, k0, k1, Y, ldy, n0, accumulate);
    default:
      return;
  }
}

}  // namespace

LUMEN_BF16 void ToBf16Padded(const float* src, int64_t n, int64_t padded, uint16_t* dst) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + k)));
  if (k < n) {
    const __mmask16 live = static_cast<__mmask16>((1u << (n - k)) - 1);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, src + k));
    _mm256_mask_storeu_epi16(dst + k, live, h);
    k = n;
  }
  for (; k < padded; ++k) dst[k] = 0;
}

void Bf16PanelProduct(const uint16_t* panel, int64_t rows, const uint16_t* xb, int64_t M,
                      int64_t ld, float* Y, int64_t ldy, int64_t n0, bool accumulate) {
  LUMEN_CHECK(ld % kBf16RowAlign == 0);
  for (int64_t k0 = 0; k0 < ld; k0 += kBlockK) {
    const int64_t k1 = std::min(ld, k0 + kBlockK);
    SweepAll(panel, rows, xb, M, ld, k0, k1, Y, ldy, n0, accumulate || k0 > 0);
  }
}

LUMEN_INTRINSICS_END

#else  // no x86: the route is never taken, so these are never called

bool CpuHasBf16() { return false; }
void ToBf16Padded(const float*, int64_t, int64_t, uint16_t*) { LUMEN_CHECK(false); }
void Bf16PanelProduct(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t,
                      int64_t, bool) {
  LUMEN_CHECK(false);
}

#endif

}  // namespace lumen::kernels
