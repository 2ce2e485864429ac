// Attention of a packed training batch, forward and backward, without an
// [M, M] matrix (flash-attention style: the forward saves one logsumexp per
// query row and head; the backward recomputes each row's probabilities from
// it).
//
// M packed tokens; token i sees keys in at most two ranges of packed indices
// (`KeyRanges`: block-diagonal packing needs one, a prefix-shared rejected
// branch two: the prompt and its own tokens), further limited by a sliding
// window on positions (pos_i - pos_j < window). GQA: query head h reads kv
// head h / (H / Hkv). Scores are scaled, optionally soft-capped, then
// softmaxed. Both functions cover the kv heads [kv0, kv1) (and their query
// heads), so callers split heads across threads without write conflicts.
//
// Backward, per row i and head h with p_j = exp(s_j - lse_i):
//   dv_j += p_j do_i;  dp_j = do_i . v_j;  ds_j = p_j (dp_j - do_i . o_i)
//   (softcap: ds_j *= 1 - (s_j / cap)^2);  dq_i += scale ds_j k_j;
//   dk_j += scale ds_j q_i.
// Scalar templates over Real (double: the FD oracle; float: the in-tree
// reference of the fast route) and the fast float route that training runs
// (AttentionTrain*Fast, attention_train.cc: tiled, vectorized, threaded).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace lumen {
class ThreadPool;
}

namespace lumen::kernels {

struct KeyRange {
  int32_t begin = 0, end = 0;  // [begin, end) in packed token indices
};
struct KeyRanges {
  KeyRange r[2];
  int n = 0;
};

struct TrainAttentionShape {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: scores = softcap * tanh(scores / softcap)
  int64_t window = 0;    // > 0: keys with pos_i - pos_j >= window are hidden
};

namespace attention_train_detail {
// Calls fn(j) for every key j token i sees, in increasing order.
template <class Fn>
void ForVisible(const KeyRanges& vis, const int32_t* pos, int64_t i, int64_t window, Fn&& fn) {
  for (int r = 0; r < vis.n; ++r)
    for (int32_t j = vis.r[r].begin; j < vis.r[r].end; ++j)
      if (window <= 0 || int64_t(pos[i]) - pos[j] < window) fn(j);
}

template <class Real>
Real Score(const TrainAttentionShape& s, const Real* q, const Real* k) {
  Real d = 0;
  for (int e = 0; e < s.head_dim; ++e) d += q[e] * k[e];
  d *= Real(s.scale);
  if (s.softcap > 0) d = Real(s.softcap) * std::tanh(d / Real(s.softcap));
  return d;
}
}  // namespace attention_train_detail

// q: [M, H*Dh]; k, v: [M, Hkv*Dh]; out: [M, H*Dh]; lse: [M, H].
template <class Real>
void AttentionTrainForward(const TrainAttentionShape& s, const Real* q, const Real* k,
                           const Real* v, const int32_t* pos, const KeyRanges* vis, int64_t M,
                           Real* out, Real* lse, int kv0, int kv1) {
  using namespace attention_train_detail;
  const int64_t Dh = s.head_dim, Q = int64_t(s.n_heads) * Dh, KV = int64_t(s.n_kv_heads) * Dh;
  const int group = s.n_heads / s.n_kv_heads;
  std::vector<Real> sc;
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < M; ++i) {
    idx.clear();
    ForVisible(vis[i], pos, i, s.window, [&](int32_t j) { idx.push_back(j); });
    sc.resize(idx.size());
    for (int kh = kv0; kh < kv1; ++kh) {
      for (int h = kh * group; h < (kh + 1) * group; ++h) {
        const Real* qh = q + i * Q + h * Dh;
        Real* o = out + i * Q + h * Dh;
        std::fill(o, o + Dh, Real(0));
        if (idx.empty()) {
          lse[i * s.n_heads + h] = -std::numeric_limits<Real>::infinity();
          continue;
        }
        Real mx = -std::numeric_limits<Real>::infinity();
        for (size_t n = 0; n < idx.size(); ++n) {
          sc[n] = Score(s, qh, k + idx[n] * KV + kh * Dh);
          mx = std::max(mx, sc[n]);
        }
        Real sum = 0;
        for (size_t n = 0; n < idx.size(); ++n) sum += std::exp(sc[n] - mx);
        const Real l = mx + std::log(sum);
        lse[i * s.n_heads + h] = l;
        for (size_t n = 0; n < idx.size(); ++n) {
          const Real p = std::exp(sc[n] - l);
          const Real* vj = v + idx[n] * KV + kh * Dh;
          for (int64_t e = 0; e < Dh; ++e) o[e] += p * vj[e];
        }
      }
    }
  }
}

// dq: [M, H*Dh], dk, dv: [M, Hkv*Dh]; the caller zeroes them (the function
// accumulates) for the heads it covers.
template <class Real>
void AttentionTrainBackward(const TrainAttentionShape& s, const Real* q, const Real* k,
                            const Real* v, const int32_t* pos, const KeyRanges* vis, int64_t M,
                            const Real* out, const Real* lse, const Real* dout, Real* dq, Real* dk,
                            Real* dv, int kv0, int kv1) {
  using namespace attention_train_detail;
  const int64_t Dh = s.head_dim, Q = int64_t(s.n_heads) * Dh, KV = int64_t(s.n_kv_heads) * Dh;
  const int group = s.n_heads / s.n_kv_heads;
  const Real scale = Real(s.scale);
  for (int64_t i = 0; i < M; ++i) {
    for (int kh = kv0; kh < kv1; ++kh) {
      for (int h = kh * group; h < (kh + 1) * group; ++h) {
        const Real* qh = q + i * Q + h * Dh;
        const Real* doh = dout + i * Q + h * Dh;
        const Real* oh = out + i * Q + h * Dh;
        Real* dqh = dq + i * Q + h * Dh;
        const Real l = lse[i * s.n_heads + h];
        Real D = 0;
        for (int64_t e = 0; e < Dh; ++e) D += doh[e] * oh[e];
        ForVisible(vis[i], pos, i, s.window, [&](int32_t j) {
          const Real* kj = k + j * KV + kh * Dh;
          const Real* vj = v + j * KV + kh * Dh;
          const Real sj = Score(s, qh, kj);
          const Real p = std::exp(sj - l);
          Real dp = 0;
          for (int64_t e = 0; e < Dh; ++e) dp += doh[e] * vj[e];
          Real ds = p * (dp - D);
          if (s.softcap > 0) {
            const Real t = sj / Real(s.softcap);
            ds *= Real(1) - t * t;
          }
          Real* dkj = dk + j * KV + kh * Dh;
          Real* dvj = dv + j * KV + kh * Dh;
          for (int64_t e = 0; e < Dh; ++e) {
            dqh[e] += scale * ds * kj[e];
            dkj[e] += scale * ds * qh[e];
            dvj[e] += p * doh[e];
          }
        });
      }
    }
  }
}

// The fast float route: the same contract as the scalar templates over all
// heads (kv0 = 0, kv1 = n_kv_heads), threaded on pool (null: the caller's
// thread). Within a stated bound of the scalar templates (tests:
// AttentionTrainFast.*). Each query row's forward output and lse depend only
// on the keys it sees, in order (not on the other rows of the batch), and
// every result is independent of the pool's size and timing.
void AttentionTrainForwardFast(const TrainAttentionShape& s, const float* q, const float* k,
                               const float* v, const int32_t* pos, const KeyRanges* vis, int64_t M,
                               float* out, float* lse, ThreadPool* pool);
// Accumulates into dq, dk, dv like AttentionTrainBackward.
void AttentionTrainBackwardFast(const TrainAttentionShape& s, const float* q, const float* k,
                                const float* v, const int32_t* pos, const KeyRanges* vis, int64_t M,
                                const float* out, const float* lse, const float* dout, float* dq,
                                float* dk, float* dv, ThreadPool* pool);

}  // namespace lumen::kernels
