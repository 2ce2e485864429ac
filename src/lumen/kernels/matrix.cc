#include "lumen/kernels/matrix.h"

#include <algorithm>
#include <vector>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"

namespace lumen::kernels {

int64_t MlxUnitBytes(MlxOrder order, int bits) {
  switch (order) {
    case MlxOrder::kRuns:
      return kMlxRunBytes;
    case MlxOrder::kGroups:
      return MlxGroupBytes(bits);
    default:
      return 0;
  }
}

void DequantizeMatrixRow(const Matrix& m, int64_t r, float* dst) {
  DequantizeMatrixColumns(m, r, 0, m.k, dst);
}

int64_t MatrixColumnAlign(const Matrix& m) {
  return m.mlx_bits ? m.mlx_group : Info(m.w.dtype).block_elems;
}

int64_t MatrixSliceAlign(const Matrix& m) {
  if (m.mlx_order != MlxOrder::kFile)  // whole runs or groups (multiples of the MLX group)
    return MlxUnitBytes(m.mlx_order, m.mlx_bits) * 8 / m.mlx_bits;
  return IsColumnGroups(m.w.dtype) ? kColsElems : MatrixColumnAlign(m);
}

const uint8_t* MlxFileCodes(const Matrix& m, int64_t r, int64_t b0, int64_t b1,
                            std::vector<uint8_t>* buf) {
  const uint8_t* row = m.w.row<const uint8_t>(r);
  if (m.mlx_order == MlxOrder::kFile) return row + b0;
  const int64_t row_bytes = m.k * m.mlx_bits / 8, unit = MlxUnitBytes(m.mlx_order, m.mlx_bits);
  const int64_t u0 = b0 / unit * unit;
  const int64_t u1 = std::min(row_bytes, (b1 + unit - 1) / unit * unit);
  buf->assign(row + u0, row + u1);
  // whole units from u0; the row's tail stays
  if (m.mlx_order == MlxOrder::kRuns)
    TransposeMlxRuns(buf->data(), u1 - u0);
  else
    UntransposeMlxGroups(buf->data(), u1 - u0, m.mlx_bits);
  return buf->data() + (b0 - u0);
}

Matrix Matrix::ColSlice(int64_t k0, int64_t k1) const {
  const int64_t align = MatrixSliceAlign(*this);
  LUMEN_CHECK(w.ndim == 2 && k0 >= 0 && k0 <= k1 && k1 <= k && k0 % align == 0 &&
              (k1 % align == 0 || k1 == k));
  // The elements [e0, e1) of every row of v: the row's first bytes skipped,
  // the stride kept. Column groups keep their addresses, so their layout
  // (which depends on the address) still reads the same.
  auto cols = [](TensorView v, int64_t e0, int64_t e1) {
    v.data = static_cast<char*>(v.data) + *RowBytes(v.dtype, e0);
    v.shape[1] = e1 - e0;
    return v;
  };
  Matrix m = *this;
  m.k = k1 - k0;
  if (mlx_bits == 0) {
    m.w = cols(w, k0, k1);
    return m;
  }
  m.w = cols(w, k0 * mlx_bits / 32, k1 * mlx_bits / 32);  // u32 words of codes
  m.scales = cols(scales, k0 / mlx_group, k1 / mlx_group);
  m.biases = cols(biases, k0 / mlx_group, k1 / mlx_group);
  return m;
}

void DequantizeMatrixColumns(const Matrix& m, int64_t r, int64_t k0, int64_t k1, float* dst) {
  const int64_t align = MatrixColumnAlign(m);
  LUMEN_CHECK(k0 >= 0 && k0 <= k1 && k1 <= m.k && k0 % align == 0 &&
              (k1 % align == 0 || k1 == m.k));
  if (k0 == k1) return;
  if (IsColumnGroups(m.w.dtype)) {  // its groups decode from the row's start
    DequantizeColumnGroups(m.w.dtype, m.w.row<const uint8_t>(r), m.k, k0, k1, dst);
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
  std::vector<uint8_t> codes;  // runs, groups: the file's order
  const auto* packed = reinterpret_cast<const uint32_t*>(
      MlxFileCodes(m, r, k0 * m.mlx_bits / 8, k1 * m.mlx_bits / 8, &codes));
  DequantizeMlxRow(packed, s, s + groups, m.mlx_bits, m.mlx_group, dst, k1 - k0);
}

}  // namespace lumen::kernels
