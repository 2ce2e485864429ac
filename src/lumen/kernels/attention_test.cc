// AttendOne/AttendHeads (every compiled SIMD target, f32/f16/bf16 KV, ring
// wrap, GQA, softcap, head sizes with and without a vector route) against the
// scalar double-precision oracle AttendOneRef.
//
// Error bound per output element (u = 2^-24), from the three f32 steps:
//   score_j error e_j <= (Dh + 2) u scale sum_d |q_d k_jd|  (dot in f32; tanh
//     softcap is 1-Lipschitz so it does not grow it);
//   p_j = exp(score_j - max) relative error <= e_max + e_max + 8u (the shift
//     by the max is exact up to e_max, vector exp within 4 ulp, +4u slack);
//   out = sum p_j v_j / sum p_j: the ratio's relative weight error is at most
//     2 * (2 e_max + 8u), plus f32 summation (S + 4) u over sum p_j |v_j|.
// so |out - ref| <= (4 e_max + 16u + (S + 4) u) * sum_j p_j |v_j| / sum_j p_j.
#include "lumen/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <hwy/targets.h>

#include "lumen/core/half.h"
#include "lumen/kernels/attention_ref.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Case {
  DType dtype;
  int H, Hkv, Dh;
  int64_t capacity, begin, end;
  float softcap;
};

// split: run the position-split phases (three position ranges, two head
// ranges) and sum their outputs instead of AttendOne.
void Check(const Case& c, std::mt19937& rng, const std::string& what, bool split = false) {
  const int64_t row = int64_t(c.Hkv) * c.Dh, S = c.end - c.begin;
  const size_t row_bytes = *RowBytes(c.dtype, row);
  std::vector<uint8_t> kb(c.capacity * row_bytes), vb(c.capacity * row_bytes);
  KvRing kv{c.dtype, kb.data(), vb.data(), c.capacity};
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  std::vector<float> kr(row), vr(row);
  for (int64_t p = 0; p < c.capacity; ++p) {
    for (auto& x : kr) x = 2.0f * ud(rng);
    for (auto& x : vr) x = ud(rng);
    StoreKv(kv, row, p, kr.data(), vr.data());
  }
  std::vector<float> q(int64_t(c.H) * c.Dh), out(q.size(), -9.0f), ref(q.size());
  for (auto& x : q) x = 2.0f * ud(rng);
  const AttentionShape shape{c.H, c.Hkv, c.Dh, 1.0f / std::sqrt(float(c.Dh)), c.softcap};
  std::vector<float> scratch(S * (c.H + 1) + 2 * row);
  if (!split) {
    AttendOne(q.data(), shape, kv, c.begin, c.end, out.data(), scratch.data());
  } else {
    if (!AttendSplitSupported(shape, c.dtype)) return;  // AttendHeads serves such shapes
    std::vector<float> scores(S * c.H), part(q.size());
    const int64_t cuts[] = {0, S / 3, S / 2 + 1, S};
    for (int i = 0; i < 3; ++i)
      if (cuts[i] < cuts[i + 1])
        AttendScores(q.data(), shape, kv, c.begin, c.end, cuts[i], cuts[i + 1], scores.data());
    AttendSoftmax(S, scores.data(), 0, 1);
    AttendSoftmax(S, scores.data(), 1, c.H);
    std::fill(out.begin(), out.end(), 0.0f);
    for (int i = 0; i < 3; ++i) {
      if (cuts[i] == cuts[i + 1]) continue;
      AttendValues(shape, kv, c.begin, c.end, cuts[i], cuts[i + 1], scores.data(), part.data());
      for (size_t e = 0; e < out.size(); ++e) out[e] += part[e];
    }
  }
  AttendOneRef(q.data(), shape, kv, c.begin, c.end, ref.data());

  const int group = c.H / c.Hkv;
  int bad = 0;
  for (int h = 0; h < c.H; ++h) {
    const int64_t off = int64_t(h / group) * c.Dh;
    std::vector<double> sc(S);
    double e_max = 0;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t slot = (c.begin + j) % c.capacity;
      double dot = 0, abs_dot = 0;
      for (int d = 0; d < c.Dh; ++d) {
        const double t = double(q[h * c.Dh + d]) * KvElemRef(kv, kv.k, slot, row, off + d);
        dot += t;
        abs_dot += std::fabs(t);
      }
      double v = dot * shape.scale;
      if (c.softcap > 0) v = c.softcap * std::tanh(v / c.softcap);
      sc[j] = v;
      e_max = std::max(e_max, (c.Dh + 2) * kU * shape.scale * abs_dot);
    }
    const double mx = *std::max_element(sc.begin(), sc.end());
    double psum = 0;
    for (auto& v : sc) psum += (v = std::exp(v - mx));
    for (int d = 0; d < c.Dh; ++d) {
      double pv = 0;
      for (int64_t j = 0; j < S; ++j)
        pv += sc[j] * std::fabs(KvElemRef(kv, kv.v, (c.begin + j) % c.capacity, row, off + d));
      const double bound = (4 * e_max + 16 * kU + (S + 4) * kU) * pv / psum;
      const double err = std::fabs(double(out[h * c.Dh + d]) - ref[h * c.Dh + d]);
      if (!(err <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " h=" << h << " d=" << d << " got " << out[h * c.Dh + d]
                      << " want " << ref[h * c.Dh + d] << " err " << err << " bound " << bound;
    }
  }
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {DType::kF16, 32, 8, 64, 600, 0, 513, 0.0f},  // llama-3.2-1b decode
      {DType::kF16, 8, 8, 128, 64, 40, 104, 0.0f},  // ring wrap, MHA, Dh 128
      {DType::kBF16, 4, 2, 64, 100, 3, 60, 0.0f},
      {DType::kF32, 6, 3, 32, 50, 0, 1, 0.0f},      // one position
      {DType::kF16, 8, 4, 256, 40, 10, 45, 50.0f},  // gemma-style softcap, Dh 256
      {DType::kF16, 4, 1, 24, 30, 0, 29, 0.0f},     // Dh 24: scalar on 16-lane targets
      {DType::kF32, 2, 1, 8, 20, 0, 17, 30.0f},
      {DType::kF16, 6, 2, 64, 70, 0, 70, 0.0f},          // group 3: per-head route
      {DType::kBF16, 16, 2, 64, 300, 100, 390, 0.0f},    // group 8, ring wrap
      {DType::kQ8_0, 32, 8, 64, 600, 0, 513, 0.0f},      // 8-bit KV, llama-3.2-1b decode
      {DType::kQ8_0, 6, 2, 128, 90, 30, 120, 0.0f},      // 8-bit KV, group 3, Dh 128, wrap
      {DType::kQ8_0, 8, 4, 256, 40, 10, 45, 50.0f},      // 8-bit KV, softcap, Dh 256
      {DType::kQ8_0, 2, 1, 32, 20, 0, 17, 0.0f},         // 8-bit KV, one block per head
      {DType::kF16, 32, 8, 64, 4096, 1000, 4096, 0.0f},  // many 64-position blocks
  };
  return cases;
}

TEST(AttentionTest, EveryTargetWithinBound) {
  std::mt19937 rng(5);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (size_t i = 0; i < Cases().size(); ++i)
      Check(Cases()[i], rng, std::string(hwy::TargetName(target)) + " case " + std::to_string(i));
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(AttentionTest, PositionSplitWithinBound) {
  std::mt19937 rng(6);
  int ran = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (size_t i = 0; i < Cases().size(); ++i) {
      const Case& c = Cases()[i];
      const AttentionShape shape{c.H, c.Hkv, c.Dh, 1.0f, c.softcap};
      ran += AttendSplitSupported(shape, c.dtype);
      Check(c, rng, std::string(hwy::TargetName(target)) + " split, case " + std::to_string(i),
            /*split=*/true);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GT(ran, 8);  // the vector shapes (all but Dh 24 / group 3) took the split route
}

TEST(AttentionTest, HeadSplitEqualsWhole) {
  std::mt19937 rng(9);
  const int H = 8, Hkv = 4, Dh = 64;
  const int64_t row = Hkv * Dh, S = 77;
  std::vector<uint16_t> kb(S * row), vb(S * row);
  KvRing kv{DType::kF16, kb.data(), vb.data(), S};
  std::vector<float> kr(row), vr(row), q(H * Dh);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  for (int64_t p = 0; p < S; ++p) {
    for (auto& x : kr) x = ud(rng);
    for (auto& x : vr) x = ud(rng);
    StoreKv(kv, row, p, kr.data(), vr.data());
  }
  for (auto& x : q) x = ud(rng);
  const AttentionShape shape{H, Hkv, Dh, 0.125f, 0.0f};
  std::vector<float> whole(H * Dh), split(H * Dh), scratch(S * (H + 1) + 2 * row);
  AttendOne(q.data(), shape, kv, 0, S, whole.data(), scratch.data());
  AttendHeads(q.data(), shape, kv, 0, S, split.data(), scratch.data(), 0, 1);
  AttendHeads(q.data(), shape, kv, 0, S, split.data(), scratch.data(), 1, 4);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(whole[i], split[i]) << i;
}

}  // namespace
}  // namespace lumen::kernels
