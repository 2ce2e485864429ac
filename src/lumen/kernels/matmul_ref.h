// Scalar reference for MatMul/MatMulT: dequantize each row, accumulate in double.
// The in-tree oracle the fast kernels are tested against.
#pragma once

#include <vector>

#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

inline void MatMulRef(const Matrix& W, const float* X, int64_t M, float* Y) {
  const int64_t N = W.n, K = W.k;
  std::vector<float> w(K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(w[k]) * X[m * K + k];
      Y[m * N + n] = float(acc);
    }
  }
}

inline void MatMulTRef(const Matrix& W, const float* dY, int64_t M, float* dX) {
  const int64_t N = W.n, K = W.k;
  std::vector<double> acc(M * K, 0.0);
  std::vector<float> w(K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) acc[m * K + k] += double(dY[m * N + n]) * w[k];
  }
  for (int64_t i = 0; i < M * K; ++i) dX[i] = float(acc[i]);
}

}  // namespace lumen::kernels
