// The AVX2 int8 row kernels for the GGUF storages (matmul_q8_avx2.h): the
// legacy 32-element blocks, the K-quant super-blocks in the file's order,
// and the layouts the loader makes for these kernels (core/repack.h: column
// groups, Q6_K slices, Q2_K / Q3_K records, Q5_K planes).
#include <cstdint>
#include <cstring>

#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/matmul_q8_avx2_internal.h"
#include "lumen/kernels/prefetch.h"

namespace lumen::kernels::int8_avx2 {

#if defined(__x86_64__)

namespace {

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
    __m128 dd;               // Q2_K: d, dmin
    __m256 d;                // d in every lane (its f16 loaded to a vector register: through
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
    } else {  // w = d (sc & 15) q - dmin (sc >> 4)
      dd = _mm_cvtph_ps(_mm_loadu_si32(blk + 80));
      d = _mm256_broadcastss_ps(dd);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
      sc8 = _mm_and_si128(v, lo4);
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
        // loaded here, not from qs0 / qs1: kept live across the first half,
        // they left one-row decode's accumulators on the stack
        const __m256i q = Load32(blk + kQs + 32 * h);
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
        // Both levels take a record's codes in turn (the same exact int16
        // sums), so that one row keeps fewer vectors live.
        const int8_t* x = a.Q(m0 + r, b0) + 128 * h;
        __m256i sum[L];
        for (int t = 0; t < 4; ++t)
          for (int lv = 0; lv < L; ++lv) {
            const __m256i p = _mm256_maddubs_epi16(codes[t], Load32(x + 256 * lv + 32 * t));
            sum[lv] = t == 0 ? p : _mm256_add_epi16(sum[lv], p);
          }
        for (int lv = 0; lv < L; ++lv)
          isum[r] =
              _mm256_add_epi32(isum[r], _mm256_madd_epi16(sum[lv], L == 2 && lv == 0 ? s256 : s1v));
      }
    }
    // The offsets o = mn per sub-block after the products: made before them,
    // their two vectors stayed live across the products, and one-row decode
    // kept its accumulators on the stack (a store and a load in each chain
    // per super-block).
    __m256 mn_lo, mn_hi;
    if constexpr (kThree) {
      SignedBytesTimes(sc8, _mm256_mul_ps(d, _mm256_set1_ps(4.0f)), &mn_lo, &mn_hi);
    } else {
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

template <int MB, int L>
RowsFn RowsFor(Fmt f) {
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
      return nullptr;  // PickMlxRows
  }
  return nullptr;
}

template <int L>
RowsFn RowsFor(Fmt f, int mb) {
  switch (mb) {
    case 1:
      return RowsFor<1, L>(f);
    case 2:
      return RowsFor<2, L>(f);
    case 3:
      return RowsFor<3, L>(f);
    default:
      return RowsFor<4, L>(f);
  }
}

}  // namespace

RowsFn PickRows(Fmt f, int levels, int mb) {
  return levels == 2 ? RowsFor<2>(f, mb) : RowsFor<1>(f, mb);
}

#else  // no x86: never covered

RowsFn PickRows(Fmt, int, int) { return nullptr; }

#endif

}  // namespace lumen::kernels::int8_avx2
