// The int8-activation route of MatMul (tier L3): each activation row is
// quantized to int8 in 32-element blocks exactly as Q8_0 quantizes weights
// (QuantizeBlockQ8 in core/quant.h: scale = absmax / 127) and dotted with the
// weights by AVX512-VNNI `vpdpbusd` (64 byte products per instruction, exact
// int32 sums); each block's integer sum is then scaled by weight scale x
// activation scale in f32. Weight types: every quantized type the engine
// loads, i.e. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (K % 32 == 0), Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K (K % 256 == 0) and MLX affine 4- and 8-bit with groups of 32, 64
// or 128 (K % 64 == 0). Each block's codes are decoded to bytes in registers
// (nibble split, 2-bit planes, 5th/3rd bits through lane masks); offsets (Q4_1
// and Q5_1 m, K-quant mins, MLX biases) multiply the activation block sums,
// computed once per activation row. F32/F16/BF16 weights keep the exact route.
//
// Why: the exact route converts every weight to f32 and spends one FMA per
// weight per activation row, which makes decode compute-bound on two cores
// for 4-bit weights and batch-4 decode 4x the work of batch 1. Here the
// per-weight work is one byte lane of one instruction, shared by nothing but
// the block-scale FMA; the weight bytes are decoded once for up to 4 rows.
//
// The int8x2 route (W.route kInt8x2 / kInt8x2Bf16, tier L2) quantizes each
// block twice (QuantizeBlockQ8x2 in core/quant.h): the first level as above,
// the second the first one's residual at 1/256 of its scale, which makes the
// activations about 16-bit fixed point per block (error at most d / 256 per
// element instead of d / 2) for one more vpdpbusd, a shift and an add per
// weight vector and row; the weight decoding is shared. Its KL to the exact
// route is below the default gate (DESIGN.md section 4), which the one-level
// route's is not: it is the default decode route (cli/routes.h).
//
// Used by MatMul/MatMulMany when W.route has int8 (matrix.h), the weight type is
// one of those (Int8RouteSupports), the CPU has AVX512-VNNI (without it but with
// AVX2, the kernels of matmul_q8_avx2.h) and M <= Int8MaxRows(W). Longer
// products take the bf16 route where it runs, else with two levels on VNNI
// the int8x2 GEMM (matmul_q8x2_gemm.h: one vpdpwssd per 32 products, the
// same integer sums), else the exact f32 panels. MatMulInt8Ref and MatMulInt8x2Ref
// (matmul_q8_ref.h) are the scalar oracles: same activation quantization, double accumulation.
#pragma once

#include <cstdint>
#include <span>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_q8x2_gemm.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// The most rows a product of W takes the int8 dot kernels for. Above it the
// products go to a route that decodes the weights once for many rows (the
// int8x2 GEMM, the bf16 panels or the exact f32 panels), a cost per call
// that short prompts pay for few rows. kInt8MaxRows for storages no int8
// kernel reads, where the bf16 panels or one level take the rest, and on
// CPUs with neither kernel set; with the VNNI kernels where the int8x2 GEMM
// takes the rest, 24 to kInt8MaxRowsVnni by weight type (matmul_q8.cc: the
// GEMM's 16-token prompts ran at 0.3-0.8x the dot kernels' on a Xeon);
// with the AVX2 kernels up to kInt8MaxRowsAvx2 by weight type
// (Avx2Int8MaxRows in matmul_q8_avx2.h: the exact panels ran prompts of 9 to
// 32 tokens at a third to four fifths of the int8x2 kernels' rate on Zen 2).
// docs/reference/performance.md, "Short prompts on AVX2" and "Short prompts
// on VNNI".
inline constexpr int64_t kInt8MaxRows = 8;
inline constexpr int64_t kInt8MaxRowsVnni = 64;
inline constexpr int64_t kInt8MaxRowsAvx2 = 32;
int64_t Int8MaxRows(const Matrix& W);

// True when this CPU has AVX512-VNNI and AVX512-VBMI (and AVX512F/BW/VL): Ice
// Lake and later Intel cores, AMD Zen 4 and 5. Cascade Lake (VNNI without
// VBMI, whose vpermt2b gathers the quads) takes the exact route.
bool CpuHasVnni();

// True when the int8 route can run W's storage on this CPU (ignores W.route):
// every type above with VNNI; on other AVX2 CPUs the GGUF types as stored and
// MLX with K a whole number of 32-element blocks (Avx2Int8Covers).
bool Int8RouteSupports(const Matrix& W);

// The column-group type (core/repack.h) this CPU's int8 kernels read for
// `plain`, which the loader then makes, else plain itself: ColumnGroupsOf for
// every type that has one, where the CPU has VNNI or AVX2; Q5_K without VNNI
// as kQ5_KPlanes (the AVX2 kernels' 5th bits).
DType Int8ColumnGroupsOf(DType plain);
// The order the loader puts W's MLX codes in (core/repack.h,
// Matrix::mlx_order) for this CPU's int8 kernels: runs where they are the
// AVX2 ones, groups where they are the AVX-512 VNNI ones, the file's where
// none reads W. W as the file has it.
MlxOrder Int8MlxOrder(const Matrix& W);

// True when MatMul(W, ..., M, ...) takes the int8 route: up to Int8MaxRows(W)
// rows the dot kernels, above it the int8x2 GEMM where it takes W
// (matmul_q8x2_gemm.h).
inline bool UsesInt8Route(const Matrix& W, int64_t M) {
  if (!RouteHasInt8(W.route)) return false;
  return M <= Int8MaxRows(W) ? Int8RouteSupports(W) : Int8x2GemmTakes(W);
}

// q[32 b + j], d[b] = QuantizeBlockQ8 (core/quant.h) of each of the nb
// 32-element blocks of x: the same bits, vectorized on AVX-512 and AVX2 CPUs.
void QuantizeBlocksQ8(const float* x, int64_t nb, int8_t* q, float* d);

// q1[32 b + j], q2[32 b + j], d2[b] = QuantizeBlockQ8x2 (core/quant.h) of each
// of the nb blocks of x: the same bits, vectorized on AVX-512 and AVX2 CPUs.
void QuantizeBlocksQ8x2(const float* x, int64_t nb, int8_t* q1, int8_t* q2, float* d2);

// For tests: true when the activation layout the int8 routes build for W
// (M rows of X, Int8Levels(W.route) levels) has the same bytes whether its
// periodic part is laid out by the vector code or, as the reference, by the
// scalar loop. Requires Int8RouteSupports(W).
bool Int8LayoutMatchesScalar(const Matrix& W, const float* X, int64_t M);

// Y[M, N] = X[M, K] * W^T through the int8 route, with Int8Levels(W.route)
// activation levels; requires Int8RouteSupports(W).
void MatMulInt8(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool);

// MatMulMany through the int8 route; every out must satisfy Int8RouteSupports.
void MatMulManyInt8(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                    ThreadPool* pool);

// The VNNI dot kernels at any row count, where MatMulManyInt8 takes them up
// to Int8MaxRows: for the benchmark that sets those counts against the GEMM
// (bench/kernels_bench.cc, BM_ShortPrompt). Requires CpuHasVnni().
void MatMulManyInt8Dots(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                        ThreadPool* pool);

}  // namespace lumen::kernels
