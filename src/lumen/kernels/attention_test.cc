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
#include <cstring>
#include <random>
#include <vector>

#include <hwy/targets.h>

#include "lumen/core/buffer.h"
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

// out (one query's [H, Dh]) against AttendOneRef over [begin, end), within
// the bound above.
// extra_u: more units of roundoff the route may add to the weights' error.
void ExpectWithinBound(const float* q, const AttentionShape& shape, const KvRing& kv, int64_t begin,
                       int64_t end, const float* out, const std::string& what, double extra_u = 0) {
  const int H = shape.n_heads, Dh = shape.head_dim, group = H / shape.n_kv_heads;
  const int64_t row = int64_t(shape.n_kv_heads) * Dh, S = end - begin;
  std::vector<float> ref(int64_t(H) * Dh);
  AttendOneRef(q, shape, kv, begin, end, ref.data());
  int bad = 0;
  for (int h = 0; h < H; ++h) {
    const int64_t off = int64_t(h / group) * Dh;
    std::vector<double> sc(S);
    double e_max = 0;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t slot = (begin + j) % kv.capacity;
      double dot = 0, abs_dot = 0;
      for (int d = 0; d < Dh; ++d) {
        const double t = double(q[h * Dh + d]) * KvElemRef(kv, kv.k, slot, row, off + d);
        dot += t;
        abs_dot += std::fabs(t);
      }
      double v = dot * shape.scale;
      if (shape.softcap > 0) v = shape.softcap * std::tanh(v / shape.softcap);
      sc[j] = v;
      e_max = std::max(e_max, (Dh + 2) * kU * shape.scale * abs_dot);
    }
    const double mx = *std::max_element(sc.begin(), sc.end());
    double psum = 0;
    for (auto& v : sc) psum += (v = std::exp(v - mx));
    for (int d = 0; d < Dh; ++d) {
      double pv = 0;
      for (int64_t j = 0; j < S; ++j)
        pv += sc[j] * std::fabs(KvElemRef(kv, kv.v, (begin + j) % kv.capacity, row, off + d));
      const double bound = (4 * e_max + (16 + extra_u) * kU + (S + 4) * kU) * pv / psum;
      const double err = std::fabs(double(out[h * Dh + d]) - ref[h * Dh + d]);
      if (!(err <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " h=" << h << " d=" << d << " got " << out[h * Dh + d] << " want "
                      << ref[h * Dh + d] << " err " << err << " bound " << bound;
    }
  }
}

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
  std::vector<float> q(int64_t(c.H) * c.Dh), out(q.size(), -9.0f);
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
  ExpectWithinBound(q.data(), shape, kv, c.begin, c.end, out.data(), what);
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

// AttendRows (prefill tiles) against the oracle, row by row. Its online
// softmax multiplies a row's output and sum by the same float factor when the
// max grows (once per 64-key tile at most), so the factor's own error cancels
// in out / sum and each rescale adds the two products' roundings: 2 u per tile
// to the weights' relative error, 4 u per tile in the bound's 2 x that error.
struct RowsCase {
  DType dtype;
  int H, Hkv, Dh;
  int64_t capacity, pos0, T, window;
  float softcap;
};

const std::vector<RowsCase>& RowsCases() {
  static const std::vector<RowsCase> cases = {
      {DType::kF16, 32, 8, 64, 600, 0, 130, 0, 0.0f},     // llama-3.2-1b prefill from 0
      {DType::kF16, 32, 8, 64, 600, 300, 40, 0, 0.0f},    // a chunk after 300 cached positions
      {DType::kBF16, 4, 2, 64, 100, 150, 40, 50, 0.0f},   // sliding window 50, ring wrap
      {DType::kF32, 6, 3, 32, 50, 0, 20, 0, 0.0f},        // group 3
      {DType::kF16, 8, 4, 256, 300, 10, 35, 0, 50.0f},    // softcap, Dh 256
      {DType::kF16, 8, 8, 128, 64, 40, 20, 30, 0.0f},     // MHA, Dh 128, window 30, wrap
      {DType::kBF16, 16, 2, 64, 400, 100, 30, 0, 0.0f},   // group 8: 6 tokens a call
      {DType::kQ8_0, 32, 8, 64, 600, 0, 100, 0, 0.0f},    // 8-bit KV
      {DType::kQ8_0, 6, 2, 128, 300, 30, 50, 0, 0.0f},    // 8-bit KV, group 3, Dh 128
      {DType::kF16, 4, 1, 24, 64, 0, 40, 0, 0.0f},        // Dh 24: 8-lane targets only
      {DType::kF32, 2, 1, 8, 64, 0, 40, 0, 30.0f},        // Dh 8, softcap
      {DType::kF16, 32, 8, 64, 1200, 1000, 40, 0, 0.0f},  // long: 17 key tiles
  };
  return cases;
}

// Runs case c's T tokens through AttendRows in calls of `block` tokens (0:
// the most a call takes), last block first; returns [T][H * Dh].
std::vector<float> RunRows(const RowsCase& c, const KvRing& kv, const std::vector<float>& q,
                           int64_t q_stride, int64_t block) {
  const AttentionShape shape{c.H, c.Hkv, c.Dh, 1.0f / std::sqrt(float(c.Dh)), c.softcap};
  const int64_t out_stride = int64_t(c.H) * c.Dh + 3;
  std::vector<float> out(c.T * out_stride, -9.0f);
  const int64_t most = AttendRowsTokens(shape);
  if (block == 0 || block > most) block = most;
  const AttentionRows rows{q.data(), q_stride, out.data(), out_stride, c.pos0, c.window};
  AlignedBuffer scratch(AttendRowsScratchFloats(shape) * sizeof(float));
  for (int64_t t0 = (c.T - 1) / block * block; t0 >= 0; t0 -= block)
    for (int h = 0; h < c.Hkv; ++h)
      AttendRows(shape, kv, rows, h, t0, std::min(c.T, t0 + block), scratch.as<float>());
  return out;
}

TEST(AttentionTest, RowsWithinBoundAndIndependentOfTheirCall) {
  std::mt19937 rng(11);
  int ran = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (size_t i = 0; i < RowsCases().size(); ++i) {
      const RowsCase& c = RowsCases()[i];
      const std::string what =
          std::string(hwy::TargetName(target)) + " rows case " + std::to_string(i);
      const AttentionShape shape{c.H, c.Hkv, c.Dh, 1.0f / std::sqrt(float(c.Dh)), c.softcap};
      if (!AttendRowsSupported(shape, c.dtype)) continue;
      ++ran;
      const int64_t row = int64_t(c.Hkv) * c.Dh, Q = int64_t(c.H) * c.Dh;
      const size_t row_bytes = *RowBytes(c.dtype, row);
      std::vector<uint8_t> kb(c.capacity * row_bytes), vb(c.capacity * row_bytes);
      const KvRing kv{c.dtype, kb.data(), vb.data(), c.capacity};
      std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
      std::vector<float> kr(row), vr(row);
      for (int64_t p = 0; p < c.pos0 + c.T; ++p) {
        for (auto& x : kr) x = 2.0f * ud(rng);
        for (auto& x : vr) x = ud(rng);
        StoreKv(kv, row, p, kr.data(), vr.data());
      }
      const int64_t q_stride = Q + 5;
      std::vector<float> q(c.T * q_stride);
      for (auto& x : q) x = 2.0f * ud(rng);
      const std::vector<float> out = RunRows(c, kv, q, q_stride, 0);
      const int64_t out_stride = Q + 3;
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t p = c.pos0 + t;
        const int64_t begin = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
        const int64_t tiles = (p + 1 - begin + 63) / 64 + 1;  // 64-key tiles, one more at an edge
        ExpectWithinBound(q.data() + t * q_stride, shape, kv, begin, p + 1,
                          out.data() + t * out_stride, what + " t=" + std::to_string(t),
                          4.0 * double(tiles));
        EXPECT_EQ(out[t * out_stride + Q], -9.0f) << what << ": wrote past the row";
      }
      // A row's bits do not depend on which tokens share its call.
      for (int64_t block : {1, 5}) {
        const std::vector<float> other = RunRows(c, kv, q, q_stride, block);
        EXPECT_EQ(std::memcmp(other.data(), out.data(), out.size() * sizeof(float)), 0)
            << what << " in calls of " << block;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GT(ran, 20);  // every case on at least two targets (Dh 24 on the 8-lane ones)
  // Shapes and types the forward must send to AttendOne instead.
  const AttentionShape llama{32, 8, 64, 0.125f, 0.0f};
  EXPECT_TRUE(AttendRowsSupported(llama, DType::kF16));
  EXPECT_FALSE(AttendRowsSupported(llama, DType::kQ4_0));                     // no KV loader
  EXPECT_FALSE(AttendRowsSupported({6, 4, 64, 0.125f, 0.0f}, DType::kF16));   // H % Hkv != 0
  EXPECT_FALSE(AttendRowsSupported({64, 1, 64, 0.125f, 0.0f}, DType::kF16));  // group > 48 rows
  EXPECT_FALSE(AttendRowsSupported({8, 8, 36, 0.125f, 0.0f}, DType::kF32));   // Dh off the lanes
}

}  // namespace
}  // namespace lumen::kernels
