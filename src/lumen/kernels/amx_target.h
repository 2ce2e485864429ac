// The compiler targets of the AMX kernels (matmul_bf16_amx.cc,
// matmul_bf16_t_amx.cc), in one place: LUMEN_AMX_X86 is defined where tile
// code can be built (x86-64 Linux, which grants the tile state through
// arch_prctl); LUMEN_AMX marks the functions that touch tiles and
// LUMEN_AVX512 the AVX-512 helpers around them, so the rest of the binary
// stays free of these instructions. Include only from .cc files.
#pragma once

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define LUMEN_AMX_X86 1
#define LUMEN_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define LUMEN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#endif
