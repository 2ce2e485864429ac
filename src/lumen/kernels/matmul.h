// MatMul: Y[M, N] = X[M, K] * W[N, K]^T for a weight W of any dtype.
//
// M = 1 is decode (a matvec, memory-bound: each weight byte is read once);
// M > 1 is prefill or batched decode, and still reads each weight row once for
// all M rows. F32/F16/BF16, Q8_0, Q4_0, Q4_K, Q6_K and MLX 4/8-bit rows are
// decoded straight into SIMD registers (runtime-dispatched Highway targets);
// other types are dequantized one row at a time into per-thread scratch.
// Nothing dequantizes a whole tensor. M <= 4 FMAs each decoded weight vector
// into all M rows; M > 4 decodes 4 rows into a small panel and runs a
// register-blocked microkernel over all M rows. Threads split N contiguously.
// MatMulT is the transposed product dX[M, K] = dY[M, N] * W[N, K] that a
// backward through a frozen (possibly quantized) weight needs.
//
// Tier: L2 against MatMulRef (the scalar oracle in matmul_ref.h); the bound is
// in matmul_test.cc. A matrix marked W.route == ActRoute::kInt8 takes the L3
// int8-activation route where it applies (matmul_q8.h).
#pragma once

#include <cstdint>
#include <span>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// W: [N, K] (any storage, matrix.h); X: [M, K] f32 rows with stride ldx floats; Y: [M, N] with
// stride ldy floats (Y is overwritten). pool may be null (single-threaded).
void MatMul(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
            ThreadPool* pool);

// Several products with the same X in one thread-pool pass (q/k/v, gate/up):
// one wake-up instead of one per matrix, and the split balances rows of all
// of them. Each Y is bit-for-bit what MatMul would write.
struct MatMulOut {
  const Matrix* w;
  float* y;
  int64_t ldy;
};
void MatMulMany(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                ThreadPool* pool);

// True when W's storage has a fused decoder on the CPU's best target (false:
// the scalar dequantize-to-scratch route). For benchmarks and reports.
bool MatMulIsFused(const Matrix& W);

// dX[M, K] = dY[M, N] * W[N, K]; dX is overwritten.
void MatMulT(const Matrix& W, const float* dY, int64_t M, float* dX, ThreadPool* pool);

// The bf16 route (matmul_bf16.h, tier L3) for every M, whatever W.route says:
// X is rounded to bf16 once per call (M * roundup(K, 32) * 2 bytes, shared by
// the threads, plus one 512 KiB panel and one f32 row per thread), then each
// thread runs the route's panels over its rows of W. Bit-identical to MatMul
// with W.route = kBf16 where that takes the route (M > 4). The training's
// --compute bf16 forward. Requires CpuHasBf16().
void MatMulBf16(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool);

}  // namespace lumen::kernels
