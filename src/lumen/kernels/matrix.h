// Matrix: a weight matrix [N, K] as kernels see it, whatever its storage.
//
// Most weights are one TensorView (f32/f16/bf16 or a GGUF block type). MLX
// affine-quantized weights are three: packed u32 codes [N, K*bits/32] plus
// per-group scales and biases [N, K/G] (f32/f16/bf16). DequantizeMatrixRow is
// the single place that knows both, so every kernel handles every layout.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "lumen/core/tensor.h"

namespace lumen::kernels {

// How a product with this matrix treats its activations. kExact: f32 as given
// (tier L2). kInt8: products with few rows (decode) quantize the rows to int8
// per 32-element block and dot them with VNNI integer instructions where the
// weight type and CPU allow it (tier L3, matmul_q8.h). kInt8x2: the same
// products with each block quantized twice, the second int8 level holding the
// first one's residual at 1/256 of its scale (about 16-bit activations, tier
// L2, matmul_q8.h). kBf16: products with many rows (prefill) round activations
// and decoded weights to bf16 and dot them with AVX512-BF16 (tier L3,
// matmul_bf16.h). kInt8Bf16, kInt8x2Bf16: an int8 decode route and the bf16
// prefill route. Where a route does not apply (row count, weight type, CPU)
// the exact route runs.
enum class ActRoute : uint8_t { kExact, kInt8, kBf16, kInt8Bf16, kInt8x2, kInt8x2Bf16 };
inline bool RouteHasInt8(ActRoute r) {
  return r == ActRoute::kInt8 || r == ActRoute::kInt8Bf16 || r == ActRoute::kInt8x2 ||
         r == ActRoute::kInt8x2Bf16;
}
inline bool RouteHasBf16(ActRoute r) {
  return r == ActRoute::kBf16 || r == ActRoute::kInt8Bf16 || r == ActRoute::kInt8x2Bf16;
}
// int8 levels per activation block of an int8 route: 2 for kInt8x2*, else 1.
inline int Int8Levels(ActRoute r) {
  return r == ActRoute::kInt8x2 || r == ActRoute::kInt8x2Bf16 ? 2 : 1;
}
// Command-line names, indexed by the enum's value.
inline constexpr std::array<std::string_view, 6> kActRouteNames = {
    "exact", "int8", "bf16", "int8+bf16", "int8x2", "int8x2+bf16"};
// nullopt: none of kActRouteNames.
inline std::optional<ActRoute> ParseActRoute(std::string_view s) {
  for (size_t i = 0; i < kActRouteNames.size(); ++i)
    if (s == kActRouteNames[i]) return static_cast<ActRoute>(i);
  return std::nullopt;
}

// How an MLX matrix's codes lie in memory: the file's order, or rearranged
// at load (core/repack.h) for the int8 kernels, 4- and 8-bit alike: as runs
// (the AVX2 kernels: TransposeMlxRuns) or groups (the AVX-512 VNNI ones:
// TransposeMlxGroups).
enum class MlxOrder : uint8_t { kFile, kRuns, kGroups };
// The bytes of a row's codes rearranged as a whole (a run: 128, a group: 64
// times the bits); 0 for the file's order.
int64_t MlxUnitBytes(MlxOrder order, int bits);

struct Matrix {
  TensorView w;       // [N, K], or MLX packed codes [N, K * bits / 32] (u32)
  TensorView scales;  // MLX only: [N, K / group]
  TensorView biases;  // MLX only: [N, K / group]
  int mlx_bits = 0;   // 0: not MLX
  int mlx_group = 0;
  // The order of the MLX codes (MlxOrder): rearranged at load for the int8
  // kernels of the CPU; every other reader takes MlxFileCodes.
  MlxOrder mlx_order = MlxOrder::kFile;
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
  // Rows [begin, end) as a matrix of their own (a view: every storage layout).
  Matrix RowSlice(int64_t begin, int64_t end) const {
    Matrix m = *this;
    m.w = w.Slice0(begin, end);
    if (mlx_bits) {
      m.scales = scales.Slice0(begin, end);
      m.biases = biases.Slice0(begin, end);
    }
    m.n = end - begin;
    return m;
  }
  // Columns [k0, k1) as a matrix of their own (a view with W's row stride).
  // k0 and k1 are multiples of MatrixSliceAlign, or k1 == k.
  Matrix ColSlice(int64_t k0, int64_t k1) const;
  bool is_f32() const { return mlx_bits == 0 && w.dtype == DType::kF32; }
  // Bytes read to stream the whole matrix once (for roofline accounting).
  size_t bytes() const {
    return w.byte_size() + (mlx_bits ? scales.byte_size() + biases.byte_size() : 0);
  }
};

// dst[0..K) = row r of m as f32.
void DequantizeMatrixRow(const Matrix& m, int64_t r, float* dst);

// Bytes [b0, b1) of row r of an MLX matrix's codes in the file's order: the
// row's own bytes, or (runs, groups) the whole units that cover them put back
// into *buf. b0 a multiple of 4.
const uint8_t* MlxFileCodes(const Matrix& m, int64_t r, int64_t b0, int64_t b1,
                            std::vector<uint8_t>* buf);

// The column granularity of m's storage: 1 for plain types, the block size of
// a GGUF block type (32, 256), the group size of MLX.
int64_t MatrixColumnAlign(const Matrix& m);

// Where Matrix::ColSlice may cut: MatrixColumnAlign, and for the column
// groups repacked at load (core/repack.h) a whole group (512); for MLX codes
// in runs or groups a whole one (MlxUnitBytes).
int64_t MatrixSliceAlign(const Matrix& m);

// dst[0..k1 - k0) = columns [k0, k1) of row r as f32, equal to the same
// elements of DequantizeMatrixRow. k0 is a multiple of MatrixColumnAlign(m);
// k1 is too, or k1 == m.k.
void DequantizeMatrixColumns(const Matrix& m, int64_t r, int64_t k0, int64_t k1, float* dst);

}  // namespace lumen::kernels
