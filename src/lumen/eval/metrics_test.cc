// Metrics on hand-made inputs with values worked out by hand (in comments).
#include "lumen/eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace lumen::eval {
namespace {

TEST(Metrics, DistinctN) {
  const std::vector<Seq> s = {{1, 2, 3}, {1, 2, 4}};
  EXPECT_DOUBLE_EQ(DistinctN(s, 1), 4.0 / 6);  // {1,2,3,4} of 6 unigrams
  EXPECT_DOUBLE_EQ(DistinctN(s, 2), 3.0 / 4);  // [1,2] twice, [2,3], [2,4]
  EXPECT_DOUBLE_EQ(DistinctN(s, 4), 0.0);      // no 4-gram at all
  const std::vector<Seq> same = {{5, 5, 5, 5}};
  EXPECT_DOUBLE_EQ(DistinctN(same, 1), 0.25);
}

TEST(Metrics, Bleu4HandValues) {
  const Seq ref = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Bleu4(ref, std::vector<Seq>{ref}), 1.0);
  // p1 = 3/4, p2 = (2+1)/(3+1), p3 = (1+1)/(2+1), p4 = (0+1)/(1+1).
  EXPECT_NEAR(Bleu4({1, 2, 3, 5}, std::vector<Seq>{ref}),
              std::pow(0.75 * 0.75 * (2.0 / 3) * 0.5, 0.25), 1e-15);
  // Brevity: all precisions 1 (empty 3/4-gram sets smooth to 1/1), BP = e^(1 - 4/2).
  EXPECT_NEAR(Bleu4({1, 2}, std::vector<Seq>{ref}), std::exp(-1.0), 1e-15);
  // Clipping: four 7s against a reference with two: p1 = 2/4, p2 = 1/4, p3 = 1/3, p4 = 1/2.
  EXPECT_NEAR(Bleu4({7, 7, 7, 7}, std::vector<Seq>{{7, 1, 7, 2}}), std::pow(1.0 / 48, 0.25), 1e-15);
  // The clip is the max count in any single reference: two references each
  // with one 7 still clip to 1.
  EXPECT_NEAR(Bleu4({7, 7, 7, 7}, std::vector<Seq>{{7, 1, 2, 3}, {4, 7, 5, 6}}),
              std::pow(0.25 * 0.25 * (1.0 / 3) * 0.5, 0.25), 1e-15);
  EXPECT_EQ(Bleu4({9, 9}, std::vector<Seq>{ref}), 0.0);  // no unigram match
  EXPECT_EQ(Bleu4({}, std::vector<Seq>{ref}), 0.0);
}

TEST(Metrics, SelfBleu) {
  const Seq a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_DOUBLE_EQ(SelfBleu(std::vector<Seq>{a, a, a}), 1.0);
  EXPECT_NEAR(SelfBleu(std::vector<Seq>{a, b}), std::pow(0.75 * 0.75 * (2.0 / 3) * 0.5, 0.25),
              1e-15);
  EXPECT_EQ(SelfBleu(std::vector<Seq>{a}), 0.0);
  EXPECT_EQ(SelfBleu(std::vector<Seq>{{1, 1}, {2, 2}}), 0.0);
}

TEST(Metrics, EntropyAndKl) {
  const std::vector<float> half = {0.5f, 0.5f, 0.0f}, skew = {0.25f, 0.75f, 0.0f};
  EXPECT_NEAR(Entropy(half), std::log(2.0), 1e-15);
  EXPECT_EQ(Entropy(std::vector<float>{1.0f, 0.0f}), 0.0);
  EXPECT_NEAR(Entropy(skew), -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-15);
  EXPECT_EQ(Kl(half, half), 0.0);
  EXPECT_NEAR(Kl(half, skew), 0.5 * std::log(2.0) + 0.5 * std::log(0.5 / 0.75), 1e-15);
  EXPECT_EQ(Kl(half, std::vector<float>{1.0f, 0.0f, 0.0f}),
            std::numeric_limits<double>::infinity());
  EXPECT_NEAR(Kl(std::vector<float>{1.0f, 0.0f}, std::vector<float>{0.5f, 0.5f}), std::log(2.0),
              1e-15);
}

}  // namespace
}  // namespace lumen::eval
