// The bf16 route of the transposed product (tier L3): dX[M, K] = (or +=)
// dY[M, N] W[N, K] for a weight W of any storage, the backward through a
// frozen weight that training's --compute bf16 takes (train/frozen.h).
//
// Same family as the bf16 prefill route (matmul_bf16.h): the operands are
// rounded to bf16 (nearest even), multiplied exactly and summed in f32. The
// threads split K into column blocks; for its block, a thread decodes the
// columns [k0, k0 + KB) of NB rows of W at a time (DequantizeMatrixColumns:
// only those columns, so W is decoded once per call over all threads),
// rounds them into a panel and adds dY's chunk [M, NB] times the panel into
// dX's columns. dY is rounded once per call, chunk by chunk, before the
// threads start. Two kernels:
// - AMX-BF16 tiles (matmul_bf16_t_amx.h) when AmxBf16Usable() and M >=
//   kAmxTMinRows: KB = 256 (or the storage's block or group when larger:
//   MatrixColumnAlign), the panel in the VNNI pair layout of B tiles, dY's
//   rows as the A tiles (padded with zero rows to a multiple of 16).
// - AVX512-BF16 `vdpbf16ps` otherwise: KB = 64 (or the alignment), the panel
//   is W's block transposed (KB rows of NB), Bf16PanelProduct.
//
// Summation order per output: f32 within each N-chunk of NB (the kernel's
// reduction), then chunk by chunk in increasing n, one f32 add each.
// Threads own disjoint columns of dX, so the result does not depend on them.
// MatMulTBf16Ref (matmul_bf16_ref.h) is the scalar oracle (double sums), and
// matmul_bf16_t_test.cc states the bound, the same for both kernels:
// (N + 2) 2^-24 sum_n |dy_n w_n| over the bf16 values.
//
// Transient memory of one call (MatMulTBf16TransientBytes): dY in bf16,
// 2 M' (N rounded up to 32) bytes shared (M' = M, or M rounded up to 16 on
// the tiles), plus per thread one panel of at most 512 KiB and the decoded
// columns of one row (two on the tiles: KB floats each) and KB bf16.
// No [M, K] scratch: the products accumulate into dX directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// dX[M, K] (stride K) = dY[M, N] (stride N) W, or dX += that with accumulate.
// pool may be null. Requires CpuHasBf16().
void MatMulTBf16(const Matrix& W, const float* dY, int64_t M, float* dX, bool accumulate,
                 ThreadPool* pool);

// The bytes one MatMulTBf16 call allocates (an upper bound over storages,
// exact for column alignment `align`), with `threads` threads, for the
// kernel this process takes at M rows (AMX or not).
size_t MatMulTBf16TransientBytes(int64_t M, int64_t N, int threads, int64_t align = 256);

}  // namespace lumen::kernels
