// The compiler target of the AVX512-VNNI kernels (matmul_q8*.cc, the int8
// decode kernels; matmul_q8x2_gemm.cc, the int8x2 prefill GEMM), in one
// place: LUMEN_VNNI marks the functions that use these instructions, which
// run only where kernels::CpuHasVnni() holds, so the rest of the binary stays
// free of them. Include only from .cc files.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#define LUMEN_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,f16c,fma")))
#endif
