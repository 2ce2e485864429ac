// MatMul: Y[M, N] = X[M, K] * W[N, K]^T for a weight W of any dtype.
//
// M = 1 is decode (a matvec, memory-bound: each weight byte is read once);
// M > 1 is prefill or batched decode, and still reads each weight row once for
// all M rows. F32/F16/BF16, the GGUF weight types (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K ... Q6_K: the scalar DequantizeRow's values bit for bit) and
// MLX 4/8-bit rows are decoded straight into SIMD registers
// (runtime-dispatched Highway targets); other storage is dequantized one row
// at a time into per-thread scratch.
// Nothing dequantizes a whole tensor. Threads split N contiguously.
//
// M <= 4 FMAs each decoded weight vector into all M rows (the dot form). M > 4
// is an outer-product GEMM: W's rows are decoded and transposed in registers
// into k-major panels, and every output y[m, n] is ONE f32 FMA chain over
// k = 0 .. K-1 in order (plus MatMulLowRank's r terms after it). So for
// M > 4 a row's bits do not depend on M, on the row's place in the call, on
// the thread count or on the N split (MatMulMany included): training relies
// on a sequence's rows coming out the same in any batch (DPO's step-0
// reference equals the policy; prefix sharing). M <= 4 rows sum in another
// order: the same bound, other last bits.
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

// Y += X W^T: the product continued from Y, for a product split along K into
// column slices of W (Matrix::ColSlice) and the matching columns of X. For
// M > 4 the exact route continues each output's FMA chain from Y and the
// AVX512-BF16 route adds each 2048-column block's sum to Y as it does within
// one call, so slices split at multiples of 2048 give the unsplit product's
// bits on both (the FFN's hidden width in pieces, model/forward.cc). The AMX
// tiles, M <= 4 and the int8 routes add each slice's whole sum to Y once:
// the same bound, other last bits.
void MatMulAccumulate(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y,
                      int64_t ldy, ThreadPool* pool);

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

// The fused LoRA epilogue: a product through W plus a rank-r term, summed in
// the product's output tile before its single store, so the output is written
// once and the only extra inputs are the small factors.
//
// Forward (MatMulLowRank): Y[M, N] = X W^T + scale * U B^T, with U = A x
// [M, r] (computed once per call by the caller, a small product) and B [N, r].
// The tile's r extra terms are FMAs into the same f32 accumulators as the K
// terms of W x (the dot product is extended to K + r terms, U pre-multiplied
// by scale), so per output
//   |y - y_ref| <= (K + r + 3) u (sum_k |w_k x_k| + sum_j |s u_j b_j|),
// u = 2^-24: the MatMul bound over K + r terms plus one rounding of s u_j.
//
// Backward (MatMulTLowRank): dX[M, K] += dY W + mask .* (U V), with U = s dY B
// [M, r] and V = A [r, K]; mask [M, K] (LoRA dropout's multipliers) may be
// null. The rank-r term is computed in registers and added to each output
// tile after its last panel of W rows, before its store; per output
//   |dx - dx_ref| <= (N + r + 3) u (|dx0| + sum_n |dy_n w_n| + |mask| sum_j |u_j v_j|).
// The oracle for both is MatMulLowRankRef / MatMulTLowRankRef (matmul_ref.h,
// double). Not bit-identical to the unfused order (product, then a separate
// rank-r pass): the bound above is the contract (matmul_lowrank_test.cc).
//
// Routes that sum W x elsewhere (the int8 activation route, the bf16 route of
// W.route = kBf16) add the rank-r term in a second pass over their rows of Y,
// with the same bound.
struct LowRank {
  const float* u = nullptr;     // [M, r], row stride r
  const float* v = nullptr;     // forward: B [N, r]; backward: A [r, K] (row stride K)
  int64_t r = 0;                // rank, >= 1
  float scale = 1.0f;           // forward only (the backward's U carries it)
  const float* mask = nullptr;  // backward only: [M, K] multipliers, or null
};
void MatMulLowRank(const Matrix& W, const float* X, int64_t M, int64_t ldx, const LowRank& lr,
                   float* Y, int64_t ldy, ThreadPool* pool);
void MatMulTLowRank(const Matrix& W, const float* dY, int64_t M, const LowRank& lr, float* dX,
                    ThreadPool* pool);
// The unfused order's second pass: Y[M, N] += scale U B^T (lr.mask null),
// within (r + 2) u (|y0| + sum_j |s u_j b_j|) of the double sum.
void AddLowRank(float* Y, int64_t ldy, int64_t M, int64_t N, const LowRank& lr, ThreadPool* pool);

// The bf16 route (matmul_bf16.h, tier L3) for every M, whatever W.route says:
// X is rounded to bf16 once per call (M * roundup(K, 32) * 2 bytes, shared by
// the threads, plus one 512 KiB panel and one f32 row per thread), then each
// thread runs the route's panels over its rows of W. Bit-identical to MatMul
// with W.route = kBf16 where that takes the route (M > 4). The training's
// --compute bf16 forward. Requires CpuHasBf16().
void MatMulBf16(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool);

}  // namespace lumen::kernels
