#include "lumen/core/tensor.h"

#include <fmt/format.h>

namespace lumen {

TensorView TensorView::Contiguous(void* data, DType dtype, const int64_t* shape, int ndim) {
  LUMEN_CHECK(ndim >= 0 && ndim <= kMaxDims);
  TensorView v;
  v.dtype = dtype;
  v.ndim = ndim;
  v.data = data;
  for (int i = 0; i < ndim; ++i) v.shape[i] = shape[i];
  if (ndim > 0) {
    const auto rb = RowBytes(dtype, shape[ndim - 1]);
    LUMEN_CHECK(rb.has_value());
    v.stride[ndim - 1] = Info(dtype).block_bytes;  // per block; innermost is contiguous
    int64_t s = static_cast<int64_t>(*rb);
    for (int i = ndim - 2; i >= 0; --i) {
      v.stride[i] = s;
      s *= shape[i];
    }
  }
  return v;
}

TensorView TensorView::Contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return Contiguous(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

size_t TensorView::row_bytes() const {
  if (ndim == 0) return Info(dtype).block_bytes;
  return *RowBytes(dtype, shape[ndim - 1]);
}

size_t TensorView::byte_size() const { return row_bytes() * static_cast<size_t>(rows()); }

bool TensorView::is_contiguous() const {
  int64_t s = static_cast<int64_t>(row_bytes());
  for (int i = ndim - 2; i >= 0; --i) {
    if (stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

TensorView TensorView::Slice0(int64_t begin, int64_t end) const {
  LUMEN_CHECK(ndim > 0 && begin >= 0 && begin <= end && end <= shape[0]);
  TensorView v = *this;
  v.shape[0] = end - begin;
  // 1-D views step by elements (whole blocks only for plain types).
  LUMEN_CHECK(ndim > 1 || !IsQuantized(dtype));
  const int64_t step = ndim == 1 ? Info(dtype).block_bytes : stride[0];
  v.data = static_cast<char*>(data) + begin * step;
  return v;
}

TensorView TensorView::Reshape(std::initializer_list<int64_t> new_shape) const {
  LUMEN_CHECK(is_contiguous());
  TensorView v = Contiguous(data, dtype, new_shape);
  LUMEN_CHECK(v.numel() == numel());
  return v;
}

std::string TensorView::ShapeString() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

}  // namespace lumen
