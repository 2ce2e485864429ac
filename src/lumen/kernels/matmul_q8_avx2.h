// The int8-activation routes (matmul_q8.h) on CPUs without AVX512-VNNI: AVX2
// kernels (Haswell and later, AMD Zen 1-3) over the weights as the file has
// them or as the loader repacked them for these kernels. Same activation
// quantization as the VNNI kernels (QuantizeBlockQ8, or QuantizeBlockQ8x2 for
// int8x2), laid out for each weight layout; the same oracles (MatMulInt8Ref,
// MatMulInt8x2Ref) and bounds.
//
// Per 32-element block and activation row: the weight codes, decoded once per
// block for up to four rows into 32 unsigned bytes (Q8_0: their magnitudes,
// the signs moved onto the activations), meet each level by `vpmaddubsw`
// (byte pairs to int16: at most 2 x 63 x 127 for 6-bit codes, 2 x 128 x 127
// for Q8_0, so never saturated) and `vpmaddwd` (pairs to int32; level 1 by
// 256, level 2 by 1: the two levels' exact sum 256 i1 + i2), then one
// conversion and one FMA with the block's weight x activation scale. Offsets
// (Q4_0's 8, Q5_0's 16, Q4_1 / Q5_1 m, K-quant mins and Q3_K / Q6_K's code
// shifts) multiply the activation sums of their 16- or 32-element runs,
// computed once per row. The column groups the loader makes for these
// kernels as for VNNI (core/repack.h) put one block (Q6_K: one 16-element
// sub-block) in each 32-bit lane of a record of 8, so that the lane work is
// paid once per 8 lanes and the products of several records are summed as
// int16 first (matmul_q8_avx2_gguf.cc: ColsRows, Q6SlicesRows, and
// Q23KRecordsRows for Q2_K / Q3_K's records). MLX affine 4- and 8-bit rows
// (groups of 32, 64 or 128) transpose runs of 8 (4) blocks in registers against
// activations laid out to match (matmul_q8_avx2_mlx.cc). The activations'
// preparation and the dispatch are in matmul_q8_avx2.cc.
#pragma once

#include <cstdint>
#include <span>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// True when this CPU has AVX2, FMA and F16C.
bool CpuHasAvx2();

// True when the AVX2 kernels cover W's storage: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
// (K % 32 == 0) and Q2_K .. Q6_K (K % 256 == 0) as stored in GGUF files, the
// column groups of those that have them, and MLX 4- and 8-bit with groups of
// 32, 64 or 128, f32/f16/bf16 scales and biases and at most 1024 groups a row.
bool Avx2Int8Covers(const Matrix& W);

// The most rows a product of W takes these kernels for (Int8MaxRows in
// matmul_q8.h; kInt8MaxRows where !Avx2Int8Covers(W)): up to where the exact f32 panels,
// which decode the weights once for all rows, overtake them on a Zen 2 (2
// threads, the 1B model's prompts of 12-32 tokens, performance.md "Short
// prompts on AVX2"): 12 rows for Q8_0, 20 for Q2_K / Q3_K (24 for their
// records, kQ2_KCols / kQ3_KCols), 32 for the other GGUF types and MLX 4-bit,
// 10 for MLX 8-bit.
int64_t Avx2Int8MaxRows(const Matrix& W);

// QuantizeBlocksQ8 / QuantizeBlocksQ8x2 (matmul_q8.h) on AVX2: the bits of
// QuantizeBlockQ8 / QuantizeBlockQ8x2 for every block (blocks with an inf or
// NaN, or whose 256 / d overflows, go through the scalar quantizer). Requires
// CpuHasAvx2().
void QuantizeBlocksQ8Avx2(const float* x, int64_t nb, int8_t* q, float* d);
void QuantizeBlocksQ8x2Avx2(const float* x, int64_t nb, int8_t* q1, int8_t* q2, float* d2);

// MatMulMany through the AVX2 kernels with Int8Levels(w.route) activation
// levels per out; requires CpuHasAvx2() and Avx2Int8Covers for every out.
// Each output is computed the same way whatever M, the other outs and the
// threads: bit-identical across them.
void MatMulManyInt8Avx2(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                        ThreadPool* pool);

}  // namespace lumen::kernels
