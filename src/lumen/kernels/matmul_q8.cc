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
// of signed weights (Q4_0: q - 8; Q8_0: q); vpdpbusd sums 4 adjacent byte
// products into each of 16 int32 lanes, so every lane belongs to one block.
// vpdpbusd multiplies unsigned by signed bytes, so activations are stored as
// u = x + 128 and sum(w x) = sum(w u) - 128 sum(w): the correction depends on
// the weights only, so it is computed once per pair (one more vpdpbusd) and
// shared by every activation row. Activation rows are stored in the weights'
// byte order with each lane's block scale (f32). Products fit in int16 and the
// lane sums in int32 exactly.
//   Q4_0 pair: [blk0 e0..15 | blk1 e0..15 | blk0 e16..31 | blk1 e16..31]
//              (low nibbles of both blocks, then high nibbles)
//   Q8_0 pair: [blk0 e0..31 | blk1 e0..31]
// An odd last block is a 32-byte half vector in natural order.
//
// Two levels (int8x2): every activation block carries a second int8 code
// vector q2 for the first level's residual at scale d2 = d / 256
// (QuantizeBlockQ8x2 in core/quant.h), stored right after q1 in the same
// order. Both levels meet the same weight vector, so per weight vector and row
// it is one more vpdpbusd, a shift and an add: i = (dot(w, q1) << 8) +
// dot(w, q2) is the block's sum of w (256 q1 + q2) exactly (|i| < 2^24, so
// also exact as f32), scaled once by d2. The weight unpacking, scales and
// offsets are shared, and the code below is the one-level code templated on L.
//
// MLX affine 4-bit (w = s q + b per group of 64 or 128) is handled like the
// K-quants with o = -b; byte j of a row holds elements 2j (low nibble) and
// 2j + 1, so a 64-element vector is [even elements | odd elements] and the
// activations are stored in that order.
//
// K-quants (Q4_K, Q6_K) have unsigned codes q and an offset per sub-block:
// w = a q - o (Q4_K: a = d sc, o = dmin m; Q6_K: a = d sc, o = 32 a). Their
// activations stay signed (vpdpbusd takes the codes as the unsigned operand,
// no correction), in natural order, 64 codes per vector (the low and high
// nibbles of 32 bytes are elements 64j..64j+31 and 64j+32..64j+63). The
// offset term sum_s o_s dx_s sum(qx over s) is a float dot of the block's
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
     .when = "act=int8|int8+bf16 cpu=avx512vnni dtype=q8_0|q4_0|q4_k|q6_k|mlx4",
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
     .tests = "QuantizeBlocksQ8x2.*;MatMulInt8x2.*;RouteKl.Int8x2DecodePassesTheDefaultGate",
     .measure = "docs/reference/performance.md#the-int8x2-decode-route-the-default",
     .when = "act=int8x2|int8x2+bf16 cpu=avx512vnni dtype=q8_0|q4_0|q4_k|q6_k|mlx4",
     .priority = 20});
namespace {

enum class Fmt { kQ4_0, kQ8_0, kQ4K, kQ6K, kMlx4 };
constexpr int kNumFmts = 5;

struct Geometry {
  Fmt fmt;
  int64_t block_bytes;  // Q4_0/Q8_0: [f16 scale | codes]
  bool unsigned_acts;   // activations stored as x + 128 (signed weights)
  int64_t sum_group;    // K-quants: elements per offset group (0: none)
};

Geometry GeometryFor(const Matrix& W) {
  if (W.mlx_bits == 4) return {Fmt::kMlx4, 0, false, W.mlx_group};
  switch (W.w.dtype) {
    case DType::kQ4_0:
      return {Fmt::kQ4_0, sizeof(BlockQ4_0), true, 0};
    case DType::kQ4_K:
      return {Fmt::kQ4K, sizeof(BlockQ4K), false, 32};
    case DType::kQ6_K:
      return {Fmt::kQ6K, sizeof(BlockQ6K), false, 16};
    default:
      return {Fmt::kQ8_0, sizeof(BlockQ8_0), true, 0};
  }
}

// Natural element index (within the row) of byte `pos` of the laid-out row.
int64_t SourceIndex(Fmt fmt, int64_t nb, int64_t pos) {
  const int64_t b = pos / kQK;
  if (fmt == Fmt::kMlx4) {  // a 64-chunk holds the even elements, then the odd ones
    const int64_t base = pos / 64 * 64, o = pos % 64;
    return base + (o < 32 ? 2 * o : 2 * (o - 32) + 1);
  }
  if (fmt != Fmt::kQ4_0 || (nb % 2 == 1 && b == nb - 1)) return pos;  // natural order
  const int64_t p = pos / 64, o = pos % 64;                           // Q4_0 pair
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
  int levels = 1;
  AlignedBuffer buf;
  const uint8_t* row(int64_t m) const { return buf.as<const uint8_t>() + m * stride; }
  const float* sums(int64_t m) const {
    return reinterpret_cast<const float*>(row(m) + (levels + 1) * K);
  }
};

// Activation rows m0 .. m0 + MB - 1 of X: records and offset sums.
template <int MB>
struct RowPtrs {
  const uint8_t* x[MB];
  const float* sums[MB];
  RowPtrs(const Int8Rows& X, int64_t m0) {
    for (int r = 0; r < MB; ++r) {
      x[r] = X.row(m0 + r);
      sums[r] = X.sums(m0 + r);
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
  out->levels = levels;
  // L bytes and 1/4 f32 scale per element, then the sums.
  out->stride = ((levels + 1) * K + 4 * nsum + 63) / 64 * 64;
  out->buf = AlignedBuffer(M * out->stride);
  std::vector<int8_t> q1(K), q2(levels == 2 ? K : 0);
  std::vector<float> dn(nb);
  const int bias = g.unsigned_acts ? 128 : 0;
  // Q8_0 and the K-quants keep natural order: no per-byte index mapping on
  // this per-call path.
  const bool natural = g.fmt != Fmt::kQ4_0 && g.fmt != Fmt::kMlx4;
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
          for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(q[l][pos + i] + bias);
        } else {
          for (int64_t i = 0; i < n; ++i)
            codes[i] = static_cast<uint8_t>(q[l][SourceIndex(g.fmt, nb, pos + i)] + bias);
        }
      }
      for (int64_t l = 0; l < n / 4; ++l)
        dx[l] = dn[(natural ? pos + 4 * l : SourceIndex(g.fmt, nb, pos + 4 * l)) / kQK];
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

// The record's integer lane sums against weight vector w, started from init
// at every level: one level, dot(q1); two, (dot(q1) << 8) + dot(q2) (init
// must then be 0 or a per-level correction, as it is added at both levels).
// ActsUnsigned: the activations are vpdpbusd's unsigned operand (x + 128
// against signed weights); otherwise the weights are (unsigned codes against
// signed activations).
template <int L, bool ActsUnsigned>
LUMEN_VNNI inline __m512i LevelDot(__m512i init, __m512i w, const uint8_t* rec) {
  auto dot = [&](const uint8_t* p) LUMEN_VNNI {
    const __m512i a = _mm512_load_si512(p);
    return ActsUnsigned ? _mm512_dpbusd_epi32(init, a, w) : _mm512_dpbusd_epi32(init, w, a);
  };
  if constexpr (L == 1) {
    return dot(rec);
  } else {
    return _mm512_add_epi32(_mm512_slli_epi32(dot(rec), 8), dot(rec + 64));
  }
}

// The same on a half record (32 elements: L x 32 B), activations unsigned.
template <int L>
LUMEN_VNNI inline __m256i LevelDotHalf(__m256i init, __m256i w, const uint8_t* rec) {
  auto dot = [&](const uint8_t* p) LUMEN_VNNI {
    return _mm256_dpbusd_epi32(init, _mm256_load_si256(reinterpret_cast<const __m256i*>(p)), w);
  };
  if constexpr (L == 1) {
    return dot(rec);
  } else {
    return _mm256_add_epi32(_mm256_slli_epi32(dot(rec), 8), dot(rec + 32));
  }
}

// Codes of blocks blk and blk + block_bytes as one 64-byte vector.
template <Fmt F>
LUMEN_VNNI inline __m512i PairCodes(const uint8_t* blk) {
  if constexpr (F == Fmt::kQ4_0) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 18));
    const __m256i y = _mm256_inserti128_si256(_mm256_zextsi128_si256(a), b, 1);
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(y, m);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), m);
    const __m512i q = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
    return _mm512_sub_epi8(q, _mm512_set1_epi8(8));
  } else {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2 + 34));
    return _mm512_inserti64x4(_mm512_zextsi256_si512(a), b, 1);
  }
}

// The pair's two f16 weight scales spread to the lanes of their blocks.
template <Fmt F>
LUMEN_VNNI inline __m512 PairScales(const uint8_t* blk, int64_t block_bytes) {
  const uint32_t h = LoadU16(blk) | (LoadU16(blk + block_bytes) << 16);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h)));
  const __m512i idx = F == Fmt::kQ4_0
                          ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                          : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(f));
}

// Codes of one block, natural order, as 32 bytes.
template <Fmt F>
LUMEN_VNNI inline __m256i BlockCodes(const uint8_t* blk) {
  if constexpr (F == Fmt::kQ4_0) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(a, m), hi = _mm_and_si128(_mm_srli_epi16(a, 4), m);
    const __m256i q = _mm256_inserti128_si256(_mm256_zextsi128_si256(lo), hi, 1);
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  }
}

LUMEN_VNNI inline float F16Scalar(const uint8_t* p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU16(p)))));
}

// Rows [n0, n1) of W against MB prepared activation rows starting at m0.
// Two accumulators per row when MB <= 2 so the FMA latency does not bind.
template <Fmt F, int MB, int L>
LUMEN_VNNI void Rows(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                     int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int kAcc = 2;
  const int64_t K = W.k, nb = K / kQK, pairs = nb / 2, bb = g.block_bytes;
  const RowPtrs<MB> rp(X, m0);
  const auto& x = rp.x;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W.w.row<const uint8_t>(n);
    __m512 acc[MB][kAcc];
    for (int r = 0; r < MB; ++r)
      for (int a = 0; a < kAcc; ++a) acc[r][a] = _mm512_setzero_ps();
    // One pair into accumulator set A (a compile-time index: a runtime one
    // made GCC keep the accumulators on the stack).
    auto pair = [&]<int A>(int64_t p, std::integral_constant<int, A>) LUMEN_VNNI {
      const uint8_t* blk = row + 2 * p * bb;
      PrefetchAhead(blk, 1);  // a pair is 36 or 68 bytes: about a line per pair
      const __m512i w = PairCodes<F>(blk);
      const __m512 s = PairScales<F>(blk, bb);
      const __m512i corr = _mm512_sub_epi32(
          _mm512_setzero_si512(),
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), w));
      for (int r = 0; r < MB; ++r) {
        const uint8_t* rec = x[r] + kRecord<L> * p;
        const __m512i i = LevelDot<L, true>(corr, w, rec);
        const __m512 sd =
            _mm512_mul_ps(s, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
        acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
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
      const __m256i corr = _mm256_sub_epi32(
          _mm256_setzero_si256(),
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(char(0x80)), w));
      for (int r = 0; r < MB; ++r) {
        const uint8_t* rec = x[r] + kRecord<L> * pairs;
        const __m256i i = LevelDotHalf<L>(corr, w, rec);
        alignas(32) int32_t v[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v), i);
        int32_t sum = 0;
        for (int32_t e : v) sum += e;
        tail[r] = s * reinterpret_cast<const float*>(rec + 32 * L)[0] * static_cast<float>(sum);
      }
    }
    for (int r = 0; r < MB; ++r) {
      __m512 t = acc[r][0];
      if constexpr (kAcc == 2) t = _mm512_add_ps(t, acc[r][1]);
      Y[(m0 + r) * ldy + n] = _mm512_reduce_add_ps(t) + tail[r];
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
    const __m512i i = LevelDot<L, false>(_mm512_setzero_si512(), w, rec);
    const __m512 sd =
        _mm512_mul_ps(lanes, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
    acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
  }
}

template <int MB, int L>
LUMEN_VNNI void RowsQ4K(const Matrix& W, const Int8Rows& X, int64_t m0, float* Y, int64_t ldy,
                        int64_t n0, int64_t n1) {
  const int64_t nsb = W.k / kQKK;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  const __m512i idx[4] = {LaneIndex(0, 8), LaneIndex(2, 8), LaneIndex(4, 8), LaneIndex(6, 8)};
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W.w.row<const uint8_t>(n);
    __m512 acc[MB][2];
    __m256 off[MB];
    for (int r = 0; r < MB; ++r) {
      acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      off[r] = _mm256_setzero_ps();
    }
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = row + sb * sizeof(BlockQ4K);
      const __m512 sm = ScalesMinsQ4K(blk);
      const __m512 av = sm;  // lanes 0-7: d sc_j (the permutes below read only those)
      const uint8_t* qs = blk + 16;
      const int64_t c = 4 * sb;
      DotRecords<MB, 0, L>(x, c, NibblePair(qs), _mm512_permutexvar_ps(idx[0], av), acc);
      DotRecords<MB, 1, L>(x, c + 1, NibblePair(qs + 32), _mm512_permutexvar_ps(idx[1], av), acc);
      DotRecords<MB, 0, L>(x, c + 2, NibblePair(qs + 64), _mm512_permutexvar_ps(idx[2], av), acc);
      DotRecords<MB, 1, L>(x, c + 3, NibblePair(qs + 96), _mm512_permutexvar_ps(idx[3], av), acc);
      const __m256 ov = _mm512_extractf32x8_ps(sm, 1);  // dmin m_j
      for (int r = 0; r < MB; ++r)
        off[r] = _mm256_fmadd_ps(ov, _mm256_loadu_ps(rows.sums[r] + 8 * sb), off[r]);
    }
    for (int r = 0; r < MB; ++r) {
      alignas(32) float t[8];
      _mm256_store_ps(t, off[r]);
      float o = 0;
      for (float v : t) o += v;
      Y[(m0 + r) * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) - o;
    }
  }
}

// Q6_K: 6-bit codes from 4 low bits (ql) and 2 high bits (qh).
LUMEN_VNNI inline __m256i Six(__m256i low, __m256i high2) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  return _mm256_or_si256(_mm256_and_si256(low, m4),
                         _mm256_slli_epi16(_mm256_and_si256(high2, m3), 4));
}

template <int MB, int L>
LUMEN_VNNI void RowsQ6K(const Matrix& W, const Int8Rows& X, int64_t m0, float* Y, int64_t ldy,
                        int64_t n0, int64_t n1) {
  const int64_t nsb = W.k / kQKK;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  // Sub-blocks of 16: lane l of chunk k (64 elements) is sub-block 4k + l / 4.
  const __m512i idx[4] = {LaneIndex(0, 4), LaneIndex(4, 4), LaneIndex(8, 4), LaneIndex(12, 4)};
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W.w.row<const uint8_t>(n);
    __m512 acc[MB][2], off[MB];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = row + sb * sizeof(BlockQ6K);
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
      const __m512 av = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)),
                                      _mm512_set1_ps(F16Scalar(blk + 208)));
      const int64_t c = 4 * sb;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = blk + 64 * h;
        const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i C = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
        const __m256i q1 = Six(A, H), q2 = Six(C, _mm256_srli_epi16(H, 2));
        const __m256i q3 = Six(_mm256_srli_epi16(A, 4), _mm256_srli_epi16(H, 4));
        const __m256i q4 = Six(_mm256_srli_epi16(C, 4), _mm256_srli_epi16(H, 6));
        const __m512i w1 = _mm512_inserti64x4(_mm512_zextsi256_si512(q1), q2, 1);
        const __m512i w2 = _mm512_inserti64x4(_mm512_zextsi256_si512(q3), q4, 1);
        DotRecords<MB, 0, L>(x, c + 2 * h, w1, _mm512_permutexvar_ps(idx[2 * h], av), acc);
        DotRecords<MB, 1, L>(x, c + 2 * h + 1, w2, _mm512_permutexvar_ps(idx[2 * h + 1], av), acc);
      }
      for (int r = 0; r < MB; ++r)
        off[r] = _mm512_fmadd_ps(av, _mm512_loadu_ps(rows.sums[r] + 16 * sb), off[r]);
    }
    for (int r = 0; r < MB; ++r)
      Y[(m0 + r) * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) -
                              32.0f * _mm512_reduce_add_ps(off[r]);
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

template <int MB, int L>
LUMEN_VNNI void RowsMlx4(const Matrix& W, const Int8Rows& X, int64_t m0, float* Y, int64_t ldy,
                         int64_t n0, int64_t n1) {
  const int64_t K = W.k, G = W.mlx_group, ng = K / G, cpg = G / 64;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  std::vector<float> sb(2 * ng);  // the row's scales, then biases
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* codes = W.w.row<const uint8_t>(n);
    ToF32(W.scales.dtype, W.scales.row<const uint8_t>(n), sb.data(), ng);
    ToF32(W.biases.dtype, W.biases.row<const uint8_t>(n), sb.data() + ng, ng);
    __m512 acc[MB][2], off[MB];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      const __m512 sc = _mm512_set1_ps(sb[g]);
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
        if (c % 2 == 0) {
          DotRecords<MB, 0, L>(x, c, NibblePair(codes + 32 * c), sc, acc);
        } else {
          DotRecords<MB, 1, L>(x, c, NibblePair(codes + 32 * c), sc, acc);
        }
      }
    }
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
      case Fmt::kQ8_0:
        return Rows<Fmt::kQ8_0, MB, L>(W, g, X, m, Y, ldy, n0, n1);
      case Fmt::kQ4K:
        return RowsQ4K<MB, L>(W, X, m, Y, ldy, n0, n1);
      case Fmt::kQ6K:
        return RowsQ6K<MB, L>(W, X, m, Y, ldy, n0, n1);
      case Fmt::kMlx4:
        return RowsMlx4<MB, L>(W, X, m, Y, ldy, n0, n1);
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
    return W.mlx_bits == 4 && (W.mlx_group == 64 || W.mlx_group == 128) && W.k % W.mlx_group == 0 &&
           flt(st) && flt(bt);
  }
  switch (W.w.dtype) {
    case DType::kQ4_0:
    case DType::kQ8_0:
      return W.k % kQK == 0;
    case DType::kQ4_K:
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
  // One prepared copy of X per weight format and level count present (q/k/v
  // may differ).
  Int8Rows rows[kNumFmts][2];
  bool have[kNumFmts][2] = {};
  auto slot = [](const Matrix& w) {
    return std::pair<int, int>(static_cast<int>(GeometryFor(w).fmt), Int8Levels(w.route) - 1);
  };
  int64_t total = 0;
  for (const MatMulOut& o : outs) {
    LUMEN_CHECK(Int8RouteSupports(*o.w));
    const auto [f, l] = slot(*o.w);
    if (!have[f][l]) Prepare(GeometryFor(*o.w), X, M, ldx, o.w->k, l + 1, &rows[f][l]);
    have[f][l] = true;
    total += o.w->n;
  }
  auto fn = [&](int64_t b, int64_t e, int) {
    int64_t off = 0;
    for (const MatMulOut& o : outs) {
      const int64_t lo = std::max<int64_t>(b - off, 0), hi = std::min<int64_t>(e - off, o.w->n);
      const auto [f, l] = slot(*o.w);
      if (lo < hi) MatMulRowsInt8(*o.w, rows[f][l], o.y, o.ldy, lo, hi);
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
