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

// MatMulLowRank's oracle: Y = X W^T + scale U B^T in double (U [M, r], B [N, r]).
inline void MatMulLowRankRef(const Matrix& W, const float* X, int64_t M, const float* U,
                             const float* B, int64_t r, float scale, float* Y) {
  const int64_t N = W.n, K = W.k;
  std::vector<float> w(K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0, low = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(w[k]) * X[m * K + k];
      for (int64_t j = 0; j < r; ++j) low += double(U[m * r + j]) * B[n * r + j];
      Y[m * N + n] = float(acc + double(scale) * low);
    }
  }
}

// MatMulTLowRank's oracle: dX += dY W + mask .* (U V) in double (U [M, r],
// V [r, K], mask [M, K] or null).
inline void MatMulTLowRankRef(const Matrix& W, const float* dY, int64_t M, const float* U,
                              const float* V, int64_t r, const float* mask, float* dX) {
  const int64_t N = W.n, K = W.k;
  std::vector<double> acc(M * K, 0.0);
  std::vector<float> w(K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) acc[m * K + k] += double(dY[m * N + n]) * w[k];
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double low = 0;
      for (int64_t j = 0; j < r; ++j) low += double(U[m * r + j]) * V[j * K + k];
      if (mask) low *= mask[m * K + k];
      dX[m * K + k] = float(double(dX[m * K + k]) + acc[m * K + k] + low);
    }
}

}  // namespace lumen::kernels
