// The fast float route of the training attention (AttentionTrain*Fast)
// against the scalar templates run in double (the oracle) and in float, on
// every compiled SIMD target: outputs, lse, dQ, dK, dV over GQA, soft-caps,
// sliding windows, block-diagonal packing, prefix-shared block masks, rows
// that see nothing and lengths that are not multiples of the tiles.
//
// Bound: relative L2 against the double oracle (and against the scalar
// float route) below kBound = 1e-5 per tensor. A float score, exp and f32 sum
// over S <= 300 keys carries about sqrt(S) u ~ 1e-6 relative error per
// element (u = 2^-24); measured worst over every target and case: 1.1e-6,
// with the scalar float route at the same level (a failure prints it). The
// 10x headroom covers the tanh and exp polynomials (a few ulp); a wrong mask,
// scale or a missing key moves a tensor by far more than 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/attention_train.h"

namespace lumen::kernels {
namespace {

constexpr double kBound = 1e-5;

template <class A, class B>
double RelL2(const std::vector<A>& a, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(double(ref[i]))) {  // -inf lse of a row that sees nothing
      if (double(a[i]) != double(ref[i])) return 1e9;
      continue;
    }
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den == 0 ? (num == 0 ? 0 : 1e9) : std::sqrt(num / den);
}

// A packed batch: positions and key ranges per token.
struct Batch {
  std::vector<int32_t> pos;
  std::vector<KeyRanges> vis;
  int64_t size() const { return int64_t(pos.size()); }
  // A causal sequence of n tokens.
  void AddSequence(int n) {
    const int32_t b = int32_t(size());
    for (int i = 0; i < n; ++i) {
      KeyRanges r;
      r.n = 1;
      r.r[0] = {b, b + i + 1};
      pos.push_back(i);
      vis.push_back(r);
    }
  }
  // [prompt; chosen; rejected]: rejected sees the prompt and itself and its
  // positions restart after the prompt.
  void AddSharedPair(int np, int nc, int nr) {
    const int32_t p0 = int32_t(size());
    AddSequence(np + nc);
    const int32_t r0 = int32_t(size());
    for (int i = 0; i < nr; ++i) {
      KeyRanges r;
      r.n = 2;
      r.r[0] = {p0, p0 + np};
      r.r[1] = {r0, r0 + i + 1};
      pos.push_back(np + i);
      vis.push_back(r);
    }
  }
  // A token that sees no key (lse -inf, output 0, no gradient).
  void AddBlind() {
    pos.push_back(0);
    vis.push_back(KeyRanges{});
  }
};

struct Tensors {
  std::vector<float> q, k, v, dout;
};

Tensors Random(const TrainAttentionShape& s, int64_t M, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensors t;
  t.q.resize(M * s.n_heads * s.head_dim);
  t.k.resize(M * s.n_kv_heads * s.head_dim);
  t.v.resize(t.k.size());
  t.dout.resize(t.q.size());
  for (auto* x : {&t.q, &t.k, &t.v, &t.dout})
    for (auto& e : *x) e = nd(rng);
  return t;
}

template <class Real>
struct Result {
  std::vector<Real> out, lse, dq, dk, dv;
};

template <class Real>
Result<Real> Scalar(const TrainAttentionShape& s, const Batch& b, const Tensors& t) {
  const int64_t M = b.size();
  auto cv = [](const std::vector<float>& x) { return std::vector<Real>(x.begin(), x.end()); };
  const auto q = cv(t.q), k = cv(t.k), v = cv(t.v), dout = cv(t.dout);
  Result<Real> r;
  r.out.resize(q.size());
  r.lse.resize(M * s.n_heads);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  AttentionTrainForward<Real>(s, q.data(), k.data(), v.data(), b.pos.data(), b.vis.data(), M,
                              r.out.data(), r.lse.data(), 0, s.n_kv_heads);
  AttentionTrainBackward<Real>(s, q.data(), k.data(), v.data(), b.pos.data(), b.vis.data(), M,
                               r.out.data(), r.lse.data(), dout.data(), r.dq.data(), r.dk.data(),
                               r.dv.data(), 0, s.n_kv_heads);
  return r;
}

Result<float> Fast(const TrainAttentionShape& s, const Batch& b, const Tensors& t,
                   ThreadPool* pool) {
  const int64_t M = b.size();
  Result<float> r;
  r.out.assign(t.q.size(), -7.0f);  // every element must be written
  r.lse.assign(M * s.n_heads, -7.0f);
  r.dq.assign(t.q.size(), 0);
  r.dk.assign(t.k.size(), 0);
  r.dv.assign(t.v.size(), 0);
  AttentionTrainForwardFast(s, t.q.data(), t.k.data(), t.v.data(), b.pos.data(), b.vis.data(), M,
                            r.out.data(), r.lse.data(), pool);
  AttentionTrainBackwardFast(s, t.q.data(), t.k.data(), t.v.data(), b.pos.data(), b.vis.data(), M,
                             r.out.data(), r.lse.data(), t.dout.data(), r.dq.data(), r.dk.data(),
                             r.dv.data(), pool);
  return r;
}

struct Case {
  const char* name;
  TrainAttentionShape s;
  Batch b;
};

std::vector<Case> Cases() {
  std::vector<Case> cs;
  auto scale = [](int Dh) { return 2.0f / std::sqrt(float(Dh)); };  // peaked softmaxes
  {
    Case c{"llama-1b widths, one causal sequence of 150", {32, 8, 64, scale(64)}, {}};
    c.b.AddSequence(150);
    cs.push_back(c);
  }
  {
    Case c{"group 3, Dh 24, softcap 30, packed 37+70+5", {6, 2, 24, scale(24), 30.0f}, {}};
    c.b.AddSequence(37);
    c.b.AddSequence(70);
    c.b.AddSequence(5);
    cs.push_back(c);
  }
  {
    Case c{"MHA, Dh 32, window 16, prefix-shared pairs", {4, 4, 32, scale(32), 0.0f, 16}, {}};
    c.b.AddSharedPair(40, 33, 29);
    c.b.AddSharedPair(7, 3, 90);
    cs.push_back(c);
  }
  {
    Case c{
        "group 4, Dh 16, softcap 50, window 20, blind rows", {4, 1, 16, scale(16), 50.0f, 20}, {}};
    c.b.AddBlind();
    c.b.AddSequence(131);
    c.b.AddBlind();
    c.b.AddSharedPair(17, 66, 45);
    cs.push_back(c);
  }
  {
    Case c{"group 8, Dh 40, shared pairs past many key tiles", {16, 2, 40, scale(40)}, {}};
    c.b.AddSharedPair(150, 70, 81);
    cs.push_back(c);
  }
  return cs;
}

TEST(AttentionTrainFast, EveryTargetWithinBoundOfTheOracle) {
  for (const Case& c : Cases()) {
    const Tensors t = Random(c.s, c.b.size(), 7);
    const Result<double> ref = Scalar<double>(c.s, c.b, t);
    const Result<float> sf = Scalar<float>(c.s, c.b, t);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      const Result<float> f = Fast(c.s, c.b, t, nullptr);
      const std::string what = std::string(hwy::TargetName(target)) + ", " + c.name;
      const struct {
        const char* name;
        const std::vector<float>& fast;
        const std::vector<float>& scalar;
        const std::vector<double>& ref;
      } ts[] = {{"out", f.out, sf.out, ref.out},
                {"lse", f.lse, sf.lse, ref.lse},
                {"dq", f.dq, sf.dq, ref.dq},
                {"dk", f.dk, sf.dk, ref.dk},
                {"dv", f.dv, sf.dv, ref.dv}};
      for (const auto& x : ts) {
        const double e = RelL2(x.fast, x.ref);
        EXPECT_LT(e, kBound) << what << ": " << x.name
                             << " (scalar float: " << RelL2(x.scalar, x.ref) << ")";
        EXPECT_LT(RelL2(x.fast, x.scalar), kBound) << what << ": " << x.name << " vs scalar f32";
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

// Every thread count gives the same bits (one unit owns each write).
TEST(AttentionTrainFast, IndependentOfThreadCount) {
  const Case c = Cases()[3];
  const Tensors t = Random(c.s, c.b.size(), 11);
  const Result<float> one = Fast(c.s, c.b, t, nullptr);
  for (int n : {2, 3}) {
    ThreadPool pool(n);
    const Result<float> r = Fast(c.s, c.b, t, &pool);
    EXPECT_EQ(r.out, one.out) << n;
    EXPECT_EQ(r.lse, one.lse) << n;
    EXPECT_EQ(r.dq, one.dq) << n;
    EXPECT_EQ(r.dk, one.dk) << n;
    EXPECT_EQ(r.dv, one.dv) << n;
  }
  const Case g = Cases()[0];  // many forward units
  const Tensors tg = Random(g.s, g.b.size(), 12);
  ThreadPool pool(3);
  const Result<float> a = Fast(g.s, g.b, tg, nullptr), b = Fast(g.s, g.b, tg, &pool);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dk, b.dk);
}

// A prefix-shared rejected row's forward has the same bits as the same row
// in its own [prompt; rejected] sequence (what PrefixShare.MatchesTwoForwards
// relies on), and a sequence's rows do not depend on what is packed before.
TEST(AttentionTrainFast, RowsDependOnlyOnTheKeysTheySee) {
  const TrainAttentionShape s{8, 2, 32, 0.3f, 0.0f};
  const int np = 70, nc = 45, nr = 83;
  Batch shared;
  shared.AddSequence(11);  // another sequence packed first shifts every tile
  shared.AddSharedPair(np, nc, nr);
  Batch two;
  two.AddSequence(np + nr);
  const int64_t Q = int64_t(s.n_heads) * s.head_dim, KV = int64_t(s.n_kv_heads) * s.head_dim;
  const Tensors ts = Random(s, shared.size(), 3);
  // two's tokens: the shared prompt rows, then the rejected rows.
  Tensors tt;
  auto rows = [](const std::vector<float>& x, int64_t w, int64_t b, int64_t n,
                 std::vector<float>& to) {
    to.insert(to.end(), x.begin() + b * w, x.begin() + (b + n) * w);
  };
  const int64_t p0 = 11, r0 = 11 + np + nc;
  rows(ts.q, Q, p0, np, tt.q);
  rows(ts.q, Q, r0, nr, tt.q);
  rows(ts.k, KV, p0, np, tt.k);
  rows(ts.k, KV, r0, nr, tt.k);
  rows(ts.v, KV, p0, np, tt.v);
  rows(ts.v, KV, r0, nr, tt.v);
  tt.dout.assign(tt.q.size(), 0.0f);
  const Result<float> a = Fast(s, shared, ts, nullptr), b = Fast(s, two, tt, nullptr);
  for (int64_t i = 0; i < np + nr; ++i) {
    const int64_t is = i < np ? p0 + i : r0 + (i - np);
    for (int64_t e = 0; e < Q; ++e)
      ASSERT_EQ(a.out[is * Q + e], b.out[i * Q + e]) << "row " << i << " element " << e;
    for (int h = 0; h < s.n_heads; ++h)
      ASSERT_EQ(a.lse[is * s.n_heads + h], b.lse[i * s.n_heads + h]) << "row " << i;
  }
}

}  // namespace
}  // namespace lumen::kernels
