// ApplyLoraRows (the gathered per-row LoRA update of the batched forward)
// against a double-precision reference, and its L1 properties: a row's
// result does not depend on the other rows listed or on the thread split,
// and weight 1 is exactly ApplyLora.
#include "lumen/model/lora.h"

#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

namespace lumen::model {
namespace {

struct Case {
  int64_t T, K, N;
  int r;
  std::vector<float> a, b, x, y0;
  LoraMatrix m() const { return {a.data(), b.data(), r, 0.75f, N, K}; }
};

Case Make(int64_t T, int64_t K, int64_t N, int r, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Case c{T, K, N, r, {}, {}, {}, {}};
  for (auto* v : {&c.a, &c.b, &c.x, &c.y0}) {
    const int64_t n = v == &c.a ? r * K : v == &c.b ? N * r : v == &c.x ? T * K : T * N;
    v->resize(size_t(n));
    for (float& f : *v) f = u(rng);
  }
  return c;
}

// y0 + s w B (A x) per listed row, in double.
std::vector<double> Reference(const Case& c, const std::vector<int64_t>& rows,
                              const std::vector<float>& w) {
  std::vector<double> y(c.y0.begin(), c.y0.end());
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* x = c.x.data() + rows[i] * c.K;
    std::vector<double> u(c.r);
    for (int j = 0; j < c.r; ++j)
      for (int64_t k = 0; k < c.K; ++k) u[j] += double(c.a[j * c.K + k]) * x[k];
    for (int64_t n = 0; n < c.N; ++n) {
      double acc = 0;
      for (int j = 0; j < c.r; ++j) acc += double(c.b[n * c.r + j]) * u[j];
      y[rows[i] * c.N + n] += 0.75 * double(w[i]) * acc;
    }
  }
  return y;
}

std::vector<float> Apply(const Case& c, const std::vector<int64_t>& rows,
                         const std::vector<float>& w, ThreadPool* pool) {
  std::vector<float> y = c.y0, u(rows.size() * c.r);
  ApplyLoraRows(c.m(), rows, w, c.x.data(), c.K, y.data(), c.N, u.data(), pool);
  return y;
}

TEST(ApplyLoraRows, MatchesReferenceAndIsBatchIndependent) {
  ThreadPool pool(4);
  // Small (inline) and large enough for the pool's split.
  for (const auto& [K, N, r] : {std::tuple<int64_t, int64_t, int>{40, 72, 3},
                                std::tuple<int64_t, int64_t, int>{2048, 2048, 16}}) {
    const Case c = Make(5, K, N, r, uint64_t(K + r));
    const std::vector<int64_t> rows = {0, 2, 3};
    const std::vector<float> w = {1.0f, 0.5f, -2.0f};
    const auto got = Apply(c, rows, w, &pool);
    const auto want = Reference(c, rows, w);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
    // r + K products summed in f32: |error| <= ~(K + r) eps |terms|.
    EXPECT_LT(worst, double(K + r) * 1.2e-7 * 4) << "K " << K;
    for (int64_t n = 0; n < N; ++n) {  // unlisted rows untouched
      EXPECT_EQ(got[1 * N + n], c.y0[1 * N + n]);
      EXPECT_EQ(got[4 * N + n], c.y0[4 * N + n]);
    }
    EXPECT_EQ(got, Apply(c, rows, w, nullptr)) << "thread split changed a result, K " << K;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto alone = Apply(c, {rows[i]}, {w[i]}, &pool);
      EXPECT_EQ(
          0, std::memcmp(alone.data() + rows[i] * N, got.data() + rows[i] * N, N * sizeof(float)))
          << "row " << rows[i] << " differs from alone, K " << K;
    }
    // Weight 1 is the model-wide ApplyLora on that row, bit for bit.
    std::vector<float> y = c.y0;
    ApplyLora(c.m(), c.x.data(), c.T, c.K, y.data(), c.N, &pool);
    EXPECT_EQ(0, std::memcmp(y.data(), got.data(), N * sizeof(float)));
  }
}

}  // namespace
}  // namespace lumen::model
