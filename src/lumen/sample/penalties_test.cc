#include "lumen/sample/penalties.h"

#include <gtest/gtest.h>

#include <vector>

namespace lumen::sample {
namespace {

TEST(Penalties, RepetitionThenPresenceAndFrequency) {
  SamplerConfig c;
  c.repetition_penalty = 2.0;
  PenaltyScratch s;
  std::vector<float> x = {2, -2, 1, 0.5f};
  const std::vector<int32_t> h = {0, 1, 0};
  ApplyPenalties(x, h, c, s);
  EXPECT_EQ(x, (std::vector<float>{1, -4, 1, 0.5f}));
  c.presence_penalty = 0.5;
  c.frequency_penalty = 0.25;
  x = {2, -2, 1, 0.5f};
  ApplyPenalties(x, h, c, s);
  // token 0 (count 2): 2/2 - 0.5 - 2*0.25 = 0; token 1 (count 1): -4 - 0.5 - 0.25.
  EXPECT_EQ(x, (std::vector<float>{0, -4.75f, 1, 0.5f}));
}

TEST(Penalties, WindowAndOutOfRangeIds) {
  SamplerConfig c;
  c.presence_penalty = 1.0;
  PenaltyScratch s;
  c.repeat_last_n = 1;
  std::vector<float> x = {0, 0, 0};
  const std::vector<int32_t> h = {0, 7, -3, 1};
  ApplyPenalties(x, h, c, s);
  EXPECT_EQ(x, (std::vector<float>{0, -1, 0}));
  c.repeat_last_n = -1;  // whole history; 7 and -3 are ignored
  x = {0, 0, 0};
  ApplyPenalties(x, h, c, s);
  EXPECT_EQ(x, (std::vector<float>{-1, -1, 0}));
  c.repeat_last_n = 0;
  x = {0, 0, 0};
  ApplyPenalties(x, h, c, s);
  EXPECT_EQ(x, (std::vector<float>{0, 0, 0}));
}

TEST(LogitBias, AddsAndIgnoresOutOfRange) {
  std::vector<float> x = {1, 2, 3};
  const std::vector<std::pair<int32_t, double>> b = {{0, 0.5}, {2, -3}, {3, 9}, {-1, 9}};
  ApplyLogitBias(x, b);
  EXPECT_EQ(x, (std::vector<float>{1.5f, 2, 0}));
}

DryConfig Dry(double mult, double base, int32_t allowed) {
  DryConfig d;
  d.multiplier = mult;
  d.base = base;
  d.allowed_length = allowed;
  return d;
}

std::vector<float> RunDry(const DryConfig& d, const std::vector<int32_t>& h, size_t v = 10) {
  std::vector<float> x(v, 0.0f);
  PenaltyScratch s;
  ApplyDry(x, h, d, s);
  return x;
}

TEST(Dry, PenalizesTheTokenThatWouldExtendARepeat) {
  // "1 2 3" repeats the start; it was followed by 4: n = 3, penalty 1 * 2^(3-2).
  const std::vector<int32_t> h = {1, 2, 3, 4, 1, 2, 3};
  auto x = RunDry(Dry(1, 2, 2), h);
  EXPECT_EQ(x[4], -2.0f);
  for (int t : {0, 1, 2, 3, 5}) EXPECT_EQ(x[t], 0.0f) << t;
  EXPECT_EQ(RunDry(Dry(1, 2, 4), h)[4], 0.0f);  // n = 3 < allowed 4
  EXPECT_EQ(RunDry(Dry(0.5, 1.75, 1), h)[4], -0.5f * 1.75f * 1.75f);
  EXPECT_EQ(RunDry(Dry(0, 2, 2), h)[4], 0.0f);  // multiplier 0: off
}

TEST(Dry, LongestMatchPerTokenWins) {
  // last = 2; at j=2 the match is "1 2" (n=2) followed by 9; at j=5 it is "2"
  // (n=1) followed by 8.
  const std::vector<int32_t> h = {7, 1, 2, 9, 3, 2, 8, 1, 2};
  const auto x = RunDry(Dry(1, 2, 1), h);
  EXPECT_EQ(x[9], -2.0f);
  EXPECT_EQ(x[8], -1.0f);
}

TEST(Dry, SequenceBreakersStopMatching) {
  const std::vector<int32_t> h = {1, 2, 3, 4, 1, 2, 3};
  DryConfig d = Dry(1, 2, 2);
  d.breaker_ids = {{2}};  // suffix is cut to "3": n = 1 < 2
  EXPECT_EQ(RunDry(d, h)[4], 0.0f);
  d.breaker_ids = {{2, 3}};  // a two-token breaker ends at the last token
  EXPECT_EQ(RunDry(d, h)[4], 0.0f);
  d.breaker_ids = {{3, 2}};  // never occurs: no effect
  EXPECT_EQ(RunDry(d, h)[4], -2.0f);
  // A breaker is never the penalized token.
  DryConfig e = Dry(1, 2, 1);
  e.breaker_ids = {{2}};
  EXPECT_EQ(RunDry(e, {5, 1, 2, 5, 1})[2], 0.0f);
  e.breaker_ids = {};
  EXPECT_EQ(RunDry(e, {5, 1, 2, 5, 1})[2], -2.0f);
}

TEST(Dry, WindowLimitsTheSearch) {
  DryConfig d = Dry(1, 2, 2);
  d.last_n = 4;  // window "4 1 2 3" holds no earlier "... 3"
  EXPECT_EQ(RunDry(d, {1, 2, 3, 4, 1, 2, 3})[4], 0.0f);
  d.last_n = 0;
  EXPECT_EQ(RunDry(d, {1, 2, 3, 4, 1, 2, 3})[4], 0.0f);
}

TEST(Dry, DegenerateRepeatsStayFiniteAndFast) {
  std::vector<int32_t> h(5000, 3);
  const auto x = RunDry(Dry(1, 1.75, 2), h);
  EXPECT_TRUE(std::isfinite(x[3]));
  EXPECT_LT(x[3], -1e20f);
}

}  // namespace
}  // namespace lumen::sample
