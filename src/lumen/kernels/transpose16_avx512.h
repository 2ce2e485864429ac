// The 16 x 16 transpose of 32-bit elements in AVX-512 registers (64
// shuffles): the exact GEMM's k-major weight panels (gemm-inl.h), the AMX
// kernels' C tiles (matmul_bf16_amx.cc) and the int8x2 GEMM's k-pair panels
// (matmul_q8x2_gemm.cc). x86-64 only; callers compile it inside AVX-512 code.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include "lumen/kernels/intrinsics_warnings.h"

namespace lumen::kernels {

LUMEN_INTRINSICS_BEGIN

// r[j] becomes column j of the 16 x 16 matrix whose rows were r[0..15].
__attribute__((target("avx512f"))) inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + j]: per 128-bit lane L, column 4L + j of rows 4g..4g+3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    const __m512i w = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    r[j] = _mm512_shuffle_i32x4(v, v2, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(v, v2, 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(w, w2, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(w, w2, 0xdd);
  }
}

LUMEN_INTRINSICS_END

}  // namespace lumen::kernels

#endif  // __x86_64__
