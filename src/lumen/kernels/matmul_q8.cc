#include "lumen/kernels/matmul_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/route.h"
#include "lumen/kernels/prefetch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LUMEN_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#endif

// Layout. A pair of weight blocks (2 x 32 elements) becomes one 64-byte vector
// of unsigned codes (Q4_0: q, standing for q - 8; Q5_0: q for q - 16; Q8_0:
// q + 128, flipping the sign bit); vpdpbusd sums 4 adjacent byte products
// into each of 16 int32 lanes, so every lane belongs to one block. vpdpbusd
// multiplies unsigned by signed bytes: the activations stay signed and
// sum(w x) = sum(c x) - offset sum(x), where the correction depends on the
// activations only, so Prepare stores it per lane once per call and the
// kernel starts each dot from it (measured: one `vpdpbusd` less per pair than
// the x + 128 layout this replaced, whose correction, -128 sum(w), was one
// more `vpdpbusd` per pair). Activation rows are stored in the weights' byte
// order with each lane's block scale (f32). Products fit in int16 and the
// lane sums in int32 exactly.
//   Q4_0 pair: [blk0 e0..15 | blk1 e0..15 | blk0 e16..31 | blk1 e16..31]
//              (low nibbles of both blocks, then high nibbles; the same for
//              Q4_1, Q5_0, Q5_1, whose 5th bits come from a 64-bit lane mask
//              built from the two blocks' qh words: one masked byte add)
//   Q8_0 pair: [blk0 e0..31 | blk1 e0..31]
// An odd last block is a 32-byte half vector in natural order.
//
// Q4_1 / Q5_1 (w = d q + m) keep their codes unsigned (0..15, 0..31) and the
// activations signed, as the K-quants below: no correction, and the offset m
// multiplies the block's activation sum (one 2-lane FMA per pair and row).
//
// Two levels (int8x2): every activation block carries a second int8 code
// vector q2 for the first level's residual at scale d2 = d / 256
// (QuantizeBlockQ8x2 in core/quant.h), stored right after q1 in the same
// order. Both levels meet the same weight vector, so per weight vector and row
// it is one more vpdpbusd, a shift and an add: i = (dot(w, q1) << 8) +
// dot(w, q2) is the block's sum of w (256 q1 + q2) exactly in int32, and
// exactly as f32 where |w| <= 128 (|i| < 2^24); MLX 8-bit codes (0..255) can
// reach 2^25, where the conversion rounds once (relative 2^-24, inside the
// oracle bound). It is scaled once by d2. The weight unpacking, scales and
// offsets are shared, and the code below is the one-level code templated on L.
//
// MLX affine 4-bit (w = s q + b per group of 32, 64 or 128) is handled like
// the K-quants with o = -b; byte j of a row holds elements 2j (low nibble) and
// 2j + 1, so a 64-element vector is [even elements | odd elements] and the
// activations are stored in that order (a group of 32 then owns lanes 0-3 and
// 8-11 or 4-7 and 12-15). MLX 8-bit: byte j is element j, natural order.
//
// K-quants (Q2_K .. Q6_K) have unsigned codes q and an offset per sub-block:
// w = a q - o (Q2_K: a = d (sc & 15), o = dmin (sc >> 4); Q3_K: a = d (sc -
// 32), o = 4 a; Q4_K, Q5_K: a = d sc, o = dmin m; Q6_K: a = d sc, o = 32 a).
// Their activations stay signed (vpdpbusd takes the codes as the unsigned
// operand, no correction), in natural order, 64 codes per vector (chunk c of
// a super-block: elements 64c..64c+63, decoded from the packed bit planes
// with shifts, masks and, for the high bits, vptestmb lane masks). The offset
// term sum_s o_s dx_s sum(qx over s) is a float dot of the super-block's
// offsets with per-row sums precomputed once per activation row (one FMA per
// row per super-block).

namespace lumen::kernels {

LUMEN_ROUTE(
    matmul_int8_decode,
    {.node = "matmul.decode",
     .name = "int8-vnni",
     .tier = Tier::kL3,
     .oracle = "MatMulInt8Ref (same activation quantization, double accumulation); "
               "as a replacement of the exact product: no oracle",
     .bound = "KL(exact || route) at most twice what Q8_0 weights cost",
     .tests = "MatMulInt8.MatchesOracleAndExactBound;MatMulInt8.ManyAndThreadsAreBitIdentical;"
              "QuantTypes.Int8RouteTracksExact;RouteKl.Int8AndBf16RoutesCostAboutWhatQ8WeightsCost",
     .measure = "docs/reference/performance.md#exactness",
     .when = "act=int8|int8+bf16 cpu=avx512vnni int8=kernel",
     .priority = 20});
LUMEN_ROUTE(
    matmul_int8x2_decode,
    {.node = "matmul.decode",
     .name = "int8x2-vnni",
     .tier = Tier::kL2,
     .oracle = "MatMulInt8x2Ref (same two-level activation quantization, double accumulation); "
               "against the exact product: the activation rounding bound",
     .bound = "|y - y_exact| <= sum over blocks of (dx / 256) sum |w| (+ f32 slack); "
              "KL(exact || route) below a quarter of what Q8_0 weights cost",
     .tests = "QuantizeBlocksQ8x2.*;MatMulInt8x2.*;RouteKl.Int8x2DecodePassesTheDefaultGate;"
              "RouteKl.Int8x2DecodeGateOnEveryWeightType",
     .measure = "docs/reference/performance.md#the-int8x2-decode-route-the-default",
     .when = "act=int8x2|int8x2+bf16 cpu=avx512vnni int8=kernel",
     .priority = 20});
namespace {

enum class Fmt { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ2K, kQ3K, kQ4K, kQ5K, kQ6K, kMlx4, kMlx8 };

// The activations' byte order within a 64-element record (see Layout).
enum class Order { kNatural, kNibblePairs, kEvenOdd };

struct Geometry {
  Fmt fmt;
  int64_t block_bytes;  // GGUF: bytes per (super-)block; MLX: 0
  int w_offset;         // Q4_0/Q5_0/Q8_0: codes are w + w_offset (unsigned); 0: none
  int64_t sum_group;    // elements per offset group (0: none)
  Order order;
};

Geometry GeometryFor(const Matrix& W) {
  if (W.mlx_bits == 4) return {Fmt::kMlx4, 0, 0, W.mlx_group, Order::kEvenOdd};
  if (W.mlx_bits == 8) return {Fmt::kMlx8, 0, 0, W.mlx_group, Order::kNatural};
  switch (W.w.dtype) {
    case DType::kQ4_0:
      return {Fmt::kQ4_0, sizeof(BlockQ4_0), 8, 0, Order::kNibblePairs};
    case DType::kQ4_1:
      return {Fmt::kQ4_1, sizeof(BlockQ4_1), 0, kQK, Order::kNibblePairs};
    case DType::kQ5_0:
      return {Fmt::kQ5_0, sizeof(BlockQ5_0), 16, 0, Order::kNibblePairs};
    case DType::kQ5_1:
      return {Fmt::kQ5_1, sizeof(BlockQ5_1), 0, kQK, Order::kNibblePairs};
    case DType::kQ8_0:
      return {Fmt::kQ8_0, sizeof(BlockQ8_0), 128, 0, Order::kNatural};
    case DType::kQ2_K:
      return {Fmt::kQ2K, sizeof(BlockQ2K), 0, 16, Order::kNatural};
    case DType::kQ3_K:
      return {Fmt::kQ3K, sizeof(BlockQ3K), 0, 16, Order::kNatural};
    case DType::kQ4_K:
      return {Fmt::kQ4K, sizeof(BlockQ4K), 0, 32, Order::kNatural};
    case DType::kQ5_K:
      return {Fmt::kQ5K, sizeof(BlockQ5K), 0, 32, Order::kNatural};
    case DType::kQ6_K:
      return {Fmt::kQ6K, sizeof(BlockQ6K), 0, 16, Order::kNatural};
    default:  // callers check Int8RouteSupports first
      LUMEN_CHECK(false);
      return {};
  }
}

// Natural element index (within the row) of byte `pos` of the laid-out row.
int64_t SourceIndex(Order order, int64_t nb, int64_t pos) {
  const int64_t b = pos / kQK;
  if (order == Order::kEvenOdd) {  // a 64-chunk holds the even elements, then the odd ones
    const int64_t base = pos / 64 * 64, o = pos % 64;
    return base + (o < 32 ? 2 * o : 2 * (o - 32) + 1);
  }
  if (order == Order::kNatural || (nb % 2 == 1 && b == nb - 1)) return pos;
  const int64_t p = pos / 64, o = pos % 64;  // a pair of nibble blocks
  const int64_t blk = 2 * p + (o / 16) % 2, e = (o % 16) + (o >= 32 ? 16 : 0);
  return blk * kQK + e;
}

// Activation rows quantized and laid out for one weight format and level
// count L. Each row is a run of records, one per 64 elements: [L code vectors
// (level 1, then level 2), 64 B each | lane scales, 16 x f32], then for an
// odd last block a half record [L x 32 B | 8 x f32]; for K-quants then the
// offset sums (the group's sum of the activations as the codes read back,
// f32). One pointer per row and sequential reads (with separate arrays the
// 4-row kernel ran out of registers). The lane scale is d (L = 1) or d2 =
// d / 256 (L = 2).
struct Int8Rows {
  int64_t M = 0, K = 0, stride = 0;  // stride: bytes per row (a multiple of 64)
  int64_t nsum = 0;                  // offset sums per row
  int levels = 1;
  AlignedBuffer buf;
  const uint8_t* row(int64_t m) const { return buf.as<const uint8_t>() + m * stride; }
  const float* sums(int64_t m) const {
    return reinterpret_cast<const float*>(row(m) + (levels + 1) * K);
  }
  // Q4_0 / Q5_0 / Q8_0: per 4-byte lane of the records, -w_offset times the
  // lane's activation codes summed (q1, or 256 q1 + q2), one int32 each.
  const int32_t* corr(int64_t m) const {
    return reinterpret_cast<const int32_t*>(row(m) + (levels + 1) * K + 4 * nsum);
  }
};

// Activation rows m0 .. m0 + MB - 1 of X: records and offset sums.
template <int MB>
struct RowPtrs {
  const uint8_t* x[MB];
  const float* sums[MB];
  const int32_t* corr[MB];
  RowPtrs(const Int8Rows& X, int64_t m0) {
    for (int r = 0; r < MB; ++r) {
      x[r] = X.row(m0 + r);
      sums[r] = X.sums(m0 + r);
      corr[r] = X.corr(m0 + r);
    }
  }
};

// Bytes of a full record (64 elements) at L levels; its lane scales start at 64 L.
template <int L>
constexpr int64_t kRecord = 64 * L + 64;

void Prepare(const Geometry& g, const float* X, int64_t M, int64_t ldx, int64_t K, int levels,
             Int8Rows* out) {
  const int64_t nb = K / kQK, nsum = g.sum_group ? K / g.sum_group : 0;
  out->M = M;
  out->K = K;
  out->nsum = nsum;
  out->levels = levels;
  // L bytes and 1/4 f32 scale per element, then the sums, then (offset
  // weights) 1/4 int32 correction per element.
  out->stride = ((levels + 1) * K + 4 * nsum + (g.w_offset ? K : 0) + 63) / 64 * 64;
  out->buf = AlignedBuffer(M * out->stride);
  std::vector<int8_t> q1(K), q2(levels == 2 ? K : 0);
  std::vector<float> dn(nb);
  // Natural order (Q8_0, the K-quants, MLX 8-bit): no per-byte index mapping
  // on this per-call path.
  const bool natural = g.order == Order::kNatural;
  for (int64_t m = 0; m < M; ++m) {
    if (levels == 1) {
      QuantizeBlocksQ8(X + m * ldx, nb, q1.data(), dn.data());
    } else {
      QuantizeBlocksQ8x2(X + m * ldx, nb, q1.data(), q2.data(), dn.data());
    }
    const int8_t* const q[2] = {q1.data(), q2.data()};
    uint8_t* rec = out->buf.as<uint8_t>() + m * out->stride;
    for (int64_t pos = 0; pos < K;) {
      const int64_t n = std::min<int64_t>(64, K - pos);  // 64, or 32 for the half record
      float* dx = reinterpret_cast<float*>(rec + levels * n);
      for (int l = 0; l < levels; ++l) {
        uint8_t* codes = rec + l * n;
        if (natural) {
          for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(q[l][pos + i]);
        } else {
          for (int64_t i = 0; i < n; ++i)
            codes[i] = static_cast<uint8_t>(q[l][SourceIndex(g.order, nb, pos + i)]);
        }
      }
      for (int64_t l = 0; l < n / 4; ++l)
        dx[l] = dn[(natural ? pos + 4 * l : SourceIndex(g.order, nb, pos + 4 * l)) / kQK];
      if (g.w_offset) {
        int32_t* corr = reinterpret_cast<int32_t*>(out->buf.as<uint8_t>() + m * out->stride +
                                                   (levels + 1) * K + 4 * nsum) +
                        pos / 4;
        const auto* c1 = reinterpret_cast<const int8_t*>(rec);
        const auto* c2 = reinterpret_cast<const int8_t*>(rec + n);
        for (int64_t l = 0; l < n / 4; ++l) {
          int32_t t = 0;
          for (int64_t i = 4 * l; i < 4 * l + 4; ++i)
            t += levels == 1 ? c1[i] : 256 * c1[i] + c2[i];
          corr[l] = -g.w_offset * t;
        }
      }
      rec += (levels + 1) * n;
      pos += n;
    }
    float* sums =
        reinterpret_cast<float*>(out->buf.as<uint8_t>() + m * out->stride + (levels + 1) * K);
    // sum over the group of dx * code (code = q1, or 256 q1 + q2); a group is
    // part of one block or whole blocks.
    const int64_t part = std::min<int64_t>(g.sum_group, kQK);
    for (int64_t s = 0; s < nsum; ++s) {
      float acc = 0;
      for (int64_t j = s * g.sum_group; j < (s + 1) * g.sum_group; j += part) {
        int32_t t = 0;
        for (int64_t i = 0; i < part; ++i)
          t += levels == 1 ? q1[j + i] : 256 * q1[j + i] + q2[j + i];
        acc += dn[j / kQK] * static_cast<float>(t);
      }
      sums[s] = acc;
    }
  }
}

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_* as the unused merge
// source, which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

}  // namespace

bool CpuHasVnni() {
  static const bool has = [] {  // CPU feature, fixed for the process
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

namespace {

LUMEN_VNNI inline uint32_t LoadU16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// QuantizeBlockQ8 on 32 floats, 16 lanes at a time: amax, d = amax / 127,
// round(x / d) half away from zero (trunc, then +-1 where the dropped fraction
// is at least one half: exact, as v - trunc(v) is exact below 2^23), clamped
// to [-127, 127]; as floats, then as bytes.
LUMEN_VNNI inline __m512 RoundHalfAwayF(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 step =
      _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));  // +-1, v's sign
  const __m512 r = _mm512_mask_add_ps(t, up, t, step);
  return _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
}

LUMEN_VNNI inline __m128i ToBytes(__m512 r) { return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)); }

LUMEN_VNNI inline __m128i RoundHalfAway(__m512 v) { return ToBytes(RoundHalfAwayF(v)); }

LUMEN_VNNI void QuantizeBlocksAvx512(const float* x, int64_t nb, int8_t* q, float* d) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, q += kQK) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    if (!(amax <= std::numeric_limits<float>::max())) {  // inf or NaN: the scalar rules
      d[b] = QuantizeBlockQ8(x, q);
      continue;
    }
    d[b] = amax / 127;
    const float id = d[b] != 0 ? 1.0f / d[b] : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), RoundHalfAway(_mm512_mul_ps(lo, vid)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), RoundHalfAway(_mm512_mul_ps(hi, vid)));
  }
}

// QuantizeBlockQ8x2 (core/quant.h) likewise: level 1 as above, kept as
// floats for the residual r = x - d q1 (fnmadd: one rounding, as std::fma),
// then q2 = round(r * id2). Blocks the fast path does not reproduce bit for
// bit (a non-finite input or scale) take the scalar definition. Returns d2
// per block.
LUMEN_VNNI void QuantizeBlocksX2Avx512(const float* x, int64_t nb, int8_t* q1, int8_t* q2,
                                       float* d2) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, q1 += kQK, q2 += kQK) {
    const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f, id2 = d != 0 ? 256.0f * id : 0.0f;
    const __mmask16 finite =
        _mm512_cmp_ps_mask(_mm512_abs_ps(v[0]), _mm512_set1_ps(amax), _CMP_LE_OQ) &
        _mm512_cmp_ps_mask(_mm512_abs_ps(v[1]), _mm512_set1_ps(amax), _CMP_LE_OQ);
    if (!(amax <= std::numeric_limits<float>::max()) ||
        !(id2 <= std::numeric_limits<float>::max()) ||
        finite != 0xFFFF) {  // inf, NaN, or 256 / d overflows: the scalar rules
      d2[b] = QuantizeBlockQ8x2(x, q1, q2);
      continue;
    }
    const __m512 vd = _mm512_set1_ps(d), vid = _mm512_set1_ps(id), vid2 = _mm512_set1_ps(id2);
    for (int h = 0; h < 2; ++h) {
      const __m512 r1 = RoundHalfAwayF(_mm512_mul_ps(v[h], vid));
      const __m512 res = _mm512_fnmadd_ps(vd, r1, v[h]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + 16 * h), ToBytes(r1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16 * h),
                       RoundHalfAway(_mm512_mul_ps(res, vid2)));
    }
    d2[b] = d / 256;
  }
}

// The record's integer lane sums of unsigned weight codes w against the
// signed activation codes, plus init (added once): one level, dot(q1); two,
// (dot(q1) << 8) + dot(q2).
template <int L>
LUMEN_VNNI inline __m512i LevelDot(__m512i init, __m512i w, const uint8_t* rec) {
  auto dot = [&](__m512i acc, const uint8_t* p)
                 LUMEN_VNNI { return _mm512_dpbusd_epi32(acc, w, _mm512_load_si512(p)); };
  if constexpr (L == 1) {
    return dot(init, rec);
  } else {
    return _mm512_add_epi32(_mm512_slli_epi32(dot(_mm512_setzero_si512(), rec), 8),
                            dot(init, rec + 64));
  }
}

// The same on a half record (32 elements: L x 32 B).
template <int L>
LUMEN_VNNI inline __m256i LevelDotHalf(__m256i init, __m256i w, const uint8_t* rec) {
  auto dot = [&](__m256i acc, const uint8_t* p) LUMEN_VNNI {
    return _mm256_dpbusd_epi32(acc, w, _mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  };
  if constexpr (L == 1) {
    return dot(init, rec);
  } else {
    return _mm256_add_epi32(_mm256_slli_epi32(dot(_mm256_setzero_si256(), rec), 8),
                            dot(init, rec + 32));
  }
}

// The legacy 32-element formats: where the codes start in a block, where the
// 5th bits start (Q5_*), whether an offset m follows d, and what is
// subtracted from the codes to make them signed (types without m).
constexpr int64_t CodesAt(Fmt f) {
  return f == Fmt::kQ4_1 ? 4 : f == Fmt::kQ5_0 ? 6 : f == Fmt::kQ5_1 ? 8 : 2;
}
constexpr int64_t HighBitsAt(Fmt f) { return f == Fmt::kQ5_0 ? 2 : f == Fmt::kQ5_1 ? 4 : 0; }
constexpr bool HasMin(Fmt f) { return f == Fmt::kQ4_1 || f == Fmt::kQ5_1; }

LUMEN_VNNI inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Codes of blocks blk and blk + bb as one 64-byte vector (the pair layout).
template <Fmt F>
LUMEN_VNNI inline __m512i PairCodes(const uint8_t* blk, int64_t bb) {
  if constexpr (F == Fmt::kQ8_0) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2 + bb));
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_zextsi256_si512(a), b, 1),
                            _mm512_set1_epi8(char(0x80)));  // w + 128, unsigned
  } else {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + CodesAt(F)));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + bb + CodesAt(F)));
    const __m256i y = _mm256_inserti128_si256(_mm256_zextsi128_si256(a), b, 1);
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(y, m);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), m);
    __m512i q = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
    if constexpr (HighBitsAt(F) != 0) {  // bit j of a block's qh: its element j
      const uint64_t h0 = LoadU32(blk + HighBitsAt(F)), h1 = LoadU32(blk + bb + HighBitsAt(F));
      const __mmask64 k = (h0 & 0xFFFF) | (h1 & 0xFFFF) << 16 | (h0 >> 16) << 32 | (h1 >> 16) << 48;
      q = _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
    }
    return q;
  }
}

// Two f16 values, at p and p + bb, as lanes 0 and 1.
LUMEN_VNNI inline __m128 TwoHalves(const uint8_t* p, int64_t bb) {
  const uint32_t h = LoadU16(p) | (LoadU16(p + bb) << 16);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h)));
}

// The pair's two f16 weight scales spread to the lanes of their blocks.
template <Fmt F>
LUMEN_VNNI inline __m512 PairScales(const uint8_t* blk, int64_t bb) {
  const __m512i idx = F != Fmt::kQ8_0
                          ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                          : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(TwoHalves(blk, bb)));
}

// Codes of one block, natural order, as 32 bytes.
template <Fmt F>
LUMEN_VNNI inline __m256i BlockCodes(const uint8_t* blk) {
  if constexpr (F == Fmt::kQ8_0) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)),
                            _mm256_set1_epi8(char(0x80)));
  } else {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + CodesAt(F)));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(a, m), hi = _mm_and_si128(_mm_srli_epi16(a, 4), m);
    __m256i q = _mm256_inserti128_si256(_mm256_zextsi128_si256(lo), hi, 1);
    if constexpr (HighBitsAt(F) != 0)
      q = _mm256_mask_add_epi8(q, LoadU32(blk + HighBitsAt(F)), q, _mm256_set1_epi8(16));
    return q;
  }
}

LUMEN_VNNI inline float F16Scalar(const uint8_t* p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU16(p)))));
}

// Rows [n0, n1) of W (a legacy 32-block format) against MB prepared
// activation rows starting at m0. Two accumulators per row so the FMA
// latency does not bind.
template <Fmt F, int MB, int L>
LUMEN_VNNI void Rows(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                     int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int kAcc = 2;
  // Without m (Q4_0, Q5_0, Q8_0) the codes are w + offset, and each row's
  // records carry -offset sum(x) per lane (Prepare), the dot's starting value.
  constexpr bool kMin = HasMin(F), kOffset = !kMin;
  const int64_t K = W.k, nb = K / kQK, pairs = nb / 2, bb = g.block_bytes;
  const RowPtrs<MB> rp(X, m0);
  const auto& x = rp.x;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W.w.row<const uint8_t>(n);
    __m512 acc[MB][kAcc];
    __m128 off[MB];  // Q4_1 / Q5_1: sum of m dx sum(qx), lanes 0 and 1
    for (int r = 0; r < MB; ++r) {
      for (int a = 0; a < kAcc; ++a) acc[r][a] = _mm512_setzero_ps();
      off[r] = _mm_setzero_ps();
    }
    // One pair into accumulator set A (a compile-time index: a runtime one
    // made GCC keep the accumulators on the stack).
    auto pair = [&]<int A>(int64_t p, std::integral_constant<int, A>) LUMEN_VNNI {
      const uint8_t* blk = row + 2 * p * bb;
      PrefetchAhead(blk, 1);  // a pair is 36 to 68 bytes: about a line per pair
      const __m512i w = PairCodes<F>(blk, bb);
      const __m512 s = PairScales<F>(blk, bb);
      for (int r = 0; r < MB; ++r) {
        const uint8_t* rec = x[r] + kRecord<L> * p;
        const __m512i init =
            kOffset ? _mm512_loadu_si512(rp.corr[r] + 16 * p) : _mm512_setzero_si512();
        const __m512i i = LevelDot<L>(init, w, rec);
        const __m512 sd =
            _mm512_mul_ps(s, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
        acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
      }
      if constexpr (kMin) {
        const __m128 m = TwoHalves(blk + 2, bb);
        for (int r = 0; r < MB; ++r) {
          const __m128 sums = _mm_castsi128_ps(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rp.sums[r] + 2 * p)));
          off[r] = _mm_fmadd_ps(m, sums, off[r]);
        }
      }
    };
    int64_t p = 0;
    for (; p + kAcc <= pairs; p += kAcc) {
      pair(p, std::integral_constant<int, 0>{});
      if constexpr (kAcc == 2) pair(p + 1, std::integral_constant<int, kAcc - 1>{});
    }
    if (p < pairs) pair(p, std::integral_constant<int, 0>{});
    float tail[MB] = {};
    if (nb % 2 == 1) {
      const uint8_t* blk = row + (nb - 1) * bb;
      const __m256i w = BlockCodes<F>(blk);
      const float s = F16Scalar(blk);
      for (int r = 0; r < MB; ++r) {
        const uint8_t* rec = x[r] + kRecord<L> * pairs;
        const __m256i init =
            kOffset ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp.corr[r] + 16 * pairs))
                    : _mm256_setzero_si256();
        const __m256i i = LevelDotHalf<L>(init, w, rec);
        alignas(32) int32_t v[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v), i);
        int32_t sum = 0;
        for (int32_t e : v) sum += e;
        tail[r] = s * reinterpret_cast<const float*>(rec + 32 * L)[0] * static_cast<float>(sum);
        if constexpr (kMin) tail[r] += F16Scalar(blk + 2) * rp.sums[r][nb - 1];
      }
    }
    for (int r = 0; r < MB; ++r) {
      __m512 t = acc[r][0];
      if constexpr (kAcc == 2) t = _mm512_add_ps(t, acc[r][1]);
      float y = _mm512_reduce_add_ps(t) + tail[r];
      if constexpr (kMin) y += _mm_cvtss_f32(off[r]) + _mm_cvtss_f32(_mm_movehdup_ps(off[r]));
      Y[(m0 + r) * ldy + n] = y;
    }
  }
}

// 64 unsigned codes (elements 64j..64j+63 of a Q4_K super-block) from 32 bytes.
LUMEN_VNNI inline __m512i NibblePair(const uint8_t* p) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(q, m), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
}

// The 8 scales and 8 mins of a Q4_K super-block (GetScaleMinK4's 6-bit
// fields, unpacked four at a time from the 12 bytes as 32-bit words) times d
// and dmin: lanes 0-7 d sc_j, lanes 8-15 dmin m_j.
LUMEN_VNNI inline __m512 ScalesMinsQ4K(const uint8_t* blk) {
  uint32_t w[3];
  std::memcpy(w, blk + 4, 12);
  constexpr uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  const uint32_t u[4] = {
      w[0] & k6,                                      // sc 0..3: low 6 bits of bytes 0..3
      (w[2] & k4) | (((w[0] >> 6) & k2) << 4),        // sc 4..7
      w[1] & k6,                                      // m 0..3: low 6 bits of bytes 4..7
      ((w[2] >> 4) & k4) | (((w[1] >> 6) & k2) << 4)  // m 4..7
  };
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
  const __m512 dd =
      _mm512_insertf32x8(_mm512_set1_ps(F16Scalar(blk)), _mm256_set1_ps(F16Scalar(blk + 2)), 1);
  return _mm512_mul_ps(f, dd);
}

// Lane index vector: lanes [0, 16) take element base + lane / width.
LUMEN_VNNI inline __m512i LaneIndex(int base, int width) {
  alignas(64) int32_t v[16];
  for (int l = 0; l < 16; ++l) v[l] = base + l / width;
  return _mm512_load_si512(v);
}

// acc += cvt(dot(w, codes)) * lanes * dx for every row; A selects the
// accumulator (compile time, see Rows).
template <int MB, int A, int L>
LUMEN_VNNI inline void DotRecords(const uint8_t* const* x, int64_t chunk, __m512i w, __m512 lanes,
                                  __m512 (&acc)[MB][2]) {
  for (int r = 0; r < MB; ++r) {
    const uint8_t* rec = x[r] + kRecord<L> * chunk;
    const __m512i i = LevelDot<L>(_mm512_setzero_si512(), w, rec);
    const __m512 sd =
        _mm512_mul_ps(lanes, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
    acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
  }
}

// Q6_K: 6-bit codes from 4 low bits (ql) and 2 high bits (qh).
LUMEN_VNNI inline __m256i Six(__m256i low, __m256i high2) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  return _mm256_or_si256(_mm256_and_si256(low, m4),
                         _mm256_slli_epi16(_mm256_and_si256(high2, m3), 4));
}

// Q2_K / Q3_K: the 2-bit codes of chunk C from the 64-byte plane qs (element
// 128 n + 32 j + l is bits 2j of qs[32 n + l]).
template <int C>
LUMEN_VNNI inline __m512i TwoBitChunk(const uint8_t* qs) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (C / 2)));
  const __m256i m = _mm256_set1_epi8(3);
  const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 4 * (C % 2)), m);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4 * (C % 2) + 2), m);
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
}

// Adds `v` to the codes of chunk C whose high bit is set: element i of the
// super-block has it in bit i / 32 of bits[i % 32] (Q3_K hmask, Q5_K qh). Both
// halves of one vector see the 32 bytes; the low half tests bit 2C, the high
// half bit 2C + 1, so one vptestmb gives the 64-lane mask.
template <int C>
LUMEN_VNNI inline __m512i AddHighBit(__m512i q, const uint8_t* bits, char v) {
  const __m512i h =
      _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits)));
  const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * C))),
                                         _mm256_set1_epi8(char(1 << (2 * C + 1))), 1);
  return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(h, sel), q, _mm512_set1_epi8(v));
}

// The unsigned codes of chunk C (elements 64C..64C+63) of a K-quant super-block.
template <Fmt F, int C>
LUMEN_VNNI inline __m512i ChunkCodes(const uint8_t* blk) {
  if constexpr (F == Fmt::kQ2K) {
    return TwoBitChunk<C>(blk + 16);
  } else if constexpr (F == Fmt::kQ3K) {
    return AddHighBit<C>(TwoBitChunk<C>(blk + 32), blk, 4);
  } else if constexpr (F == Fmt::kQ4K) {
    return NibblePair(blk + 16 + 32 * C);
  } else if constexpr (F == Fmt::kQ5K) {
    return AddHighBit<C>(NibblePair(blk + 48 + 32 * C), blk + 16, 16);
  } else {  // Q6_K: chunk 2h + t holds parts 2t, 2t + 1 of half h
    const uint8_t* ql = blk + 64 * (C / 2);
    const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
    const __m256i H =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * (C / 2)));
    constexpr int s = 4 * (C % 2);  // low nibbles (parts 0, 1) or high (2, 3)
    const __m256i lo = Six(_mm256_srli_epi16(A, s), _mm256_srli_epi16(H, s));
    const __m256i hi = Six(_mm256_srli_epi16(B, s), _mm256_srli_epi16(H, s + 2));
    return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
  }
}

// Elements per sub-block (a lane scale and an offset each).
constexpr int SubBlock(Fmt f) { return f == Fmt::kQ4K || f == Fmt::kQ5K ? 32 : 16; }

// A K-quant super-block's sub-block scales a and offsets o (w = a q - o), one
// per lane (sub-blocks of 32: lanes 0-7).
template <Fmt F>
LUMEN_VNNI inline void SubScales(const uint8_t* blk, __m512* a, __m512* o) {
  if constexpr (F == Fmt::kQ4K || F == Fmt::kQ5K) {
    const __m512 sm = ScalesMinsQ4K(blk);
    *a = sm;
    *o = _mm512_shuffle_f32x4(sm, sm, _MM_SHUFFLE(3, 2, 3, 2));  // lanes 8-15 to 0-7
  } else if constexpr (F == Fmt::kQ6K) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    *a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)),
                       _mm512_set1_ps(F16Scalar(blk + 208)));
    *o = _mm512_mul_ps(*a, _mm512_set1_ps(32.0f));
  } else if constexpr (F == Fmt::kQ3K) {
    // Q3KScale's 6-bit fields four at a time: low nibbles from bytes 0-7,
    // high 2 bits from the pairs of bits of bytes 8-11.
    uint32_t w[3];
    std::memcpy(w, blk + 96, 12);
    constexpr uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
    const uint32_t u[4] = {(w[0] & k4) | ((w[2] & k2) << 4),
                           (w[1] & k4) | (((w[2] >> 2) & k2) << 4),
                           ((w[0] >> 4) & k4) | (((w[2] >> 4) & k2) << 4),
                           ((w[1] >> 4) & k4) | (((w[2] >> 6) & k2) << 4)};
    const __m512i sc =
        _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))),
                         _mm512_set1_epi32(32));
    *a = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(F16Scalar(blk + 108)));
    *o = _mm512_mul_ps(*a, _mm512_set1_ps(4.0f));
  } else {  // Q2_K: byte j = scale j (low nibble) | min j (high nibble)
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m512i k = _mm512_set1_epi32(15);
    *a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sc, k)),
                       _mm512_set1_ps(F16Scalar(blk + 80)));
    *o = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)),
                       _mm512_set1_ps(F16Scalar(blk + 82)));
  }
}

// Chunk C of a super-block (record 4 sb + C) into accumulator C % 2.
template <Fmt F, int C, int MB, int L>
LUMEN_VNNI inline void KChunk(const uint8_t* const* x, int64_t sb, const uint8_t* blk, __m512 a,
                              __m512i idx, __m512 (&acc)[MB][2]) {
  DotRecords<MB, C % 2, L>(x, 4 * sb + C, ChunkCodes<F, C>(blk), _mm512_permutexvar_ps(idx, a),
                           acc);
}

// Rows [n0, n1) of W (a K-quant) against MB prepared activation rows at m0.
template <Fmt F, int MB, int L>
LUMEN_VNNI void RowsK(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                      int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int kSub = SubBlock(F), kSubs = kQKK / kSub;  // 16 or 8 sub-blocks
  const int64_t nsb = W.k / kQKK;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  // Lane l of chunk c (64 elements, 16 lanes of 4) is sub-block (64 c + 4 l) / kSub.
  const int w = kSub / 4;
  const __m512i idx[4] = {LaneIndex(0, w), LaneIndex(64 / kSub, w), LaneIndex(128 / kSub, w),
                          LaneIndex(192 / kSub, w)};
  const __mmask16 sums_mask = kSubs == 16 ? 0xFFFF : 0x00FF;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W.w.row<const uint8_t>(n);
    __m512 acc[MB][2], off[MB];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = row + sb * g.block_bytes;
      __m512 a, o;
      SubScales<F>(blk, &a, &o);
      KChunk<F, 0, MB, L>(x, sb, blk, a, idx[0], acc);
      KChunk<F, 1, MB, L>(x, sb, blk, a, idx[1], acc);
      KChunk<F, 2, MB, L>(x, sb, blk, a, idx[2], acc);
      KChunk<F, 3, MB, L>(x, sb, blk, a, idx[3], acc);
      for (int r = 0; r < MB; ++r)
        off[r] =
            _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(sums_mask, rows.sums[r] + kSubs * sb), off[r]);
    }
    for (int r = 0; r < MB; ++r)
      Y[(m0 + r) * ldy + n] =
          _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) - _mm512_reduce_add_ps(off[r]);
  }
}

// n values of type t (f16, bf16 or f32) as f32.
LUMEN_VNNI inline void ToF32(DType t, const uint8_t* p, float* out, int64_t n) {
  int64_t i = 0;
  if (t == DType::kF16) {
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(
          out + i,
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i))));
  } else if (t == DType::kBF16) {
    for (; i + 16 <= n; i += 16) {
      const __m512i w =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
      _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
  }
  if (i < n) DequantizeRow(t, p + i * Info(t).block_bytes, out + i, n - i);
}

// MLX 4-bit (F = kMlx4) or 8-bit (kMlx8), groups of 32, 64 or 128 (K a
// multiple of 64).
template <Fmt F, int MB, int L>
LUMEN_VNNI void RowsMlx(const Matrix& W, const Int8Rows& X, int64_t m0, float* Y, int64_t ldy,
                        int64_t n0, int64_t n1) {
  const int64_t K = W.k, G = W.mlx_group, ng = K / G, nc = K / 64;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  // Groups of 32: lanes of groups 2c and 2c + 1 (see Layout).
  const __m512i idx32 = F == Fmt::kMlx4
                            ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                            : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  std::vector<float> sb(2 * ng);  // the row's scales, then biases
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* codes = W.w.row<const uint8_t>(n);
    ToF32(W.scales.dtype, W.scales.row<const uint8_t>(n), sb.data(), ng);
    ToF32(W.biases.dtype, W.biases.row<const uint8_t>(n), sb.data() + ng, ng);
    __m512 acc[MB][2], off[MB];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
    // Chunk c (64 elements) into accumulator A.
    auto chunk = [&]<int A>(int64_t c, std::integral_constant<int, A>) LUMEN_VNNI {
      const __m512i w =
          F == Fmt::kMlx4 ? NibblePair(codes + 32 * c) : _mm512_loadu_si512(codes + 64 * c);
      const __m512 sc = G == 32 ? _mm512_permutexvar_ps(idx32, _mm512_maskz_loadu_ps(3, &sb[2 * c]))
                                : _mm512_set1_ps(sb[c * 64 / G]);
      DotRecords<MB, A, L>(x, c, w, sc, acc);
    };
    int64_t c = 0;
    for (; c + 2 <= nc; c += 2) {
      chunk(c, std::integral_constant<int, 0>{});
      chunk(c + 1, std::integral_constant<int, 1>{});
    }
    if (c < nc) chunk(c, std::integral_constant<int, 0>{});
    // Bias term: sum_g b_g * (sum of the group's activations), 16 groups at a time.
    for (int64_t g = 0; g < ng; g += 16) {
      const __mmask16 k = ng - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (ng - g)) - 1);
      const __m512 b = _mm512_maskz_loadu_ps(k, sb.data() + ng + g);
      for (int r = 0; r < MB; ++r)
        off[r] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(k, rows.sums[r] + g), off[r]);
    }
    for (int r = 0; r < MB; ++r)
      Y[(m0 + r) * ldy + n] =
          _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) + _mm512_reduce_add_ps(off[r]);
  }
}

// Calls run(integral_constant<MB>, m) over the rows four at a time, then the rest.
template <class Run>
void ByFours(int64_t M, Run run) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run(std::integral_constant<int, 4>{}, m);
  switch (M - m) {
    case 3:
      return run(std::integral_constant<int, 3>{}, m);
    case 2:
      return run(std::integral_constant<int, 2>{}, m);
    case 1:
      return run(std::integral_constant<int, 1>{}, m);
    default:
      return;
  }
}

template <int L>
void MatMulRowsLevels(const Matrix& W, const Int8Rows& X, float* Y, int64_t ldy, int64_t n0,
                      int64_t n1) {
  const Geometry g = GeometryFor(W);
  ByFours(X.M, [&](auto mb, int64_t m) {
    constexpr int MB = decltype(mb)::value;
    switch (g.fmt) {
      case Fmt::kQ4_0:
        return Rows<Fmt::kQ4_0, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ4_1:
        return Rows<Fmt::kQ4_1, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ5_0:
        return Rows<Fmt::kQ5_0, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ5_1:
        return Rows<Fmt::kQ5_1, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ8_0:
        return Rows<Fmt::kQ8_0, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ2K:
        return RowsK<Fmt::kQ2K, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ3K:
        return RowsK<Fmt::kQ3K, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ4K:
        return RowsK<Fmt::kQ4K, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ5K:
        return RowsK<Fmt::kQ5K, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ6K:
        return RowsK<Fmt::kQ6K, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kMlx4:
        return RowsMlx<Fmt::kMlx4, MB, L>(W, X, m, Y, ldy, n0, n1);
      case Fmt::kMlx8:
        return RowsMlx<Fmt::kMlx8, MB, L>(W, X, m, Y, ldy, n0, n1);
    }
  });
}

void MatMulRowsInt8(const Matrix& W, const Int8Rows& X, float* Y, int64_t ldy, int64_t n0,
                    int64_t n1) {
  if (X.levels == 2) return MatMulRowsLevels<2>(W, X, Y, ldy, n0, n1);
  MatMulRowsLevels<1>(W, X, Y, ldy, n0, n1);
}

#pragma GCC diagnostic pop

#else  // no x86: the route is never supported, so these are never called

}  // namespace
bool CpuHasVnni() { return false; }
namespace {
void QuantizeBlocksAvx512(const float*, int64_t, int8_t*, float*) { LUMEN_CHECK(false); }
void QuantizeBlocksX2Avx512(const float*, int64_t, int8_t*, int8_t*, float*) { LUMEN_CHECK(false); }
void MatMulRowsInt8(const Matrix&, const Int8Rows&, float*, int64_t, int64_t, int64_t) {
  LUMEN_CHECK(false);
}

#endif

}  // namespace

void QuantizeBlocksQ8(const float* x, int64_t nb, int8_t* q, float* d) {
  if (CpuHasVnni()) return QuantizeBlocksAvx512(x, nb, q, d);
  for (int64_t b = 0; b < nb; ++b) d[b] = QuantizeBlockQ8(x + b * kQK, q + b * kQK);
}

void QuantizeBlocksQ8x2(const float* x, int64_t nb, int8_t* q1, int8_t* q2, float* d2) {
  if (CpuHasVnni()) return QuantizeBlocksX2Avx512(x, nb, q1, q2, d2);
  for (int64_t b = 0; b < nb; ++b)
    d2[b] = QuantizeBlockQ8x2(x + b * kQK, q1 + b * kQK, q2 + b * kQK);
}

bool Int8RouteSupports(const Matrix& W) {
  if (!CpuHasVnni()) return false;
  if (W.mlx_bits != 0) {
    const DType st = W.scales.dtype, bt = W.biases.dtype;
    auto flt = [](DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; };
    const int64_t G = W.mlx_group;
    return (W.mlx_bits == 4 || W.mlx_bits == 8) && (G == 32 || G == 64 || G == 128) &&
           W.k % G == 0 && W.k % 64 == 0 && flt(st) && flt(bt);
  }
  switch (W.w.dtype) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
      return W.k % kQK == 0;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return W.k % kQKK == 0;
    default:
      return false;
  }
}

void MatMulInt8(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool) {
  const MatMulOut out{&W, Y, ldy};
  MatMulManyInt8({&out, 1}, X, M, ldx, pool);
}

void MatMulManyInt8(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                    ThreadPool* pool) {
  // One prepared copy of X per activation layout present (q/k/v may differ):
  // byte order, sign, offset group and level count (formats that agree on
  // all four, e.g. Q4_K and Q5_K, share one).
  struct Prepared {
    Geometry g;
    int levels;
    Int8Rows rows;
    bool Fits(const Geometry& o, int l) const {
      return g.order == o.order && g.w_offset == o.w_offset && g.sum_group == o.sum_group &&
             levels == l;
    }
  };
  std::vector<Prepared> prepared;
  prepared.reserve(outs.size());  // rows_of keeps pointers into it
  std::vector<const Int8Rows*> rows_of(outs.size());
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Matrix& w = *outs[i].w;
    LUMEN_CHECK(Int8RouteSupports(w));
    const Geometry g = GeometryFor(w);
    const int levels = Int8Levels(w.route);
    auto it = std::find_if(prepared.begin(), prepared.end(),
                           [&](const Prepared& p) { return p.Fits(g, levels); });
    if (it == prepared.end()) {
      prepared.push_back({g, levels, {}});
      it = prepared.end() - 1;
      Prepare(g, X, M, ldx, w.k, levels, &it->rows);
    }
    rows_of[i] = &it->rows;
    total += w.n;
  }
  auto fn = [&](int64_t b, int64_t e, int) {
    int64_t off = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const MatMulOut& o = outs[i];
      const int64_t lo = std::max<int64_t>(b - off, 0), hi = std::min<int64_t>(e - off, o.w->n);
      if (lo < hi) MatMulRowsInt8(*o.w, *rows_of[i], o.y, o.ldy, lo, hi);
      off += o.w->n;
    }
  };
  if (pool && total >= 32) {
    pool->ParallelFor(total, fn, 16);
  } else {
    fn(0, total, 0);
  }
}

}  // namespace lumen::kernels
