#include "lumen/kernels/matrix.h"

#include <vector>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"

namespace lumen::kernels {

void DequantizeMatrixRow(const Matrix& m, int64_t r, float* dst) {
  DequantizeMatrixColumns(m, r, 0, m.k, dst);
}

int64_t MatrixColumnAlign(const Matrix& m) {
  return m.mlx_bits ? m.mlx_group : Info(m.w.dtype).block_elems;
}

void DequantizeMatrixColumns(const Matrix& m, int64_t r, int64_t k0, int64_t k1, float* dst) {
  const int64_t align = MatrixColumnAlign(m);
  LUMEN_CHECK(k0 >= 0 && k0 <= k1 && k1 <= m.k && k0 % align == 0 &&
              (k1 % align == 0 || k1 == m.k));
  if (k0 == k1) return;
  if (IsColumnGroups(m.w.dtype)) {  // its groups decode from the row's start
    DequantizeColumnGroups(PlainOf(m.w.dtype), m.w.row<const uint8_t>(r), m.k, k0, k1, dst);
    return;
  }
  if (m.mlx_bits == 0) {
    // Whole blocks from k0: the same per-block arithmetic as the full row.
    const uint8_t* row = m.w.row<const uint8_t>(r) + *RowBytes(m.w.dtype, k0);
    DequantizeRow(m.w.dtype, row, dst, k1 - k0);
    return;
  }
  const int64_t g0 = k0 / align, groups = (k1 - k0 + align - 1) / align;
  float sb[2 * 1024];
  std::vector<float> big;
  float* s = sb;
  if (groups > 1024) {
    big.resize(2 * groups);
    s = big.data();
  }
  const size_t sbytes = *RowBytes(m.scales.dtype, g0);
  DequantizeRow(m.scales.dtype, m.scales.row<const uint8_t>(r) + sbytes, s, groups);
  DequantizeRow(m.biases.dtype, m.biases.row<const uint8_t>(r) + sbytes, s + groups, groups);
  const uint32_t* packed = m.w.row<const uint32_t>(r) + k0 * m.mlx_bits / 32;
  DequantizeMlxRow(packed, s, s + groups, m.mlx_bits, m.mlx_group, dst, k1 - k0);
}

}  // namespace lumen::kernels
