// Products through a frozen weight W [N, K] of any storage, at Real = float
// (kernels::MatMul / MatMulT: the training route) or double (rows decoded to
// f32, then double arithmetic: the finite-difference oracle).
//
// FrozenProductT's float route holds a scratch of at most
// kTransposedRowChunk x K floats (rows are done in chunks; each chunk decodes
// W once more, which costs 1/kTransposedRowChunk of the product).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matrix.h"

namespace lumen::train {

inline constexpr int64_t kTransposedRowChunk = 256;

// y [M, N] = x [M, K] W^T (overwritten).
template <class Real>
void FrozenProduct(const kernels::Matrix& W, const Real* x, int64_t M, Real* y, ThreadPool* pool) {
  if constexpr (std::is_same_v<Real, float>) {
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
void FrozenProductT(const kernels::Matrix& W, const Real* dy, int64_t M, Real* dx,
                    ThreadPool* pool) {
  if constexpr (std::is_same_v<Real, float>) {
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

}  // namespace lumen::train
