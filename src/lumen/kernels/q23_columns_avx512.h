// The codes of a Q2_K or Q3_K super-block as the loader repacks them
// (core/repack.h: Q2_K records, Q3_K planes), in AVX-512 registers as four
// 16-lane columns: byte 4 l + i of column t is the code of element 4 t + i of
// 16-element sub-block 2 (l % 8) + l / 8 (lanes 0-7 the first halves of the
// eight 32-element blocks, lanes 8-15 their second halves). The int8 decode
// kernels read the columns so (Order::kHalfColumns, matmul_q8_gguf.cc); the
// int8x2 GEMM's row decode (matmul_q8x2_gemm.cc) and the 16-lane row decoders
// (row_decoders-inl.h) take the sub-blocks from them in natural order
// (SubBlockCodes). x86-64 only; callers compile it inside AVX-512 code.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "lumen/kernels/intrinsics_warnings.h"

namespace lumen::kernels {

LUMEN_INTRINSICS_BEGIN

#define LUMEN_Q23_TARGET __attribute__((target("avx512f,avx512bw"), always_inline))

// The lane (the dword of the 64 code bytes) that holds 16-element sub-block s.
constexpr int Q23Lane(int s) { return 8 * (s % 2) + s / 2; }

// Q2_K records: the 64 code bytes at qs hold column t at bits 2 t.
LUMEN_Q23_TARGET inline void Q2RecordColumns(const uint8_t* qs, __m512i (&u)[4]) {
  const __m512i v = _mm512_loadu_si512(qs), k3 = _mm512_set1_epi8(3);
  u[0] = _mm512_and_si512(v, k3);
  u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), k3);
  u[2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), k3);
  u[3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), k3);
}

// Q3_K planes (the super-block's first 96 bytes): the 3-bit codes (w = a (q -
// 4)) of records 2 k and 2 k + 1 at bits 0-2 and 3-5 of plane k (k < 3), those
// of records 6 and 7 split over bits 6-7 of all three. Column t is record t
// (lanes 0-7) beside record 4 + t (lanes 8-15): [P0 | P2] & 7, its >> 3, then
// [P1 | P0 >> 6] and [P1 >> 3 | P1 >> 6] (16-bit shifts by half, each field
// masked to its byte), with the third bits of records 6 and 7 from P2's bits
// 6 and 7.
LUMEN_Q23_TARGET inline void Q3PlaneColumns(const uint8_t* blk, __m512i (&u)[4]) {
  const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
  const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32));
  const __m256i p2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64));
  const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(p0), p2, 1);
  const __m512i y = _mm512_inserti64x4(_mm512_castsi256_si512(p1), p0, 1);
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(p1), p1, 1);
  const __m512i k7 = _mm512_set1_epi8(7);
  const __m512i low = _mm512_inserti64x4(k7, _mm256_set1_epi8(3), 1);
  const __m512i third = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi8(4), 1);
  // 16-bit shift counts by half: 0 | 6 and 3 | 6
  const __m512i by_06 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(6), 1);
  const __m512i by_36 = _mm512_inserti64x4(_mm512_set1_epi16(3), _mm256_set1_epi16(6), 1);
  u[0] = _mm512_and_si512(x, k7);
  u[1] = _mm512_and_si512(_mm512_srli_epi16(x, 3), k7);
  // (a & b) | c: ternary-logic table 0xEA
  u[2] = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(y, by_06), low,
                                   _mm512_and_si512(_mm512_srli_epi16(x, 4), third), 0xEA);
  u[3] = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(z, by_36), low,
                                   _mm512_and_si512(_mm512_srli_epi16(x, 5), third), 0xEA);
}

// The columns transposed by lane: the 128-bit lane j of by[r] holds lane
// 4 j + r of the four columns, the 16 codes of one sub-block in element order
// (a 4 x 16 dword transpose: eight unpacks).
struct SubBlockCodes {
  __m512i by[4];
  LUMEN_Q23_TARGET explicit SubBlockCodes(const __m512i (&u)[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(u[0], u[1]), t1 = _mm512_unpackhi_epi32(u[0], u[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(u[2], u[3]), t3 = _mm512_unpackhi_epi32(u[2], u[3]);
    by[0] = _mm512_unpacklo_epi64(t0, t2);
    by[1] = _mm512_unpackhi_epi64(t0, t2);
    by[2] = _mm512_unpacklo_epi64(t1, t3);
    by[3] = _mm512_unpackhi_epi64(t1, t3);
  }
  // The 32 codes of 32-element block l (sub-blocks 2 l and 2 l + 1: lanes l
  // and 8 + l), in element order.
  LUMEN_Q23_TARGET __m256i Block(int l) const {
    const __m512i v = by[l % 4];
    return _mm512_castsi512_si256(l < 4 ? _mm512_shuffle_i32x4(v, v, 0x08)    // lanes 0, 2
                                        : _mm512_shuffle_i32x4(v, v, 0x0D));  // lanes 1, 3
  }
  // The 16 codes of sub-block s (lane Q23Lane(s)), in element order.
  LUMEN_Q23_TARGET __m128i Sub(int s) const {
    const int lane = Q23Lane(s);
    const __m512i v = by[lane % 4];
    switch (lane / 4) {
      case 0:
        return _mm512_castsi512_si128(v);
      case 1:
        return _mm512_extracti32x4_epi32(v, 1);
      case 2:
        return _mm512_extracti32x4_epi32(v, 2);
      default:
        return _mm512_extracti32x4_epi32(v, 3);
    }
  }
};

#undef LUMEN_Q23_TARGET

LUMEN_INTRINSICS_END

}  // namespace lumen::kernels

#endif  // __x86_64__
