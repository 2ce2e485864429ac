// Scalar oracles for the int8-activation routes (matmul_q8.h): the same
// activation quantization (one int8 level, or two for int8x2), then
// y = sum_j w_j * xq_j in double with the
// weights split as the fast kernels see them, w = a - o: Q4_0/Q8_0 a = d q
// (signed q), o = 0; Q4_K a = d sc q, o = dmin m; Q6_K a = d sc q, o = 32 d sc
// (unsigned q); MLX 4-bit a = s q, o = -b. The split matters for the error bound: the kernels sum
// the a and o parts separately, so their rounding scales with |a| + |o|, not |w|.
#pragma once

#include <cmath>
#include <cstring>
#include <vector>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// a[0..K), o[0..K) of row n (w = a - o).
inline void WeightParts(const Matrix& W, int64_t n, double* a, double* o) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  const int64_t K = W.k;
  for (int64_t i = 0; i < K; ++i) o[i] = 0;
  if (W.mlx_bits == 4) {  // w = s q + b: element i in bits 4(i % 8) of little-endian word i / 8
    const int64_t G = W.mlx_group;
    std::vector<float> s(K / G), b(K / G);
    DequantizeRow(W.scales.dtype, W.scales.row(n), s.data(), K / G);
    DequantizeRow(W.biases.dtype, W.biases.row(n), b.data(), K / G);
    for (int64_t i = 0; i < K; ++i) {
      const int q = (row[i / 2] >> (4 * (i % 2))) & 15;
      a[i] = double(s[i / G]) * q;
      o[i] = -double(b[i / G]);
    }
    return;
  }
  switch (W.w.dtype) {
    case DType::kQ4_0:
      for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t* blk = row + b * sizeof(BlockQ4_0);
        const double d = HalfAt(blk);
        for (int j = 0; j < kQK / 2; ++j) {
          a[b * kQK + j] = d * ((blk[2 + j] & 15) - 8);
          a[b * kQK + j + kQK / 2] = d * ((blk[2 + j] >> 4) - 8);
        }
      }
      return;
    case DType::kQ8_0:
      for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t* blk = row + b * sizeof(BlockQ8_0);
        const double d = HalfAt(blk);
        for (int j = 0; j < kQK; ++j) a[b * kQK + j] = d * static_cast<int8_t>(blk[2 + j]);
      }
      return;
    case DType::kQ4_K:
      for (int64_t sb = 0; sb < K / kQKK; ++sb) {
        const uint8_t* blk = row + sb * sizeof(BlockQ4K);
        const double d = HalfAt(blk), dmin = HalfAt(blk + 2);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          GetScaleMinK4(j, blk + 4, &sc, &m);
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = blk[16 + 32 * (j / 2) + l];
            const int q = j % 2 == 0 ? (byte & 15) : (byte >> 4);
            a[sb * kQKK + 32 * j + l] = d * sc * q;
            o[sb * kQKK + 32 * j + l] = dmin * m;
          }
        }
      }
      return;
    case DType::kQ6_K:
      for (int64_t sb = 0; sb < K / kQKK; ++sb) {
        const uint8_t* blk = row + sb * sizeof(BlockQ6K);
        const double d = HalfAt(blk + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
        for (int e = 0; e < kQKK; ++e) {
          const int h = e / 128, i = e % 128, l = i % 32, part = i / 32;
          const uint8_t lo = blk[64 * h + l + (part % 2) * 32];
          const int low = part < 2 ? (lo & 15) : (lo >> 4);
          const int high = (blk[128 + 32 * h + l] >> (2 * part)) & 3;
          const double as = d * sc[e / 16];
          a[sb * kQKK + e] = as * (low | (high << 4));
          o[sb * kQKK + e] = 32 * as;
        }
      }
      return;
    default:
      return;
  }
}

// Row m of X as the int8 route with `levels` levels reads it: xq[0..K).
inline void Int8ActivationsRef(const float* x, int64_t K, int levels, double* xq) {
  int8_t q1[kQK], q2[kQK];
  for (int64_t b = 0; b < K / kQK; ++b) {
    if (levels == 1) {
      const float d = QuantizeBlockQ8(x + b * kQK, q1);
      for (int j = 0; j < kQK; ++j) xq[b * kQK + j] = double(d) * q1[j];
    } else {
      const float d2 = QuantizeBlockQ8x2(x + b * kQK, q1, q2);
      for (int j = 0; j < kQK; ++j) xq[b * kQK + j] = double(d2) * (256 * q1[j] + q2[j]);
    }
  }
}

// Y[M, N] (dense, ld N) through the int8 route with `levels` activation
// levels; abs_dot (if non-null) gets sum_j (|a_j| + |o_j|) |xq_j| per output,
// for the error bound.
inline void MatMulInt8LevelsRef(const Matrix& W, const float* X, int64_t M, int levels, float* Y,
                                std::vector<double>* abs_dot) {
  const int64_t N = W.n, K = W.k;
  std::vector<double> xq(M * K), a(K), o(K);
  for (int64_t m = 0; m < M; ++m) Int8ActivationsRef(X + m * K, K, levels, xq.data() + m * K);
  if (abs_dot) abs_dot->assign(M * N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    WeightParts(W, n, a.data(), o.data());
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        acc += (a[k] - o[k]) * xq[m * K + k];
        mag += (std::fabs(a[k]) + std::fabs(o[k])) * std::fabs(xq[m * K + k]);
      }
      Y[m * N + n] = float(acc);
      if (abs_dot) (*abs_dot)[m * N + n] = mag;
    }
  }
}

// The int8 route (ActRoute::kInt8): one level.
inline void MatMulInt8Ref(const Matrix& W, const float* X, int64_t M, float* Y,
                          std::vector<double>* abs_dot = nullptr) {
  MatMulInt8LevelsRef(W, X, M, 1, Y, abs_dot);
}

// The int8x2 route (ActRoute::kInt8x2): two levels.
inline void MatMulInt8x2Ref(const Matrix& W, const float* X, int64_t M, float* Y,
                            std::vector<double>* abs_dot = nullptr) {
  MatMulInt8LevelsRef(W, X, M, 2, Y, abs_dot);
}

}  // namespace lumen::kernels
