// Scalar oracles for the bf16 routes: the prefill product (matmul_bf16.h,
// MatMulBf16) and the transposed product (matmul_bf16_t.h): dequantize each
// weight row, round weights and activations (or cotangents) to bf16 (nearest
// even), multiply exactly and accumulate in double.
#pragma once

#include <vector>

#include "lumen/core/half.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

inline float RoundBf16(float v) { return BF16ToF32(F32ToBF16(v)); }

// Y[M, N] = bf16(X[M, K]) * bf16(W)^T with X dense (stride K) and Y dense (stride N).
inline void MatMulBf16Ref(const Matrix& W, const float* X, int64_t M, float* Y) {
  const int64_t N = W.n, K = W.k;
  std::vector<float> w(K), xb(M * K);
  for (int64_t i = 0; i < M * K; ++i) xb[i] = RoundBf16(X[i]);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (float& v : w) v = RoundBf16(v);
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(w[k]) * xb[m * K + k];
      Y[m * N + n] = float(acc);
    }
  }
}

// dX[M, K] = bf16(dY[M, N]) * bf16(W) with dY dense (stride N), dX dense (stride K, overwritten).
inline void MatMulTBf16Ref(const Matrix& W, const float* dY, int64_t M, float* dX) {
  const int64_t N = W.n, K = W.k;
  std::vector<float> w(K);
  std::vector<double> acc(M * K, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (float& v : w) v = RoundBf16(v);
    for (int64_t m = 0; m < M; ++m) {
      const double g = RoundBf16(dY[m * N + n]);
      for (int64_t k = 0; k < K; ++k) acc[m * K + k] += g * w[k];
    }
  }
  for (int64_t i = 0; i < M * K; ++i) dX[i] = float(acc[i]);
}

}  // namespace lumen::kernels
