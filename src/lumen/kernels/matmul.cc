#include "lumen/kernels/matmul.h"

#include <vector>


#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/matmul.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "lumen/kernels/dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {

// Rows [n0, n1) of W against all M rows of X. f32 weights are read in place;
// other dtypes are dequantized one row at a time into `scratch` (K floats).
void MatMulRows(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y,
                int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t K = W.k;
  std::vector<float> scratch(W.is_f32() ? 0 : K);
  for (int64_t n = n0; n < n1; ++n) {
    const float* w;
    if (W.is_f32()) {
      w = W.w.row<const float>(n);
    } else {
      DequantizeMatrixRow(W, n, scratch.data());
      w = scratch.data();
    }
    for (int64_t m = 0; m < M; ++m) Y[m * ldy + n] = DotF32(w, X + m * ldx, K);
  }
}

// dX[M, K] for columns of dY in [n0, n1), accumulated into dX (caller zeroes).
void MatMulTRows(const Matrix& W, const float* dY, int64_t M, float* dX, int64_t k0,
                 int64_t k1) {
  const int64_t N = W.n, K = W.k;
  std::vector<float> scratch(K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, scratch.data());
    for (int64_t m = 0; m < M; ++m)
      AxpyF32(dY[m * N + n], scratch.data() + k0, dX + m * K + k0, k1 - k0);
  }
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

HWY_EXPORT(MatMulRows);
HWY_EXPORT(MatMulTRows);

void MatMul(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
            ThreadPool* pool) {
  const int64_t N = W.n;
  auto fn = [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatMulRows)(W, X, M, ldx, Y, ldy, b, e);
  };
  if (pool) {
    pool->ParallelFor(N, fn, 16);
  } else {
    fn(0, N, 0);
  }
}

void MatMulT(const Matrix& W, const float* dY, int64_t M, float* dX, ThreadPool* pool) {
  const int64_t K = W.k;
  for (int64_t i = 0; i < M * K; ++i) dX[i] = 0.0f;
  // Split K across threads: each thread dequantizes every row but writes only
  // its own column range, so no reduction between threads is needed.
  auto fn = [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatMulTRows)(W, dY, M, dX, b, e);
  };
  if (pool) {
    pool->ParallelFor(K, fn, 64);
  } else {
    fn(0, K, 0);
  }
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
