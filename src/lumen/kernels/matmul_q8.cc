#include "lumen/kernels/matmul_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/core/quant.h"

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

namespace lumen::kernels {
namespace {

enum class Fmt { kQ4_0, kQ8_0 };

// Blocks are [f16 scale | codes]; only the size differs.
struct Geometry {
  Fmt fmt;
  int64_t block_bytes;
};

Geometry GeometryFor(DType t) {
  if (t == DType::kQ4_0) return {Fmt::kQ4_0, sizeof(BlockQ4_0)};
  return {Fmt::kQ8_0, sizeof(BlockQ8_0)};
}

// Natural element index (within the row) of byte `pos` of the laid-out row.
int64_t SourceIndex(Fmt fmt, int64_t nb, int64_t pos) {
  const int64_t b = pos / kQK;
  if (fmt == Fmt::kQ8_0 || (nb % 2 == 1 && b == nb - 1)) return pos;  // natural order
  const int64_t p = pos / 64, o = pos % 64;                           // Q4_0 pair
  const int64_t blk = 2 * p + (o / 16) % 2, e = (o % 16) + (o >= 32 ? 16 : 0);
  return blk * kQK + e;
}

// Activation rows quantized and laid out for one weight format. Each row is
// a run of records, one per weight pair: [u = x + 128, 64 B | lane scales,
// 16 x f32], then for an odd last block a half record [32 B | 8 x f32]. One
// pointer per row and sequential reads (with separate arrays the 4-row kernel
// ran out of registers).
struct Int8Rows {
  int64_t M = 0, K = 0, stride = 0;  // stride: bytes per row (a multiple of 64)
  AlignedBuffer buf;
  const uint8_t* row(int64_t m) const { return buf.as<const uint8_t>() + m * stride; }
};

constexpr int64_t kRecord = 128;

void Prepare(const Geometry& g, const float* X, int64_t M, int64_t ldx, int64_t K, Int8Rows* out) {
  const int64_t nb = K / kQK;
  out->M = M;
  out->K = K;
  out->stride = (2 * K + 63) / 64 * 64;  // per element: a byte, and a f32 scale per 4
  out->buf = AlignedBuffer(M * out->stride);
  std::vector<int8_t> qn(K);
  std::vector<float> dn(nb);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b)
      QuantizeActivationBlock(X + m * ldx + b * kQK, qn.data() + b * kQK, &dn[b]);
    uint8_t* rec = out->buf.as<uint8_t>() + m * out->stride;
    for (int64_t pos = 0; pos < K;) {
      const int64_t n = std::min<int64_t>(64, K - pos);  // 64, or 32 for the half record
      float* dx = reinterpret_cast<float*>(rec + n);
      for (int64_t i = 0; i < n; ++i) rec[i] = uint8_t(qn[SourceIndex(g.fmt, nb, pos + i)] + 128);
      for (int64_t l = 0; l < n / 4; ++l) dx[l] = dn[SourceIndex(g.fmt, nb, pos + 4 * l) / kQK];
      rec += 2 * n;
      pos += n;
    }
  }
}

#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_* as the unused merge
// source, which -Wmaybe-uninitialized reports at every inlined use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

bool CpuHasVnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

LUMEN_VNNI inline uint32_t LoadU16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
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
template <Fmt F, int MB>
LUMEN_VNNI void Rows(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                     int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int kAcc = 2;
  const int64_t K = W.k, nb = K / kQK, pairs = nb / 2, bb = g.block_bytes;
  const uint8_t* x[MB];
  for (int r = 0; r < MB; ++r) x[r] = X.row(m0 + r);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = W.w.row<const uint8_t>(n);
    __m512 acc[MB][kAcc];
    for (int r = 0; r < MB; ++r)
      for (int a = 0; a < kAcc; ++a) acc[r][a] = _mm512_setzero_ps();
    // One pair into accumulator set A (a compile-time index: a runtime one
    // made GCC keep the accumulators on the stack).
    auto pair = [&]<int A>(int64_t p, std::integral_constant<int, A>) LUMEN_VNNI {
      const uint8_t* blk = row + 2 * p * bb;
      const __m512i w = PairCodes<F>(blk);
      const __m512 s = PairScales<F>(blk, bb);
      const __m512i corr = _mm512_sub_epi32(
          _mm512_setzero_si512(),
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), w));
      for (int r = 0; r < MB; ++r) {
        const uint8_t* rec = x[r] + kRecord * p;
        const __m512i i = _mm512_dpbusd_epi32(corr, _mm512_load_si512(rec), w);
        const __m512 sd =
            _mm512_mul_ps(s, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64)));
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
        const uint8_t* rec = x[r] + kRecord * pairs;
        const __m256i i =
            _mm256_dpbusd_epi32(corr, _mm256_load_si256(reinterpret_cast<const __m256i*>(rec)), w);
        alignas(32) int32_t v[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(v), i);
        int32_t sum = 0;
        for (int32_t e : v) sum += e;
        tail[r] = s * reinterpret_cast<const float*>(rec + 32)[0] * static_cast<float>(sum);
      }
    }
    for (int r = 0; r < MB; ++r) {
      __m512 t = acc[r][0];
      if constexpr (kAcc == 2) t = _mm512_add_ps(t, acc[r][1]);
      Y[(m0 + r) * ldy + n] = _mm512_reduce_add_ps(t) + tail[r];
    }
  }
}

template <Fmt F>
void RowsAllM(const Matrix& W, const Geometry& g, const Int8Rows& X, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + 4 <= X.M; m += 4) Rows<F, 4>(W, g, X, m, Y, ldy, n0, n1);
  switch (X.M - m) {
    case 3:
      return Rows<F, 3>(W, g, X, m, Y, ldy, n0, n1);
    case 2:
      return Rows<F, 2>(W, g, X, m, Y, ldy, n0, n1);
    case 1:
      return Rows<F, 1>(W, g, X, m, Y, ldy, n0, n1);
    default:
      return;
  }
}

void MatMulRowsInt8(const Matrix& W, const Int8Rows& X, float* Y, int64_t ldy, int64_t n0,
                    int64_t n1) {
  const Geometry g = GeometryFor(W.w.dtype);
  if (g.fmt == Fmt::kQ4_0) return RowsAllM<Fmt::kQ4_0>(W, g, X, Y, ldy, n0, n1);
  return RowsAllM<Fmt::kQ8_0>(W, g, X, Y, ldy, n0, n1);
}

#pragma GCC diagnostic pop

#else  // no x86: the route is never supported, so these are never called

bool CpuHasVnni() { return false; }
void MatMulRowsInt8(const Matrix&, const Int8Rows&, float*, int64_t, int64_t, int64_t) {
  LUMEN_CHECK(false);
}

#endif

}  // namespace

void QuantizeActivationBlock(const float* x, int8_t* q, float* d) {
  float amax = 0.0f;
  for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.0f;
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < kQK; ++i) {
    // |x * inv| <= 127 up to one rounding; the clamp keeps a rounding to 127.5 in range.
    const float v = std::nearbyint(x[i] * inv);
    q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  *d = scale;
}

bool Int8RouteSupports(const Matrix& W) {
  static const bool vnni = CpuHasVnni();  // CPU feature, fixed for the process
  if (!vnni || W.mlx_bits != 0 || W.k % kQK != 0) return false;
  return W.w.dtype == DType::kQ4_0 || W.w.dtype == DType::kQ8_0;
}

void MatMulInt8(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool) {
  const MatMulOut out{&W, Y, ldy};
  MatMulManyInt8({&out, 1}, X, M, ldx, pool);
}

void MatMulManyInt8(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                    ThreadPool* pool) {
  // One prepared copy of X per weight format present (q/k/v may differ).
  Int8Rows rows[2];
  bool have[2] = {false, false};
  int64_t total = 0;
  for (const MatMulOut& o : outs) {
    LUMEN_CHECK(Int8RouteSupports(*o.w));
    const Geometry g = GeometryFor(o.w->w.dtype);
    const int f = static_cast<int>(g.fmt);
    if (!have[f]) Prepare(g, X, M, ldx, o.w->k, &rows[f]);
    have[f] = true;
    total += o.w->n;
  }
  auto fn = [&](int64_t b, int64_t e, int) {
    int64_t off = 0;
    for (const MatMulOut& o : outs) {
      const int64_t lo = std::max<int64_t>(b - off, 0), hi = std::min<int64_t>(e - off, o.w->n);
      const int f = static_cast<int>(GeometryFor(o.w->w.dtype).fmt);
      if (lo < hi) MatMulRowsInt8(*o.w, rows[f], o.y, o.ldy, lo, hi);
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
