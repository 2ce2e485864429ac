// The f32 LoRA products of a training step around a frozen weight W [N, K]
// with adapter A [r, K], B [N, r] and scale s (lora.h), each a parallel
// kernel product (kernels::MatMul over a dense f32 view, or kernels::MatMulT)
// that reads its large operand (x [M, K] or dy [M, N]) row-major once:
//
//   LoraDown   u  [M, r]  = x A^T                (the forward's A x)
//   LoraDyB    du [M, r]  = dy (s B)             (the backward's s dy B)
//   LoraGradB  dB [N, r] += s dy^T u
//   LoraGradA  dA [r, K] += du^T x               (x: the dropped input A saw)
//   LoraDxAdd  dx [M, K] += mask .* (du A)       (the unfused order; the fused
//                                                 one is kernels::MatMulTLowRank)
//
// Bounds: each output is a sum of M (gradients), K, N or r products in f32, so
// within the MatMul bound (reduction + 2) u sum |terms| of the double sum
// (kernels/matmul_test.cc), plus one rounding where s is folded into an
// operand (s B, and s times dB's sum). Row blocks are fixed by M alone
// (kLoraRowBlock), so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "lumen/core/thread_pool.h"

namespace lumen::train {

// Rows of x per LoraDown task: fixed, so each row takes the same kernel path
// (kernels::MatMul's M > 4 panels) whatever the thread count; the last block
// absorbs the remainder.
inline constexpr int64_t kLoraRowBlock = 16;

void LoraDown(const float* A, int64_t r, int64_t K, const float* x, int64_t M, float* u,
              ThreadPool* pool);
void LoraDyB(const float* B, int64_t N, int64_t r, float s, const float* dy, int64_t M, float* du,
             ThreadPool* pool);
void LoraGradB(const float* dy, const float* u, int64_t M, int64_t N, int64_t r, float s, float* dB,
               ThreadPool* pool);
void LoraGradA(const float* du, const float* x, int64_t M, int64_t K, int64_t r, float* dA,
               ThreadPool* pool);
// mask [M, K] may be null.
void LoraDxAdd(const float* du, const float* A, int64_t M, int64_t K, int64_t r, const float* mask,
               float* dx, ThreadPool* pool);

}  // namespace lumen::train
