// The int8x2 route's long products (prefill: more rows than Int8MaxRows) on
// AVX512-VNNI CPUs, as an outer-product GEMM on int16 (`vpdpwssd`).
//
// The activations are quantized exactly as the int8x2 decode kernels do it
// (QuantizeBlocksQ8x2: q1, q2 and d2 = d / 256 per 32-block), and 256 q1 + q2
// (|.| <= 32639) is a 16-bit integer at scale d2: one int16 per activation,
// so one vpdpwssd (32 products) does what the decode kernels' two vpdpbusd
// levels do, and each block's integer sum is the same exact int32. The
// weights are split as the oracle sees them (matmul_q8_ref.h: w = a q - o):
// each unit of 32 elements (Q6_K: 16) is int16 codes q with a scale a, and
// offsets o per 32 (Q2_K: 16; none for the symmetric types), decoded once
// per call into k-pair-major panels of 32 columns; Q2_K's and Q3_K's
// sub-block scales are folded into their codes; MLX rows are codes q with
// a = s and o = -b of their group per 32. F16 and BF16 rows are
// requantized per 32-unit to codes of at most kFloatCodeMax (12 bits: 32
// products of them and the activations stay within int32), a = amax / 2047:
// each weight within a / 2, about 1/16 of what BF16's own rounding of the
// unit's largest weight is worth. The register tile is 6 rows by 32
// columns: per k pair, two panel loads and six broadcast pairs feed twelve
// vpdpwssd; per unit, each accumulator is converted once and added as
// y += (a d2) isum - o sum(x over the unit).
//
// Why: on an Intel core without AMX, vdpbf16ps runs at half the f32 FMA's
// rate and vpdpwssd at the FMA's; 32 k of 16 columns cost 16 vpdpwssd and 3
// scale operations here against 32 FMAs on the exact route
// (docs/reference/performance.md, "The int8x2 prefill GEMM").
//
// Every output is one f32 chain over its units in k order, so a row's bits
// do not depend on M (above Int8MaxRows), the tile, the k slices or the
// thread split. The oracle is MatMulInt8x2Ref, as for the decode kernels.
#pragma once

#include <cstdint>
#include <span>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// The largest code of a requantized F16 / BF16 unit: 32 x 32639 x 2047 <
// 2^31, so a unit's integer sum is exact.
inline constexpr float kFloatCodeMax = 2047.0f;
// A unit whose largest magnitude is below this is zero codes at scale 0
// (each weight off by less than it; 2047 / amax would overflow near 1e-35).
inline constexpr float kFloatUnitTiny = 1e-30f;

// True when this GEMM can run W's storage on this CPU (ignores W.route):
// AVX512-VNNI (CpuHasVnni), and F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K .. Q6_K as the file has them or as column groups (core/repack.h), K a
// multiple of 32, and MLX 4- and 8-bit in the file's words (groups a multiple
// of 32). F32 keeps the exact or bf16 prefill.
bool Int8x2GemmSupports(const Matrix& W);

// True when this GEMM requantizes W's values (F16, BF16: 12-bit codes per 32)
// rather than reading its codes.
bool Int8x2GemmRequantizes(const Matrix& W);

// An F16 / BF16 row of K elements (K % 32 == 0) requantized as this GEMM
// reads it: codes[K] and scale[K / 32], the oracle's arithmetic
// (matmul_q8_ref.h). Requires CpuHasVnni(). For tests, against a scalar loop.
void RequantizeFloatRow(DType t, const uint8_t* row, int64_t K, int16_t* codes, float* scale);

// True when W's products of more than Int8MaxRows(W) rows take this GEMM:
// the route has two int8 levels, no bf16 prefill that runs on this CPU takes
// them first, and Int8x2GemmSupports(W).
bool Int8x2GemmTakes(const Matrix& W);

// For every out: Y = X W^T, or Y += X W^T with accumulate (each output's
// chain continues from Y). Requires Int8x2GemmSupports of every out.
void MatMulManyInt8x2Gemm(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                          ThreadPool* pool, bool accumulate);

}  // namespace lumen::kernels
