#include "lumen/kernels/matmul_q8x2_gemm.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/route.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/prefetch.h"
#include "lumen/kernels/q23_columns_avx512.h"
#include "lumen/kernels/q4k_scales_avx512.h"
#include "lumen/kernels/transpose16_avx512.h"
#include "lumen/kernels/vnni_target.h"

namespace lumen::kernels {

LUMEN_ROUTE(
    matmul_int8x2_prefill,
    {.node = "matmul.prefill",
     .name = "int8x2-gemm-vnni",
     .tier = Tier::kL2,
     .oracle = "MatMulInt8x2Ref (the decode kernels' two-level activation quantization, double "
               "accumulation; F16/BF16 weights requantized to 12-bit codes per 32); against the "
               "exact product: the activation (and requantization) rounding bound",
     .bound = "|y - y_exact| <= sum over blocks of (dx / 256) sum |w| (F16/BF16: plus "
              "(amax / 4094) sum |x| per 32) (+ f32 slack); KL(exact || route) below a quarter "
              "of what Q8_0 weights cost",
     .tests = "Int8x2Gemm.*;RouteKl.Int8x2PrefillGemmPassesTheDefaultGate;RouteKl."
              "Int8x2PrefillGemmGateOnMlx",
     .measure = "docs/reference/performance.md#the-int8x2-prefill-gemm-session-40",
     .when = "act=int8x2|int8x2+bf16 cpu=avx512vnni int8gemm=kernel",
     .priority = 15});

namespace {

// The unit of W's storage (elements per scale: 16 for Q6_K, whose 8-bit
// sub-block scales times its codes could pass int32 over 32 products; Q2_K's
// and Q3_K's 4- and 6-bit ones are folded into their codes), and its offset
// unit (elements per offset; 0: none).
int UnitOf(const Matrix& W) { return PlainOf(W.w.dtype) == DType::kQ6_K ? 16 : 32; }
int OffsetUnitOf(const Matrix& W) {
  if (W.mlx_bits) return 32;  // -bias per group, repeated per 32
  const DType plain = PlainOf(W.w.dtype);
  if (plain == DType::kQ2_K) return 16;
  return plain == DType::kQ4_1 || plain == DType::kQ5_1 || plain == DType::kQ4_K ||
                 plain == DType::kQ5_K
             ? 32
             : 0;
}

bool Covered(DType plain) {
  switch (plain) {
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

// Tile and blocking: kR rows by kNR columns (two vectors); kKC columns of K
// per slice, whose panel part (kKC / 2 pairs x kNR int32) is 16 KiB of L1.
constexpr int kR = 6;
constexpr int64_t kNR = 32;
constexpr int64_t kKC = 256;
// How far ahead of the row it decodes a panel prefetches: a short prompt's
// call (16-64 rows) is as long as streaming its weights, and the hardware
// prefetchers of the Xeon in performance.md do not run ahead of the decode;
// 4-32 rows measured alike there (16-token F16 prefill, "Short prompts on VNNI").
constexpr int64_t kAheadRows = 8;

#if defined(__x86_64__)

LUMEN_INTRINSICS_BEGIN

LUMEN_VNNI inline float HalfF(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 byte codes (each below 64) as 32 int16 at c, minus `shift`, plus 16 in
// the lanes of `plus16` (a 5th bit).
LUMEN_VNNI inline void StoreCodes(__m256i bytes, __mmask32 plus16, int shift, int16_t* c) {
  __m512i w = _mm512_cvtepu8_epi16(bytes);
  w = _mm512_mask_add_epi16(w, plus16, w, _mm512_set1_epi16(16));
  _mm512_storeu_si512(c, _mm512_sub_epi16(w, _mm512_set1_epi16(static_cast<int16_t>(shift))));
}

// StoreCodes without a 5th bit, then times m0 (elements 0-15) and m1 (16-31):
// a sub-block scale folded into the codes.
LUMEN_VNNI inline void StoreScaledCodes(__m256i bytes, int shift, int m0, int m1, int16_t* c) {
  const __m512i w =
      _mm512_sub_epi16(_mm512_cvtepu8_epi16(bytes), _mm512_set1_epi16(static_cast<int16_t>(shift)));
  const __m512i m = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(m0)),
                                       _mm256_set1_epi16(static_cast<int16_t>(m1)), 1);
  _mm512_storeu_si512(c, _mm512_mullo_epi16(w, m));
}

// The 2-bit planes of a Q2_K / Q3_K super-block: the 32 codes of elements
// 128 n + 32 j + (0..31).
LUMEN_VNNI inline __m256i TwoBitPlane(const uint8_t* qs, int n, int j) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * n));
  return _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), _mm256_set1_epi8(3));
}

// A group's code columns (64 bytes each: dword l of a column is block l's;
// the legacy types' and Q8_0's column groups, MLX groups; core/repack.h)
// transposed in registers: by[h][r]'s 128-bit lane j holds block 4 j + r's
// dwords of columns 4 h .. 4 h + 3 (a 4 x 16 dword transpose of each four
// columns: four scalar dwords stored and read back as a vector stall the
// load). pick[j]: lane j's dword indexes, then lane j's of a second vector,
// so a block's bytes are one permute.
struct GroupColumns {
  __m512i by[2][4];
  __m512i pick[4];
};

// The first `quads` quads of columns (four each) at col.
LUMEN_VNNI inline GroupColumns LoadGroupColumns(const uint8_t* col, int quads) {
  GroupColumns g;
  for (int h = 0; h < quads; ++h) {
    const uint8_t* c4 = col + 256 * h;
    const __m512i c0 = _mm512_loadu_si512(c4), c1 = _mm512_loadu_si512(c4 + 64);
    const __m512i c2 = _mm512_loadu_si512(c4 + 128), c3 = _mm512_loadu_si512(c4 + 192);
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
    const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
    g.by[h][0] = _mm512_unpacklo_epi64(t0, t2);
    g.by[h][1] = _mm512_unpackhi_epi64(t0, t2);
    g.by[h][2] = _mm512_unpacklo_epi64(t1, t3);
    g.by[h][3] = _mm512_unpackhi_epi64(t1, t3);
  }
  const __m512i base = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 0, 1, 2, 3, 16, 17, 18, 19);
  for (int j = 0; j < 4; ++j) g.pick[j] = _mm512_add_epi32(base, _mm512_set1_epi32(4 * j));
  return g;
}

// Block l's first 16 bytes (dwords 0-3) in the file's order.
LUMEN_VNNI inline __m128i GroupBlock16(const GroupColumns& g, int64_t l) {
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(g.pick[l / 4], g.by[0][l % 4]));
}

// Block l's 32 bytes (dwords 0-7; two quads loaded) in the file's order.
LUMEN_VNNI inline __m256i GroupBlock32(const GroupColumns& g, int64_t l) {
  return _mm512_castsi512_si256(
      _mm512_permutex2var_epi32(g.by[0][l % 4], g.pick[l / 4], g.by[1][l % 4]));
}

// One weight row as the oracle splits it (matmul_q8_ref.h, w = a q - o):
// codes[k], and per unit u of S elements scale[u] = a and offset[u] = o.
// `plain` holds the row's blocks in the file's format (t plain), or Q2_K's
// records / Q3_K's planes (t kQ2_KCols / kQ3_KCols).
LUMEN_VNNI void DecodeRow(DType t, const uint8_t* plain, int64_t K, int16_t* codes, float* scale,
                          float* offset) {
  const __m128i m15 = _mm_set1_epi8(15);
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool min = t == DType::kQ4_1 || t == DType::kQ5_1;
      const bool five = t == DType::kQ5_0 || t == DType::kQ5_1;
      const int64_t bytes = Info(t).block_bytes, qs = 2 + (min ? 2 : 0) + (five ? 4 : 0);
      const int shift = min ? 0 : five ? 16 : 8;
      for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t* blk = plain + b * bytes;
        uint32_t h = 0;  // bit j: the 5th bit of element j
        if (five) std::memcpy(&h, blk + qs - 4, 4);
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + qs));
        const __m128i lo = _mm_and_si128(q, m15), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m15);
        StoreCodes(_mm256_set_m128i(hi, lo), h, shift, codes + b * kQK);
        scale[b] = HalfF(blk);
        offset[b] = min ? -HalfF(blk + 2) : 0.0f;
      }
      return;
    }
    case DType::kQ8_0:
      for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t* blk = plain + b * sizeof(BlockQ8_0);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        _mm512_storeu_si512(codes + b * kQK, _mm512_cvtepi8_epi16(q));
        scale[b] = HalfF(blk);
        offset[b] = 0.0f;
      }
      return;
    case DType::kQ2_K:
    case DType::kQ2_KCols:
    case DType::kQ3_K:
    case DType::kQ3_KCols: {
      // Codes times their sub-block's scale (Q2_K: q (sc & 15), at most 45;
      // Q3_K: (q - 4) (sc - 32), at most 128 in magnitude), one scale d per
      // 32-unit; Q2_K's offsets dmin (sc >> 4) per 16 elements.
      const bool three = t == DType::kQ3_K || t == DType::kQ3_KCols;
      const bool repacked = t == DType::kQ2_KCols || t == DType::kQ3_KCols;
      const int64_t bytes = three ? sizeof(BlockQ3K) : sizeof(BlockQ2K);
      for (int64_t s = 0; s < K / kQKK; ++s) {
        const uint8_t* blk = plain + s * bytes;
        const uint8_t* qs = blk + (three ? offsetof(BlockQ3K, qs) : offsetof(BlockQ2K, qs));
        const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));  // Q3_K
        int sc[16];
        for (int u = 0; u < 16; ++u)
          sc[u] = three ? Q3KScale(blk + offsetof(BlockQ3K, scales), u) - 32 : blk[u] & 15;
        if (repacked) {
          // Q2_K records, Q3_K planes (q23_columns_avx512.h): block l's 32
          // codes, sub-blocks 2 l and 2 l + 1, from the columns by lane.
          __m512i u[4];
          if (three) {
            Q3PlaneColumns(blk, u);
          } else {
            Q2RecordColumns(qs, u);
          }
          const SubBlockCodes sub(u);
          for (int l = 0; l < 8; ++l)
            StoreScaledCodes(sub.Block(l), three ? 4 : 0, sc[2 * l], sc[2 * l + 1],
                             codes + s * kQKK + 32 * l);
        } else {
          for (int n = 0; n < 2; ++n)
            for (int j = 0; j < 4; ++j) {
              const __m256i lo = TwoBitPlane(qs, n, j);
              const int u = 8 * n + 2 * j;  // the sub-blocks of elements 128 n + 32 j ..
              int16_t* c = codes + s * kQKK + 128 * n + 32 * j;
              if (!three) {
                StoreScaledCodes(lo, 0, sc[u], sc[u + 1], c);
                continue;
              }
              // q - 4, plus 4 where the third bit (bit 4 n + j of hmask[l]) is set.
              const __mmask32 third = _mm256_test_epi8_mask(
                  hmask, _mm256_set1_epi8(static_cast<char>(1 << (4 * n + j))));
              const __m256i q = _mm256_mask_add_epi8(lo, third, lo, _mm256_set1_epi8(4));
              StoreScaledCodes(q, 4, sc[u], sc[u + 1], c);
            }
        }
        const float d = HalfF(blk + (three ? offsetof(BlockQ3K, d) : offsetof(BlockQ2K, d)));
        for (int u = 0; u < 8; ++u) scale[s * 8 + u] = d;
        if (!three) {
          const float dmin = HalfF(blk + offsetof(BlockQ2K, dmin));
          for (int u = 0; u < 16; ++u) offset[s * 16 + u] = dmin * (blk[u] >> 4);
        }
      }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = t == DType::kQ5_K;
      const int64_t bytes = five ? sizeof(BlockQ5K) : sizeof(BlockQ4K);
      const __m256i n15 = _mm256_set1_epi8(15);
      for (int64_t s = 0; s < K / kQKK; ++s) {
        const uint8_t* blk = plain + s * bytes;
        const float d = HalfF(blk), dmin = HalfF(blk + 2);
        const uint8_t* qs = blk + (five ? 48 : 16);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
        for (int p = 0; p < 4; ++p) {
          // Elements 64 p + l: the low nibble of qs[32 p + l] (5th bit: bit 2 p of
          // qh[l]); 64 p + 32 + l: the high nibble (bit 2 p + 1).
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * p));
          const __mmask32 b0 =
              five ? _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << (2 * p))))
                   : 0;
          const __mmask32 b1 =
              five ? _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(2 << (2 * p))))
                   : 0;
          StoreCodes(_mm256_and_si256(q, n15), b0, 0, codes + s * kQKK + 64 * p);
          StoreCodes(_mm256_and_si256(_mm256_srli_epi16(q, 4), n15), b1, 0,
                     codes + s * kQKK + 64 * p + 32);
        }
        for (int u = 0; u < 8; ++u) {
          uint8_t a, m;
          GetScaleMinK4(u, blk + 4, &a, &m);
          scale[s * 8 + u] = d * a;
          offset[s * 8 + u] = dmin * m;
        }
      }
      return;
    }
    case DType::kQ6_K: {
      const __m256i n15 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
      for (int64_t s = 0; s < K / kQKK; ++s) {
        const uint8_t* blk = plain + s * sizeof(BlockQ6K);
        const float d = HalfF(blk + offsetof(BlockQ6K, d));
        for (int n = 0; n < 2; ++n) {
          const __m256i qh = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ6K, qh) + 32 * n));
          for (int q = 0; q < 4; ++q) {
            // Elements 128 n + 32 q + l: a nibble of ql (low for q < 2) and
            // bits 2 q of qh[32 n + l] as bits 4-5.
            const __m256i ql =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * n + 32 * (q & 1)));
            const __m256i lo =
                q < 2 ? _mm256_and_si256(ql, n15) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), n15);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * q), three);
            StoreCodes(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), 0, 32,
                       codes + s * kQKK + 128 * n + 32 * q);
          }
        }
        const auto* sc = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6K, scales));
        for (int u = 0; u < 16; ++u) {
          scale[s * 16 + u] = d * sc[u];
          offset[s * 16 + u] = 0.0f;
        }
      }
      return;
    }
    default:
      LUMEN_CHECK(false);
  }
}

// The largest |w| of up to 16 F16 / BF16 units (32 elements, 64 bytes each,
// from p) as the storage's 16-bit patterns, dword j for unit j (zero past
// `units`). Sign-cleared patterns order as their values do, with inf and NaN
// above every finite one, so the maxima are taken as integers and also tell
// which units are finite. A tree across registers: at each step pairs of
// registers trade halves and keep the larger, so 16 units cost 15 maxima,
// 30 shuffles and a permute, not 16 horizontal reductions.
LUMEN_VNNI __m512i UnitMaxBits(const uint8_t* p, int units) {
  const __m512i abs = _mm512_set1_epi16(0x7FFF);
  __m512i v[16];
  for (int j = 0; j < 16; ++j)
    v[j] = j < units ? _mm512_and_si512(_mm512_loadu_si512(p + j * 2 * kQK), abs)
                     : _mm512_setzero_si512();
  // a[i]: 128-bit lanes 0-1 unit 2i, 2-3 unit 2i + 1.
  __m512i a[8];
  for (int i = 0; i < 8; ++i) {
    const __m512i x = v[2 * i], y = v[2 * i + 1];
    a[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(x, y, 0x44), _mm512_shuffle_i64x2(x, y, 0xEE));
  }
  // b[i]: 128-bit lane l unit 4i + l.
  __m512i b[4];
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_max_epu16(_mm512_shuffle_i64x2(a[2 * i], a[2 * i + 1], 0x88),
                            _mm512_shuffle_i64x2(a[2 * i], a[2 * i + 1], 0xDD));
  // c[i]: in 128-bit lane l, qword 0 unit 8i + l, qword 1 unit 8i + 4 + l.
  __m512i c[2];
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_max_epu16(_mm512_unpacklo_epi64(b[2 * i], b[2 * i + 1]),
                            _mm512_unpackhi_epi64(b[2 * i], b[2 * i + 1]));
  // In 128-bit lane l, dword k: unit 4k + l (two words each).
  const __m512 c0 = _mm512_castsi512_ps(c[0]), c1 = _mm512_castsi512_ps(c[1]);
  __m512i d = _mm512_max_epu16(_mm512_castps_si512(_mm512_shuffle_ps(c0, c1, 0x88)),
                               _mm512_castps_si512(_mm512_shuffle_ps(c0, c1, 0xDD)));
  d = _mm512_and_si512(_mm512_max_epu16(d, _mm512_srli_epi32(d, 16)), _mm512_set1_epi32(0xFFFF));
  // Dword 4l + k holds unit 4k + l.
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_epi32(order, d);
}

// Elements [0, 32) of a unit at p as f32.
LUMEN_VNNI void LoadFloatUnit(DType t, const uint8_t* p, __m512* w0, __m512* w1) {
  const __m512i h = _mm512_loadu_si512(p);
  const __m256i h0 = _mm512_castsi512_si256(h), h1 = _mm512_extracti64x4_epi64(h, 1);
  if (t == DType::kBF16) {
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
    *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
  } else {
    *w0 = _mm512_cvtph_ps(h0);
    *w1 = _mm512_cvtph_ps(h1);
  }
}

// An F16 / BF16 row requantized per 32-unit to 12-bit codes as the oracle
// does it (matmul_q8_ref.h): q = rint(w 2047 / amax), scale amax / 2047
// (zero below kFloatUnitTiny); a unit with an inf or NaN gets scale NaN (its
// outputs are NaN where the exact route's would be non-finite). No offsets.
// Sixteen units at a time: their maxima, scales and reciprocals as vectors,
// then each unit read again (from L1) for its codes. ahead (may be null): a
// later row, prefetched into L2 a line per unit.
LUMEN_VNNI void DecodeFloatRow(DType t, const uint8_t* row, int64_t K, int16_t* codes, float* scale,
                               const uint8_t* ahead) {
  const bool bf16 = t == DType::kBF16;
  // Pairs of packed 16-bit codes come out as qwords 0 2 4 6 1 3 5 7.
  const __m512i unpack = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
  for (int64_t b0 = 0; b0 < K / kQK; b0 += 16) {
    const int units = static_cast<int>(std::min<int64_t>(16, K / kQK - b0));
    const uint8_t* p = row + b0 * kQK * 2;
    if (ahead)
      for (int j = 0; j < units; ++j) __builtin_prefetch(ahead + (b0 + j) * kQK * 2, 0, 2);
    const __m512i bits = UnitMaxBits(p, units);
    const __m512 amax = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16))
                             : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits));
    const __mmask16 finite =
        _mm512_cmplt_epu32_mask(bits, _mm512_set1_epi32(bf16 ? 0x7F80 : 0x7C00));
    const __mmask16 live =
        finite & _mm512_cmp_ps_mask(amax, _mm512_set1_ps(kFloatUnitTiny), _CMP_GE_OQ);
    alignas(64) float inv[16];
    _mm512_store_ps(inv, _mm512_maskz_div_ps(live, _mm512_set1_ps(kFloatCodeMax), amax));
    const __m512 s =
        _mm512_mask_blend_ps(finite, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                             _mm512_maskz_div_ps(live, amax, _mm512_set1_ps(kFloatCodeMax)));
    _mm512_mask_storeu_ps(scale + b0, static_cast<__mmask16>((1u << units) - 1), s);
    for (int j = 0; j < units; ++j) {
      int16_t* out = codes + (b0 + j) * kQK;
      if (!((live >> j) & 1)) {
        _mm512_storeu_si512(out, _mm512_setzero_si512());
        continue;
      }
      __m512 w0, w1;
      LoadFloatUnit(t, p + j * 2 * kQK, &w0, &w1);
      const __m512 r = _mm512_set1_ps(inv[j]);
      const __m512i q = _mm512_packs_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(w0, r)),
                                           _mm512_cvtps_epi32(_mm512_mul_ps(w1, r)));
      _mm512_storeu_si512(out, _mm512_permutexvar_epi64(unpack, q));
    }
  }
}

// An MLX row n (w = s q + b per group, the file's little-endian words: 4-bit
// element i is nibble i % 2 of byte i / 2, 8-bit element i byte i) as the
// oracle splits it: codes q, and per 32-unit a = s and o = -b of its group.
// sb: room for the row's group scales and biases (2 K / group floats). Codes
// in groups (MlxOrder::kGroups) are read as the column groups are.
LUMEN_VNNI void DecodeMlxRow(const Matrix& W, int64_t n, int16_t* codes, float* scale,
                             float* offset, float* sb) {
  const int64_t K = W.k, G = W.mlx_group;
  const bool eight = W.mlx_bits == 8;
  float* s = sb;
  float* b = sb + K / G;
  DequantizeRow(W.scales.dtype, W.scales.row(n), s, K / G);
  DequantizeRow(W.biases.dtype, W.biases.row(n), b, K / G);
  const uint8_t* row = W.w.row<const uint8_t>(n);
  const int64_t gb = MlxGroupBytes(W.mlx_bits);
  const int64_t groups = W.mlx_order == MlxOrder::kGroups ? K * W.mlx_bits / 8 / gb : 0;
  const __m128i m15 = _mm_set1_epi8(15);
  GroupColumns cols;
  for (int64_t u = 0; u < K / kQK; ++u) {
    const int64_t l = u % kColsBlocks;
    const bool in_group = u / kColsBlocks < groups;
    if (in_group && l == 0) cols = LoadGroupColumns(row + u / kColsBlocks * gb, eight ? 2 : 1);
    __m256i q;
    if (eight) {
      q = in_group ? GroupBlock32(cols, l)
                   : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + u * kQK));
    } else {  // 16 bytes: low nibbles the even elements, high the odd
      const __m128i v = in_group
                            ? GroupBlock16(cols, l)
                            : _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + u * kQK / 2));
      const __m128i lo = _mm_and_si128(v, m15), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m15);
      q = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    }
    _mm512_storeu_si512(codes + u * kQK, _mm512_cvtepu8_epi16(q));
    const int64_t g = u * kQK / G;
    scale[u] = s[g];
    offset[u] = -b[g];
  }
}

// DecodeRow for a row of column groups (core/repack.h) of the legacy types,
// Q4_K and Q5_K, read where the groups hold them (the blocks after the last
// group are plain): block (sub-block) l's 16 code bytes are dword l of each
// code column, its 5th bits nibble l of each mask. Q6_K (repacked a
// super-block at a time) goes through UnpackColumnGroupsRow, Q2_K and Q3_K
// through DecodeRow, which reads their records and planes.
LUMEN_VNNI void DecodeGroupsRow(DType t, const uint8_t* row, int64_t K, int16_t* codes,
                                float* scale, float* offset) {
  const DType plain = PlainOf(t);
  const int64_t be = Info(plain).block_elems, bb = Info(plain).block_bytes;
  const int64_t group = kColsElems / be * bb, groups = K / kColsElems;
  const bool super = be == kQKK, eight = plain == DType::kQ8_0;
  const bool min = plain == DType::kQ4_1 || plain == DType::kQ5_1;
  const bool five = plain == DType::kQ5_0 || plain == DType::kQ5_1 || plain == DType::kQ5_K;
  const int shift = plain == DType::kQ4_0 ? 8 : plain == DType::kQ5_0 ? 16 : 0;
  const __m128i m15 = _mm_set1_epi8(15);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp = row + g * group;
    const ColsFields f = ColsFieldsAt(plain, grp);
    const uint8_t* col = grp + f.codes;
    uint64_t masks[8] = {};
    if (five) std::memcpy(masks, grp + f.high, sizeof(masks));
    const GroupColumns cols = LoadGroupColumns(col, eight ? 2 : 1);
    if (super) {  // lane l: sub-block l % 8 of super-block l / 8 (d sc, dmin m: exact products)
      __m512 a, o;
      ScalesMinsQ4KPair(grp + f.scales, &a, &o);
      _mm512_storeu_ps(scale + g * kColsBlocks, a);
      _mm512_storeu_ps(offset + g * kColsBlocks, o);
    }
    for (int64_t l = 0; l < kColsBlocks; ++l) {
      int16_t* c = codes + g * kColsElems + kQK * l;
      const int64_t u = g * kColsBlocks + l;
      if (eight) {  // codes plus 128
        const __m256i q8 =
            _mm256_xor_si256(GroupBlock32(cols, l), _mm256_set1_epi8(static_cast<char>(0x80)));
        _mm512_storeu_si512(c, _mm512_cvtepi8_epi16(q8));
      } else {
        const __m128i q = GroupBlock16(cols, l);
        uint32_t h = 0;  // bit e: the 5th bit of element e = 4 m + i, bit 4 l + i of mask m
        if (five)
          for (int m = 0; m < 8; ++m)
            h |= static_cast<uint32_t>((masks[m] >> (4 * l)) & 15) << (4 * m);
        const __m128i lo = _mm_and_si128(q, m15), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m15);
        StoreCodes(_mm256_set_m128i(hi, lo), h, shift, c);
      }
      if (!super) {
        scale[u] = HalfF(grp + f.d + 2 * l);
        offset[u] = min ? -HalfF(grp + f.m + 2 * l) : 0.0f;
      }
    }
  }
  const int64_t done = groups * kColsElems;
  DecodeRow(plain, row + groups * group, K - done, codes + done, scale + done / kQK,
            offset + done / kQK);
}

// dst[j * ldd + i] = src[i * lds + j] for i, j < 16: a 16 x 16 block of
// dwords through registers (dst 64-byte aligned).
LUMEN_VNNI inline void Transpose16(const int32_t* src, int64_t lds, int32_t* dst, int64_t ldd) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * lds);
  Transpose16x16(r);
  for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + j * ldd, r[j]);
}

// The activations of all M rows in tiles of kR rows (rows past M are zero):
// per tile, for each 32-block b, its 16 k pairs x kR rows of (256 q1 + q2)
// as int16 pairs (pairs[(b 16 + p) kR + i]), d2[b kR + i], and the sums of
// the quantized activations (d2 times the exact integer sum) per 16 and per
// 32 elements, sum16[(u) kR + i] and sum32[(b) kR + i].
struct PackedX {
  int64_t tiles = 0, nb = 0;
  AlignedBuffer pairs, d2, sum16, sum32;
  const int32_t* Pairs(int64_t t) const { return pairs.as<int32_t>() + t * nb * 16 * kR; }
  const float* D2(int64_t t) const { return d2.as<float>() + t * nb * kR; }
  const float* Sum16(int64_t t) const { return sum16.as<float>() + t * 2 * nb * kR; }
  const float* Sum32(int64_t t) const { return sum32.as<float>() + t * nb * kR; }
};

// One row's blocks into a tile (its place i in the tile added to every
// pointer): pair p of block b at pairs[(16 b + p) kR], d2[b kR], and the
// quantized sums sum16[(2 b + h) kR] (h: half), sum32[b kR].
LUMEN_VNNI void PackRow(const int8_t* q1, const int8_t* q2, const float* d2, int64_t nb,
                        int32_t* pairs, float* d2_out, float* sum16, float* sum32) {
  const __m512i index =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(kR));
  const __m512i ones = _mm512_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q1 + b * kQK));
    const __m256i c2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q2 + b * kQK));
    // 256 q1 + q2 as int16 (|.| <= 32639): the pairs are its dwords.
    const __m512i a =
        _mm512_add_epi16(_mm512_slli_epi16(_mm512_cvtepi8_epi16(c1), 8), _mm512_cvtepi8_epi16(c2));
    _mm512_i32scatter_epi32(pairs + b * 16 * kR, index, a, 4);
    const __m512i pair_sums = _mm512_madd_epi16(a, ones);  // exact: at most 2 x 32639
    const int32_t s0 = _mm512_mask_reduce_add_epi32(0x00FF, pair_sums);
    const int32_t s1 = _mm512_mask_reduce_add_epi32(0xFF00, pair_sums);
    d2_out[b * kR] = d2[b];
    sum16[2 * b * kR] = d2[b] * static_cast<float>(s0);
    sum16[(2 * b + 1) * kR] = d2[b] * static_cast<float>(s1);
    sum32[b * kR] = d2[b] * static_cast<float>(s0 + s1);
  }
}

PackedX PackX(const float* X, int64_t M, int64_t ldx, int64_t K, ThreadPool* pool) {
  PackedX p;
  p.tiles = (M + kR - 1) / kR;
  p.nb = K / kQK;
  const int64_t nb = p.nb, cells = p.tiles * nb * kR;
  p.pairs = AlignedBuffer(std::max<int64_t>(1, cells * 16) * sizeof(int32_t));
  p.d2 = AlignedBuffer(std::max<int64_t>(1, cells) * sizeof(float));
  p.sum16 = AlignedBuffer(std::max<int64_t>(1, 2 * cells) * sizeof(float));
  p.sum32 = AlignedBuffer(std::max<int64_t>(1, cells) * sizeof(float));
  // Tiles [t0, t1); a row past M packs as zeros (codes, scales and sums).
  auto tiles = [&](int64_t t0, int64_t t1, int) {
    std::vector<int8_t> q1(K), q2(K);
    std::vector<float> d2(nb);
    for (int64_t m = t0 * kR; m < t1 * kR; ++m) {
      if (m < M) {
        QuantizeBlocksQ8x2(X + m * ldx, nb, q1.data(), q2.data(), d2.data());
      } else {
        std::fill(q1.begin(), q1.end(), int8_t{0});
        std::fill(q2.begin(), q2.end(), int8_t{0});
        std::fill(d2.begin(), d2.end(), 0.0f);
      }
      const int64_t t = m / kR, i = m % kR;
      int32_t* pairs = p.pairs.as<int32_t>() + t * nb * 16 * kR;
      PackRow(q1.data(), q2.data(), d2.data(), nb, pairs + i, p.d2.as<float>() + t * nb * kR + i,
              p.sum16.as<float>() + t * 2 * nb * kR + i, p.sum32.as<float>() + t * nb * kR + i);
    }
  };
  if (pool && p.tiles > 1)
    pool->ParallelFor(p.tiles, tiles);
  else
    tiles(0, p.tiles, 0);
  return p;
}

// The decoded panel of kNR weight rows (rows past the matrix: zeros):
// codes as k pairs (codes[p kNR + c]: elements 2p, 2p + 1 of row c), and per
// unit u scale[u kNR + c], offset[u kNR + c]. rows: the codes row by row
// (kNR x K int16) before they are transposed into pairs.
struct Panel {
  AlignedBuffer codes, scale, offset, rows;
  std::vector<uint8_t> plain;      // a row's blocks in the file's order
  std::vector<float> rs, ro, mlx;  // mlx: a row's group scales and biases
};

LUMEN_VNNI void DecodePanel(const Matrix& W, int64_t n0, Panel* p) {
  const DType t = W.w.dtype, plain = PlainOf(t);
  const int64_t K = W.k, units = K / UnitOf(W);
  const int64_t offsets = OffsetUnitOf(W) ? K / OffsetUnitOf(W) : 0;
  p->rs.resize(units);
  p->ro.resize(K / 16);  // the most any type writes
  int16_t* rows = p->rows.as<int16_t>();
  float* scale = p->scale.as<float>();
  float* offset = p->offset.as<float>();
  for (int64_t c = 0; c < kNR; ++c) {
    const int64_t n = n0 + c;
    if (n >= W.n) {
      std::memset(rows + c * K, 0, K * sizeof(int16_t));
      for (int64_t u = 0; u < units; ++u) scale[u * kNR + c] = 0.0f;
      for (int64_t u = 0; u < offsets; ++u) offset[u * kNR + c] = 0.0f;
      continue;
    }
    const uint8_t* row = W.w.row<const uint8_t>(n);
    // The row kAheadRows on, into L2 as this one is decoded: one line per
    // line read for F16 / BF16, whose rows are the largest, else the row at once.
    const uint8_t* ahead = n + kAheadRows < W.n ? W.w.row<const uint8_t>(n + kAheadRows) : nullptr;
    if (ahead && !Int8x2GemmRequantizes(W)) PrefetchAhead(ahead, W.w.row_bytes(), 0);
    if (W.mlx_bits) {
      p->mlx.resize(2 * K / W.mlx_group);
      DecodeMlxRow(W, n, rows + c * K, p->rs.data(), p->ro.data(), p->mlx.data());
    } else if (Int8x2GemmRequantizes(W)) {
      DecodeFloatRow(plain, row, K, rows + c * K, p->rs.data(), ahead);
    } else if (t == DType::kQ2_KCols || t == DType::kQ3_KCols) {
      DecodeRow(t, row, K, rows + c * K, p->rs.data(), p->ro.data());
    } else if (IsColumnGroups(t) && plain != DType::kQ6_K) {
      DecodeGroupsRow(t, row, K, rows + c * K, p->rs.data(), p->ro.data());
    } else {
      if (IsColumnGroups(t)) {  // Q6_K slices: a super-block at a time
        p->plain.resize(*RowBytes(plain, K));
        UnpackColumnGroupsRow(t, row, K, p->plain.data());
        row = p->plain.data();
      }
      DecodeRow(plain, row, K, rows + c * K, p->rs.data(), p->ro.data());
    }
    for (int64_t u = 0; u < units; ++u) scale[u * kNR + c] = p->rs[u];
    for (int64_t u = 0; u < offsets; ++u) offset[u * kNR + c] = p->ro[u];
  }
  // Row c's pair q is dword q of its codes; 16 rows by 16 pairs a block.
  const auto* src = reinterpret_cast<const int32_t*>(rows);
  int32_t* codes = p->codes.as<int32_t>();
  for (int64_t c = 0; c < kNR; c += 16)
    for (int64_t q = 0; q < K / 2; q += 16)
      Transpose16(src + c * (K / 2) + q, K / 2, codes + q * kNR + c, kNR);
}

// Units [u0, u1) of S elements for one tile of kR rows against one panel:
// f[i][v] (row i, columns 16 v ..) continues its chain unit by unit.
template <int S, int kOff>
LUMEN_VNNI void Tile(const int32_t* xp, const float* xd, const float* xs, const int32_t* wc,
                     const float* ws, const float* wo, int64_t u0, int64_t u1, __m512 (&f)[kR][2]) {
  constexpr int kPairs = S / 2;
  for (int64_t u = u0; u < u1; ++u) {
    __m512i acc[kR][2];
    for (int i = 0; i < kR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    const int32_t* w = wc + u * kPairs * kNR;
    const int32_t* x = xp + u * kPairs * kR;
#pragma GCC unroll 16
    for (int p = 0; p < kPairs; ++p, w += kNR, x += kR) {
      const __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 16);
#pragma GCC unroll 8
      for (int i = 0; i < kR; ++i) {
        const __m512i xb = _mm512_set1_epi32(x[i]);
        acc[i][0] = _mm512_dpwssd_epi32(acc[i][0], xb, w0);
        acc[i][1] = _mm512_dpwssd_epi32(acc[i][1], xb, w1);
      }
    }
    const __m512 s0 = _mm512_load_ps(ws + u * kNR), s1 = _mm512_load_ps(ws + u * kNR + 16);
    const int64_t b = u * S / kQK;  // the activation block
#pragma GCC unroll 8
    for (int i = 0; i < kR; ++i) {
      const __m512 d = _mm512_set1_ps(xd[b * kR + i]);
      f[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][0]), _mm512_mul_ps(s0, d), f[i][0]);
      f[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][1]), _mm512_mul_ps(s1, d), f[i][1]);
    }
    // Offsets per kOff elements (0: none): kOff = S, one per unit; 16 in a
    // unit of 32, two (xs then holds the sums per 16).
    for (int h = 0; h < (kOff == 0 ? 0 : S / kOff); ++h) {
      const int64_t o = u * (S / kOff) + h;
      const __m512 o0 = _mm512_load_ps(wo + o * kNR), o1 = _mm512_load_ps(wo + o * kNR + 16);
#pragma GCC unroll 8
      for (int i = 0; i < kR; ++i) {
        const __m512 sum = _mm512_set1_ps(xs[o * kR + i]);
        f[i][0] = _mm512_fnmadd_ps(o0, sum, f[i][0]);
        f[i][1] = _mm512_fnmadd_ps(o1, sum, f[i][1]);
      }
    }
  }
}

// Columns [n0, n0 + nr) of Y (nr <= kNR) for all rows: the panel at n0,
// kKC columns of K at a time, every tile of rows over each slice.
LUMEN_VNNI void PanelProduct(const Matrix& W, const Panel& panel, const PackedX& x, int64_t M,
                             float* Y, int64_t ldy, int64_t n0, int64_t nr, bool accumulate) {
  const int S = UnitOf(W), off = OffsetUnitOf(W);
  const int64_t K = W.k;
  const int32_t* wc = panel.codes.as<int32_t>();
  const float* ws = panel.scale.as<float>();
  const float* wo = panel.offset.as<float>();
  const int64_t slices = std::max<int64_t>(1, (K + kKC - 1) / kKC);
  alignas(64) float tmp[kR][kNR];
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t k0 = s * kKC, k1 = std::min(K, k0 + kKC);
    const bool start = s == 0 && !accumulate;
    for (int64_t t = 0; t < x.tiles; ++t) {
      const int64_t rows = std::min<int64_t>(kR, M - t * kR);
      __m512 f[kR][2];
      for (int i = 0; i < kR; ++i) {
        if (start || i >= rows) {
          f[i][0] = f[i][1] = _mm512_setzero_ps();
          continue;
        }
        const float* y = Y + (t * kR + i) * ldy + n0;
        if (nr == kNR) {
          f[i][0] = _mm512_loadu_ps(y);
          f[i][1] = _mm512_loadu_ps(y + 16);
        } else {
          std::memset(tmp[i], 0, sizeof(tmp[i]));
          std::memcpy(tmp[i], y, nr * sizeof(float));
          f[i][0] = _mm512_load_ps(tmp[i]);
          f[i][1] = _mm512_load_ps(tmp[i] + 16);
        }
      }
      const int32_t* xp = x.Pairs(t);
      const float* xd = x.D2(t);
      const float* xs = off == 16 ? x.Sum16(t) : x.Sum32(t);
      if (S == 16)  // Q6_K
        Tile<16, 0>(xp, xd, xs, wc, ws, wo, k0 / 16, k1 / 16, f);
      else if (off == 0)
        Tile<32, 0>(xp, xd, xs, wc, ws, wo, k0 / 32, k1 / 32, f);
      else if (off == 16)
        Tile<32, 16>(xp, xd, xs, wc, ws, wo, k0 / 32, k1 / 32, f);
      else
        Tile<32, 32>(xp, xd, xs, wc, ws, wo, k0 / 32, k1 / 32, f);
      for (int i = 0; i < rows; ++i) {
        float* y = Y + (t * kR + i) * ldy + n0;
        if (nr == kNR) {
          _mm512_storeu_ps(y, f[i][0]);
          _mm512_storeu_ps(y + 16, f[i][1]);
        } else {
          _mm512_store_ps(tmp[i], f[i][0]);
          _mm512_store_ps(tmp[i] + 16, f[i][1]);
          std::memcpy(y, tmp[i], nr * sizeof(float));
        }
      }
    }
  }
}

LUMEN_INTRINSICS_END
#endif  // __x86_64__

}  // namespace

bool Int8x2GemmSupports(const Matrix& W) {
  if (!CpuHasVnni() || W.mlx_order == MlxOrder::kRuns) return false;
  // MLX: the decode kernels' groups (32, 64, 128: whole 32-units), float
  // scales and biases.
  if (W.mlx_bits != 0) return Int8RouteSupports(W);
  const DType t = W.w.dtype;
  if (t == DType::kQ5_KPlanes || !Covered(PlainOf(t))) return false;
  return W.k % std::max<int64_t>(kQK, Info(PlainOf(t)).block_elems) == 0;
}

bool Int8x2GemmRequantizes(const Matrix& W) {
  return W.mlx_bits == 0 && (W.w.dtype == DType::kF16 || W.w.dtype == DType::kBF16);
}

void RequantizeFloatRow(DType t, const uint8_t* row, int64_t K, int16_t* codes, float* scale) {
  LUMEN_CHECK(CpuHasVnni() && (t == DType::kF16 || t == DType::kBF16) && K % kQK == 0);
#if defined(__x86_64__)
  DecodeFloatRow(t, row, K, codes, scale, nullptr);
#endif
}

bool Int8x2GemmTakes(const Matrix& W) {
  return Int8Levels(W.route) == 2 &&  // kInt8x2 or kInt8x2Bf16
         !(RouteHasBf16(W.route) && CpuHasBf16()) && Int8x2GemmSupports(W);
}

void MatMulManyInt8x2Gemm(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                          ThreadPool* pool, bool accumulate) {
#if defined(__x86_64__)
  if (outs.empty() || M <= 0) return;
  const int64_t K = outs[0].w->k;
  for (const MatMulOut& o : outs) LUMEN_CHECK(o.w->k == K && Int8x2GemmSupports(*o.w));
  const PackedX x = PackX(X, M, ldx, K, pool);
  std::vector<int64_t> first(outs.size() + 1, 0);  // panels before out i
  for (size_t i = 0; i < outs.size(); ++i) first[i + 1] = first[i] + (outs[i].w->n + kNR - 1) / kNR;
  // One panel per thread, made by its first unit (units are one panel each).
  std::vector<Panel> panels(pool ? pool->size() : 1);
  auto fn = [&](int64_t b, int64_t e, int thread) {
    Panel& panel = panels[thread];
    if (!panel.codes.data()) {
      panel.codes = AlignedBuffer(std::max<int64_t>(1, K / 2 * kNR) * sizeof(int32_t));
      panel.scale = AlignedBuffer(std::max<int64_t>(1, K / 16 * kNR) * sizeof(float));
      panel.offset = AlignedBuffer(std::max<int64_t>(1, K / 16 * kNR) * sizeof(float));
      panel.rows = AlignedBuffer(std::max<int64_t>(1, K * kNR) * sizeof(int16_t));
    }
    for (int64_t g = b; g < e; ++g) {
      const size_t i = std::upper_bound(first.begin(), first.end(), g) - first.begin() - 1;
      const MatMulOut& o = outs[i];
      const int64_t n0 = (g - first[i]) * kNR, nr = std::min(kNR, o.w->n - n0);
      DecodePanel(*o.w, n0, &panel);
      PanelProduct(*o.w, panel, x, M, o.y, o.ldy, n0, nr, accumulate);
    }
  };
  const int64_t total = first.back();
  if (pool && total > 1)
    pool->ParallelForDynamic(total, fn, 1);
  else
    fn(0, total, 0);
#else
  (void)outs, (void)X, (void)M, (void)ldx, (void)pool, (void)accumulate;
  LUMEN_CHECK(false);
#endif
}

}  // namespace lumen::kernels
