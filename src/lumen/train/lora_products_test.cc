// The f32 LoRA products (lora_products.h) against double sums: each output
// within (reduction + 3) 2^-24 of the sum of its terms' magnitudes (the
// MatMul bound plus the rounding where s is folded into an operand), for row
// counts that take the small-M path (3), one 16-row block (16) and blocks
// with a remainder (37, 300: spans MatMulT's 128-row panels); and bit-for-bit
// the same on 1, 2 and 3 threads (fixed row blocks).
#include "lumen/train/lora_products.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace lumen::train {
namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> ud(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = ud(rng);
  return v;
}

// got within (terms + 3) u abs of want.
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<double>& abs, int64_t terms, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= (terms + 3) * kU * abs[i] + 1e-30) && bad++ < 3)
      ADD_FAILURE() << what << " i=" << i << " got " << got[i] << " want " << want[i];
}

struct Outputs {
  std::vector<float> u, du, dB, dA, dx;
};

Outputs RunAll(const std::vector<float>& A, const std::vector<float>& B,
               const std::vector<float>& x, const std::vector<float>& dy,
               const std::vector<float>& mask, int64_t M, int64_t N, int64_t K, int64_t r, float s,
               ThreadPool* pool) {
  Outputs o;
  o.u.resize(M * r);
  o.du.resize(M * r);
  o.dB.assign(N * r, 0.5f);  // accumulates
  o.dA.assign(r * K, -0.25f);
  o.dx.assign(M * K, 1.0f);
  LoraDown(A.data(), r, K, x.data(), M, o.u.data(), pool);
  LoraDyB(B.data(), N, r, s, dy.data(), M, o.du.data(), pool);
  LoraGradB(dy.data(), o.u.data(), M, N, r, s, o.dB.data(), pool);
  LoraGradA(o.du.data(), x.data(), M, K, r, o.dA.data(), pool);
  LoraDxAdd(o.du.data(), A.data(), M, K, r, mask.data(), o.dx.data(), pool);
  return o;
}

TEST(LoraProducts, WithinBoundOfDoubleAndThreadIndependent) {
  std::mt19937 rng(3);
  const int64_t N = 72, K = 100, r = 8;  // K, N: no multiple of a vector pair
  const float s = 1.5f;
  for (int64_t M : {3, 16, 37, 300}) {
    const auto A = Random(r * K, rng), B = Random(N * r, rng), x = Random(M * K, rng),
               dy = Random(M * N, rng);
    std::vector<float> mask(M * K);
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = (rng() % 5 == 0) ? 0.0f : 1.25f;
    const Outputs o = RunAll(A, B, x, dy, mask, M, N, K, r, s, nullptr);
    // Each product against double sums of the f32 inputs it was given.
    std::vector<double> u(M * r), ua(M * r), du(M * r), dua(M * r);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < r; ++j) {
        for (int64_t k = 0; k < K; ++k) {
          u[m * r + j] += double(A[j * K + k]) * x[m * K + k];
          ua[m * r + j] += std::fabs(double(A[j * K + k]) * x[m * K + k]);
        }
        for (int64_t n = 0; n < N; ++n) {
          du[m * r + j] += double(s) * dy[m * N + n] * B[n * r + j];
          dua[m * r + j] += std::fabs(double(s) * dy[m * N + n] * B[n * r + j]);
        }
      }
    ExpectNear(o.u, u, ua, K, "u");
    ExpectNear(o.du, du, dua, N, "du");
    std::vector<double> dB(N * r, 0.5), dBa(N * r, 0.5), dA(r * K, -0.25), dAa(r * K, 0.25);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < r; ++j) {
        for (int64_t n = 0; n < N; ++n) {
          const double t = double(s) * dy[m * N + n] * o.u[m * r + j];
          dB[n * r + j] += t;
          dBa[n * r + j] += std::fabs(t);
        }
        for (int64_t k = 0; k < K; ++k) {
          const double t = double(o.du[m * r + j]) * x[m * K + k];
          dA[j * K + k] += t;
          dAa[j * K + k] += std::fabs(t);
        }
      }
    ExpectNear(o.dB, dB, dBa, M, "dB");
    ExpectNear(o.dA, dA, dAa, M, "dA");
    std::vector<double> dx(M * K), dxa(M * K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double t = 0, a = 0;
        for (int64_t j = 0; j < r; ++j) {
          t += double(o.du[m * r + j]) * A[j * K + k];
          a += std::fabs(double(o.du[m * r + j]) * A[j * K + k]);
        }
        dx[m * K + k] = 1.0 + mask[m * K + k] * t;
        dxa[m * K + k] = 1.0 + mask[m * K + k] * a;
      }
    ExpectNear(o.dx, dx, dxa, r, "dx");
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      const Outputs p = RunAll(A, B, x, dy, mask, M, N, K, r, s, &pool);
      EXPECT_EQ(p.u, o.u) << "M=" << M << " threads=" << threads;
      EXPECT_EQ(p.du, o.du) << "M=" << M << " threads=" << threads;
      EXPECT_EQ(p.dB, o.dB) << "M=" << M << " threads=" << threads;
      EXPECT_EQ(p.dA, o.dA) << "M=" << M << " threads=" << threads;
      EXPECT_EQ(p.dx, o.dx) << "M=" << M << " threads=" << threads;
    }
  }
}

}  // namespace
}  // namespace lumen::train
