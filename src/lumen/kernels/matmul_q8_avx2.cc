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
#include "lumen/kernels/prefetch.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define LUMEN_AVX2 __attribute__((target("avx2,fma,f16c")))
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
             .when = "act=int8|int8+bf16 cpu=avx2 int8=kernel",
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
     .when = "act=int8x2|int8x2+bf16 cpu=avx2 int8=kernel",
     .priority = 15});

namespace {

// Activation rows as the kernels read them: per row and 32-element block,
// the levels' codes together (level 1, then level 2), the block's scale, and
// the activation sums the offsets multiply.
struct Acts {
  int levels = 1;
  int order = 0;           // an Order (see Prepare)
  int64_t nb = 0;          // blocks per row
  std::vector<int8_t> q;   // [M][nb][levels][32]
  std::vector<float> d;    // [M][nb]: d (one level) or d2 = d / 256 (two)
  std::vector<float> s16;  // [M][2 nb]: d x sum over each 16-element half of (256 q1 + q2), or q
  std::vector<float> s32;  // [M][nb]: the same over the block
  // [M][nb][8]: the sums of (256 q1 + q2), or q, over each 4 elements: Q4_0 /
  // Q5_0's code shift is subtracted from the dot lanes in integers (exact, as
  // the VNNI kernels do), since d q x and d 8 x nearly cancel.
  std::vector<int32_t> lanes;
  std::vector<int32_t> sums;  // [M][nb]: the same over the block
  const int8_t* Q(int64_t m, int64_t b) const { return q.data() + (m * nb + b) * kQK * levels; }
  const float* D(int64_t m) const { return d.data() + m * nb; }
  const float* S16(int64_t m) const { return s16.data() + m * 2 * nb; }
  const float* S32(int64_t m) const { return s32.data() + m * nb; }
  const int32_t* Lanes(int64_t m, int64_t b) const { return lanes.data() + (m * nb + b) * 8; }
  const int32_t* Sums(int64_t m) const { return sums.data() + m * nb; }
};

// The activations' byte order. kRecords: the blocks of the row's whole
// 512-element groups are laid out for the column groups (core/repack.h) in
// chunks of 8 blocks (half a group): [level][record r (0..7)][lane l
// (block)][4 bytes], record r holding elements 4r .. 4r + 3 of each block,
// which is what a column group's column c holds in its low (r = c) or high
// (r = c + 4) nibbles, and Q8_0's column r; the blocks after the last group
// stay natural. kSlices: Q6_K's repacked super-blocks, in chunks of 4 blocks
// (128 elements): [level][record j (0..3)][lane l (16-element slice)][4
// bytes], record j holding elements 4j .. 4j + 3 of each slice. A chunk keeps
// its bytes' place in the row.
// kSuper: kRecords' chunks over the whole row (K-quant rows, whose blocks
// come in super-blocks of 8), for the Q2_K / Q3_K kernels, which move their
// codes into records in registers (Q23KRecordsRows).
// kMlx4Records: kSuper's chunks over the row's whole runs of 8 blocks, each
// block's elements first deinterleaved (the even ones, then the odd ones),
// for MLX 4-bit rows: record r of a block then holds elements 8 (r % 4) + 2 i
// + r / 4 (i = 0..3), the codes that dword r % 4 of the block's MLX bytes
// holds in its low (r < 4) or high nibbles (Mlx4RecordsRows).
// kMlx8Slices: kSlices' chunks over the row's whole runs of 4 blocks, for MLX
// 8-bit rows (Mlx8SlicesRows), with the lanes in another order (below).
enum Order { kNatural, kRecords, kSlices, kSuper, kMlx4Records, kMlx8Slices, kOrders };

// kMlx4Records' lane l holds block MlxLaneBlock(l) of its run (0, 2, 4, 6, 1,
// 3, 5, 7): the blocks a 4 x 4 dword transpose of four 32-byte loads leaves
// there (Mlx4RecordsRows); the run's d and s32 are in the same order.
constexpr int64_t MlxLaneBlock(int64_t l) { return l < 4 ? 2 * l : 2 * (l - 4) + 1; }
// kMlx8Slices' lane l holds 16-element slice MlxLaneSlice(l) of its chunk
// (block l % 4, half l / 4: 0, 2, 4, 6, 1, 3, 5, 7), what the same transpose
// of four blocks' 32 bytes leaves there; the chunk's s16 in the same order.
constexpr int64_t MlxLaneSlice(int64_t l) { return 2 * (l % 4) + l / 4; }

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
      // The scales and sums the MLX kernels read per lane, in the lanes' order.
      auto in_lane_order = [](float* v, int64_t (*src)(int64_t)) {
        float t[8];
        for (int l = 0; l < 8; ++l) t[l] = v[src(l)];
        std::memcpy(v, t, sizeof t);
      };
      if (mlx) {
        in_lane_order(a->d.data() + m * nb + b0, MlxLaneBlock);
        in_lane_order(a->s32.data() + m * nb + b0, MlxLaneBlock);
      }
      if (order == kMlx8Slices) in_lane_order(a->s16.data() + m * 2 * nb + 2 * b0, MlxLaneSlice);
    }
}

enum class Fmt {
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ2K,
  kQ3K,
  kQ4K,
  kQ5K,
  kQ6K,
  // MLX affine 4- and 8-bit (w = s q + b per group of 32, 64 or 128).
  kMlx4,
  kMlx8,
  // Column groups (core/repack.h), made at load where these kernels read them.
  kQ4_0C,
  kQ4_1C,
  kQ5_0C,
  kQ5_1C,
  kQ8_0C,
  kQ4KC,
  kQ5KC,
  kQ6KC,
  kQ2KC,  // Q2_K / Q3_K records: repacked a super-block at a time, as Q6_K
  kQ3KC,
  kQ5KP  // Q5_K column groups with the 5th bits in planes
};

constexpr Order OrderOf(Fmt f) {
  return f == Fmt::kQ2K || f == Fmt::kQ3K || f == Fmt::kQ2KC || f == Fmt::kQ3KC ? kSuper
         : f == Fmt::kQ6KC                                                      ? kSlices
         : f == Fmt::kMlx4                                                      ? kMlx4Records
         : f == Fmt::kMlx8                                                      ? kMlx8Slices
         : f >= Fmt::kQ4_0C                                                     ? kRecords
                                                                                : kNatural;
}

// The plain format of a column-group one.
constexpr Fmt PlainFmt(Fmt f) {
  switch (f) {
    case Fmt::kQ4_0C:
      return Fmt::kQ4_0;
    case Fmt::kQ4_1C:
      return Fmt::kQ4_1;
    case Fmt::kQ5_0C:
      return Fmt::kQ5_0;
    case Fmt::kQ5_1C:
      return Fmt::kQ5_1;
    case Fmt::kQ8_0C:
      return Fmt::kQ8_0;
    case Fmt::kQ4KC:
      return Fmt::kQ4K;
    case Fmt::kQ5KC:
    case Fmt::kQ5KP:
      return Fmt::kQ5K;
    case Fmt::kQ2KC:
      return Fmt::kQ2K;
    case Fmt::kQ3KC:
      return Fmt::kQ3K;
    default:
      return f;
  }
}

// Each storage the kernels read, and its format.
constexpr struct {
  DType type;
  Fmt fmt;
} kStorages[] = {{DType::kQ4_0, Fmt::kQ4_0},      {DType::kQ4_1, Fmt::kQ4_1},
                 {DType::kQ5_0, Fmt::kQ5_0},      {DType::kQ5_1, Fmt::kQ5_1},
                 {DType::kQ8_0, Fmt::kQ8_0},      {DType::kQ2_K, Fmt::kQ2K},
                 {DType::kQ3_K, Fmt::kQ3K},       {DType::kQ4_K, Fmt::kQ4K},
                 {DType::kQ5_K, Fmt::kQ5K},       {DType::kQ6_K, Fmt::kQ6K},
                 {DType::kQ4_0Cols, Fmt::kQ4_0C}, {DType::kQ4_1Cols, Fmt::kQ4_1C},
                 {DType::kQ5_0Cols, Fmt::kQ5_0C}, {DType::kQ5_1Cols, Fmt::kQ5_1C},
                 {DType::kQ8_0Cols, Fmt::kQ8_0C}, {DType::kQ4_KCols, Fmt::kQ4KC},
                 {DType::kQ5_KCols, Fmt::kQ5KC},  {DType::kQ6_KCols, Fmt::kQ6KC},
                 {DType::kQ2_KCols, Fmt::kQ2KC},  {DType::kQ3_KCols, Fmt::kQ3KC},
                 {DType::kQ5_KPlanes, Fmt::kQ5KP}};

constexpr DType TypeOf(Fmt f) {
  for (const auto& s : kStorages)
    if (s.fmt == f) return s.type;
  return DType::kF32;
}

// W's format; false where no kernel reads its storage (or K is not whole blocks).
// MLX rows convert their group scales and biases to f32 on the stack: at most
// this many groups per row (K up to 32768 at groups of 32).
constexpr int64_t kMlxMaxGroups = 1024;

bool FmtOf(const Matrix& W, Fmt* f) {
  if (W.mlx_bits != 0) {
    auto flt = [](DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; };
    const int64_t G = W.mlx_group;
    *f = W.mlx_bits == 4 ? Fmt::kMlx4 : Fmt::kMlx8;
    return (W.mlx_bits == 4 || W.mlx_bits == 8) && (G == 32 || G == 64 || G == 128) &&
           W.k % G == 0 && W.k / G <= kMlxMaxGroups && flt(W.scales.dtype) && flt(W.biases.dtype);
  }
  for (const auto& s : kStorages)
    if (s.type == W.w.dtype) {
      *f = s.fmt;
      return W.k % Info(PlainOf(s.type)).block_elems == 0;
    }
  return false;
}

// One weight row against activation rows m0 .. m0 + MB - 1: y[r * ldy].
using RowsFn = void (*)(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy);
// The same for MLX rows, which also read their row of W's scales and biases.
using MlxRowsFn = void (*)(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                           int64_t ldy);

#if defined(__x86_64__)

LUMEN_AVX2 inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

LUMEN_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LUMEN_AVX2 inline __m256i Load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

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

// Per int32 lane j: the sum over bytes 4j..4j+3 of w (256 q1 + q2), or of
// w q at one level; w unsigned and below 129, so no int16 pair saturates.
template <int L>
LUMEN_AVX2 inline __m256i Dot(__m256i w, const int8_t* xq) {
  const __m256i p1 = _mm256_maddubs_epi16(w, Load32(xq));
  if constexpr (L == 1) {
    return _mm256_madd_epi16(p1, _mm256_set1_epi16(1));
  } else {
    const __m256i p2 = _mm256_maddubs_epi16(w, Load32(xq + kQK));
    return _mm256_add_epi32(_mm256_madd_epi16(p1, _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(p2, _mm256_set1_epi16(1)));
  }
}

// The same for signed weight codes: |w| against x carrying w's sign (the
// activation codes stay within +-127, so negating them is exact; |-128| is
// the unsigned byte 128).
template <int L>
LUMEN_AVX2 inline __m256i DotSigned(__m256i w, const int8_t* xq) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i p1 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Load32(xq), w));
  if constexpr (L == 1) {
    return _mm256_madd_epi16(p1, _mm256_set1_epi16(1));
  } else {
    const __m256i p2 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Load32(xq + kQK), w));
    return _mm256_add_epi32(_mm256_madd_epi16(p1, _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(p2, _mm256_set1_epi16(1)));
  }
}

// A 4 x 4 dword transpose within each 128-bit half: dword k of t[c]'s half
// is dword c of v[k]'s.
LUMEN_AVX2 inline void TransposeDwords(const __m256i* v, __m256i* t) {
  const __m256i lo01 = _mm256_unpacklo_epi32(v[0], v[1]), hi01 = _mm256_unpackhi_epi32(v[0], v[1]);
  const __m256i lo23 = _mm256_unpacklo_epi32(v[2], v[3]), hi23 = _mm256_unpackhi_epi32(v[2], v[3]);
  t[0] = _mm256_unpacklo_epi64(lo01, lo23);
  t[1] = _mm256_unpackhi_epi64(lo01, lo23);
  t[2] = _mm256_unpacklo_epi64(hi01, hi23);
  t[3] = _mm256_unpackhi_epi64(hi01, hi23);
}

// Byte j = `value` where bit j of bits is set, else 0.
LUMEN_AVX2 inline __m256i BitBytes(uint32_t bits, char value) {
  // Byte j of each 64-bit quarter q reads byte q of bits; the mask picks its bit j % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(value));
}

// Byte l = `value` where bit j of bytes[l] is set, else 0.
LUMEN_AVX2 inline __m256i BitOfBytes(__m256i bytes, int j, char value) {
  const __m256i mask = _mm256_set1_epi8(static_cast<char>(1 << j));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(value));
}

// The legacy 32-element blocks: the codes (Q8_0 signed, the others unsigned)
// times each row's block, scaled by d_w d_x; Q4_0 / Q5_0's shift subtracted
// from the integer lanes, Q4_1 / Q5_1's m through the block sums.
template <Fmt F>
constexpr int64_t LegacyBytes() {
  return F == Fmt::kQ4_0   ? sizeof(BlockQ4_0)
         : F == Fmt::kQ4_1 ? sizeof(BlockQ4_1)
         : F == Fmt::kQ5_0 ? sizeof(BlockQ5_0)
         : F == Fmt::kQ5_1 ? sizeof(BlockQ5_1)
                           : sizeof(BlockQ8_0);
}

// w = d (q - 8), d (q - 16): the shift (a power of two) times the block's activation sum.
template <Fmt F>
constexpr int ShiftLog2() {
  return F == Fmt::kQ4_0 ? 3 : F == Fmt::kQ5_0 ? 4 : 0;
}

// Blocks [b_begin, b_end) of row w into acc (and off, Q4_1 / Q5_1's m terms).
template <Fmt F, int MB, int L>
LUMEN_AVX2 inline void LegacyBlocks(const uint8_t* w, const Acts& a, int64_t m0, int64_t b_begin,
                                    int64_t b_end, __m256* acc, float* off) {
  constexpr bool kMin = F == Fmt::kQ4_1 || F == Fmt::kQ5_1,
                 kFive = F == Fmt::kQ5_0 || F == Fmt::kQ5_1;
  constexpr int64_t kBytes = LegacyBytes<F>();
  constexpr int64_t kQh = kMin ? 4 : 2, kQs = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0);
  constexpr int kShiftLog2 = ShiftLog2<F>();
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = b_begin; b < b_end; ++b) {
    const uint8_t* blk = w + b * kBytes;
    if (b % 4 == 0) PrefetchAhead(blk, 4 * kBytes);
    const float dw = Half(blk);
    __m256i codes;
    if constexpr (F == Fmt::kQ8_0) {
      codes = Load32(blk + 2);
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs));
      codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4);
      if constexpr (kFive) {
        uint32_t qh;
        std::memcpy(&qh, blk + kQh, 4);
        codes = _mm256_or_si256(codes, BitBytes(qh, 0x10));
      }
    }
    const float mw = kMin ? Half(blk + 2) : 0.0f;
    for (int r = 0; r < MB; ++r) {
      const int8_t* xq = a.Q(m0 + r, b);
      __m256i i = F == Fmt::kQ8_0 ? DotSigned<L>(codes, xq) : Dot<L>(codes, xq);
      if constexpr (kShiftLog2 > 0)  // at most 16 x 4 x 32639 < 2^22: exact
        i = _mm256_sub_epi32(i, _mm256_slli_epi32(Load32(a.Lanes(m0 + r, b)), kShiftLog2));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(dw * a.D(m0 + r)[b]), acc[r]);
      if constexpr (kMin) off[r] += mw * a.S32(m0 + r)[b];
    }
  }
}

template <Fmt F, int MB, int L>
LUMEN_AVX2 void LegacyRows(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  __m256 acc[MB];
  float off[MB];
  for (int r = 0; r < MB; ++r) {
    acc[r] = _mm256_setzero_ps();
    off[r] = 0;
  }
  LegacyBlocks<F, MB, L>(w, a, m0, 0, a.nb, acc, off);
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]) + off[r];
}

// Q4_K / Q5_K's 8 6-bit scales and mins at q (GetScaleMinK4's packing: words
// u0, u1, u2) as d x scale and dmin x min, d and dmin the two f16 at dd.
// Unpacked in vector registers, four bytes per lane: the same unpacking in
// general registers, and its moves (and the f16s') to vector registers, cost
// a fifth of a Q4_K weight row on Zen 2. Reads 16 bytes at q.
LUMEN_AVX2 inline void ScalesMinsK4(const uint8_t* q, const uint8_t* dd, __m256* sc, __m256* mn) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));  // u0 u1 u2 -
  // Lanes 0, 1: scales 0-3 (u0 & 0x3F..), mins 0-3 (u1 & 0x3F..).
  const __m128i low = _mm_and_si128(x, _mm_set1_epi8(0x3F));
  // Lanes 0, 1: the top two bits of u0's, u1's bytes, at bits 4, 5.
  const __m128i top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(x, 6), _mm_set1_epi8(0x03)), 4);
  // Lanes 0, 1: u2's low and high nibbles.
  const __m128i u2 = _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 2, 2, 2));
  const __m128i nib =
      _mm_and_si128(_mm_blend_epi32(u2, _mm_srli_epi32(u2, 4), 0x2), _mm_set1_epi8(0x0F));
  // Scales 0-3, 4-7, mins 0-3, 4-7.
  const __m128i both = _mm_unpacklo_epi32(low, _mm_or_si128(nib, top));
  const __m128 f = _mm_cvtph_ps(_mm_loadu_si32(dd));  // d, dmin
  *sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(both)), _mm256_broadcastss_ps(f));
  *mn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(both, 8))),
                      _mm256_broadcastss_ps(_mm_movehdup_ps(f)));
}

// Q4_K / Q5_K: sub-block j of a super-block is activation block 8 sb + j.
template <bool kFive, int MB, int L>
LUMEN_AVX2 inline void Q45KSuperBlocks(const uint8_t* w, const Acts& a, int64_t m0,
                                       int64_t sb_begin, int64_t sb_end, __m256* acc) {
  constexpr int64_t kBytes = kFive ? sizeof(BlockQ5K) : sizeof(BlockQ4K), kQs = kFive ? 48 : 16;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = sb_begin; sb < sb_end; ++sb) {
    const uint8_t* blk = w + sb * kBytes;
    PrefetchAhead(blk, kBytes);
    __m256 sc, mn;
    ScalesMinsK4(blk + 4, blk, &sc, &mn);
    const int64_t b0 = sb * 8;
    alignas(32) float fs[MB][8];
    for (int r = 0; r < MB; ++r) {
      _mm256_store_ps(fs[r], _mm256_mul_ps(sc, _mm256_loadu_ps(a.D(m0 + r) + b0)));
      acc[r] = _mm256_fnmadd_ps(mn, _mm256_loadu_ps(a.S32(m0 + r) + b0), acc[r]);
    }
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = Load32(blk + 16);
    for (int k = 0; k < 4; ++k) {
      const __m256i raw = Load32(blk + kQs + 32 * k);
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        lo = _mm256_or_si256(lo, BitOfBytes(qh, 2 * k, 0x10));
        hi = _mm256_or_si256(hi, BitOfBytes(qh, 2 * k + 1, 0x10));
      }
      for (int r = 0; r < MB; ++r) {
        const __m256i il = Dot<L>(lo, a.Q(m0 + r, b0 + 2 * k));
        const __m256i ih = Dot<L>(hi, a.Q(m0 + r, b0 + 2 * k + 1));
        acc[r] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(il), _mm256_broadcast_ss(&fs[r][2 * k]), acc[r]);
        acc[r] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih), _mm256_broadcast_ss(&fs[r][2 * k + 1]), acc[r]);
      }
    }
  }
}

template <bool kFive, int MB, int L>
LUMEN_AVX2 void Q45KRows(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  __m256 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  Q45KSuperBlocks<kFive, MB, L>(w, a, m0, 0, a.nb / 8, acc);
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]);
}

// The K-quants with 16-element sub-blocks (Q2_K, Q3_K, Q6_K): each 32-element
// block's int16 pair sums 0-7 hold its first sub-block, 8-15 its second, so
// vpmaddwd by [s_a x 8, s_b x 8] applies the two sub-blocks' integer scales
// (level 1 by 256 s: the scale byte shuffled into each int16's high byte;
// level 2 by s: that shifted back, sign extended) and the block's eight int32
// lanes sum to its whole scaled dot, which one FMA by the activation scale
// adds; the super-block scale d multiplies the sum of its 8 blocks. sc8: the
// 16 integer sub-block scales (|256 s| <= 2^15, so every int32 sum is exact:
// at most 2 x (2 x 63 x 127) x 2^15 for Q6_K); mn_lo / mn_hi: the offsets (o =
// mn) per sub-block, through the activation sums of the 16-element halves;
// codes(k) gives block k's 32 codes. (Scales stored as floats and reloaded at
// other offsets missed store forwarding: a quarter of Q2_K's decode.)
template <int MB, int L, class Codes>
LUMEN_AVX2 inline void SixteensSuperBlock(__m128i sc8, float d, __m256 mn_lo, __m256 mn_hi,
                                          const Acts& a, int64_t m0, int64_t b0, __m256* acc,
                                          __m256* off, const Codes& codes) {
  const __m256i scales = _mm256_broadcastsi128_si256(sc8);
  // Two FMA chains per row, and the offsets in their own (off): with one chain
  // through every FMA of a row, one-row decode waited on FMA latency. (The
  // same for every MB: a row's sums may not depend on its batch.)
  constexpr int kChains = 2;
  __m256 part[MB][kChains];
  const int8_t* x[MB];
  for (int r = 0; r < MB; ++r) {
    for (int c = 0; c < kChains; ++c) part[r][c] = _mm256_setzero_ps();
    x[r] = a.Q(m0 + r, b0);
    const float* s16 = a.S16(m0 + r) + 2 * b0;
    off[r] = _mm256_fnmadd_ps(mn_lo, _mm256_loadu_ps(s16), off[r]);
    off[r] = _mm256_fnmadd_ps(mn_hi, _mm256_loadu_ps(s16 + 8), off[r]);
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m256i c = codes(k);
    // int16 j of 128-bit lane h: byte 2k + h of sc8 high, zero (0x80) low.
    const __m256i s256 = _mm256_shuffle_epi8(
        scales, _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((2 * k + 1) << 8) | 0x80)),
                                 _mm_set1_epi16(static_cast<int16_t>(((2 * k) << 8) | 0x80))));
    const __m256i s1 = _mm256_srai_epi16(s256, 8);
    for (int r = 0; r < MB; ++r) {
      const int8_t* xq = x[r] + k * L * kQK;
      const __m256i p1 = _mm256_maddubs_epi16(c, Load32(xq));
      __m256i i;
      if constexpr (L == 1) {
        i = _mm256_madd_epi16(p1, s1);
      } else {
        const __m256i p2 = _mm256_maddubs_epi16(c, Load32(xq + kQK));
        i = _mm256_add_epi32(_mm256_madd_epi16(p1, s256), _mm256_madd_epi16(p2, s1));
      }
      __m256& p = part[r][k % kChains];
      p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_broadcast_ss(a.D(m0 + r) + b0 + k), p);
    }
  }
  for (int r = 0; r < MB; ++r) {
    for (int w = kChains / 2; w >= 1; w /= 2)
      for (int c = 0; c < w; ++c) part[r][c] = _mm256_add_ps(part[r][c], part[r][c + w]);
    acc[r] = _mm256_fmadd_ps(part[r][0], _mm256_set1_ps(d), acc[r]);
  }
}

// The 16 signed bytes of sc8 as floats times k, in two vectors of 8.
LUMEN_AVX2 inline void SignedBytesTimes(__m128i sc8, __m256 k, __m256* lo, __m256* hi) {
  *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), k);
  *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))), k);
}

template <int MB, int L>
LUMEN_AVX2 void Q6KRows(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  __m256 acc[MB], off[MB];
  for (int r = 0; r < MB; ++r) acc[r] = off[r] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = w + sb * sizeof(BlockQ6K);
    PrefetchAhead(blk, sizeof(BlockQ6K));
    const float d = Half(blk + 208);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    __m256 mn_lo, mn_hi;
    SignedBytesTimes(sc8, _mm256_set1_ps(32 * d), &mn_lo, &mn_hi);  // w = d sc (q - 32)
    // Block k = 4 h + p: low bits from ql[64 h + 32 (p % 2)] (nibble p / 2),
    // high bits 2p of qh[32 h].
    SixteensSuperBlock<MB, L>(sc8, d, mn_lo, mn_hi, a, m0, sb * 8, acc, off, [&](int k) LUMEN_AVX2 {
      const int h = k / 4, p = k % 4;
      const __m256i ql = Load32(blk + 64 * h + 32 * (p % 2));
      const __m256i qh = Load32(blk + 128 + 32 * h);
      const __m256i lo = _mm256_and_si256(p < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
      // bits 2p, 2p + 1 of each qh byte to bits 4, 5 (shifts stay inside the byte under the mask)
      const __m256i hi = _mm256_and_si256(
          p == 3 ? _mm256_srli_epi16(qh, 2) : _mm256_slli_epi16(qh, 4 - 2 * p), m2);
      return _mm256_or_si256(lo, hi);
    });
  }
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(_mm256_add_ps(acc[r], off[r]));
}

// Q2_K and Q3_K against activations in super-block records (Prepare's kSuper
// order: record r of a super-block holds elements 4r .. 4r + 3 of each of its
// 8 blocks, lane l block l), the codes moved into the same order in
// registers: block l = 4n + j's codes are bits 2j of qs[32 n ..], so record r
// is dword r of qs half n over lanes 4n .. 4n + 3, shifted right by 2j in lane
// l; Q3_K's third bit of block l is bit l of hmask's dword r. Each lane then
// holds one block's products, as in the column groups: records 0-3 (the
// block's first sub-block) and 4-7 (its second) are summed as int16 (4 x 2 x
// 7 x 127 < 2^15) before one vpmaddwd each by the sub-blocks' integer scales
// (level 1 by 256 s), and the lane work is one conversion and one FMA per
// super-block. On CPUs whose vpmaddubsw and vpmaddwd share one port (Zen 2),
// the natural order's two vpmaddwd per block and level cost as much as the
// byte products. kRepacked: the super-block is in core/repack.h's records
// layout (the loader's kQ2_KCols / kQ3_KCols), so Q2_K's record 4 h + t is
// bits 2 t of qs half h: no transpose (one weight row 97 -> 80 ns in the
// experiment that motivated it); Q3_K's records are a mask or a shift and a
// mask of its three planes, records 6 and 7 two of each and an or (from the
// records' 2-bit fields and hmask bits, five instructions per record: one
// weight row 102 -> 91 ns).
template <bool kThree, bool kRepacked, int MB, int L>
LUMEN_AVX2 void Q23KRecordsRows(const uint8_t* w, const Acts& a, int64_t m0, float* y,
                                int64_t ldy) {
  constexpr int64_t kBytes = kThree ? sizeof(BlockQ3K) : sizeof(BlockQ2K), kQs = kThree ? 32 : 16;
  const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  // int16 pairs of lane l: scale byte 2l (first sub-block) or 2l + 1 in the high byte.
  const __m256i first = _mm256_setr_epi32(0x00800080, 0x02800280, 0x04800480, 0x06800680,
                                          0x08800880, 0x0A800A80, 0x0C800C80, 0x0E800E80);
  const __m256i second = _mm256_add_epi8(first, _mm256_set1_epi32(0x01000100));
  const __m128i lo4 = _mm_set1_epi8(0x0F);
  __m256 acc[MB], off[MB];
  for (int r = 0; r < MB; ++r) acc[r] = off[r] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = w + sb * kBytes;
    PrefetchAhead(blk, kBytes);
    __m128i sc8;
    __m256 mn_lo, mn_hi, d;  // d in every lane (its f16 loaded to a vector register: through
                             // a general one, Q2_K's d and dmin cost 5% of its decode)
    if constexpr (kThree) {  // w = d (sc - 32) (q - 4); Q3KScale's packing, in 64-bit words
      d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_loadu_si16(blk + 108)));
      uint64_t lo;
      uint32_t hi;
      std::memcpy(&lo, blk + 96, 8);
      std::memcpy(&hi, blk + 104, 4);
      constexpr uint64_t kLo4 = 0x0F0F0F0F0F0F0F0FULL;
      constexpr uint32_t kTwo = 0x03030303u;
      const uint64_t top_a = (hi & kTwo) | uint64_t((hi >> 2) & kTwo) << 32;
      const uint64_t top_b = ((hi >> 4) & kTwo) | uint64_t((hi >> 6) & kTwo) << 32;
      sc8 = _mm_sub_epi8(_mm_set_epi64x(static_cast<int64_t>(((lo >> 4) & kLo4) | top_b << 4),
                                        static_cast<int64_t>((lo & kLo4) | top_a << 4)),
                         _mm_set1_epi8(32));
      SignedBytesTimes(sc8, _mm256_mul_ps(d, _mm256_set1_ps(4.0f)), &mn_lo, &mn_hi);
    } else {  // w = d (sc & 15) q - dmin (sc >> 4)
      const __m128 dd = _mm_cvtph_ps(_mm_loadu_si32(blk + 80));  // d, dmin
      d = _mm256_broadcastss_ps(dd);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
      sc8 = _mm_and_si128(v, lo4);
      // dmin (sc >> 4), the bytes widened as they load (widening the
      // nibbles in a register cost 7% of a weight row)
      const __m256 k = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
      auto mins = [&](int at) LUMEN_AVX2 {
        const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + at));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(_mm256_cvtepu8_epi32(b8), 4)), k);
      };
      mn_lo = mins(0);
      mn_hi = mins(8);
    }
    const __m256i scales = _mm256_broadcastsi128_si256(sc8);
    const __m256i qs0 = Load32(blk + kQs), qs1 = Load32(blk + kQs + 32);
    __m256i hm = _mm256_setzero_si256();
    if constexpr (kThree) hm = Load32(blk);
    const int64_t b0 = sb * 8;
    __m256i isum[MB];
    for (int r = 0; r < MB; ++r) isum[r] = _mm256_setzero_si256();
    // Half h: records 4h .. 4h + 3, the blocks' sub-block h.
    for (int h = 0; h < 2; ++h) {
      __m256i codes[4];
      if constexpr (kRepacked && kThree) {  // planes 0, 1, 2: hm, qs0, qs1
        const __m256i m7 = _mm256_set1_epi8(7);
        if (h == 0) {
          codes[0] = _mm256_and_si256(hm, m7);
          codes[1] = _mm256_and_si256(_mm256_srli_epi16(hm, 3), m7);
          codes[2] = _mm256_and_si256(qs0, m7);
          codes[3] = _mm256_and_si256(_mm256_srli_epi16(qs0, 3), m7);
        } else {
          codes[0] = _mm256_and_si256(qs1, m7);
          codes[1] = _mm256_and_si256(_mm256_srli_epi16(qs1, 3), m7);
          codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(hm, 6), m3),
                                     _mm256_and_si256(_mm256_srli_epi16(qs1, 4), four));
          codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs0, 6), m3),
                                     _mm256_and_si256(_mm256_srli_epi16(qs1, 5), four));
        }
      } else if constexpr (kRepacked) {
        const __m256i q = h == 0 ? qs0 : qs1;
        codes[0] = _mm256_and_si256(q, m3);
        codes[1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
        codes[2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
        codes[3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
      } else {
        // Dwords 4h .. 4h + 3 of each qs half, shifted by 2j (j = 0..3) and
        // masked, then transposed 4 x 4 in each 128-bit lane: record 4h + t,
        // lane 4n + j = dword 4h + t of qs half n shifted by 2j. (A per-lane
        // variable shift after a dword broadcast costs two cycles per vpsrlvd
        // on Zen 2.) Q3_K's third bit of block 4n + j, bit 4n + j of the hmask
        // dword, is moved to bit 2 before the transpose: hmask's dwords 4h ..
        // 4h + 3 in both 128-bit lanes, the upper's shifted down 4 bits, then
        // bit j of each byte to bit 2 (16-bit shifts, masked per byte).
        const __m256i q = h == 0 ? _mm256_permute2x128_si256(qs0, qs1, 0x20)
                                 : _mm256_permute2x128_si256(qs0, qs1, 0x31);
        __m256i s[4] = {_mm256_and_si256(q, m3), _mm256_and_si256(_mm256_srli_epi16(q, 2), m3),
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), m3),
                        _mm256_and_si256(_mm256_srli_epi16(q, 6), m3)};
        if constexpr (kThree) {
          const __m256i hh = h == 0 ? _mm256_permute2x128_si256(hm, hm, 0x00)
                                    : _mm256_permute2x128_si256(hm, hm, 0x11);
          const __m256i hq = _mm256_blend_epi32(hh, _mm256_srli_epi16(hh, 4), 0xF0);
          s[0] = _mm256_or_si256(s[0], _mm256_and_si256(_mm256_slli_epi16(hq, 2), four));
          s[1] = _mm256_or_si256(s[1], _mm256_and_si256(_mm256_slli_epi16(hq, 1), four));
          s[2] = _mm256_or_si256(s[2], _mm256_and_si256(hq, four));
          s[3] = _mm256_or_si256(s[3], _mm256_and_si256(_mm256_srli_epi16(hq, 1), four));
        }
        TransposeDwords(s, codes);
      }
      // int16 pairs of lane l: 256 s of sub-block 2l + h in the high byte.
      const __m256i s256 = _mm256_shuffle_epi8(scales, h == 0 ? first : second);
      const __m256i s1v = _mm256_srai_epi16(s256, 8);
      for (int r = 0; r < MB; ++r) {
        const int8_t* x = a.Q(m0 + r, b0) + 128 * h;
        for (int lv = 0; lv < L; ++lv) {
          const int8_t* xl = x + 256 * lv;
          const __m256i sum =
              _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(codes[0], Load32(xl)),
                                                _mm256_maddubs_epi16(codes[1], Load32(xl + 32))),
                               _mm256_add_epi16(_mm256_maddubs_epi16(codes[2], Load32(xl + 64)),
                                                _mm256_maddubs_epi16(codes[3], Load32(xl + 96))));
          isum[r] =
              _mm256_add_epi32(isum[r], _mm256_madd_epi16(sum, L == 2 && lv == 0 ? s256 : s1v));
        }
      }
    }
    for (int r = 0; r < MB; ++r) {
      const __m256 scale = _mm256_mul_ps(d, _mm256_loadu_ps(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[r]);
      const float* s16 = a.S16(m0 + r) + 2 * b0;
      off[r] = _mm256_fnmadd_ps(mn_lo, _mm256_loadu_ps(s16), off[r]);
      off[r] = _mm256_fnmadd_ps(mn_hi, _mm256_loadu_ps(s16 + 8), off[r]);
    }
  }
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(_mm256_add_ps(acc[r], off[r]));
}

// The 8 lanes' dot products of 8 records of unsigned codes (below 16 where
// kRun is 8: 8 x 2 x 15 x 127 < 2^15) against the activation records at x
// (Prepare's [level][record][lane]): kRun records' int16 products summed
// before one vpmaddwd per level.
template <int L, int kRun>
LUMEN_AVX2 inline __m256i RecordsDot(const __m256i* codes, const int8_t* x) {
  __m256i i = _mm256_setzero_si256();
  for (int lv = 0; lv < L; ++lv) {
    const __m256i k = _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1);
    for (int q0 = 0; q0 < 8; q0 += kRun) {
      __m256i sum = _mm256_maddubs_epi16(codes[q0], Load32(x + 256 * lv + 32 * q0));
      for (int q = q0 + 1; q < q0 + kRun; ++q)
        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes[q], Load32(x + 256 * lv + 32 * q)));
      i = _mm256_add_epi32(i, _mm256_madd_epi16(sum, k));
    }
  }
  return i;
}

// Column groups (core/repack.h): each half group is 8 blocks (K-quants: 8
// sub-blocks, one super-block) in the 8 lanes of 8 code records, record r
// holding elements 4r .. 4r + 3 of each (Prepare's records order), so all of
// a lane's products belong to one block: the 4-bit records' int16 products
// are summed before one vpmaddwd per level (8 x 2 x 15 x 127 < 2^15; 5-bit
// codes four records at a time, Q8_0 one), and the lane work (conversion,
// scale, FMA) is paid once per 8 blocks, their scales one f16 vector. The
// blocks after the last group are plain.
template <Fmt C, int MB, int L>
LUMEN_AVX2 void ColsRows(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  constexpr Fmt F = PlainFmt(C);
  constexpr bool kK = F == Fmt::kQ4K || F == Fmt::kQ5K, kQ8 = F == Fmt::kQ8_0;
  constexpr bool kFive = F == Fmt::kQ5_0 || F == Fmt::kQ5_1 || F == Fmt::kQ5K;
  constexpr bool kMin = F == Fmt::kQ4_1 || F == Fmt::kQ5_1;
  constexpr DType kPlain = TypeOf(F);
  constexpr int64_t kGroupBytes = kK ? 2 * int64_t(kFive ? sizeof(BlockQ5K) : sizeof(BlockQ4K))
                                     : kColsBlocks * LegacyBytes<F>();
  constexpr int kRun = kQ8 ? 1 : kFive ? 4 : 8;  // records summed as int16
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const int64_t groups = a.nb / kColsBlocks;
  __m256 acc[MB];
  float off[MB];
  for (int r = 0; r < MB; ++r) {
    acc[r] = _mm256_setzero_ps();
    off[r] = 0;
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp = w + g * kGroupBytes;
    PrefetchAhead(grp, kGroupBytes);
    const ColsFields c = ColsFieldsAt(kPlain, grp);
    for (int h = 0; h < 2; ++h) {
      const int64_t b0 = g * kColsBlocks + 8 * h;
      __m256i codes[8], mag[8];  // mag: Q8_0's |w| (codes keep the signs)
      if constexpr (kQ8) {
        for (int q = 0; q < 8; ++q) {  // stored as w + 128
          codes[q] = _mm256_xor_si256(Load32(grp + c.codes + 64 * q + 32 * h),
                                      _mm256_set1_epi8(static_cast<char>(0x80)));
          mag[q] = _mm256_sign_epi8(codes[q], codes[q]);
        }
      } else {
        for (int col = 0; col < 4; ++col) {
          const __m256i v = Load32(grp + c.codes + 64 * col + 32 * h);
          codes[col] = _mm256_and_si256(v, m4);
          codes[col + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        if constexpr (C == Fmt::kQ5KP) {  // record q's 5th bits: bit q of the planes' bytes
          const __m256i v = Load32(grp + c.high + 32 * h);
          // Bit q moved to bit 4 (16-bit shifts: no other byte's bit lands there).
          const __m256i at4[8] = {_mm256_slli_epi16(v, 4),
                                  _mm256_slli_epi16(v, 3),
                                  _mm256_slli_epi16(v, 2),
                                  _mm256_slli_epi16(v, 1),
                                  v,
                                  _mm256_srli_epi16(v, 1),
                                  _mm256_srli_epi16(v, 2),
                                  _mm256_srli_epi16(v, 3)};
          for (int q = 0; q < 8; ++q)
            codes[q] = _mm256_or_si256(codes[q], _mm256_and_si256(at4[q], _mm256_set1_epi8(0x10)));
        } else if constexpr (kFive) {
          for (int q = 0; q < 8; ++q) {
            uint32_t bits;  // mask q, the bits of lanes 8h .. 8h + 7
            std::memcpy(&bits, grp + c.high + 8 * q + 4 * h, 4);
            codes[q] = _mm256_or_si256(codes[q], BitBytes(bits, 0x10));
          }
        }
      }
      __m256 sw, ow = _mm256_setzero_ps();  // per lane: w = sw q - ow (legacy m: + ow)
      if constexpr (kK) {
        ScalesMinsK4(grp + c.scales + 12 * h, grp + c.d + 4 * h, &sw, &ow);
      } else {
        sw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + c.d + 16 * h)));
        if constexpr (kMin)
          ow = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + c.m + 16 * h)));
      }
      for (int r = 0; r < MB; ++r) {
        const int8_t* x = a.Q(m0 + r, b0);
        __m256i i;
        if constexpr (kQ8) {
          i = _mm256_setzero_si256();
          for (int lv = 0; lv < L; ++lv)
            for (int q = 0; q < 8; ++q) {
              const __m256i xv = _mm256_sign_epi8(Load32(x + 256 * lv + 32 * q), codes[q]);
              const __m256i p = _mm256_maddubs_epi16(mag[q], xv);
              i = _mm256_add_epi32(
                  i, _mm256_madd_epi16(p, _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1)));
            }
        } else {
          i = RecordsDot<L, kRun>(codes, x);
        }
        if constexpr (ShiftLog2<F>() > 0)
          i = _mm256_sub_epi32(i, _mm256_slli_epi32(Load32(a.Sums(m0 + r) + b0), ShiftLog2<F>()));
        const __m256 scale = _mm256_mul_ps(sw, _mm256_loadu_ps(a.D(m0 + r) + b0));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[r]);
        if constexpr (kK)
          acc[r] = _mm256_fnmadd_ps(ow, _mm256_loadu_ps(a.S32(m0 + r) + b0), acc[r]);
        if constexpr (kMin)
          acc[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.S32(m0 + r) + b0), acc[r]);
      }
    }
  }
  if constexpr (kK) {
    Q45KSuperBlocks<kFive, MB, L>(w, a, m0, 2 * groups, a.nb / 8, acc);
  } else {
    LegacyBlocks<F, MB, L>(w, a, m0, groups * kColsBlocks, a.nb, acc, off);
  }
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]) + off[r];
}

// Q6_K repacked (core/repack.h: every super-block in place): lane l of a
// half super-block's 4 records is its 16-element slice 8h + l (a sub-block,
// with its own scale), record j elements 4j .. 4j + 3 of each slice (Prepare's
// kSlices order); two records' int16 products are summed before vpmaddwd (2
// x 2 x 63 x 127 < 2^15).
template <int MB, int L>
LUMEN_AVX2 void Q6SlicesRows(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  const __m256i pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  __m256 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < a.nb / 8; ++sb) {
    const uint8_t* blk = w + sb * sizeof(BlockQ6K);
    PrefetchAhead(blk, sizeof(BlockQ6K));
    const float d = Half(blk + 208);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    for (int h = 0; h < 2; ++h) {
      const __m256 sw = _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h == 0 ? sc8 : _mm_srli_si128(sc8, 8))),
          _mm256_set1_ps(d));
      const __m256 ow = _mm256_mul_ps(sw, _mm256_set1_ps(32.0f));  // w = d sc (q - 32)
      const __m256i v0 = Load32(blk + 32 * h), v1 = Load32(blk + 64 + 32 * h);
      const __m256i hb = Load32(blk + 128 + 32 * h);
      // Record j: low bits from vector j % 2 (nibble j / 2), high bits 2j of hb
      // moved to bits 4, 5 (shifts stay inside the byte under the mask).
      const __m256i codes[4] = {
          _mm256_or_si256(_mm256_and_si256(v0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m2)),
          _mm256_or_si256(_mm256_and_si256(v1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), _mm256_and_si256(hb, m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), m2))};
      const int64_t b0 = sb * 8 + 4 * h;  // the half's four activation blocks
      for (int r = 0; r < MB; ++r) {
        const int8_t* x = a.Q(m0 + r, b0);
        __m256i i = _mm256_setzero_si256();
        for (int lv = 0; lv < L; ++lv) {
          const __m256i k = _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1);
          for (int j = 0; j < 4; j += 2) {
            const __m256i sum = _mm256_add_epi16(
                _mm256_maddubs_epi16(codes[j], Load32(x + 128 * lv + 32 * j)),
                _mm256_maddubs_epi16(codes[j + 1], Load32(x + 128 * lv + 32 * j + 32)));
            i = _mm256_add_epi32(i, _mm256_madd_epi16(sum, k));
          }
        }
        // Slices 2k and 2k + 1 are activation block b0 + k.
        const __m256 dx =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(a.D(m0 + r) + b0)), pairs);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, dx), acc[r]);
        acc[r] = _mm256_fnmadd_ps(ow, _mm256_loadu_ps(a.S16(m0 + r) + 2 * b0), acc[r]);
      }
    }
  }
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]);
}

// n f16 / bf16 / f32 values at src as floats (an MLX row's scales or
// biases): f16 and bf16 eight at a time, the rest by DequantizeRow (whose
// scalar conversion per value cost a quarter of an MLX row's time).
LUMEN_AVX2 inline void GroupFloats(DType t, const void* src, int64_t n, float* dst) {
  const auto* h = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  if (t != DType::kF32)
    for (; i + 8 <= n; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * i));
      _mm256_storeu_ps(dst + i, t == DType::kF16 ? _mm256_cvtph_ps(v)
                                                 : _mm256_castsi256_ps(_mm256_slli_epi32(
                                                       _mm256_cvtepu16_epi32(v), 16)));
    }
  if (i < n) DequantizeRow(t, h + Info(t).block_bytes * i, dst + i, n - i);
}

// One activation block b of an MLX row (w = s q + o in its group) into acc[r]
// and off[r] for rows m0 .. m0 + MB - 1, in natural order (the blocks after a
// row's last whole run). 4-bit: byte j holds elements 2j (low nibble) and 2j +
// 1, so the block's 16 bytes' nibbles are interleaved back into element order;
// 8-bit: codes up to 255 would saturate vpmaddubsw's int16 pairs (2 x 255 x
// 127), so they go in as q - 128 (a signed byte: magnitudes against the
// activations carrying the signs, as Q8_0) and 128 x the activation lane sums
// come back in integers (exact: at most 32 x 128 x 32639 per lane); the bias
// multiplies the activation block sum.
template <int kBits, int MB, int L>
LUMEN_AVX2 inline void MlxBlock(const uint8_t* row, const Acts& a, int64_t m0, int64_t b, float s,
                                float o, __m256* acc, float* off) {
  __m256i codes;
  if constexpr (kBits == 4) {
    const uint8_t* blk = row + b * (kQK / 2);
    if (b % 4 == 0) PrefetchAhead(blk, 64);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    codes = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  } else {
    const uint8_t* blk = row + b * kQK;
    if (b % 2 == 0) PrefetchAhead(blk, 64);
    codes = _mm256_xor_si256(Load32(blk), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  for (int r = 0; r < MB; ++r) {
    const int8_t* xq = a.Q(m0 + r, b);
    __m256i i;
    if constexpr (kBits == 4) {
      i = Dot<L>(codes, xq);
    } else {
      i = _mm256_add_epi32(DotSigned<L>(codes, xq),
                           _mm256_slli_epi32(Load32(a.Lanes(m0 + r, b)), 7));
    }
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s * a.D(m0 + r)[b]), acc[r]);
    off[r] += o * a.S32(m0 + r)[b];
  }
}

// An MLX row's group scales and biases as floats (the kernels read eight
// from a run's first group, so eight zeros follow), the block -> group shift,
// and the group of each lane of a run whose lane l holds block lane_block(l),
// relative to the group of the run's first block.
struct MlxGroups {
  int shift;
  __m256i spread;
  float sc[kMlxMaxGroups + 8], bias[kMlxMaxGroups + 8];
};

LUMEN_AVX2 inline void LoadMlxGroups(const Matrix& W, int64_t n, int64_t (*lane_block)(int64_t),
                                     MlxGroups* g) {
  const int64_t groups = W.k / W.mlx_group;
  g->shift = W.mlx_group == 32 ? 0 : W.mlx_group == 64 ? 1 : 2;
  alignas(32) int32_t spread[8];
  for (int l = 0; l < 8; ++l) spread[l] = static_cast<int32_t>(lane_block(l) >> g->shift);
  g->spread = _mm256_load_si256(reinterpret_cast<const __m256i*>(spread));
  GroupFloats(W.scales.dtype, W.scales.row(n), groups, g->sc);
  GroupFloats(W.biases.dtype, W.biases.row(n), groups, g->bias);
  std::fill_n(g->sc + groups, 8, 0.0f);
  std::fill_n(g->bias + groups, 8, 0.0f);
}

// MLX 4-bit rows against kMlx4Records activations: each whole run of 8
// blocks (128 code bytes) is transposed in registers, so that lane l of
// vector c is dword c of block MlxLaneBlock(l) (elements 8c .. 8c + 7, the
// even ones in the low nibbles); with the activations deinterleaved and in
// that lane order (Prepare), every product of a lane belongs to one block,
// and the lane work (conversion, scales, FMA, the biases through the block
// sums) is paid once per 8 blocks, as for the column groups, with no
// load-time rewrite (every other reader sees the file's bytes). A run's 4
// loads and 8 unpacks replace the natural kernel's per-block shuffles and
// scalar scale products (row 161 -> 91 ns at K = 2048 on Zen 2). The blocks
// after the last whole run take MlxBlock.
template <int MB, int L>
LUMEN_AVX2 void Mlx4RecordsRows(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                                int64_t ldy) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  MlxGroups g;
  LoadMlxGroups(W, n, MlxLaneBlock, &g);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MB];
  float off[MB] = {};
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t runs = a.nb / 8;
  for (int64_t u = 0; u < runs; ++u) {
    const int64_t b0 = 8 * u;
    const uint8_t* p = row + b0 * (kQK / 2);
    PrefetchAhead(p, 128);
    __m256i v[4], t[4];  // v[k]: blocks 2k and 2k + 1
    for (int k = 0; k < 4; ++k) v[k] = Load32(p + 32 * k);
    TransposeDwords(v, t);
    __m256i codes[8];
    for (int c = 0; c < 4; ++c) {
      codes[c] = _mm256_and_si256(t[c], m4);
      codes[c + 4] = _mm256_and_si256(_mm256_srli_epi16(t[c], 4), m4);
    }
    const int64_t g0 = b0 >> g.shift;
    const __m256 sw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.sc + g0), g.spread);
    const __m256 ow = _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.bias + g0), g.spread);
    for (int r = 0; r < MB; ++r) {
      const __m256i i = RecordsDot<L, 8>(codes, a.Q(m0 + r, b0));
      const __m256 scale = _mm256_mul_ps(sw, _mm256_loadu_ps(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[r]);
      acc[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.S32(m0 + r) + b0), acc[r]);
    }
  }
  for (int64_t b = 8 * runs; b < a.nb; ++b)
    MlxBlock<4, MB, L>(row, a, m0, b, g.sc[b >> g.shift], g.bias[b >> g.shift], acc, off);
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]) + off[r];
}

// Lane l of a kMlx8Slices chunk holds block l % 4.
constexpr int64_t MlxSliceBlock(int64_t l) { return MlxLaneSlice(l) / 2; }

// MLX 8-bit rows against kMlx8Slices activations: the four blocks of a run
// (128 code bytes) transposed in registers within 128-bit halves, so that
// lane l of vector c is dword c + 4 (l / 4) of block l % 4 (slice
// MlxLaneSlice(l)): a lane's products belong to one half block. The codes go
// in as q - 128, as MlxBlock's (one vpmaddwd per record and level: two
// records' int16 pairs could overflow), and the 128 comes back with the bias:
// w = s (q - 128) + (b + 128 s), the second term through the slices' sums. The
// lane work is paid once per 4 blocks where MlxBlock pays it per block. The
// blocks after the last whole run take MlxBlock.
template <int MB, int L>
LUMEN_AVX2 void Mlx8SlicesRows(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                               int64_t ldy) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  MlxGroups g;
  LoadMlxGroups(W, n, MlxSliceBlock, &g);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[MB];
  float off[MB] = {};
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t runs = a.nb / 4;
  for (int64_t u = 0; u < runs; ++u) {
    const int64_t b0 = 4 * u;
    const uint8_t* p = row + b0 * kQK;
    PrefetchAhead(p, 128);
    __m256i v[4], codes[4], mag[4];  // v[k]: block k, as q - 128
    for (int k = 0; k < 4; ++k) v[k] = _mm256_xor_si256(Load32(p + 32 * k), flip);
    TransposeDwords(v, codes);
    for (int c = 0; c < 4; ++c) mag[c] = _mm256_sign_epi8(codes[c], codes[c]);
    const int64_t g0 = b0 >> g.shift;
    const __m256 sw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.sc + g0), g.spread);
    const __m256 ow =
        _mm256_fmadd_ps(sw, _mm256_set1_ps(128.0f),
                        _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.bias + g0), g.spread));
    for (int r = 0; r < MB; ++r) {
      const int8_t* x = a.Q(m0 + r, b0);
      __m256i i = _mm256_setzero_si256();
      for (int lv = 0; lv < L; ++lv)
        for (int c = 0; c < 4; ++c) {
          const __m256i xv = _mm256_sign_epi8(Load32(x + 128 * lv + 32 * c), codes[c]);
          i = _mm256_add_epi32(i,
                               _mm256_madd_epi16(_mm256_maddubs_epi16(mag[c], xv),
                                                 _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1)));
        }
      const __m256 dx = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, dx), acc[r]);
      acc[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.S16(m0 + r) + 2 * b0), acc[r]);
    }
  }
  for (int64_t b = 4 * runs; b < a.nb; ++b)
    MlxBlock<8, MB, L>(row, a, m0, b, g.sc[b >> g.shift], g.bias[b >> g.shift], acc, off);
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]) + off[r];
}

template <int MB, int L>
MlxRowsFn PickMlxRows(Fmt f) {
  return f == Fmt::kMlx4 ? Mlx4RecordsRows<MB, L> : Mlx8SlicesRows<MB, L>;
}

MlxRowsFn PickMlx(Fmt f, int levels, int mb) {
  switch (mb) {
    case 1:
      return levels == 2 ? PickMlxRows<1, 2>(f) : PickMlxRows<1, 1>(f);
    case 2:
      return levels == 2 ? PickMlxRows<2, 2>(f) : PickMlxRows<2, 1>(f);
    case 3:
      return levels == 2 ? PickMlxRows<3, 2>(f) : PickMlxRows<3, 1>(f);
    default:
      return levels == 2 ? PickMlxRows<4, 2>(f) : PickMlxRows<4, 1>(f);
  }
}

template <int MB, int L>
RowsFn PickRows(Fmt f) {
  switch (f) {
    case Fmt::kQ4_0:
      return LegacyRows<Fmt::kQ4_0, MB, L>;
    case Fmt::kQ4_1:
      return LegacyRows<Fmt::kQ4_1, MB, L>;
    case Fmt::kQ5_0:
      return LegacyRows<Fmt::kQ5_0, MB, L>;
    case Fmt::kQ5_1:
      return LegacyRows<Fmt::kQ5_1, MB, L>;
    case Fmt::kQ8_0:
      return LegacyRows<Fmt::kQ8_0, MB, L>;
    case Fmt::kQ2K:
      return Q23KRecordsRows<false, false, MB, L>;
    case Fmt::kQ3K:
      return Q23KRecordsRows<true, false, MB, L>;
    case Fmt::kQ2KC:
      return Q23KRecordsRows<false, true, MB, L>;
    case Fmt::kQ3KC:
      return Q23KRecordsRows<true, true, MB, L>;
    case Fmt::kQ4K:
      return Q45KRows<false, MB, L>;
    case Fmt::kQ5K:
      return Q45KRows<true, MB, L>;
    case Fmt::kQ6K:
      return Q6KRows<MB, L>;
    case Fmt::kQ4_0C:
      return ColsRows<Fmt::kQ4_0C, MB, L>;
    case Fmt::kQ4_1C:
      return ColsRows<Fmt::kQ4_1C, MB, L>;
    case Fmt::kQ5_0C:
      return ColsRows<Fmt::kQ5_0C, MB, L>;
    case Fmt::kQ5_1C:
      return ColsRows<Fmt::kQ5_1C, MB, L>;
    case Fmt::kQ8_0C:
      return ColsRows<Fmt::kQ8_0C, MB, L>;
    case Fmt::kQ4KC:
      return ColsRows<Fmt::kQ4KC, MB, L>;
    case Fmt::kQ5KC:
      return ColsRows<Fmt::kQ5KC, MB, L>;
    case Fmt::kQ5KP:
      return ColsRows<Fmt::kQ5KP, MB, L>;
    case Fmt::kQ6KC:
      return Q6SlicesRows<MB, L>;
    case Fmt::kMlx4:
    case Fmt::kMlx8:
      return nullptr;  // PickMlx
  }
  return nullptr;
}

template <int L>
RowsFn PickRows(Fmt f, int mb) {
  switch (mb) {
    case 1:
      return PickRows<1, L>(f);
    case 2:
      return PickRows<2, L>(f);
    case 3:
      return PickRows<3, L>(f);
    default:
      return PickRows<4, L>(f);
  }
}

RowsFn Pick(Fmt f, int levels, int mb) {
  return levels == 2 ? PickRows<2>(f, mb) : PickRows<1>(f, mb);
}

}  // namespace

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
  for (int64_t b = 0; b < nb; ++b) d[b] = QuantizeBlockAvx2<1>(x + b * kQK, q + b * kQK);
}

LUMEN_AVX2 void QuantizeBlocksQ8x2Avx2(const float* x, int64_t nb, int8_t* q1, int8_t* q2,
                                       float* d2) {
  LUMEN_CHECK(CpuHasAvx2());
  alignas(32) int8_t both[2 * kQK];
  for (int64_t b = 0; b < nb; ++b) {
    d2[b] = QuantizeBlockAvx2<2>(x + b * kQK, both);
    std::memcpy(q1 + b * kQK, both, kQK);
    std::memcpy(q2 + b * kQK, both + kQK, kQK);
  }
}

#else  // no x86: never covered

void QuantizeWithSums(const float*, int64_t, int, int8_t*, float*, int32_t*) { LUMEN_CHECK(false); }
void Deinterleave(const int8_t*, int64_t, int8_t*) { LUMEN_CHECK(false); }

}  // namespace

bool CpuHasAvx2() { return false; }
void QuantizeBlocksQ8Avx2(const float*, int64_t, int8_t*, float*) { LUMEN_CHECK(false); }
void QuantizeBlocksQ8x2Avx2(const float*, int64_t, int8_t*, int8_t*, float*) { LUMEN_CHECK(false); }

namespace {
RowsFn Pick(Fmt, int, int) {
  LUMEN_CHECK(false);
  return nullptr;
}
MlxRowsFn PickMlx(Fmt, int, int) {
  LUMEN_CHECK(false);
  return nullptr;
}
}  // namespace

#endif

bool Avx2Int8Covers(const Matrix& W) {
  Fmt f;
  return FmtOf(W, &f);
}

int64_t Avx2Int8MaxRows(const Matrix& W) {
  Fmt f;
  if (!FmtOf(W, &f)) return kInt8MaxRows;  // no kernel here: what the route selection assumes
  switch (PlainFmt(f)) {
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
  Acts acts[2][kOrders];  // by level count and order, prepared when an out needs one
  bool ready[2][kOrders] = {};
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
    const int levels = Int8Levels(w.route), order = OrderOf(f);
    Acts& act = acts[levels - 1][order];
    if (!ready[levels - 1][order]) {
      Prepare(X, M, ldx, w.k, levels, order, &act);
      ready[levels - 1][order] = true;
    }
    LUMEN_CHECK(act.nb * kQK == w.k);  // every out reads the same X
    plans[i].acts = &act;
    const bool mlx = f == Fmt::kMlx4 || f == Fmt::kMlx8;
    for (int mb = 1; mb <= kRowsPerPass; ++mb) {
      plans[i].fn[mb - 1] = mlx ? nullptr : Pick(f, levels, mb);
      plans[i].mlx[mb - 1] = mlx ? PickMlx(f, levels, mb) : nullptr;
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
