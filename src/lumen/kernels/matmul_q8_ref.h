// Scalar oracle for the int8-activation route (matmul_q8.h): the same
// activation quantization, the weight's integer codes dotted exactly per
// 32-block, each block scaled by (weight scale x activation scale) and summed
// in double. Q4_0 and Q8_0 weights only.
#pragma once

#include <cstring>
#include <vector>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

// Signed weight integers and scale of block b of row n (w = d * q).
inline float WeightBlockInts(const Matrix& W, int64_t n, int64_t b, int32_t* q) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  uint16_t h;
  if (W.w.dtype == DType::kQ4_0) {
    const uint8_t* blk = row + b * sizeof(BlockQ4_0);
    for (int j = 0; j < kQK / 2; ++j) {
      q[j] = (blk[2 + j] & 15) - 8;
      q[j + kQK / 2] = (blk[2 + j] >> 4) - 8;
    }
    std::memcpy(&h, blk, 2);
  } else {
    const uint8_t* blk = row + b * sizeof(BlockQ8_0);
    for (int j = 0; j < kQK; ++j) q[j] = static_cast<int8_t>(blk[2 + j]);
    std::memcpy(&h, blk, 2);
  }
  return F16ToF32(h);
}

// Y[M, N] (dense, ld N); also returns, per output, sum_b |dw dx| sum_j |qw qx|
// in abs_dot (for the error bound) when non-null.
inline void MatMulInt8Ref(const Matrix& W, const float* X, int64_t M, float* Y,
                          std::vector<double>* abs_dot = nullptr) {
  const int64_t N = W.n, K = W.k, nb = K / kQK;
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * nb);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b)
      QuantizeActivationBlock(X + m * K + b * kQK, qx.data() + m * K + b * kQK, &dx[m * nb + b]);
  if (abs_dot) abs_dot->assign(M * N, 0.0);
  int32_t qw[kQK];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0, mag = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const double s = double(WeightBlockInts(W, n, b, qw)) * dx[m * nb + b];
        int64_t dot = 0, adot = 0;
        for (int j = 0; j < kQK; ++j) {
          const int64_t p = int64_t(qw[j]) * qx[m * K + b * kQK + j];
          dot += p;
          adot += p < 0 ? -p : p;
        }
        acc += s * double(dot);
        mag += std::abs(s) * double(adot);
      }
      Y[m * N + n] = float(acc);
      if (abs_dot) (*abs_dot)[m * N + n] = mag;
    }
}

}  // namespace lumen::kernels
