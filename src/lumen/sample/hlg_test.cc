// HLG: the bit-exact degeneracy gates, the monotonicity properties, hand
// values, and the pivots.
#include "lumen/sample/hlg.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "lumen/sample/sampler.h"
#include "lumen/sample/test_util.h"

namespace lumen::sample {
namespace {

using testing::Dist;
using testing::kNegInf;
using testing::RandomLogits;

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Draws `n` tokens with logprobs from a fresh sampler.
std::vector<std::pair<int32_t, float>> Draws(const SamplerConfig& c, const std::vector<float>& x,
                                             int n) {
  Sampler s(c);
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) {
    auto y = x;
    TokenLogprobs lp;
    const int32_t t = s.Sample(y, {}, &lp);
    out.emplace_back(t, lp.chosen.logprob);
  }
  return out;
}

SamplerConfig Plain(double t, uint64_t seed) {
  SamplerConfig c;
  c.temperature = t;
  c.seed = seed;
  return c;
}

// Gate (DESIGN.md section 4, L1): HLG with the roll-off off and m = 1/T is plain
// temperature T — identical float probabilities and identical tokens and
// logprobs for the same seed — over 500 random distributions per T, each pivot.
TEST(HlgGate, RolloffOffEqualsPlainTemperatureBitExact) {
  std::mt19937_64 gen(42);
  std::uniform_int_distribution<size_t> vocab(2, 400);
  for (double t : {1.0, 0.3, 0.7, 1.5, 2.0}) {
    for (int trial = 0; trial < 500; ++trial) {
      const auto x = RandomLogits(gen, vocab(gen));
      const uint64_t seed = gen();
      const SamplerConfig plain = Plain(t, seed);
      SamplerConfig hlg = plain;
      hlg.hlg.enabled = true;
      hlg.hlg.rolloff = false;
      hlg.hlg.pivot = static_cast<HlgPivot>(trial % 3);
      ASSERT_TRUE(BitEqual(Dist(plain, x), Dist(hlg, x))) << "T=" << t << " trial " << trial;
      ASSERT_EQ(Draws(plain, x, 4), Draws(hlg, x, 4)) << "T=" << t << " trial " << trial;
    }
  }
}

// With the roll-off on but a width no token reaches, every token is in the
// mids and HlgOffset is exactly 0: still bit-identical.
TEST(HlgGate, WideMidsEqualPlainTemperatureBitExact) {
  std::mt19937_64 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const auto x = RandomLogits(gen, 300);
    SamplerConfig plain = Plain(0.8, trial);
    SamplerConfig hlg = plain;
    hlg.hlg.enabled = true;
    hlg.hlg.width = 1e6;
    ASSERT_TRUE(BitEqual(Dist(plain, x), Dist(hlg, x))) << trial;
    ASSERT_EQ(Draws(plain, x, 3), Draws(hlg, x, 3)) << trial;
  }
}

TEST(HlgTone, IsMonotoneAndContinuous) {
  HlgConfig h;
  for (double m : {0.25, 1.0, 3.0}) {
    double prev = -INFINITY;
    for (double z = -200; z <= 50; z += 0.001) {
      const double g = HlgTone(z, m, h);
      ASSERT_GT(g, prev) << "z=" << z;
      prev = g;
      // The offset form the sampler uses agrees with the definition.
      ASSERT_NEAR(m * z + HlgOffset(z, m, h), g, 1e-12 * (1 + std::fabs(g))) << z;
    }
    for (double knee : {-h.width, h.width}) {
      EXPECT_NEAR(HlgTone(knee - 1e-9, m, h), HlgTone(knee + 1e-9, m, h), 1e-8);
      // Slope m on both sides of each knee (C1).
      const double eps = 1e-6;
      const double left = (HlgTone(knee, m, h) - HlgTone(knee - eps, m, h)) / eps;
      const double right = (HlgTone(knee + eps, m, h) - HlgTone(knee, m, h)) / eps;
      EXPECT_NEAR(left, m, 1e-4);
      EXPECT_NEAR(right, m, 1e-4);
    }
  }
}

TEST(HlgTone, HandValues) {
  HlgConfig h;  // w 4, shoulder 4, toe 6
  EXPECT_DOUBLE_EQ(HlgTone(2.0, 1.0, h), 2.0);
  EXPECT_NEAR(HlgTone(6.0, 1.0, h), 4 + 4 * std::log(1.5), 1e-15);
  EXPECT_NEAR(HlgTone(-14.0, 2.0, h), -8 - 12 * std::log(1 + 10.0 / 6), 1e-14);
  EXPECT_EQ(HlgOffset(3.9, 2.0, h), 0.0);
  h.rolloff = false;
  EXPECT_EQ(HlgTone(-14.0, 2.0, h), -28.0);
  EXPECT_EQ(HlgOffset(-14.0, 2.0, h), 0.0);
}

TEST(Hlg, TopPivotHandExample) {
  // logits [0, -8, -20], top pivot (offset 6): z = 6, -2, -14 -> shoulder, mids,
  // toe. Expected values from an independent Python evaluation of the formula.
  SamplerConfig c;
  c.hlg.enabled = true;
  auto p = Dist(c, {0, -8, -20});
  EXPECT_NEAR(p[0], 0.9995104254659112, 1e-7);
  EXPECT_NEAR(p[1], 0.0004893903491801177, 1e-9);
  EXPECT_NEAR(p[2], 1.8418490878202917e-07, 1e-12);
  c.temperature = 0.5;  // m = 2
  p = Dist(c, {0, -8, -20});
  EXPECT_NEAR(p[1], 2.397375377784473e-07, 1e-12);
  EXPECT_NEAR(p[2], 3.39573136231612e-14, 1e-19);
}

// Expected HLG distribution for a known pivot (in normalized log-probs).
std::vector<double> HlgRef(const std::vector<double>& probs, double mu, double m,
                           const HlgConfig& h) {
  std::vector<double> g;
  for (double p : probs) g.push_back(p > 0 ? HlgTone(std::log(p) - mu, m, h) : -INFINITY);
  return testing::SoftmaxRef(g);
}

TEST(Hlg, EntropyAndMedianPivots) {
  const std::vector<double> probs = {0.3, 0.25, 0.2, 0.15, 0.1};
  const auto x = testing::LogitsFor(probs);
  HlgConfig h;
  h.width = 0.3;  // narrow, so the pivot choice shows in the result
  h.shoulder = 0.5;
  h.toe = 0.5;
  SamplerConfig c;
  c.hlg = h;
  c.hlg.enabled = true;
  double mu_entropy = 0;
  for (double p : probs) mu_entropy += p * std::log(p);
  c.hlg.pivot = HlgPivot::kEntropy;
  auto got = Dist(c, x);
  auto want = HlgRef(probs, mu_entropy, 1.0, h);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  // Cumulative mass 0.3, 0.55: the boundary token is the second.
  c.hlg.pivot = HlgPivot::kMedian;
  got = Dist(c, x);
  want = HlgRef(probs, std::log(0.25), 1.0, h);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  // And they differ from each other and from the top pivot.
  c.hlg.pivot = HlgPivot::kTop;
  auto top = Dist(c, x);
  EXPECT_GT(std::fabs(top[0] - got[0]), 1e-3);
}

TEST(Hlg, MedianPivotOnLargeVocabMatchesBruteForce) {
  std::mt19937_64 gen(5);
  for (int trial = 0; trial < 4; ++trial) {
    auto x = RandomLogits(gen, 50000, true, true);
    std::vector<double> xd(x.begin(), x.end());
    const auto p = testing::SoftmaxRef(xd);
    std::vector<size_t> order;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] > 0) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double cum = 0, mu = 0;
    for (size_t i : order) {
      cum += p[i];
      if (cum >= 0.5) {
        mu = std::log(p[i]);
        break;
      }
    }
    SamplerConfig c;
    c.hlg.enabled = true;
    c.hlg.pivot = HlgPivot::kMedian;
    const auto got = Dist(c, x);
    const auto want = HlgRef(p, mu, 1.0, c.hlg);
    double worst = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(want[i], 1e-30));
    }
    EXPECT_LT(worst, 1e-4) << trial;
  }
}

// Property: g is monotone, so the ranking (with ties kept as ties) and the
// argmax never change; -inf stays at probability 0; no NaN.
TEST(HlgProperty, RankingAndArgmaxPreserved) {
  std::mt19937_64 gen(99);
  std::uniform_int_distribution<size_t> vocab(2, 300);
  std::uniform_real_distribution<double> knob(0.2, 8.0);
  for (int trial = 0; trial < 600; ++trial) {
    const auto x = RandomLogits(gen, vocab(gen));
    SamplerConfig c;
    c.seed = trial;
    c.temperature = knob(gen) / 4;
    c.hlg.enabled = true;
    c.hlg.width = knob(gen);
    c.hlg.shoulder = knob(gen);
    c.hlg.toe = knob(gen);
    c.hlg.pivot_offset = knob(gen);
    c.hlg.pivot = static_cast<HlgPivot>(trial % 3);
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
    ASSERT_EQ(arg_x, arg_p) << trial;
    for (size_t i = 0; i < x.size(); ++i) {
      for (size_t j = 0; j < x.size(); ++j) {
        if (x[i] > x[j]) {
          ASSERT_GE(p[i], p[j]) << trial << " " << i << " " << j;
        }
        if (x[i] == x[j]) {
          ASSERT_EQ(p[i], p[j]) << trial << " " << i << " " << j;
        }
      }
    }
  }
}

TEST(Hlg, IgnoresTruncationAndKeepsGreedy) {
  const std::vector<float> x = {1, 2, 3, 0};
  SamplerConfig c;
  c.hlg.enabled = true;
  const auto base = Dist(c, x);
  c.top_k = 1;
  c.top_p = 0.1;
  c.min_p = 0.9;
  EXPECT_TRUE(BitEqual(base, Dist(c, x)));
  c.temperature = 0;
  EXPECT_EQ(Dist(c, x), (std::vector<float>{0, 0, 1, 0}));
}

TEST(Hlg, ToeLiftsTheTailRelativeToTemperature) {
  const std::vector<float> x = {0, -2, -15, -25};
  SamplerConfig plain;
  SamplerConfig hlg;
  hlg.hlg.enabled = true;
  const auto a = Dist(plain, x), b = Dist(hlg, x);
  EXPECT_GT(b[3] / b[0], a[3] / a[0] * 10);
}

}  // namespace
}  // namespace lumen::sample
