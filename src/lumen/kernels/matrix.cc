#include "lumen/kernels/matrix.h"

#include <vector>

#include "lumen/core/quant.h"

namespace lumen::kernels {

void DequantizeMatrixRow(const Matrix& m, int64_t r, float* dst) {
  if (m.mlx_bits == 0) {
    DequantizeRow(m.w.dtype, m.w.row(r), dst, m.k);
    return;
  }
  const int64_t groups = m.k / m.mlx_group;
  float sb[2 * 1024];
  std::vector<float> big;
  float* s = sb;
  if (groups > 1024) {
    big.resize(2 * groups);
    s = big.data();
  }
  DequantizeRow(m.scales.dtype, m.scales.row(r), s, groups);
  DequantizeRow(m.biases.dtype, m.biases.row(r), s + groups, groups);
  DequantizeMlxRow(m.w.row<const uint32_t>(r), s, s + groups, m.mlx_bits, m.mlx_group, dst, m.k);
}

}  // namespace lumen::kernels
