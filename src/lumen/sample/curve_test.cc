// Control-point curve: PCHIP against hand-computed values, extrapolation,
// validation messages, the identity gate (bit-exact with T = 1) and the
// monotonicity property.
#include "lumen/sample/curve.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "lumen/sample/sampler.h"
#include "lumen/sample/test_util.h"

namespace lumen::sample {
namespace {

using testing::Dist;
using testing::kNegInf;

// Points given by their log-space coordinates (X, Y), converted to percent.
CurveConfig FromLog(std::initializer_list<std::pair<double, double>> xy) {
  CurveConfig c;
  c.enabled = true;
  for (auto [x, y] : xy) c.points.push_back({100 * std::exp(x), 100 * std::exp(y)});
  return c;
}

TEST(Pchip, HandComputedTangentsAndValues) {
  // X = -3, -2, 0; Y = -4, -2, 0: h = 1, 2; secants d = 2, 1.
  // Interior (Fritsch-Carlson weighted harmonic mean): w1 = 5, w2 = 4,
  //   m1 = 9 / (5/2 + 4/1) = 18/13.
  // Ends (three-point): m0 = ((2+2)*2 - 1*1)/3 = 7/3, m2 = ((4+1)*1 - 2*2)/3 = 1/3.
  const Pchip p(FromLog({{-3, -4}, {-2, -2}, {0, 0}}));
  ASSERT_EQ(p.tangents().size(), 3u);
  EXPECT_NEAR(p.tangents()[0], 7.0 / 3, 1e-12);
  EXPECT_NEAR(p.tangents()[1], 18.0 / 13, 1e-12);
  EXPECT_NEAR(p.tangents()[2], 1.0 / 3, 1e-12);
  // Hermite at t = 1/2: h00 = h01 = 1/2, h10 = 1/8, h11 = -1/8.
  EXPECT_NEAR(p.Eval(-2.5), -2 - 1 + 7.0 / 24 - 18.0 / 13 / 8, 1e-12);
  EXPECT_NEAR(p.Eval(-1.0), -1 + 2 * (18.0 / 13) / 8 - 2 * (1.0 / 3) / 8, 1e-12);
  // Through the knots.
  EXPECT_NEAR(p.Eval(-3), -4, 1e-12);
  EXPECT_NEAR(p.Eval(-2), -2, 1e-12);
  EXPECT_NEAR(p.Eval(0), 0, 1e-12);
  // Below the bottom: slope max(M0, 1) = 7/3.
  EXPECT_NEAR(p.Eval(-5), -4 - 2 * 7.0 / 3, 1e-12);
  EXPECT_NEAR(p.Slope(-5), 7.0 / 3, 1e-12);
  EXPECT_NEAR(p.Slope(-2.5), 1.0 + 0.0 + (p.Eval(-2.5 + 1e-6) - p.Eval(-2.5 - 1e-6)) / 2e-6 - 1.0,
              1e-6);
}

TEST(Pchip, ExtrapolationAboveTopAndShallowBottom) {
  // Two points: a straight line of slope ln 8 / ln 5 in log space.
  CurveConfig c{true, {{10, 5}, {50, 40}}, false};
  const Pchip p(c);
  const double slope = std::log(8.0) / std::log(5.0);
  EXPECT_NEAR(p.Eval(std::log(0.8)), std::log(0.4) + slope * std::log(0.8 / 0.5), 1e-12);
  EXPECT_NEAR(p.Eval(std::log(0.01)), std::log(0.05) + slope * std::log(0.1), 1e-12);
  // Bottom tangent below 1 (ln 5 / ln 10): the tail continues with slope 1.
  CurveConfig d{true, {{10, 20}, {100, 100}}, false};
  const Pchip q(d);
  EXPECT_NEAR(q.Slope(std::log(0.01)), 1.0, 1e-15);
  EXPECT_NEAR(q.Eval(std::log(0.01)), std::log(0.2) + std::log(0.1), 1e-12);
}

TEST(Pchip, MonotoneDataGivesMonotoneCurve) {
  std::mt19937_64 gen(1);
  std::uniform_real_distribution<double> u(0.01, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    CurveConfig c;
    c.enabled = true;
    double x = 0.001, y = 0.001;
    for (int k = 0; k < 2 + trial % 6; ++k) {
      x += u(gen) * 15;
      y += (k % 3 == 1 ? 0.0 : u(gen) * 15);  // flat pieces too
      c.points.push_back({std::min(x, 100.0), std::min(y, 100.0)});
    }
    if (!ValidateCurve(c).ok()) continue;
    const Pchip p(c);
    double prev = -INFINITY;
    for (double l = -40; l <= 0; l += 0.003) {
      const double v = p.Eval(l);
      ASSERT_GE(v, prev - 1e-12) << trial << " l=" << l;
      prev = v;
    }
  }
}

TEST(CurveValidation, RejectsWithPointAndReason) {
  auto msg = [](CurveConfig c) { return ValidateCurve(c).message(); };
  EXPECT_EQ(msg({true, {{50, 50}}, false}), "curve.points: need at least 2 points, got 1");
  EXPECT_EQ(msg({true, {{50, 50}, {NAN, 60}}, false}),
            "curve.points[1]: x must be finite, got nan");
  EXPECT_EQ(msg({true, {{0, 50}, {60, 60}}, false}),
            "curve.points[0]: x must be a percentage in (0, 100], got 0");
  EXPECT_EQ(msg({true, {{50, 50}, {60, 101}}, false}),
            "curve.points[1]: y must be a percentage in (0, 100], got 101");
  EXPECT_EQ(msg({true, {{50, 50}, {50, 60}}, false}),
            "curve.points[1]: x must be strictly increasing, got 50 after 50");
  EXPECT_EQ(msg({true, {{10, 50}, {50, 40}}, false}),
            "curve.points[1]: y must not decrease, got 40 after 50 (set allow_nonmonotone to "
            "allow)");
  EXPECT_TRUE(ValidateCurve({true, {{10, 50}, {50, 40}}, true}).ok());
  EXPECT_TRUE(ValidateCurve({true, {{10, 10}, {100, 100}}, false}).ok());
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gate: identity curves reproduce plain T = 1 exactly (same floats, same
// tokens and logprobs for the same seed) over 500 random distributions.
TEST(CurveGate, IdentityEqualsTemperatureOneBitExact) {
  const std::vector<CurveConfig> identities = {
      {true, {{1, 1}, {100, 100}}, false},
      {true, {{0.01, 0.01}, {1, 1}, {10, 10}, {50, 50}, {100, 100}}, false},
      {true, {{0.3, 0.3}, {7.5, 7.5}, {33.3, 33.3}}, false},  // top below 100: extrapolates
  };
  std::mt19937_64 gen(17);
  std::uniform_int_distribution<size_t> vocab(2, 400);
  for (int trial = 0; trial < 500; ++trial) {
    const auto x = testing::RandomLogits(gen, vocab(gen));
    SamplerConfig plain;
    plain.seed = gen();
    plain.top_logprobs = 3;
    SamplerConfig curve = plain;
    curve.curve = identities[trial % identities.size()];
    ASSERT_TRUE(BitEqual(Dist(plain, x), Dist(curve, x))) << trial;
    Sampler a(plain), b(curve);
    for (int i = 0; i < 4; ++i) {
      auto y = x, z = x;
      TokenLogprobs la, lb;
      ASSERT_EQ(a.Sample(y, {}, &la), b.Sample(z, {}, &lb)) << trial;
      ASSERT_EQ(la.chosen.logprob, lb.chosen.logprob);
      ASSERT_EQ(la.top.size(), lb.top.size());
      for (size_t k = 0; k < la.top.size(); ++k) {
        ASSERT_EQ(la.top[k].token, lb.top[k].token);
        ASSERT_EQ(la.top[k].logprob, lb.top[k].logprob);
      }
    }
  }
}

TEST(Curve, AppliesPoutProportionalToExpCurve) {
  // A two-point curve through (10%, 5%) and (50%, 40%): p_out ∝ exp(C(log p)).
  CurveConfig cc{true, {{10, 5}, {50, 40}}, false};
  const Pchip p(cc);
  const std::vector<double> probs = {0.6, 0.25, 0.1, 0.05};
  SamplerConfig c;
  c.curve = cc;
  const auto got = Dist(c, testing::LogitsFor(probs));
  std::vector<double> g;
  for (double q : probs) g.push_back(p.Eval(std::log(q)));
  const auto want = testing::SoftmaxRef(g);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
}

TEST(CurveProperty, RankingAndArgmaxPreserved) {
  std::mt19937_64 gen(23);
  std::uniform_int_distribution<size_t> vocab(2, 300);
  const std::vector<CurveConfig> curves = {
      {true, {{0.1, 0.5}, {5, 8}, {30, 35}, {100, 100}}, false},
      {true, {{1, 0.01}, {20, 10}, {60, 70}}, false},
      {true, {{0.001, 2}, {0.5, 3}, {2, 3}, {80, 99}}, false},  // flat piece
  };
  for (int trial = 0; trial < 300; ++trial) {
    const auto x = testing::RandomLogits(gen, vocab(gen));
    SamplerConfig c;
    c.curve = curves[trial % curves.size()];
    const auto p = Dist(c, x);
    size_t arg_x = 0, arg_p = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_FALSE(std::isnan(p[i]));
      if (x[i] == kNegInf) {
        ASSERT_EQ(p[i], 0.0f);
      }
      if (x[i] > x[arg_x]) arg_x = i;
      if (p[i] > p[arg_p]) arg_p = i;
    }
    // A flat piece of the curve makes ties, so the argmax token must reach the
    // top probability (and, for strictly increasing curves, be the first to).
    ASSERT_EQ(p[arg_x], p[arg_p]) << trial;
    if (trial % curves.size() != 2) {
      ASSERT_EQ(arg_x, arg_p) << trial;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      for (size_t j = 0; j < x.size(); ++j) {
        if (x[i] > x[j]) {
          ASSERT_GE(p[i], p[j]) << trial;
        }
        if (x[i] == x[j]) {
          ASSERT_EQ(p[i], p[j]) << trial;
        }
      }
    }
  }
}

TEST(Curve, NonmonotoneAllowedStaysFinite) {
  SamplerConfig c;
  c.curve = {true, {{1, 30}, {20, 5}, {100, 100}}, true};
  std::mt19937_64 gen(2);
  const auto x = testing::RandomLogits(gen, 200);
  const auto p = Dist(c, x);
  double sum = 0;
  for (float v : p) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

}  // namespace
}  // namespace lumen::sample
