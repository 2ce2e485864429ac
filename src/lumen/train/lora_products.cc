#include "lumen/train/lora_products.h"

#include <algorithm>
#include <vector>

#include "lumen/kernels/matmul.h"
#include "lumen/train/frozen.h"

namespace lumen::train {
namespace {

// t [cols, rows] = p [rows, cols]^T, times s.
std::vector<float> Transposed(const float* p, int64_t rows, int64_t cols, float s = 1.0f) {
  std::vector<float> t(size_t(rows) * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = s * p[i * cols + j];
  return t;
}

// y [M, n] = x [M, k] P^T for a small dense P [n, k] (n = the rank): the
// kernel splits its work over P's n rows, too few to share, so the row
// blocks of x are shared instead.
void SmallProduct(const float* P, int64_t n, int64_t k, const float* x, int64_t M, float* y,
                  ThreadPool* pool) {
  const kernels::Matrix W = DenseMatrix(P, n, k);
  const int64_t blocks = std::max<int64_t>(1, M / kLoraRowBlock);
  auto fn = [&](int64_t b, int64_t e, int) {
    const int64_t m0 = b * kLoraRowBlock, m1 = e == blocks ? M : e * kLoraRowBlock;
    kernels::MatMul(W, x + m0 * k, m1 - m0, k, y + m0 * n, n, nullptr);
  };
  if (pool && blocks > 1) {
    pool->ParallelFor(blocks, fn);
  } else {
    fn(0, blocks, 0);
  }
}

}  // namespace

void LoraDown(const float* A, int64_t r, int64_t K, const float* x, int64_t M, float* u,
              ThreadPool* pool) {
  SmallProduct(A, r, K, x, M, u, pool);
}

void LoraDyB(const float* B, int64_t N, int64_t r, float s, const float* dy, int64_t M, float* du,
             ThreadPool* pool) {
  const std::vector<float> sbt = Transposed(B, N, r, s);  // [r, N]
  SmallProduct(sbt.data(), r, N, dy, M, du, pool);
}

void LoraGradB(const float* dy, const float* u, int64_t M, int64_t N, int64_t r, float s, float* dB,
               ThreadPool* pool) {
  // dB^T [r, N] = u^T [r, M] dy [M, N]: the transposed product through dy's rows.
  const std::vector<float> ut = Transposed(u, M, r);
  std::vector<float> t(size_t(r) * N);
  kernels::MatMulT(DenseMatrix(dy, M, N), ut.data(), r, t.data(), pool);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < r; ++j) dB[n * r + j] += s * t[j * N + n];
}

void LoraGradA(const float* du, const float* x, int64_t M, int64_t K, int64_t r, float* dA,
               ThreadPool* pool) {
  // dA [r, K] += du^T [r, M] x [M, K]: x's rows are read whole, in order.
  const std::vector<float> dut = Transposed(du, M, r);
  std::vector<float> t(size_t(r) * K);
  kernels::MatMulT(DenseMatrix(x, M, K), dut.data(), r, t.data(), pool);
  for (int64_t i = 0; i < r * K; ++i) dA[i] += t[i];
}

void LoraDxAdd(const float* du, const float* A, int64_t M, int64_t K, int64_t r, const float* mask,
               float* dx, ThreadPool* pool) {
  std::vector<float> t(size_t(M) * K);
  kernels::MatMulT(DenseMatrix(A, r, K), du, M, t.data(), pool);
  for (int64_t i = 0; i < M * K; ++i) dx[i] += mask ? mask[i] * t[i] : t[i];
}

}  // namespace lumen::train
