// The scales and mins of a Q4_K / Q5_K column group's two super-blocks in
// AVX-512 registers (VBMI): the int8 decode kernels' column groups
// (matmul_q8_gguf.cc) and the int8x2 GEMM's panel decode (matmul_q8x2_gemm.cc).
// x86-64 only; include only from .cc files that include vnni_target.h.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <array>
#include <cstdint>

#include "lumen/kernels/vnni_target.h"

namespace lumen::kernels {

// The scales and mins of the two super-blocks of a Q4_K / Q5_K column group,
// from its 32-byte meta field (core/repack.h: the 12 scale bytes of each, then d0,
// dmin0, d1, dmin1): a, lane l = d sc of sub-block l % 8 of super-block
// l / 8; o, the same lanes of dmin m. One vpermb puts the bytes each field
// needs in its output qword (sc of a super-block: q0-q3, q8-q11; m: q4-q11),
// two vpmultishiftqb take every field's two bit windows (A: its low bits,
// from q[j] or q[j + 4]; B: the top two bits of q[j - 4] or q[j], for j >= 4)
// and one select and mask join them: half the vector work of two
// ScalesMinsQ4K calls (matmul_q8_gguf.cc), which was a third of the column
// group's.
// Byte b of ScalesMinsQ4KPair's tables is field j of output qword b / 8:
// the 8 scales (qwords 0, 1) or mins (2, 3) of super-block b / 8 % 2, whose
// scale byte i is meta byte h + i.
struct Q4KPairField {
  bool mins;
  int h, j;
};
template <class Fn>
constexpr std::array<uint8_t, 32> Q4KPairTable(Fn f) {
  std::array<uint8_t, 32> t{};
  for (int b = 0; b < 32; ++b)
    t[b] = static_cast<uint8_t>(f(Q4KPairField{b >= 16, 12 * ((b / 8) % 2), b % 8}));
  return t;
}

LUMEN_VNNI inline void ScalesMinsQ4KPair(const uint8_t* meta, __m512* a, __m512* o) {
  // The tables are constant expressions: built by a loop in the function,
  // they stayed loops in one of GCC's inlined copies (281 against 42 ns per
  // row in the kernel bench).
  // Gather: sc_j from q[j] (j < 4) or q[j + 4]; m_j from q[j + 4] (j < 4:
  // q4-q7 into bytes 0-3; j >= 4: q8-q11 into bytes 4-7, whose top bits
  // come from q[j], bytes 0-3).
  alignas(32) static constexpr auto kGather =
      Q4KPairTable([](Q4KPairField x) { return x.h + (x.mins || x.j >= 4 ? x.j + 4 : x.j); });
  // A: the field's low bits at byte j (the high nibble, bit 8 j + 4, for
  // m_j with j >= 4). B (j >= 4): bits 6-7 of byte j - 4 to bits 4-5.
  alignas(32) static constexpr auto kShiftA =
      Q4KPairTable([](Q4KPairField x) { return 8 * x.j + (x.mins && x.j >= 4 ? 4 : 0); });
  alignas(32) static constexpr auto kShiftB =
      Q4KPairTable([](Q4KPairField x) { return x.j >= 4 ? 8 * (x.j - 4) + 2 : 0; });
  // Bits taken from A (the rest from B): all six for j < 4, the low four after.
  alignas(32) static constexpr auto kFromA =
      Q4KPairTable([](Q4KPairField x) { return x.j < 4 ? 0x3f : 0x0f; });
  const __m256i gather = _mm256_load_si256(reinterpret_cast<const __m256i*>(kGather.data()));
  const __m256i shift_a = _mm256_load_si256(reinterpret_cast<const __m256i*>(kShiftA.data()));
  const __m256i shift_b = _mm256_load_si256(reinterpret_cast<const __m256i*>(kShiftB.data()));
  const __m256i from_a = _mm256_load_si256(reinterpret_cast<const __m256i*>(kFromA.data()));
  const __m256i q =
      _mm256_permutexvar_epi8(gather, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta)));
  const __m256i wa = _mm256_multishift_epi64_epi8(shift_a, q);
  const __m256i wb = _mm256_multishift_epi64_epi8(shift_b, q);
  // from_a ? wa : wb bit by bit (0xCA: A ? B : C), then the six field bits.
  const __m256i f =
      _mm256_and_si256(_mm256_ternarylogic_epi32(from_a, wa, wb, 0xCA), _mm256_set1_epi8(0x3f));
  const __m128 dd = _mm_cvtph_ps(  // d0, dmin0, d1, dmin1
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta + 24)));
  const __m512 d = _mm512_castps128_ps512(dd);
  *a = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(f))),
      _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), d));
  *o = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(f, 1))),
      _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), d));
}

}  // namespace lumen::kernels

#endif  // __x86_64__
