// Scalar oracles for the int8-activation routes (matmul_q8.h): the same
// activation quantization (one int8 level, or two for int8x2), then
// y = sum_j w_j * xq_j in double with the weights split as the fast kernels
// see them, w = a - o, from each format's code q (decoded here from the block
// bytes, independently of the kernels):
//   Q4_0, Q5_0, Q8_0   a = d (q - 8), d (q - 16), d q (signed), o = 0
//                      (Q8_0 column groups: their stored byte minus 128)
//   Q4_1, Q5_1         a = d q, o = -m (q unsigned)
//   Q2_K               a = d (sc & 15) q, o = dmin (sc >> 4)   (sub-blocks of 16)
//   Q3_K               a = d (sc - 32) q, o = 4 d (sc - 32)    (q = 0..7)
//   Q4_K, Q5_K         a = d sc q, o = dmin m                  (sub-blocks of 32)
//   Q6_K               a = d sc q, o = 32 d sc                 (q = 0..63)
//   MLX 4/8-bit        a = s q, o = -b                         (per group)
//   F16, BF16          a = (amax / 2047) rint(w 2047 / amax)   (per 32: the int8x2
//                      GEMM's requantization; NaN for a unit with inf / NaN,
//                      0 where amax < kFloatUnitTiny)
// The split matters for the error bound: the kernels sum the a and o parts
// separately, so their rounding scales with |a| + |o|, not |w|.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lumen/core/check.h"
#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8x2_gemm.h"
#include "lumen/kernels/matrix.h"

namespace lumen::kernels {

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// Code j (0..31) of a legacy 32-element block: low nibbles hold elements
// 0..15, high nibbles 16..31; qh (5-bit types, else null) their 5th bits as a
// little-endian u32.
inline int LegacyCode(const uint8_t* qs, const uint8_t* qh, int j) {
  int q = j < kQK / 2 ? (qs[j] & 15) : (qs[j - kQK / 2] >> 4);
  if (qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    q |= static_cast<int>((h >> j) & 1) << 4;
  }
  return q;
}

// Code e (0..255) of a Q2_K / Q3_K super-block's 2-bit planes (qs, 64 bytes):
// element 128 n + 32 j + l is bits 2j of qs[32 n + l].
inline int TwoBitCode(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

// The same in Q2_K records (core/repack.h): element j = 16 h + 4 t + i of
// block l at bits 2 t of qs[32 h + 4 l + i].
inline int RecordCode(const uint8_t* qs, int e) {
  const int l = e / 32, j = e % 32;
  return (qs[32 * (j / 16) + 4 * l + j % 4] >> (2 * (j % 16 / 4))) & 3;
}

// The 3-bit code (0..7) of element e in Q3_K's planes (core/repack.h):
// element 4 r + i of block l is record r of lane byte 4 l + i.
inline int PlaneCode(const uint8_t* planes, int e) {
  const int r = e % 32 / 4;
  const uint8_t* b = planes + 4 * (e / 32) + e % 4;
  if (r < 6) return (b[32 * (r / 2)] >> (3 * (r % 2))) & 7;
  return ((b[32 * (r - 6)] >> 6) & 3) | ((b[64] >> r) & 1) << 2;
}

// Byte f (in the file's order) of an MLX row's codes at row, as its order
// (Matrix::mlx_order, core/repack.h) stores it: in a whole 128-byte run,
// byte b of the dword at 32 k + 16 h + 4 c is at 32 c + 16 h + 4 k + b; in a
// whole group of 64 D bytes (D = bits), byte b of the dword at D l + c is at
// 4 (16 c + l) + b.
inline uint8_t MlxCodeByte(const Matrix& W, const uint8_t* row, int64_t f) {
  const int64_t unit = MlxUnitBytes(W.mlx_order, W.mlx_bits);
  if (unit == 0 || (f / unit + 1) * unit > W.k * W.mlx_bits / 8) return row[f];
  const int64_t u = f / unit * unit, o = f % unit, b = o % 4, D = W.mlx_bits;
  if (W.mlx_order == MlxOrder::kGroups) return row[u + 4 * (16 * (o / 4 % D) + o / 4 / D) + b];
  const int64_t k = o / 32, h = o % 32 / 16, c = o % 16 / 4;
  return row[u + 32 * c + 16 * h + 4 * k + b];
}

// a[0..K), o[0..K) of row n (w = a - o).
inline void WeightParts(const Matrix& W, int64_t n, double* a, double* o) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  const int64_t K = W.k;
  for (int64_t i = 0; i < K; ++i) o[i] = 0;
  if (W.mlx_bits != 0) {  // w = s q + b; little-endian words: element i is byte i (8-bit)
                          // or the low (even i) / high (odd i) nibble of byte i / 2 (4-bit)
    const int64_t G = W.mlx_group;
    std::vector<float> s(K / G), b(K / G);
    DequantizeRow(W.scales.dtype, W.scales.row(n), s.data(), K / G);
    DequantizeRow(W.biases.dtype, W.biases.row(n), b.data(), K / G);
    for (int64_t i = 0; i < K; ++i) {
      const int q = W.mlx_bits == 8 ? MlxCodeByte(W, row, i)
                                    : (MlxCodeByte(W, row, i / 2) >> (4 * (i % 2))) & 15;
      a[i] = double(s[i / G]) * q;
      o[i] = -double(b[i / G]);
    }
    return;
  }
  // Legacy 32-blocks: d, then m (Q4_1/Q5_1), then qh (Q5_*), then the codes.
  struct Legacy {
    int64_t bytes, qs, qh;  // qh < 0: 4-bit
    bool min;
    int shift;  // signed types: q - shift
  };
  auto legacy = [&](const Legacy& f, int64_t b0 = 0) {  // blocks b0 ..
    for (int64_t b = b0; b < K / kQK; ++b) {
      const uint8_t* blk = row + b * f.bytes;
      const double d = HalfAt(blk), m = f.min ? HalfAt(blk + 2) : 0.0;
      for (int j = 0; j < kQK; ++j) {
        a[b * kQK + j] = d * (LegacyCode(blk + f.qs, f.qh < 0 ? nullptr : blk + f.qh, j) - f.shift);
        o[b * kQK + j] = -m;
      }
    }
  };
  // Column groups (core/repack.h): block l of a group of 16 is lane l of its
  // fields; the blocks after the last group are plain.
  auto groups = [&](const Legacy& f) {
    const int64_t grouped = K / kColsElems * kColsBlocks;
    for (int64_t b = 0; b < grouped; ++b) {
      const uint8_t* g = row + b / kColsBlocks * kColsBlocks * f.bytes;
      const int64_t l = b % kColsBlocks;
      const ColsFields c = ColsFieldsAt(PlainOf(W.w.dtype), g);
      const double d = HalfAt(g + c.d + 2 * l), m = f.min ? HalfAt(g + c.m + 2 * l) : 0.0;
      for (int j = 0; j < kQK; ++j) {
        const int byte = j % 16;  // byte j % 16 of the block: column byte / 4, lane l
        const uint8_t v = g[c.codes + 64 * (byte / 4) + 4 * l + byte % 4];
        int q = j < 16 ? v & 15 : v >> 4;
        const int64_t bit = 64 * (j / 4) + 4 * l + j % 4;  // of the masks, little-endian
        if (f.qh >= 0) q |= ((g[c.high + bit / 8] >> (bit % 8)) & 1) << 4;
        a[b * kQK + j] = d * (q - f.shift);
        o[b * kQK + j] = -m;
      }
    }
    legacy(f, grouped);
  };
  switch (W.w.dtype) {
    case DType::kF16:
    case DType::kBF16: {  // the int8x2 GEMM's requantization (matmul_q8x2_gemm.h)
      std::vector<float> w(K);
      DequantizeRow(W.w.dtype, row, w.data(), K);
      for (int64_t u = 0; u < K / kQK; ++u) {
        float amax = 0;
        bool finite = true;
        for (int j = 0; j < kQK; ++j) {
          finite = finite && std::isfinite(w[u * kQK + j]);
          amax = std::max(amax, std::fabs(w[u * kQK + j]));
        }
        const bool zero = amax < kFloatUnitTiny;
        const float inv = zero ? 0.0f : kFloatCodeMax / amax;
        const float scale = zero ? 0.0f : amax / kFloatCodeMax;
        for (int j = 0; j < kQK; ++j)
          a[u * kQK + j] = finite ? double(scale) * std::nearbyint(w[u * kQK + j] * inv) : NAN;
      }
      return;
    }
    case DType::kQ4_0:
      return legacy({sizeof(BlockQ4_0), 2, -1, false, 8});
    case DType::kQ4_1:
      return legacy({sizeof(BlockQ4_1), 4, -1, true, 0});
    case DType::kQ5_0:
      return legacy({sizeof(BlockQ5_0), 6, 2, false, 16});
    case DType::kQ5_1:
      return legacy({sizeof(BlockQ5_1), 8, 4, true, 0});
    case DType::kQ4_0Cols:
      return groups({sizeof(BlockQ4_0), 2, -1, false, 8});
    case DType::kQ4_1Cols:
      return groups({sizeof(BlockQ4_1), 4, -1, true, 0});
    case DType::kQ5_0Cols:
      return groups({sizeof(BlockQ5_0), 6, 2, false, 16});
    case DType::kQ5_1Cols:
      return groups({sizeof(BlockQ5_1), 8, 4, true, 0});
    case DType::kQ8_0:
    case DType::kQ8_0Cols: {
      // Column groups (core/repack.h): block l of a group of 16 is lane l of
      // 8 columns, its codes plus 128; the blocks after the last group are plain.
      const int64_t bb = sizeof(BlockQ8_0);
      const int64_t grouped = W.w.dtype == DType::kQ8_0Cols ? K / kColsElems * kColsBlocks : 0;
      for (int64_t b = 0; b < K / kQK; ++b) {
        const uint8_t* g = row + b / kColsBlocks * kColsBlocks * bb;
        const int64_t l = b % kColsBlocks;
        const ColsFields c = ColsFieldsAt(DType::kQ8_0, g);
        const uint8_t* blk = row + b * bb;
        const double d = b < grouped ? HalfAt(g + c.d + 2 * l) : HalfAt(blk);
        for (int j = 0; j < kQK; ++j)
          a[b * kQK + j] = d * (b < grouped ? g[c.codes + 64 * (j / 4) + 4 * l + j % 4] - 128
                                            : static_cast<int8_t>(blk[2 + j]));
      }
      return;
    }
    case DType::kQ2_K:
    case DType::kQ2_KCols:
      for (int64_t sb = 0; sb < K / kQKK; ++sb) {
        const uint8_t* blk = row + sb * sizeof(BlockQ2K);
        const double d = HalfAt(blk + 80), dmin = HalfAt(blk + 82);
        for (int e = 0; e < kQKK; ++e) {
          const uint8_t sc = blk[e / 16];
          const int q =
              W.w.dtype == DType::kQ2_KCols ? RecordCode(blk + 16, e) : TwoBitCode(blk + 16, e);
          a[sb * kQKK + e] = d * (sc & 15) * q;
          o[sb * kQKK + e] = dmin * (sc >> 4);
        }
      }
      return;
    case DType::kQ3_K:
    case DType::kQ3_KCols:
      for (int64_t sb = 0; sb < K / kQKK; ++sb) {
        const uint8_t* blk = row + sb * sizeof(BlockQ3K);
        const double d = HalfAt(blk + 108);
        for (int e = 0; e < kQKK; ++e) {
          const int q = W.w.dtype == DType::kQ3_KCols
                            ? PlaneCode(blk, e)
                            : TwoBitCode(blk + 32, e) | (((blk[e % 32] >> (e / 32)) & 1) << 2);
          const double as = d * (Q3KScale(blk + 96, e / 16) - 32);
          a[sb * kQKK + e] = as * q;
          o[sb * kQKK + e] = 4 * as;
        }
      }
      return;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ4_KCols:
    case DType::kQ5_KCols:
    case DType::kQ5_KPlanes: {
      const DType plain = PlainOf(W.w.dtype);
      const bool five = plain == DType::kQ5_K;
      const int64_t bytes = five ? sizeof(BlockQ5K) : sizeof(BlockQ4K), qs = five ? 48 : 16;
      int64_t sb = 0;
      // Column groups (core/repack.h): sub-block l of a group is sub-block
      // l % 8 of super-block 2 g + l / 8, lane l of the columns and masks;
      // scales, d and dmin in the meta field. A last odd super-block is plain.
      for (; IsColumnGroups(W.w.dtype) && sb + 2 <= K / kQKK; sb += 2) {
        const uint8_t* g = row + sb * bytes;
        const ColsFields c = ColsFieldsAt(plain, g);
        for (int64_t l = 0; l < 16; ++l) {
          const int64_t h = l / 8;
          const double d = HalfAt(g + c.d + 4 * h), dmin = HalfAt(g + c.d + 4 * h + 2);
          uint8_t sc, m;
          GetScaleMinK4(static_cast<int>(l % 8), g + c.scales + 12 * h, &sc, &m);
          for (int j = 0; j < kQK; ++j) {
            const int byte = j % 16;
            int q = (g[c.codes + 64 * (byte / 4) + 4 * l + byte % 4] >> (4 * (j / 16))) & 15;
            if (W.w.dtype == DType::kQ5_KPlanes) {  // bit j / 4 of byte 4 l + j % 4
              q |= ((g[c.high + 4 * l + j % 4] >> (j / 4)) & 1) << 4;
            } else if (five) {  // bit 4 l + j % 4 of mask j / 4
              const int64_t bit = 64 * (j / 4) + 4 * l + j % 4;
              q |= ((g[c.high + bit / 8] >> (bit % 8)) & 1) << 4;
            }
            a[sb * kQKK + 32 * l + j] = d * sc * q;
            o[sb * kQKK + 32 * l + j] = dmin * m;
          }
        }
      }
      for (; sb < K / kQKK; ++sb) {
        const uint8_t* blk = row + sb * bytes;
        const double d = HalfAt(blk), dmin = HalfAt(blk + 2);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          GetScaleMinK4(j, blk + 4, &sc, &m);
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = blk[qs + 32 * (j / 2) + l];
            int q = j % 2 == 0 ? (byte & 15) : (byte >> 4);
            if (five) q |= ((blk[16 + l] >> j) & 1) << 4;
            a[sb * kQKK + 32 * j + l] = d * sc * q;
            o[sb * kQKK + 32 * j + l] = dmin * m;
          }
        }
      }
      return;
    }
    case DType::kQ6_K:
    case DType::kQ6_KCols:
      for (int64_t sb = 0; sb < K / kQKK; ++sb) {
        const uint8_t* blk = row + sb * sizeof(BlockQ6K);
        const double d = HalfAt(blk + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
        for (int e = 0; e < kQKK; ++e) {
          int low, high;
          if (W.w.dtype == DType::kQ6_KCols) {  // slices (core/repack.h): column j, byte 4 l + b
            const int j = e % 16 / 4, byte = 4 * (e / 16) + e % 4;
            low = (blk[64 * (j % 2) + byte] >> (4 * (j / 2))) & 15;
            high = (blk[128 + byte] >> (2 * j)) & 3;
          } else {
            const int h = e / 128, i = e % 128, l = i % 32, part = i / 32;
            const uint8_t lo = blk[64 * h + l + (part % 2) * 32];
            low = part < 2 ? (lo & 15) : (lo >> 4);
            high = (blk[128 + 32 * h + l] >> (2 * part)) & 3;
          }
          const int sub = e / 16;  // the 16-element sub-block
          const double as = d * sc[sub];
          a[sb * kQKK + e] = as * (low | (high << 4));
          o[sb * kQKK + e] = 32 * as;
        }
      }
      return;
    default:  // no int8 kernel: callers check Int8RouteSupports first
      LUMEN_CHECK(false);
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
