// vecmath span kernels on every compiled SIMD target against the scalar
// references (vecmath_ref.h): element-wise outputs bit for bit (the kernels'
// contract), sums within the reassociation bound kSumBlock * 2^-24 * sum of
// |terms|, and the references themselves against libm in double.
#include "lumen/kernels/vecmath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <hwy/targets.h>

#include "lumen/kernels/vecmath_ref.h"

namespace lumen::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kSumRel = kSumBlock * 0x1p-24;  // float lanes within a block

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

// memcmp of n floats; n == 0 is equal (memcmp must not see the null data()
// of an empty vector).
int CompareFloats(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  return n == 0 ? 0 : std::memcmp(a.data(), b.data(), n * sizeof(float));
}

// Runs `body` once per compiled and supported target, then restores dispatch.
template <class F>
void ForEachTarget(F body) {
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Inputs mixing ordinary values with the edge cases each kernel must handle.
std::vector<float> Inputs(std::mt19937& gen, size_t n, float scale, bool specials) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = nd(gen);
  if (specials && n > 8) {
    x[1] = kNegInf;
    x[3] = -87.3f;
    x[5] = -100.0f;
    x[7] = 0.0f;
  }
  return x;
}

TEST(VecmathRef, ExpAndLogAccuracy) {
  EXPECT_EQ(ref::ExpRef(0.0f), 1.0f);
  EXPECT_EQ(ref::ExpRef(kNegInf), 0.0f);
  EXPECT_EQ(ref::ExpRef(-87.31f), 0.0f);
  EXPECT_EQ(ref::LogRef(1.0f), 0.0f);
  double worst_exp = 0, worst_log = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    worst_exp = std::max(worst_exp, std::fabs(ref::ExpRef(x) / std::exp(double(x)) - 1));
  }
  for (float x = 1e-30f; x < 1e30f; x *= 1.0137f) {
    const double want = std::log(double(x));
    worst_log =
        std::max(worst_log, std::fabs(ref::LogRef(x) - want) / std::max(1.0, std::fabs(want)));
  }
  EXPECT_LT(worst_exp, 3e-7);  // about 2 ulp
  EXPECT_LT(worst_log, 3e-7);
}

TEST(Vecmath, ExpShiftSumBitExactAndBoundedSums) {
  std::mt19937 gen(1);
  ForEachTarget([&] {
    for (size_t n = 0; n < 2 * kSumBlock + 70; n += (n < 80 ? 1 : 37)) {
      for (size_t mis = 0; mis < 3; mis += 2) {
        auto buf = Inputs(gen, n + mis, 6.0f, true);
        const float* s = buf.data() + mis;
        std::vector<float> e(n, -1.0f), want(n);
        std::vector<double> blocks(SumBlocks(n), -1.0);
        const double sum = ExpShiftSum(s, n, 0.5f, e.data(), blocks.data());
        const double ref_sum = ref::ExpShiftSumRef(s, n, 0.5f, want.data());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(SameBits(e[i], want[i]))
              << "n=" << n << " i=" << i << " x=" << s[i] << " got " << e[i] << " want " << want[i];
        }
        ASSERT_NEAR(sum, ref_sum, kSumRel * ref_sum) << n;
        double bsum = 0;
        for (size_t b = 0; b < blocks.size(); ++b) {
          double want_b = 0;
          for (size_t i = b * kSumBlock; i < std::min(n, (b + 1) * kSumBlock); ++i)
            want_b += want[i];
          ASSERT_NEAR(blocks[b], want_b, kSumRel * want_b) << n << " block " << b;
          bsum += blocks[b];
        }
        ASSERT_EQ(bsum, sum);  // the total is the sum of the block sums, in order
        // Not storing e gives the same sum.
        ASSERT_EQ(ExpShiftSum(s, n, 0.5f, nullptr, nullptr), sum);
        ASSERT_NEAR(BlockSum(want.data(), n, nullptr), ref_sum, kSumRel * ref_sum);
      }
    }
  });
}

TEST(Vecmath, MaxAndScoresExact) {
  std::mt19937 gen(2);
  ForEachTarget([&] {
    for (size_t n = 0; n < 100; ++n) {
      auto x = Inputs(gen, n, 3.0f, true);
      if (n > 12) {
        x[9] = std::nanf("");
        x[11] = std::numeric_limits<float>::infinity();
      }
      const float cm = CleanMax(x.data(), n);
      ASSERT_TRUE(SameBits(cm, ref::CleanMaxRef(x.data(), n))) << n;
      if (n > 12) {
        ASSERT_EQ(cm, ref::kFloatMax);
      }
      std::vector<float> lp(n), s(n);
      const float shift = n > 12 ? 1.5f : cm;
      const float smax = CleanShiftScore(x.data(), n, shift, 1.25f, lp.data(), s.data());
      float want_max = kNegInf;
      for (size_t i = 0; i < n; ++i) {
        const float l = ref::Clean(x[i]) - shift;
        const float sc = 1.25f * l + 0.0f;
        ASSERT_TRUE(SameBits(lp[i], l)) << n << " " << i;
        ASSERT_TRUE(SameBits(s[i], sc)) << n << " " << i;
        want_max = std::max(want_max, sc);
      }
      ASSERT_TRUE(SameBits(smax, want_max));
      std::vector<float> s2(n);
      ASSERT_TRUE(SameBits(ScaleScore(lp.data(), n, 1.25f, s2.data()), want_max));
      ASSERT_EQ(0, CompareFloats(s, s2, n));
      // MaxF32 on cleaned values.
      ASSERT_TRUE(SameBits(MaxF32(lp.data(), n), ref::CleanMaxRef(lp.data(), n)));
    }
    EXPECT_EQ(CleanMax(nullptr, 0), kNegInf);
  });
}

TEST(Vecmath, HlgScoreExactAndAccurate) {
  std::mt19937 gen(3);
  ForEachTarget([&] {
    for (int trial = 0; trial < 40; ++trial) {
      const size_t n = 1 + trial * 13;
      auto lp = Inputs(gen, n, 8.0f, true);
      for (float& v : lp) v = -std::fabs(v);
      HlgSpan p;
      p.mu = -1.0f - trial % 7;
      p.m = 0.5f + 0.1f * (trial % 9);
      p.width = 0.5f + trial % 5;
      p.toe = 1.0f + trial % 4;
      p.shoulder = 0.5f + trial % 3;
      p.inv_toe = 1.0f / p.toe;
      p.inv_shoulder = 1.0f / p.shoulder;
      std::vector<float> s(n);
      const float mx = HlgScore(lp.data(), n, p, s.data());
      float want_max = kNegInf;
      for (size_t i = 0; i < n; ++i) {
        const float want = ref::HlgScoreRef(lp[i], p);
        ASSERT_TRUE(SameBits(s[i], want)) << trial << " " << i << " " << s[i] << " " << want;
        want_max = std::max(want_max, want);
        if (lp[i] == kNegInf) continue;
        // The reference against the formula in double (sample/hlg.h's HlgOffset).
        const double z = double(lp[i]) - p.mu, w = p.width;
        double off = 0;
        if (z > w) off = -p.m * ((z - w) - p.shoulder * std::log1p((z - w) / p.shoulder));
        if (z < -w) off = p.m * ((-z - w) - p.toe * std::log1p((-z - w) / p.toe));
        const double g = double(p.m) * lp[i] + off;
        ASSERT_NEAR(want, g, 1e-5 * (1 + std::fabs(g))) << lp[i];
        // Inside the mids the score is exactly the plain temperature score.
        if (std::fabs(z) <= w * 0.999) {
          ASSERT_TRUE(SameBits(want, p.m * lp[i] + 0.0f));
        }
      }
      ASSERT_TRUE(SameBits(mx, want_max));
    }
  });
}

TEST(Vecmath, PchipScoreExact) {
  // A 4-knot curve with arbitrary cubic coefficients: the kernel must pick the
  // same segment and evaluate the same expression as the reference.
  const double x[] = {-9.0, -4.0, -1.5, -0.2};
  const double a[] = {0.3, -0.1, 0.05}, b[] = {0.2, 0.1, -0.3}, c[] = {-0.05, 0.4, 0.1},
               d[] = {0.01, -0.2, 0.07}, ih[] = {1 / 5.0, 1 / 2.5, 1 / 1.3};
  PchipSpan cs{x, a, b, c, d, ih, 4, 0.3, 0.1, 0.25, -0.4};
  std::mt19937 gen(4);
  ForEachTarget([&] {
    for (size_t n = 0; n < 90; ++n) {
      auto lp = Inputs(gen, n, 5.0f, true);
      for (float& v : lp) v = -std::fabs(v);
      if (n > 20) {
        lp[13] = -4.0f;  // exactly on a knot (log_z 0 below)
        lp[15] = -9.0f;
        lp[17] = -0.2f;
      }
      for (double log_z : {0.0, 0.7}) {
        std::vector<float> s(n);
        const float mx = PchipScore(lp.data(), n, log_z, cs, s.data());
        float want_max = kNegInf;
        for (size_t i = 0; i < n; ++i) {
          const float want = ref::PchipScoreRef(lp[i], log_z, cs);
          ASSERT_TRUE(SameBits(s[i], want)) << n << " " << i << " lp " << lp[i];
          want_max = std::max(want_max, want);
        }
        ASSERT_TRUE(SameBits(mx, want_max));
      }
    }
  });
  // Hand values of the reference: segment 1 at l = -2.75 (t = 0.5), and the
  // two extrapolations.
  EXPECT_DOUBLE_EQ(ref::PchipOffsetRef(-2.75, cs), -0.1 + 0.5 * (0.1 + 0.5 * (0.4 + 0.5 * -0.2)));
  EXPECT_DOUBLE_EQ(ref::PchipOffsetRef(-11.0, cs), 0.3 + 0.25 * -2.0);
  EXPECT_DOUBLE_EQ(ref::PchipOffsetRef(0.0, cs), 0.1 + -0.4 * 0.2);
}

// The fused score+exp kernels give exactly what the two-pass route gives:
// the same scores, the same e and the same (bitwise) sums.
TEST(Vecmath, FusedScoreExpEqualsTwoPasses) {
  const double x[] = {-9.0, -4.0, -1.5, -0.2};
  const double a[] = {0.3, -0.1, 0.05}, b[] = {0.2, 0.1, -0.3}, c[] = {-0.05, 0.4, 0.1},
               d[] = {0.01, -0.2, 0.07}, ih[] = {1 / 5.0, 1 / 2.5, 1 / 1.3};
  const PchipSpan cs{x, a, b, c, d, ih, 4, 0.3, 0.1, 0.25, -0.4};
  HlgSpan p;
  p.mu = -3.0f;
  p.m = 1.3f;
  std::mt19937 gen(7);
  ForEachTarget([&] {
    for (size_t n : {0, 1, 5, 17, 63, 256, 257, 700, 1500}) {
      auto lp = Inputs(gen, n, 6.0f, true);
      for (float& v : lp) v = -std::fabs(v);
      std::vector<float> s1(n), s2(n), e1(n), e2(n);
      std::vector<double> b1(SumBlocks(n)), b2(SumBlocks(n));
      const float shift = HlgScoreAt(0.0f, p);
      const double f = HlgScoreExp(lp.data(), n, p, shift, s1.data(), e1.data(), b1.data());
      HlgScore(lp.data(), n, p, s2.data());
      const double t = ExpShiftSum(s2.data(), n, shift, e2.data(), b2.data());
      ASSERT_EQ(f, t) << n;
      ASSERT_EQ(0, CompareFloats(s1, s2, n)) << n;
      ASSERT_EQ(0, CompareFloats(e1, e2, n)) << n;
      ASSERT_EQ(b1, b2);
      const float cshift = PchipScoreAt(0.0f, 0.5, cs);
      const double fc =
          PchipScoreExp(lp.data(), n, 0.5, cs, cshift, s1.data(), e1.data(), b1.data());
      PchipScore(lp.data(), n, 0.5, cs, s2.data());
      const double tc = ExpShiftSum(s2.data(), n, cshift, e2.data(), b2.data());
      ASSERT_EQ(fc, tc) << n;
      ASSERT_EQ(0, CompareFloats(s1, s2, n)) << n;
      ASSERT_EQ(0, CompareFloats(e1, e2, n)) << n;
      std::vector<float> lp2(n);
      CleanShift(lp.data(), n, 0.25f, lp2.data());
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameBits(lp2[i], ref::Clean(lp[i]) - 0.25f));
    }
  });
}

TEST(Vecmath, LogSoftmaxAndMoments) {
  std::mt19937 gen(5);
  ForEachTarget([&] {
    for (size_t n = 1; n < 700; n += 23) {
      auto x = Inputs(gen, n, 4.0f, false);
      if (n > 3) x[2] = kNegInf;
      std::vector<float> out(n);
      const double lz = LogSoftmax(x.data(), n, out.data());
      double m = kNegInf, z = 0;
      for (float v : x) m = std::max(m, double(v));
      for (float v : x) z += std::exp(double(v) - m);
      const double want_lz = m + std::log(z);
      ASSERT_NEAR(lz, want_lz, 1e-6 * (1 + std::fabs(want_lz))) << n;
      for (size_t i = 0; i < n; ++i) {
        if (x[i] == kNegInf) {
          ASSERT_EQ(out[i], kNegInf);
          continue;
        }
        const double want = double(x[i]) - want_lz;
        ASSERT_NEAR(out[i], want, 2e-6 * (1 + std::fabs(want))) << n << " " << i;
      }
      // Moments of the normalized log-probs: sum p = 1, sum p l = -entropy.
      double se = 0, sel = 0;
      ExpMoments(out.data(), n, &se, &sel);
      double want_h = 0;
      for (size_t i = 0; i < n; ++i) {
        if (x[i] != kNegInf) want_h -= std::exp(double(x[i]) - want_lz) * (double(x[i]) - want_lz);
      }
      ASSERT_NEAR(se, 1.0, 1e-5) << n;
      ASSERT_NEAR(-sel, want_h, 1e-5 * (1 + want_h)) << n;
    }
  });
}

TEST(Vecmath, IndicesAtLeast) {
  std::mt19937 gen(6);
  ForEachTarget([&] {
    for (size_t n = 0; n < 200; n += 7) {
      const auto x = Inputs(gen, n, 2.0f, true);
      std::vector<uint32_t> idx(n), want;
      for (size_t i = 0; i < n; ++i) {
        if (x[i] >= 1.0f) want.push_back(static_cast<uint32_t>(i));
      }
      idx.resize(IndicesAtLeast(x.data(), n, 1.0f, idx.data()));
      ASSERT_EQ(idx, want) << n;
    }
  });
}

}  // namespace
}  // namespace lumen::kernels
