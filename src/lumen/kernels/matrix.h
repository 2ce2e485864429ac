// Matrix: a weight matrix [N, K] as kernels see it, whatever its storage.
//
// Most weights are one TensorView (f32/f16/bf16 or a GGUF block type). MLX
// affine-quantized weights are three: packed u32 codes [N, K*bits/32] plus
// per-group scales and biases [N, K/G] (f32/f16/bf16). DequantizeMatrixRow is
// the single place that knows both, so every kernel handles every layout.
#pragma once

#include <cstdint>

#include "lumen/core/tensor.h"

namespace lumen::kernels {

// How a product with this matrix treats its activations. kExact: f32 as given
// (tier L2). kInt8: rows quantized to int8 per 32-element block and dotted
// with VNNI integer instructions where the weight type and CPU allow it
// (tier L3, matmul_q8.h); the exact route otherwise.
enum class ActRoute : uint8_t { kExact, kInt8 };

struct Matrix {
  TensorView w;       // [N, K], or MLX packed codes [N, K * bits / 32] (u32)
  TensorView scales;  // MLX only: [N, K / group]
  TensorView biases;  // MLX only: [N, K / group]
  int mlx_bits = 0;   // 0: not MLX
  int mlx_group = 0;
  int64_t n = 0, k = 0;  // logical shape
  ActRoute route = ActRoute::kExact;

  static Matrix Plain(const TensorView& v) {
    Matrix m;
    m.w = v;
    m.n = v.dim(0);
    m.k = v.dim(1);
    return m;
  }
  bool valid() const { return w.data != nullptr; }
  bool is_f32() const { return mlx_bits == 0 && w.dtype == DType::kF32; }
  // Bytes read to stream the whole matrix once (for roofline accounting).
  size_t bytes() const {
    return w.byte_size() + (mlx_bits ? scales.byte_size() + biases.byte_size() : 0);
  }
};

// dst[0..K) = row r of m as f32.
void DequantizeMatrixRow(const Matrix& m, int64_t r, float* dst);

}  // namespace lumen::kernels
