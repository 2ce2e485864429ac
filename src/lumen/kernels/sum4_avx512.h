// The lane sums of four AVX-512 f32 vectors in one shuffle tree (13 ops
// instead of four separate 16-lane reductions): the end of every dot-shaped
// kernel that keeps one accumulator vector per output (attention scores, the
// bf16 prefill tile). x86-64 only; callers compile it inside AVX-512 code.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include "lumen/kernels/intrinsics_warnings.h"

namespace lumen::kernels {

LUMEN_INTRINSICS_BEGIN

// Returns [sum a, sum b, sum c, sum d].
__attribute__((target("avx512f"))) inline __m128 SumLanes4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Quarters: ab = [a0+a2, a1+a3, b0+b2, b1+b3]; t's 128-bit quarter i then
  // holds four partial sums of the i-th input; two in-lane swaps finish them.
  const __m512 ab =
      _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd =
      _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
  const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, t));
}

LUMEN_INTRINSICS_END

}  // namespace lumen::kernels

#endif  // __x86_64__
