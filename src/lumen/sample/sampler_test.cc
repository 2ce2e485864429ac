#include "lumen/sample/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "lumen/sample/rng.h"
#include "lumen/sample/test_util.h"

namespace lumen::sample {
namespace {

using testing::Dist;
using testing::kNegInf;
using testing::LogitsFor;
using testing::SoftmaxRef;

void ExpectProbs(const std::vector<float>& got, const std::vector<double>& want,
                 double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

TEST(Rng, MatchesReferenceXoshiro256StarStar) {
  // Values from an independent Python implementation (splitmix64 seeding of
  // xoshiro256**, seed 42).
  Rng r(42);
  EXPECT_EQ(r.Next(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(r.Next(), 0x6104d9866d113a7eULL);
  EXPECT_EQ(r.Next(), 0xae17533239e499a1ULL);
  Rng a(7), b(7), c(8);
  for (int i = 0; i < 100; ++i) {
    const double u = a.NextDouble();
    EXPECT_EQ(u, b.NextDouble());
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  EXPECT_NE(a.Next(), c.Next());
}

TEST(Sampler, DefaultIsSoftmaxAtTemperatureOne) {
  const std::vector<float> x = {1, 2, 3, 0};
  ExpectProbs(Dist({}, x), SoftmaxRef({1, 2, 3, 0}));
}

TEST(Sampler, TemperatureScalesLogits) {
  SamplerConfig c;
  c.temperature = 0.5;
  ExpectProbs(Dist(c, {1, 2, 3, 0}), SoftmaxRef({2, 4, 6, 0}));
  c.temperature = 2.0;
  ExpectProbs(Dist(c, {1, 2, 3, 0}), SoftmaxRef({0.5, 1, 1.5, 0}));
}

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  SamplerConfig c;
  c.temperature = 0;
  c.top_k = 1;  // ignored under greedy, must not matter
  Sampler s(c);
  std::vector<float> x = {1, 3, 3, 2};
  EXPECT_EQ(s.Sample(x, {}), 1);
  std::vector<float> p;
  s.Distribution(std::vector<float>{1, 3, 3, 2}, {}, p);
  EXPECT_EQ(p, (std::vector<float>{0, 1, 0, 0}));
}

TEST(Sampler, GreedySeesBiasAndPenalties) {
  SamplerConfig c;
  c.temperature = 0;
  c.logit_bias = {{0, 5.0}};
  std::vector<float> x = {1, 3, 3, 2};
  EXPECT_EQ(Sampler(c).Sample(x, {}), 0);
  EXPECT_EQ(x[0], 6.0f);  // the bias edits the logits in place
  SamplerConfig r;
  r.temperature = 0;
  r.repetition_penalty = 2.0;
  std::vector<float> y = {1, 3, 3, 2};
  const std::vector<int32_t> hist = {1, 2};
  EXPECT_EQ(Sampler(r).Sample(y, hist), 3);  // 3/2 = 1.5 < 2
}

TEST(Sampler, GreedyLogprobsAreThePlainSoftmax) {
  SamplerConfig c;
  c.temperature = 0;
  c.top_logprobs = 2;
  std::vector<float> x = {1, 2, 3, 0};
  TokenLogprobs lp;
  EXPECT_EQ(Sampler(c).Sample(x, {}, &lp), 2);
  const auto p = SoftmaxRef({1, 2, 3, 0});
  EXPECT_EQ(lp.chosen.token, 2);
  EXPECT_NEAR(lp.chosen.logprob, std::log(p[2]), 1e-6);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].token, 2);
  EXPECT_EQ(lp.top[1].token, 1);
  EXPECT_NEAR(lp.top[1].logprob, std::log(p[1]), 1e-6);
}

TEST(Sampler, LogitBiasMinusInfBansToken) {
  SamplerConfig c;
  c.logit_bias = {{2, -std::numeric_limits<double>::infinity()}, {99, 5.0}};  // 99: ignored
  ExpectProbs(Dist(c, {1, 2, 3, 0}), SoftmaxRef({1, 2, -INFINITY, 0}));
}

TEST(Sampler, TopKKeepsTheKBestWithLowestIdOnTies) {
  SamplerConfig c;
  c.top_k = 2;
  ExpectProbs(Dist(c, {1, 5, 3, 4, 2}), {0, std::exp(5.0) / (std::exp(5.0) + std::exp(4.0)), 0,
                                         std::exp(4.0) / (std::exp(5.0) + std::exp(4.0)), 0});
  ExpectProbs(Dist(c, {1, 2, 2, 2}), {0, 0.5, 0.5, 0});
  c.top_k = 100;  // k > V: no-op
  ExpectProbs(Dist(c, {1, 5, 3}), SoftmaxRef({1, 5, 3}));
}

TEST(Sampler, TopKSkipsMinusInfAndNaN) {
  SamplerConfig c;
  c.top_k = 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto p = Dist(c, {kNegInf, nan, 1, kNegInf, 0});
  ExpectProbs(p, {0, 0, std::exp(1.0) / (std::exp(1.0) + 1), 0, 1 / (std::exp(1.0) + 1)});
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingMass) {
  const auto x = LogitsFor({0.5, 0.3, 0.15, 0.05});
  SamplerConfig c;
  c.top_p = 0.75;
  ExpectProbs(Dist(c, x), {0.625, 0.375, 0, 0});
  c.top_p = 0.85;
  ExpectProbs(Dist(c, x), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  c.top_p = 0.1;
  ExpectProbs(Dist(c, x), {1, 0, 0, 0});
  c.top_p = 1.0;
  ExpectProbs(Dist(c, x), {0.5, 0.3, 0.15, 0.05});
}

TEST(Sampler, TopPOnLargeVocabMatchesBruteForce) {
  std::mt19937_64 gen(3);
  for (int trial = 0; trial < 5; ++trial) {
    auto x = testing::RandomLogits(gen, 20000, true, false);
    for (float& v : x) v *= 0.2f;  // flat: the nucleus spans thousands of tokens
    SamplerConfig c;
    c.top_p = 0.9;
    const auto got = Dist(c, x);
    std::vector<size_t> order(x.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    std::vector<double> xd(x.begin(), x.end());
    const auto p = SoftmaxRef(xd);
    double cum = 0;
    std::set<size_t> keep;
    for (size_t i : order) {
      keep.insert(i);
      cum += p[i];
      if (cum >= 0.9) break;
    }
    size_t kept = 0;
    for (size_t i = 0; i < x.size(); ++i) kept += got[i] > 0;
    // The boundary token can differ by float summation order; allow one.
    EXPECT_NEAR(static_cast<double>(kept), static_cast<double>(keep.size()), 1.0);
    EXPECT_GT(kept, 1000u);
    for (size_t i = 0; i < x.size(); ++i) {
      if (got[i] > 0) {
        EXPECT_TRUE(keep.count(i) || i == order[keep.size()]) << i;
      }
    }
  }
}

TEST(Sampler, MinPIsRelativeToTheTopToken) {
  const auto x = LogitsFor({0.5, 0.3, 0.15, 0.05});
  SamplerConfig c;
  c.min_p = 0.2;  // keep p >= 0.1
  ExpectProbs(Dist(c, x), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  c.min_p = 0.7;
  ExpectProbs(Dist(c, x), {1, 0, 0, 0});
}

TEST(Sampler, TypicalKeepsTokensNearTheEntropy) {
  // H = 1.2799 nats; |surprise - H| = .364, .076, .329, 1.023 -> order 1, 2, 0, 3.
  const auto x = LogitsFor({0.4, 0.3, 0.2, 0.1});
  SamplerConfig c;
  c.typical_p = 0.45;
  ExpectProbs(Dist(c, x), {0, 0.6, 0.4, 0});
  c.typical_p = 0.8;
  ExpectProbs(Dist(c, x), {4.0 / 9, 3.0 / 9, 2.0 / 9, 0});
}

TEST(Sampler, TopNSigmaKeepsLogitsNearTheMax) {
  // mean 19/6, population sd 4.487.
  const std::vector<float> x = {10, 9, 0, 0, 0, 0};
  SamplerConfig c;
  c.top_n_sigma = 1.0;
  const double e = std::exp(1.0);
  ExpectProbs(Dist(c, x), {e / (e + 1), 1 / (e + 1), 0, 0, 0, 0});
  c.top_n_sigma = 3.0;
  ExpectProbs(Dist(c, x), SoftmaxRef({10, 9, 0, 0, 0, 0}));
}

TEST(Sampler, ChainOrderTopKThenTopPThenTemperature) {
  const auto x = LogitsFor({0.4, 0.3, 0.2, 0.1});
  SamplerConfig c;
  c.top_k = 2;    // renormalized: 4/7, 3/7
  c.top_p = 0.5;  // sees 4/7 >= 0.5: keeps token 0 only (on the raw p it would keep two)
  ExpectProbs(Dist(c, x), {1, 0, 0, 0});
  SamplerConfig d;
  d.min_p = 0.3;  // keeps p >= 0.12 at T = 1, then T = 2 over the survivors
  d.temperature = 2.0;
  const double a = std::sqrt(0.4), b = std::sqrt(0.3), cc = std::sqrt(0.2);
  ExpectProbs(Dist(d, x), {a / (a + b + cc), b / (a + b + cc), cc / (a + b + cc), 0});
}

TEST(Sampler, XtcRemovesAllButTheLeastLikelyAboveThreshold) {
  const auto x = LogitsFor({0.5, 0.3, 0.15, 0.05});
  SamplerConfig c;
  c.xtc_probability = 1.0;
  c.xtc_threshold = 0.1;
  c.seed = 5;
  c.top_logprobs = 4;
  Sampler s(c);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    auto y = x;
    TokenLogprobs lp;
    const int32_t t = s.Sample(y, {}, &lp);
    ++seen[t];
    ASSERT_EQ(lp.top.size(), 2u);
    EXPECT_EQ(lp.top[0].token, 2);
    EXPECT_NEAR(lp.top[0].logprob, std::log(0.75), 1e-6);
    EXPECT_EQ(lp.top[1].token, 3);
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[2], seen[3]);
  // One token above the threshold: nothing removed.
  c.xtc_threshold = 0.4;
  Sampler s2(c);
  auto y = x;
  TokenLogprobs lp;
  s2.Sample(y, {}, &lp);
  EXPECT_EQ(lp.top.size(), 4u);
  // probability 0: never fires (and the distribution is untouched).
  c.xtc_threshold = 0.1;
  c.xtc_probability = 0.0;
  ExpectProbs(Dist(c, x), {0.5, 0.3, 0.15, 0.05});
}

TEST(Sampler, MirostatUpdatesMuFromObservedSurprise) {
  SamplerConfig c;
  c.mirostat = 2;
  c.mirostat_tau = 3.0;
  c.mirostat_eta = 0.1;
  c.seed = 11;
  Sampler s(c);
  EXPECT_DOUBLE_EQ(s.mirostat_mu(), 6.0);
  const auto x = LogitsFor({0.5, 0.3, 0.15, 0.04, 0.01});
  double mu = 6.0;
  for (int i = 0; i < 20; ++i) {
    auto y = x;
    TokenLogprobs lp;
    s.Sample(y, {}, &lp);
    const double surprise = -lp.chosen.logprob / std::log(2.0);
    mu -= 0.1 * (surprise - 3.0);
    EXPECT_NEAR(s.mirostat_mu(), mu, 1e-5);
  }
  s.Reset();
  EXPECT_DOUBLE_EQ(s.mirostat_mu(), 6.0);
}

TEST(Sampler, MirostatTruncatesBySurprise) {
  SamplerConfig c;
  c.mirostat = 2;
  c.mirostat_tau = 1.0;  // mu = 2 bits: keep p >= 0.25
  const auto x = LogitsFor({0.5, 0.3, 0.15, 0.05});
  ExpectProbs(Dist(c, x), {0.625, 0.375, 0, 0});
  c.mirostat_tau = 0.1;  // mu = 0.2 bits: nothing qualifies, the argmax stays
  ExpectProbs(Dist(c, x), {1, 0, 0, 0});
}

TEST(Sampler, SeedReproducesARun) {
  SamplerConfig c;
  c.seed = 1234;
  c.top_k = 50;
  c.temperature = 0.9;
  std::mt19937_64 gen(9);
  const auto x = testing::RandomLogits(gen, 500, false, false);
  Sampler a(c), b(c);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 300; ++i) {
    auto y = x, z = x;
    ta.push_back(a.Sample(y, {}));
    tb.push_back(b.Sample(z, {}));
  }
  EXPECT_EQ(ta, tb);
  a.Reset();
  for (int i = 0; i < 300; ++i) {
    auto y = x;
    tc.push_back(a.Sample(y, {}));
  }
  EXPECT_EQ(ta, tc);
  c.seed = 1235;
  Sampler d(c);
  std::vector<int32_t> td;
  for (int i = 0; i < 300; ++i) {
    auto y = x;
    td.push_back(d.Sample(y, {}));
  }
  EXPECT_NE(ta, td);
  EXPECT_EQ(Sampler(c).seed(), 1235u);
}

TEST(Sampler, EmpiricalFrequenciesMatchTheDistribution) {
  // Chi-square goodness of fit with a fixed seed (deterministic); the 0.1%
  // critical value for 7 degrees of freedom is 24.32.
  const std::vector<double> p = {0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.05, 0.01};
  SamplerConfig c;
  c.seed = 2024;
  Sampler s(c);
  const auto x = LogitsFor(p);
  const int n = 100000;
  std::vector<int> count(p.size());
  for (int i = 0; i < n; ++i) {
    auto y = x;
    ++count[s.Sample(y, {})];
  }
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = n * p[i];
    chi2 += (count[i] - e) * (count[i] - e) / e;
  }
  EXPECT_LT(chi2, 24.32);
  EXPECT_GT(chi2, 0.0);
}

TEST(Sampler, LogprobsComeFromTheSampledDistribution) {
  SamplerConfig c;
  c.top_k = 3;
  c.temperature = 0.7;
  c.top_logprobs = 5;
  c.seed = 3;
  const std::vector<float> x = {0.1f, 2.0f, -1.0f, 1.5f, 0.7f};
  const auto p = Dist(c, x);
  Sampler s(c);
  auto y = x;
  TokenLogprobs lp;
  const int32_t t = s.Sample(y, {}, &lp);
  EXPECT_EQ(lp.chosen.token, t);
  EXPECT_NEAR(lp.chosen.logprob, std::log(p[t]), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);  // only the survivors of top-k
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 4);
  for (const auto& e : lp.top) EXPECT_NEAR(e.logprob, std::log(p[e.token]), 1e-6);
}

TEST(Sampler, MinusInfAndNaNNeverProduceNaNOrGetChosen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {kNegInf, 2, nan, kNegInf, 1};
  for (int mode = 0; mode < 3; ++mode) {
    SamplerConfig c;
    c.seed = 1;
    if (mode == 1) c.hlg.enabled = true;
    if (mode == 2) c.curve = {true, {{1, 1}, {100, 100}}, false};
    const auto p = Dist(c, x);
    for (float v : p) EXPECT_FALSE(std::isnan(v));
    EXPECT_EQ(p[0], 0.0f);
    EXPECT_EQ(p[2], 0.0f);
    Sampler s(c);
    for (int i = 0; i < 50; ++i) {
      auto y = x;
      const int32_t t = s.Sample(y, {});
      EXPECT_TRUE(t == 1 || t == 4) << t;
    }
  }
  std::vector<float> all = {kNegInf, kNegInf};
  EXPECT_EQ(Sampler(SamplerConfig{}).Sample(all, {}), 0);
}

TEST(Sampler, CreateRejectsInvalidConfig) {
  SamplerConfig c;
  c.top_p = 2;
  auto r = Sampler::Create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "top_p: must be in (0, 1], got 2");
}

}  // namespace
}  // namespace lumen::sample
