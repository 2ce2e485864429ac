#include "lumen/kernels/matmul_q8_avx2.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/route.h"
#include "lumen/kernels/matmul_q8.h"

#include "lumen/kernels/matmul_q8_avx2_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace lumen::kernels {

LUMEN_ROUTE(matmul_int8_decode_avx2,
            {.node = "matmul.decode",
             .name = "int8-avx2",
             .tier = Tier::kL3,
             .oracle = "MatMulInt8Ref (same activation quantization, double accumulation); "
                       "as a replacement of the exact product: no oracle",
             .bound = "KL(exact || route) at most twice what Q8_0 weights cost",
             .tests = "MatMulInt8Avx2.MatchesOracleAndExactBound;MatMulInt8Avx2."
                      "ThreadsManyAndBatchesAreBitIdentical;QuantTypes.Int8RouteTracksExact",
             .measure = "docs/reference/performance.md#exactness",
             .when = "act=int8|int8+bf16 cpu=int8-avx2 int8=kernel",
             .priority = 15});
LUMEN_ROUTE(
    matmul_int8x2_decode_avx2,
    {.node = "matmul.decode",
     .name = "int8x2-avx2",
     .tier = Tier::kL2,
     .oracle = "MatMulInt8x2Ref (same two-level activation quantization, double "
               "accumulation); against the exact product: the activation rounding bound",
     .bound = "|y - y_exact| <= sum over blocks of (dx / 256) sum |w| (+ f32 slack); "
              "KL(exact || route) below a quarter of what Q8_0 weights cost",
     .tests = "MatMulInt8Avx2.MatchesOracleAndExactBound;MatMulInt8Avx2."
              "ThreadsManyAndBatchesAreBitIdentical;MatMulInt8Avx2.ExtremeCodesDoNotSaturate;"
              "MatMulInt8Avx2.MlxRowsWithinBoundBitIdenticalAndUnsaturated;"
              "RouteKl.Int8x2DecodeGateOnEveryWeightType;RouteKl."
              "Int8x2ShortPrefillPassesTheDefaultGate;RouteKl.Int8x2ShortPrefillGateOnMlx;"
              "MatMulInt8.RouteSelection",
     .measure = "docs/reference/performance.md#the-int8x2-decode-route-on-avx2",
     .when = "act=int8x2|int8x2+bf16 cpu=int8-avx2 int8=kernel",
     .priority = 15});

namespace int8_avx2 {
namespace {

// The nb blocks of the row x quantized (QuantizeBlockQ8, or QuantizeBlockQ8x2
// with the levels' codes together per block, as Acts::q), their scales (d, or
// d2), and the sums of q, or 256 q1 + q2, over each 4 elements (Acts::lanes).
void QuantizeWithSums(const float* x, int64_t nb, int levels, int8_t* q, float* d, int32_t* lanes);
// Each of the n 32-byte blocks at src with its even bytes first, then its odd
// ones, at dst.
void Deinterleave(const int8_t* src, int64_t n, int8_t* dst);

void Prepare(const float* X, int64_t M, int64_t ldx, int64_t K, int levels, int order, Acts* a) {
  const int64_t nb = K / kQK;
  a->levels = levels;
  a->order = order;
  a->nb = nb;
  a->q.resize(static_cast<size_t>(M * K * levels));
  a->d.resize(static_cast<size_t>(M * nb));
  a->s16.resize(static_cast<size_t>(M * 2 * nb));
  a->s32.resize(static_cast<size_t>(M * nb));
  a->lanes.resize(static_cast<size_t>(M * nb * 8));
  a->sums.resize(static_cast<size_t>(M * nb));
  for (int64_t m = 0; m < M; ++m) {
    QuantizeWithSums(X + m * ldx, nb, levels, a->q.data() + m * K * levels, a->d.data() + m * nb,
                     a->lanes.data() + m * nb * 8);
    for (int64_t b = 0; b < nb; ++b) {
      const int32_t* lane = a->lanes.data() + (m * nb + b) * 8;
      // at most 16 x 32639: exact in f32
      const int32_t half[2] = {lane[0] + lane[1] + lane[2] + lane[3],
                               lane[4] + lane[5] + lane[6] + lane[7]};
      const float d = a->d[m * nb + b];
      a->s16[m * 2 * nb + 2 * b] = d * static_cast<float>(half[0]);
      a->s16[m * 2 * nb + 2 * b + 1] = d * static_cast<float>(half[1]);
      a->s32[m * nb + b] = d * static_cast<float>(half[0] + half[1]);
      a->sums[m * nb + b] = half[0] + half[1];
    }
  }
  if (order == kMlx4Records || order == kMlx8Slices)
    for (int s = 0; s < 3; ++s) {
      const int64_t per = int64_t{1} << s, groups = nb >> s;
      if (nb % per != 0) continue;
      a->gsum[s].assign(static_cast<size_t>(M * groups), 0.0f);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < nb; ++b) a->gsum[s][m * groups + b / per] += a->s32[m * nb + b];
    }
  if (order == kNatural) return;
  // Chunks of `blocks` blocks: `lanes` runs of `run` elements, 4 bytes of each per record.
  const bool records = order != kSlices && order != kMlx8Slices, mlx = order == kMlx4Records;
  const int64_t blocks = records ? 8 : 4, run = records ? kQK : 16, lanes = 8, recs = run / 4;
  const int64_t end = order == kRecords ? K / kColsElems * kColsBlocks : nb / blocks * blocks;
  const int64_t chunk = blocks * kQK * levels;
  std::vector<int8_t> tmp(static_cast<size_t>(chunk));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b0 = 0; b0 < end; b0 += blocks) {
      int8_t* c = a->q.data() + (m * nb + b0) * kQK * levels;
      if (mlx) {
        Deinterleave(c, blocks * levels, tmp.data());
      } else {
        std::memcpy(tmp.data(), c, static_cast<size_t>(chunk));
      }
      for (int lv = 0; lv < levels; ++lv)
        for (int64_t r = 0; r < recs; ++r)
          for (int64_t l = 0; l < lanes; ++l) {
            // element of the chunk; natural: [block][level][32]
            const int64_t src = mlx ? MlxLaneBlock(l) : order == kMlx8Slices ? MlxLaneSlice(l) : l;
            const int64_t e = src * run + 4 * r;
            std::memcpy(c + (lv * recs + r) * 32 + l * 4,
                        tmp.data() + (e / kQK * levels + lv) * kQK + e % kQK, 4);
          }
      // The scales the MLX 4-bit kernel reads per lane, in the lanes' order.
      if (mlx) {
        float* d = a->d.data() + m * nb + b0;
        float t[8];
        for (int l = 0; l < 8; ++l) t[l] = d[MlxLaneBlock(l)];
        std::memcpy(d, t, sizeof t);
      }
    }
}

// W's format; false where no kernel reads its storage (or K is not whole blocks).
bool FmtOf(const Matrix& W, Fmt* f) {
  if (W.mlx_bits != 0) {
    auto flt = [](DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; };
    const int64_t G = W.mlx_group;
    *f = W.mlx_bits == 4 ? Fmt::kMlx4 : Fmt::kMlx8;
    return (W.mlx_bits == 4 || W.mlx_bits == 8) && (G == 32 || G == 64 || G == 128) &&
           W.k % G == 0 && flt(W.scales.dtype) && flt(W.biases.dtype) &&
           W.mlx_order != MlxOrder::kGroups;  // the VNNI kernels' order
  }
  for (const auto& s : kStorages)
    if (s.type == W.w.dtype) {
      *f = s.fmt;
      return W.k % Info(PlainOf(s.type)).block_elems == 0;
    }
  return false;
}

#if defined(__x86_64__)

// std::round (half away from zero) of v, clamped to +-127 as the scalar
// quantizers clamp; a NaN lane (0 x an infinite 1 / d) gives -127, as their
// NearestInt does.
LUMEN_AVX2 inline __m256 RoundClamp127(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
  const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
  const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_set1_ps(1.0f), sign)));
  return _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

// The 32 integer-valued floats of v[0..3] (within +-127) as bytes at q.
LUMEN_AVX2 inline void StoreBytes(const __m256* v, int8_t* q) {
  const __m256i a = _mm256_packs_epi32(_mm256_cvtps_epi32(v[0]), _mm256_cvtps_epi32(v[1]));
  const __m256i b = _mm256_packs_epi32(_mm256_cvtps_epi32(v[2]), _mm256_cvtps_epi32(v[3]));
  // packs interleave the 128-bit lanes: dwords 0, 4, 1, 5, ... back in order.
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b),
                                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
}

// QuantizeBlockQ8 (L = 1, returns d) or QuantizeBlockQ8x2 (L = 2, q2 at q +
// 32, returns d / 256) of the block at x, the same bits; blocks the vector
// rules do not cover (an inf or NaN; 256 / d overflowing) take the scalar ones.
template <int L>
LUMEN_AVX2 inline float QuantizeBlockAvx2(const float* x, int8_t* q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));  // a NaN lane keeps m: caught below
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float amax = _mm_cvtss_f32(h);
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f, id2 = d != 0 ? 256.0f * id : 0.0f;
  bool finite = amax <= std::numeric_limits<float>::max();
  for (int i = 0; i < 4 && finite; ++i)  // every lane ordered and within amax (no NaN)
    finite = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v[i], abs_mask), _mm256_set1_ps(amax),
                                              _CMP_LE_OQ)) == 0xFF;
  if (!finite || (L == 2 && !(id2 <= std::numeric_limits<float>::max())))
    return L == 1 ? QuantizeBlockQ8(x, q) : QuantizeBlockQ8x2(x, q, q + kQK);
  __m256 r1[4];
  for (int i = 0; i < 4; ++i) r1[i] = RoundClamp127(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
  StoreBytes(r1, q);
  if constexpr (L == 1) {
    return d;
  } else {
    __m256 r2[4];
    for (int i = 0; i < 4; ++i)
      r2[i] = RoundClamp127(
          _mm256_mul_ps(_mm256_fnmadd_ps(_mm256_set1_ps(d), r1[i], v[i]), _mm256_set1_ps(id2)));
    StoreBytes(r2, q + kQK);
    return d / 256;
  }
}

template <int L>
LUMEN_AVX2 void QuantizeWithSumsL(const float* x, int64_t nb, int8_t* q, float* d, int32_t* lanes) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    int8_t* qb = q + b * L * kQK;
    d[b] = QuantizeBlockAvx2<L>(x + b * kQK, qb);
    // Byte pairs (1 x q: no saturation), then pairs of those: the 4-element sums.
    __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, Load32(qb)), ones16);
    if constexpr (L == 2)
      s = _mm256_add_epi32(
          _mm256_slli_epi32(s, 8),
          _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, Load32(qb + kQK)), ones16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes + 8 * b), s);
  }
}

void QuantizeWithSums(const float* x, int64_t nb, int levels, int8_t* q, float* d, int32_t* lanes) {
  if (levels == 2) return QuantizeWithSumsL<2>(x, nb, q, d, lanes);
  QuantizeWithSumsL<1>(x, nb, q, d, lanes);
}

LUMEN_AVX2 void Deinterleave(const int8_t* src, int64_t n, int8_t* dst) {
  // Each 16-byte half: its even bytes, then its odd ones; then the halves' evens together.
  const __m256i halves = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  for (int64_t b = 0; b < n; ++b) {
    const __m256i v = _mm256_shuffle_epi8(Load32(src + kQK * b), halves);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + kQK * b),
                        _mm256_permute4x64_epi64(v, _MM_SHUFFLE(3, 1, 2, 0)));
  }
}

#else  // no x86: never covered

void QuantizeWithSums(const float*, int64_t, int, int8_t*, float*, int32_t*) { LUMEN_CHECK(false); }
void Deinterleave(const int8_t*, int64_t, int8_t*) { LUMEN_CHECK(false); }

#endif

}  // namespace
}  // namespace int8_avx2

using int8_avx2::Acts;
using int8_avx2::Fmt;
using int8_avx2::FmtOf;
using int8_avx2::MlxRowsFn;
using int8_avx2::RowsFn;

#if defined(__x86_64__)

bool CpuHasAvx2() {
  static const bool has = [] {  // CPU feature, fixed for the process
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return has;
}

LUMEN_AVX2 void QuantizeBlocksQ8Avx2(const float* x, int64_t nb, int8_t* q, float* d) {
  LUMEN_CHECK(CpuHasAvx2());
  for (int64_t b = 0; b < nb; ++b) d[b] = int8_avx2::QuantizeBlockAvx2<1>(x + b * kQK, q + b * kQK);
}

LUMEN_AVX2 void QuantizeBlocksQ8x2Avx2(const float* x, int64_t nb, int8_t* q1, int8_t* q2,
                                       float* d2) {
  LUMEN_CHECK(CpuHasAvx2());
  alignas(32) int8_t both[2 * kQK];
  for (int64_t b = 0; b < nb; ++b) {
    d2[b] = int8_avx2::QuantizeBlockAvx2<2>(x + b * kQK, both);
    std::memcpy(q1 + b * kQK, both, kQK);
    std::memcpy(q2 + b * kQK, both + kQK, kQK);
  }
}

#else  // no x86: never covered

bool CpuHasAvx2() { return false; }
void QuantizeBlocksQ8Avx2(const float*, int64_t, int8_t*, float*) { LUMEN_CHECK(false); }
void QuantizeBlocksQ8x2Avx2(const float*, int64_t, int8_t*, int8_t*, float*) { LUMEN_CHECK(false); }

#endif

bool Avx2Int8Covers(const Matrix& W) {
  Fmt f;
  return FmtOf(W, &f);
}

int64_t Avx2Int8MaxRows(const Matrix& W) {
  Fmt f;
  if (!FmtOf(W, &f)) return kInt8MaxRows;  // no kernel here: what the route selection assumes
  switch (int8_avx2::PlainFmt(f)) {
    case Fmt::kQ8_0:  // one vpmaddwd per record and level: the dearest per row
      return 12;
    case Fmt::kMlx8:  // the same, and lane work per 4 blocks (Q8_0: 8): even with the panels at 10
      return 10;
    case Fmt::kQ2K:  // file order 20; records (f) 24: int8x2 ahead by 5% at 24 rows, behind at 32
    case Fmt::kQ3K:
      return f == Fmt::kQ2KC || f == Fmt::kQ3KC ? 24 : 20;
    default:
      return 32;
  }
}

void MatMulManyInt8Avx2(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                        ThreadPool* pool) {
  LUMEN_CHECK(CpuHasAvx2());
  // Rows of X are taken four at a time: the decoded weights are shared by up
  // to four accumulators (and the 16 vector registers hold no more).
  constexpr int64_t kRowsPerPass = 4;
  Acts acts[2][int8_avx2::kOrders];  // by level count and order, prepared when an out needs one
  bool ready[2][int8_avx2::kOrders] = {};
  struct Plan {
    RowsFn fn[kRowsPerPass];
    MlxRowsFn mlx[kRowsPerPass];  // MLX rows (fn null)
    const Acts* acts;
  };
  std::vector<Plan> plans(outs.size());
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Matrix& w = *outs[i].w;
    Fmt f;
    LUMEN_CHECK(FmtOf(w, &f));
    const int levels = Int8Levels(w.route), order = int8_avx2::OrderOf(f);
    Acts& act = acts[levels - 1][order];
    if (!ready[levels - 1][order]) {
      int8_avx2::Prepare(X, M, ldx, w.k, levels, order, &act);
      ready[levels - 1][order] = true;
    }
    LUMEN_CHECK(act.nb * kQK == w.k);  // every out reads the same X
    plans[i].acts = &act;
    const bool mlx = f == Fmt::kMlx4 || f == Fmt::kMlx8;
    for (int mb = 1; mb <= kRowsPerPass; ++mb) {
      plans[i].fn[mb - 1] = mlx ? nullptr : int8_avx2::PickRows(f, levels, mb);
      plans[i].mlx[mb - 1] =
          mlx ? int8_avx2::PickMlxRows(f, static_cast<int>(w.mlx_group),
                                       w.mlx_order == MlxOrder::kRuns, levels, mb)
              : nullptr;
    }
    total += w.n;
  }
  auto fn = [&](int64_t b, int64_t e, int) {
    int64_t off = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const MatMulOut& o = outs[i];
      const int64_t lo = std::max<int64_t>(b - off, 0), hi = std::min<int64_t>(e - off, o.w->n);
      for (int64_t n = lo; n < hi; ++n) {
        const auto* row = o.w->w.row<const uint8_t>(n);
        for (int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
          const int64_t mb = std::min(kRowsPerPass, M - m0);
          float* y = o.y + m0 * o.ldy + n;
          if (plans[i].fn[mb - 1])
            plans[i].fn[mb - 1](row, *plans[i].acts, m0, y, o.ldy);
          else
            plans[i].mlx[mb - 1](*o.w, n, *plans[i].acts, m0, y, o.ldy);
        }
      }
      off += o.w->n;
    }
  };
  if (pool && total >= 32) {
    pool->ParallelForStealing(total, fn, 16);
  } else {
    fn(0, total, 0);
  }
}

}  // namespace lumen::kernels