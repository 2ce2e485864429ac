// GatedActivation: the same bits as GatedRef on every compiled target (the
// vecmath contract), and GatedRef within a few ulp of the textbook SiLU and
// GELU-tanh (std::exp / std::tanh) over the range activations take.
#include "lumen/kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <hwy/targets.h>

namespace lumen::kernels {
namespace {

std::vector<float> Inputs(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  // Edges: exact zero, tiny, where exp over/underflows, large magnitudes.
  const float edges[] = {0.0f,    -0.0f,  1e-30f, -1e-30f, 1e-6f, -88.5f, 88.5f,
                         -100.0f, 100.0f, -1e4f,  1e4f,    3.0f,  -3.0f};
  for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]) && i < n; ++i) x[i * 7 % n] = edges[i];
  return x;
}

TEST(GatedActivation, EveryTargetGivesTheReferenceBits) {
  std::mt19937 rng(1);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    for (size_t n : {1u, 15u, 16u, 37u, 1000u}) {  // tails of every target width
      const std::vector<float> g = Inputs(n, rng), u = Inputs(n, rng);
      std::vector<float> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = GatedRef(act, g[i], u[i]);
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        hwy::SetSupportedTargetsForTest(target);
        std::vector<float> got = g;
        GatedActivation(act, got.data(), u.data(), static_cast<int64_t>(n));
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float)))
            << hwy::TargetName(target) << " n=" << n << " act=" << int(act);
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
}

TEST(GatedActivation, ReferenceTracksTheTextbookFormulas) {
  // Against the formulas in double: |ref - exact| <= (8 + 2 |z|) ulp of the
  // result + 1e-30. exp(-z) turns a relative error e in z into |z| e, so z's
  // own roundings (GELU: three) are amplified where the result is tiny; 8 ulp
  // cover ExpRef, the add, the divide and the final multiply. Below 1e-30 the
  // exp's clamp at +-88 shows (results there are 0 or denormal-sized).
  std::mt19937 rng(2);
  const std::vector<float> x = Inputs(20000, rng);
  constexpr double kC = 0.7978845608028654;  // sqrt(2/pi)
  for (float v : x) {
    const double xd = v, zg = 2 * kC * (xd + 0.044715 * xd * xd * xd);
    const double silu = xd / (1 + std::exp(-xd));
    const double gelu = xd / (1 + std::exp(-zg));  // = 0.5 x (1 + tanh(zg / 2)), no cancellation
    const double rs = GatedRef(Activation::kSilu, v, 1.0f);
    const double rg = GatedRef(Activation::kGeluTanh, v, 1.0f);
    EXPECT_LE(std::fabs(rs - silu),
              (8 + 2 * std::fabs(xd)) * std::ldexp(std::fabs(silu), -23) + 1e-30)
        << v;
    EXPECT_LE(std::fabs(rg - gelu),
              (8 + 2 * std::fabs(zg)) * std::ldexp(std::fabs(gelu), -23) + 1e-30)
        << v;
    // The float textbook functions agree too, up to their own cancellation in
    // 1 + tanh (about |x| ulp(1) / 2).
    if (std::fabs(gelu) > 1e-3) {
      EXPECT_NEAR(GeluTanh(v), rg, 1e-6 * std::fabs(gelu) + std::ldexp(std::fabs(xd), -23)) << v;
    }
    if (std::fabs(silu) > 1e-3) {
      EXPECT_NEAR(Silu(v), rs, 1e-6 * std::fabs(silu)) << v;
    }
  }
  // Known values: act(0) = 0, act(large) = x, act(very negative) -> 0.
  EXPECT_EQ(GatedRef(Activation::kSilu, 0.0f, 5.0f), 0.0f);
  EXPECT_EQ(GatedRef(Activation::kSilu, 100.0f, 1.0f), 100.0f);
  EXPECT_EQ(GatedRef(Activation::kGeluTanh, 100.0f, 1.0f), 100.0f);
  EXPECT_LE(std::fabs(GatedRef(Activation::kGeluTanh, -100.0f, 1.0f)), 1e-30f);  // exp clamps at 88
}

}  // namespace
}  // namespace lumen::kernels
