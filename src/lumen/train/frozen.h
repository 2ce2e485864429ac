// Products through a frozen weight W [N, K] of any storage, at Real = float
// (the training route: kernels::MatMul / MatMulT in f32, or with bf16 the
// bf16-operand routes kernels::MatMulBf16 / MatMulTBf16, train/compute.h) or
// double (rows decoded to f32, then double arithmetic: the finite-difference
// oracle, which ignores bf16).
//
// Transient memory of one call: f32 FrozenProductT holds MatMulT's f32
// result for at most kTransposedRowChunk rows (rows go in chunks; each chunk
// decodes W once more, 1/kTransposedRowChunk of the product); bf16 adds into dx directly and holds
// dy in bf16 plus the panels (kernels/matmul_bf16_t.h); the bf16 FrozenProduct holds x in bf16 plus
// the panels (kernels/matmul.h, MatMulBf16). A LoRA target's fused backward
// (kernels::MatMulTLowRank, graph.cc) adds into dx in place and holds no
// [rows, K] result at all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16_t.h"
#include "lumen/kernels/matrix.h"

namespace lumen::train {

inline constexpr int64_t kTransposedRowChunk = 256;

// y [M, N] = x [M, K] W^T (overwritten).
template <class Real>
void FrozenProduct(const kernels::Matrix& W, const Real* x, int64_t M, Real* y, ThreadPool* pool,
                   bool bf16 = false) {
  if constexpr (std::is_same_v<Real, float>) {
    if (bf16)
      kernels::MatMulBf16(W, x, M, W.k, y, W.n, pool);
    else
      kernels::MatMul(W, x, M, W.k, y, W.n, pool);
  } else {
    std::vector<float> row(W.k);
    for (int64_t n = 0; n < W.n; ++n) {
      kernels::DequantizeMatrixRow(W, n, row.data());
      for (int64_t m = 0; m < M; ++m) {
        Real acc = 0;
        const Real* xm = x + m * W.k;
        for (int64_t k = 0; k < W.k; ++k) acc += Real(row[k]) * xm[k];
        y[m * W.n + n] = acc;
      }
    }
  }
}

// dx [M, K] += dy [M, N] W.
template <class Real>
void FrozenProductT(const kernels::Matrix& W, const Real* dy, int64_t M, Real* dx, ThreadPool* pool,
                    bool bf16 = false) {
  if constexpr (std::is_same_v<Real, float>) {
    if (bf16) return kernels::MatMulTBf16(W, dy, M, dx, /*accumulate=*/true, pool);
    const int64_t rows = std::min(M, kTransposedRowChunk);
    std::vector<float> tmp(size_t(rows) * W.k);
    for (int64_t m0 = 0; m0 < M; m0 += rows) {
      const int64_t mc = std::min(rows, M - m0);
      kernels::MatMulT(W, dy + m0 * W.n, mc, tmp.data(), pool);
      float* out = dx + m0 * W.k;
      for (int64_t i = 0; i < mc * W.k; ++i) out[i] += tmp[i];
    }
  } else {
    std::vector<float> row(W.k);
    for (int64_t n = 0; n < W.n; ++n) {
      kernels::DequantizeMatrixRow(W, n, row.data());
      for (int64_t m = 0; m < M; ++m) {
        const Real g = dy[m * W.n + n];
        if (g == 0) continue;
        Real* dxm = dx + m * W.k;
        for (int64_t k = 0; k < W.k; ++k) dxm[k] += g * Real(row[k]);
      }
    }
  }
}

// A dense f32 matrix [n, k] (LoRA's A or B) as a kernels::Matrix view.
inline kernels::Matrix DenseMatrix(const float* p, int64_t n, int64_t k) {
  return kernels::Matrix::Plain(TensorView::Contiguous(const_cast<float*>(p), DType::kF32, {n, k}));
}

}  // namespace lumen::train
