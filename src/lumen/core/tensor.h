// TensorView: a non-owning, typed, strided view of up to 4 dimensions.
//
// Shapes are row-major, outermost first: a Linear weight is [out, in] (GGUF's
// ne = [in, out] is reversed on load). Strides are in bytes so that views over
// quantized rows (whole blocks) and over mmap'd files work alike; the innermost
// dimension is always contiguous. The memory belongs to a Buffer/MappedFile that
// outlives the view.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "lumen/core/check.h"
#include "lumen/core/dtype.h"

namespace lumen {

inline constexpr int kMaxDims = 4;

struct TensorView {
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};   // elements per dimension
  std::array<int64_t, kMaxDims> stride{};  // bytes between consecutive indices
  void* data = nullptr;

  // A contiguous view. The innermost dimension must be whole blocks.
  static TensorView Contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView Contiguous(void* data, DType dtype, const int64_t* shape, int ndim);

  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const;
  int64_t rows() const {
    if (ndim == 0) return 1;
    return shape[ndim - 1] == 0 ? 0 : numel() / shape[ndim - 1];
  }
  int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
  size_t row_bytes() const;  // bytes of one innermost row
  size_t byte_size() const;  // bytes spanned when contiguous
  bool is_contiguous() const;

  // Pointer to row r of a 2-D view (or of the tensor flattened to rows).
  template <typename T = void>
  T* row(int64_t r) const {
    LUMEN_DCHECK(r >= 0 && r < rows());
    return reinterpret_cast<T*>(static_cast<char*>(data) + r * stride[ndim - 2 < 0 ? 0 : ndim - 2]);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }

  // Sub-view of rows [begin, end) along dimension 0.
  TensorView Slice0(int64_t begin, int64_t end) const;
  // Reinterpret a contiguous view with a new shape of the same numel.
  TensorView Reshape(std::initializer_list<int64_t> shape) const;

  std::string ShapeString() const;  // "[64, 512]"
};

}  // namespace lumen
