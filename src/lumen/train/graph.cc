#include "lumen/train/graph.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "lumen/core/check.h"
#include "lumen/core/route.h"
#include "lumen/kernels/attention_train.h"
#include "lumen/kernels/matrix.h"
#include "lumen/kernels/train_ops.h"
#include "lumen/model/forward.h"
#include "lumen/train/frozen.h"
#include "lumen/train/lora_products.h"
#include "lumen/train/pool_rows.h"

namespace lumen::train {

LUMEN_ROUTE(
    train_graph_f32,
    {.node = "train.graph",
     .name = "f32",
     .tier = Tier::kL2,
     .oracle = "the same graph in double (itself checked by finite differences) and torch float64",
     .bound = "relative L2 of LoRA gradients below 1e-4 of the double route",
     .tests = "Families/GradientCheck.FloatRouteWithinBoundOfDouble/*;Types/"
              "QuantizedBase.FloatRouteWithinBoundOfDouble/*;"
              "Golden/GoldenTrain.FloatRouteMatchesTorchFloat64/*",
     .priority = 10});
LUMEN_ROUTE(train_graph_double,
            {.node = "train.graph",
             .name = "double",
             .tier = Tier::kL2,
             .oracle = "fourth-order finite differences of the loss; torch float64",
             .bound = "relative error below 1e-6",
             .tests = "Families/GradientCheck.EveryObjectiveMatchesFiniteDifferences/*;"
                      "Scalings/RopeScalingGradient.MatchesFiniteDifferences/*;Golden/"
                      "GoldenTrain.DoubleRouteMatchesTorchFloat64/*",
             .when = "train.compute=double",
             .priority = 20});
LUMEN_ROUTE(train_attention_scalar,
            {.node = "attn.train",
             .name = "scalar-lse",
             .tier = Tier::kL2,
             .oracle = "finite differences in double (the template the double route runs)",
             .bound = "relative error below 1e-6 in double",
             .tests = "Families/GradientCheck.EveryObjectiveMatchesFiniteDifferences/*;Families/"
                      "PrefixShare.MatchesTwoForwards/*",
             .priority = 0});
LUMEN_ROUTE(
    train_segmented,
    {.node = "train.backward",
     .name = "segmented",
     .tier = Tier::kL1,
     .oracle = "the unsegmented backward",
     .bound =
         "bit-identical gradients (recomputation reproduces the forward, dropout masks included)",
     .tests = "Families/PrefixShare.SegmentedBackwardIsBitIdentical/"
              "*;Levers.EveryCombinationTrainsAndMatchesThePlainPath",
     .when = "train.segment=on",
     .priority = 10});
LUMEN_ROUTE(train_plain_backward,
            {.node = "train.backward",
             .name = "whole",
             .tier = Tier::kL1,
             .oracle = "itself (every activation kept)",
             .bound = "bit-identical",
             .tests = "Families/GradientCheck.FloatRouteWithinBoundOfDouble/*",
             .priority = 0});
LUMEN_ROUTE(train_mlp_chunk, {.node = "train.mlp",
                              .name = "token-chunked",
                              .tier = Tier::kL1,
                              .oracle = "the unchunked MLP",
                              .bound = "bit-identical loss and gradients (per-token arithmetic)",
                              .tests = "Families/PrefixShare.MlpChunkMatchesUnchunked/*",
                              .when = "train.mlp_chunk=on",
                              .priority = 10});
LUMEN_ROUTE(train_mlp_whole, {.node = "train.mlp",
                              .name = "whole",
                              .tier = Tier::kL1,
                              .oracle = "itself",
                              .bound = "bit-identical",
                              .tests = "Families/GradientCheck.FloatRouteWithinBoundOfDouble/*",
                              .priority = 0});

using model::LayerWeights;
using model::Matrix;

template <class Real>
Graph<Real>::Graph(const model::ModelConfig& c, const model::Weights& w, const LoraLayout* layout,
                   ThreadPool* pool)
    : c_(c), w_(w), layout_(layout), pool_(pool), embed_scale_(model::EmbedScale(c, w)) {
  rope_global_ =
      kernels::MakeRopeTable(c.rope_dim, c.rope_theta, c.rope_scaling, c.max_ctx, c.max_ctx);
  rope_local_ = kernels::MakeRopeTable(c.rope_dim, c.rope_theta_local, {}, c.max_ctx, c.max_ctx);
  if (w.rope_freqs)
    for (size_t i = 0; i < rope_global_.inv_freq.size(); ++i)
      rope_global_.inv_freq[i] /= w.rope_freqs[i];
}

template <class Real>
const kernels::RopeTable& Graph<Real>::Rope(int l) const {
  return c_.layer_sliding[l] && c_.family == model::Family::kGemma3 ? rope_local_ : rope_global_;
}

template <class Real>
template <class Fn>
void Graph<Real>::ForRows(int64_t M, Fn&& fn) {
  RowsOnPool(pool_, M, [&](int64_t i, int) { fn(i); });
}

template <class Real>
template <class Fn>
void Graph<Real>::NormRows(int64_t M, Fn&& fn) {
  PhaseTimer timer(Phase(&StepProfile::norms_s));
  ForRows(M, fn);
}

template <class Real>
size_t Graph<Real>::saved_bytes() const {
  size_t n = 0;
  for (const auto& v : boundaries_) n += v.size();
  for (const auto& s : saved_) {
    for (const auto* v : {&s.x_in, &s.xn1, &s.q_pre, &s.k_pre, &s.q, &s.k, &s.v, &s.att, &s.lse,
                          &s.o_pre, &s.x_mid, &s.g, &s.u, &s.h, &s.d_pre})
      n += v->size();
    for (const auto& u : s.lora_u) n += u.size();
  }
  return n * sizeof(Real);
}

template <class Real>
void Graph<Real>::AddStepFlops(const PackedBatch& b, StepProfile& p) const {
  const double M = double(b.size()), D = double(c_.dim), Q = double(c_.q_dim()),
               KV = double(c_.kv_dim()), F = double(c_.ffn_dim);
  const double frozen = 2 * M * (D * (Q + 2 * KV) + Q * D + 3 * D * F);  // one pass
  const int first = layout_ ? layout_->first_layer : c_.n_layers;
  double lora = 0;  // forward A x, B u; backward dB, du, dA, dx: 3 passes over (n + k) r
  if (layout_)
    for (const LoraSlot& s : layout_->slots)
      lora += 3 * 2 * M * double(layout_->cfg.rank) * double(s.n + s.k);
  p.product_flops += frozen * (c_.n_layers + (c_.n_layers - first)) + lora;
  // Visible (query, key) pairs; a window keeps at most `window` keys of a
  // range (positions within a range are consecutive in every packing).
  for (int l = 0; l < c_.n_layers; ++l) {
    const int64_t w = c_.layer_sliding[l] ? c_.sliding_window : 0;
    double pairs = 0;
    for (const kernels::KeyRanges& v : b.visible)
      for (int r = 0; r < v.n; ++r) {
        const int64_t n = std::max<int64_t>(0, v.r[r].end - v.r[r].begin);
        pairs += double(w > 0 ? std::min(n, w) : n);
      }
    // 2 flops per multiply-add per head dim: QK^T, PV forward; dP, dV, dK,
    // dQ backward (the recomputed scores are not counted).
    const double per = 2 * double(c_.n_heads) * double(c_.head_dim) * pairs;
    p.attention_flops += 2 * per + (l >= first ? 4 * per : 0);
  }
}

namespace {
// Frees vectors' storage (clear() keeps the capacity).
template <class... V>
void Release(V&... v) {
  (std::decay_t<decltype(v)>().swap(v), ...);
}

// The dropout multiplier of element (row m, column k) of a target's input.
inline float DropScale(const DropoutKey& key, float p, int l, Target t, int64_t m, int64_t k) {
  const double r =
      Uniform01(HashKey({key.seed, key.step, uint64_t(l), uint64_t(t), uint64_t(m), uint64_t(k)}));
  return r < p ? 0.0f : 1.0f / (1.0f - p);
}
}  // namespace

template <class Real>
std::vector<Real> Graph<Real>::DropMask(int l, Target t, int64_t M, int64_t K) {
  std::vector<Real> mask(size_t(M) * K);
  const float p = layout_->cfg.dropout;
  ForRows(M, [&](int64_t m) {
    for (int64_t k = 0; k < K; ++k) mask[m * K + k] = Real(DropScale(key_, p, l, t, row0_ + m, k));
  });
  return mask;
}

template <class Real>
const LoraSlot* Graph<Real>::LoraInput(int l, Target t, const Real* x, int64_t M,
                                       std::vector<Real>& u) {
  const LoraSlot* slot = params_ && layout_ ? layout_->Find(l, t) : nullptr;
  if (!slot || lora_scale_ == 0.0f) {
    u.clear();
    return nullptr;
  }
  const int r = layout_->cfg.rank;
  const int64_t K = slot->k;
  std::vector<Real> xd;
  if (layout_->cfg.dropout > 0) {  // drop(x), the input A sees
    xd = DropMask(l, t, M, K);
    for (size_t i = 0; i < xd.size(); ++i) xd[i] *= x[i];
    x = xd.data();
  }
  const Real* A = params_->w.data() + slot->a_off;
  u.assign(size_t(M) * r, Real(0));
  Probe(ProbeSite::kLoraX, x, M * K);
  if (LoraBf16(K)) {
    LoraProductBf16(A, r, K, x, M, u.data());
    return slot;
  }
  if constexpr (std::is_same_v<Real, float>) {
    LoraDown(A, r, K, x, M, u.data(), pool_);
    return slot;
  }
  ForRows(M, [&](int64_t m) {
    for (int j = 0; j < r; ++j) {
      Real acc = 0;
      const Real* Aj = A + int64_t(j) * K;
      for (int64_t k = 0; k < K; ++k) acc += Aj[k] * x[m * K + k];
      u[m * r + j] = acc;
    }
  });
  return slot;
}

template <class Real>
void Graph<Real>::Linear(int l, Target t, const Matrix& W, const Real* x, int64_t M, Real* y,
                         std::vector<Real>& u) {
  PhaseTimer timer(Phase(&StepProfile::products_s));
  const LoraSlot* slot = LoraInput(l, t, x, M, u);
  if (W.valid()) Probe(ProbeSite::kProductX, x, M * W.k);
  if (slot) Probe(ProbeSite::kLoraU, u.data(), M * layout_->cfg.rank);
  if constexpr (std::is_same_v<Real, float>) {
    if (slot && FusedLora(W.valid(), Bf16(kFrozenForward))) {
      const kernels::LowRank lr{.u = u.data(),
                                .v = params_->w.data() + slot->b_off,
                                .r = layout_->cfg.rank,
                                .scale = lora_scale_};
      return kernels::MatMulLowRank(W, x, M, W.k, lr, y, W.n, pool_);
    }
  }
  if (W.valid())  // else y holds a fused product's slice
    FrozenProduct(W, x, M, y, pool_, Bf16(kFrozenForward));
  if (!slot) return;
  const int r = layout_->cfg.rank;
  const int64_t N = slot->n;
  const Real* B = params_->w.data() + slot->b_off;
  const Real s = Real(lora_scale_);
  if (LoraBf16(r)) {
    std::vector<Real> bu(size_t(M) * N);
    LoraProductBf16(B, N, r, u.data(), M, bu.data());
    for (size_t i = 0; i < bu.size(); ++i) y[i] += s * bu[i];
    return;
  }
  if constexpr (std::is_same_v<Real, float>) {  // the unfused order: a second pass over y
    return kernels::AddLowRank(y, N, M, N, {.u = u.data(), .v = B, .r = r, .scale = s}, pool_);
  }
  ForRows(M, [&](int64_t m) {
    const Real* um = u.data() + m * r;
    Real* ym = y + m * N;
    for (int64_t n = 0; n < N; ++n) {
      Real acc = 0;
      const Real* Bn = B + n * r;
      for (int j = 0; j < r; ++j) acc += Bn[j] * um[j];
      ym[n] += s * acc;
    }
  });
}

template <class Real>
void Graph<Real>::LinearBackward(int l, Target t, const Matrix& W, const Real* x, const Real* u,
                                 const Real* dy, int64_t M, Real* dx, LoraParams<Real>& grad) {
  PhaseTimer timer(Phase(&StepProfile::products_s));
  const LoraSlot* slot = layout_ && lora_scale_ != 0.0f ? layout_->Find(l, t) : nullptr;
  if (W.valid()) Probe(ProbeSite::kProductTDy, dy, M * W.n);
  // Fused: dx gets dy W and the rank-r term in one pass, after du is known.
  const bool fused = slot && FusedLora(W.valid(), Bf16(kFrozenBackward));
  if (W.valid() && !fused)  // else the caller's one product (fused weights)
    FrozenProductT(W, dy, M, dx, pool_, Bf16(kFrozenBackward));
  if (!slot) return;
  const int r = layout_->cfg.rank;
  const int64_t N = slot->n, K = slot->k;
  const Real* A = params_->w.data() + slot->a_off;
  const Real* B = params_->w.data() + slot->b_off;
  Real* dA = grad.w.data() + slot->a_off;
  Real* dB = grad.w.data() + slot->b_off;
  const Real s = Real(lora_scale_);
  // The same mask the forward drew (a hash of the row and column), once.
  std::vector<Real> mask = layout_->cfg.dropout > 0 ? DropMask(l, t, M, K) : std::vector<Real>();
  if constexpr (std::is_same_v<Real, float>) {
    return LinearBackwardF32(*slot, W, x, u, dy, M, dx, grad, std::move(mask), fused);
  }
  // dB [N, r] += s dy^T u
  ForRows(N, [&](int64_t n) {
    for (int j = 0; j < r; ++j) {
      Real acc = 0;
      for (int64_t m = 0; m < M; ++m) acc += dy[m * N + n] * u[m * r + j];
      dB[n * r + j] += s * acc;
    }
  });
  // du [M, r] = s dy B
  std::vector<Real> du(size_t(M) * r);
  Probe(ProbeSite::kLoraDy, dy, M * N);
  if (LoraBf16(N)) {
    LoraProductTBf16(B, N, r, dy, M, du.data());
    for (Real& v : du) v *= s;
  } else {
    ForRows(M, [&](int64_t m) {
      for (int j = 0; j < r; ++j) {
        Real acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dy[m * N + n] * B[n * r + j];
        du[m * r + j] = s * acc;
      }
    });
  }
  Probe(ProbeSite::kLoraDu, du.data(), M * r);
  // dA [r, K] += du^T drop(x); dx [M, K] += drop'(du A)
  ForRows(K, [&](int64_t k) {
    for (int j = 0; j < r; ++j) {
      Real acc = 0;
      for (int64_t m = 0; m < M; ++m) {
        Real xv = x[m * K + k];
        if (!mask.empty()) xv *= mask[m * K + k];
        acc += du[m * r + j] * xv;
      }
      dA[int64_t(j) * K + k] += acc;
    }
  });
  if (LoraBf16(r)) {
    std::vector<Real> dxa(size_t(M) * K);
    LoraProductTBf16(A, r, K, du.data(), M, dxa.data());
    for (size_t i = 0; i < dxa.size(); ++i) dx[i] += mask.empty() ? dxa[i] : dxa[i] * mask[i];
    return;
  }
  ForRows(M, [&](int64_t m) {
    for (int64_t k = 0; k < K; ++k) {
      Real acc = 0;
      for (int j = 0; j < r; ++j) acc += du[m * r + j] * A[int64_t(j) * K + k];
      if (!mask.empty()) acc *= mask[m * K + k];
      dx[m * K + k] += acc;
    }
  });
}

// The f32 route's LoRA backward (lora_products.h): every product a parallel
// kernel over row-major operands; fused: dx += dy W + mask .* (du A) in one
// kernels::MatMulTLowRank pass (the frozen product is still to do). With
// dropout, dA is last: the mask becomes drop(x) in place once dx has used it.
template <class Real>
void Graph<Real>::LinearBackwardF32(const LoraSlot& slot, const Matrix& W, const Real* x,
                                    const Real* u, const Real* dy, int64_t M, Real* dx,
                                    LoraParams<Real>& grad, std::vector<Real> mask, bool fused) {
  if constexpr (std::is_same_v<Real, float>) {
    const int r = layout_->cfg.rank;
    const int64_t N = slot.n, K = slot.k;
    const float* A = params_->w.data() + slot.a_off;
    const float* B = params_->w.data() + slot.b_off;
    const float s = lora_scale_;
    LoraGradB(dy, u, M, N, r, s, grad.w.data() + slot.b_off, pool_);
    Probe(ProbeSite::kLoraDy, dy, M * N);
    std::vector<float> du(size_t(M) * r);
    if (LoraBf16(N)) {
      LoraProductTBf16(B, N, r, dy, M, du.data());
      for (float& v : du) v *= s;
    } else {
      LoraDyB(B, N, r, s, dy, M, du.data(), pool_);
    }
    Probe(ProbeSite::kLoraDu, du.data(), M * r);
    float* m = mask.empty() ? nullptr : mask.data();
    if (fused) {
      const kernels::LowRank lr{.u = du.data(), .v = A, .r = r, .mask = m};
      kernels::MatMulTLowRank(W, dy, M, lr, dx, pool_);
    } else if (LoraBf16(r)) {
      std::vector<float> dxa(size_t(M) * K);
      LoraProductTBf16(A, r, K, du.data(), M, dxa.data());
      for (size_t i = 0; i < dxa.size(); ++i) dx[i] += m ? dxa[i] * m[i] : dxa[i];
    } else {
      LoraDxAdd(du.data(), A, M, K, r, m, dx, pool_);
    }
    if (m)  // drop(x), the input A saw
      for (int64_t i = 0; i < M * K; ++i) m[i] *= x[i];
    LoraGradA(du.data(), m ? m : x, M, K, r, grad.w.data() + slot.a_off, pool_);
  } else {
    LUMEN_CHECK(false);  // the double graph keeps its scalar loops (the oracle)
  }
}

template <class Real>
void Graph<Real>::LoraProductBf16(const Real* P, int64_t N, int64_t K, const Real* x, int64_t M,
                                  Real* y) {
  if constexpr (std::is_same_v<Real, float>) {
    kernels::MatMulBf16(DenseMatrix(P, N, K), x, M, K, y, N, pool_);
  } else {
    LUMEN_CHECK(false);  // the double graph never takes bf16 (Bf16() is false)
  }
}

template <class Real>
void Graph<Real>::LoraProductTBf16(const Real* P, int64_t N, int64_t K, const Real* dy, int64_t M,
                                   Real* dx) {
  if constexpr (std::is_same_v<Real, float>) {
    kernels::MatMulTBf16(DenseMatrix(P, N, K), dy, M, dx, /*accumulate=*/false, pool_);
  } else {
    LUMEN_CHECK(false);
  }
}

// Chunk boundaries of M rows for --mlp-chunk: chunks of T rows, the last one
// absorbing the remainder, so no chunk has fewer than T rows (kernels::MatMul
// takes another route at 4 rows or fewer, with another summation order).
template <class Real>
std::vector<int64_t> Graph<Real>::MlpChunks(int64_t M) const {
  std::vector<int64_t> b = {0};
  if (mlp_chunk_ > 0)
    for (int64_t t = mlp_chunk_; t + mlp_chunk_ <= M; t += mlp_chunk_) b.push_back(t);
  b.push_back(M);
  return b;
}

// x += rs * post_norm(out), the end of a block; keeps out before the norm in
// pre when there is one (Gemma2/3).
template <class Real>
void Graph<Real>::AddBlockOutput(const float* post_norm, std::vector<Real>& out,
                                 std::vector<Real>& pre, Real* x) {
  const int64_t D = c_.dim, M = int64_t(out.size()) / D;
  if (post_norm) {
    pre = out;
    NormRows(M, [&](int64_t i) {
      kernels::RmsNormRow(out.data() + i * D, post_norm, c_.norm_offset, c_.norm_eps, D,
                          out.data() + i * D);
    });
  }
  const Real rs = Real(c_.residual_scale);
  for (size_t i = 0; i < out.size(); ++i) x[i] += out[i] * rs;
}

// d out from dx: the residual scale, then the post norm's backward.
template <class Real>
const Real* Graph<Real>::BlockOutputBackward(const float* post_norm, const std::vector<Real>& pre,
                                             const Real* dx, int64_t M, std::vector<Real>& dout) {
  const int64_t D = c_.dim;
  const Real rs = Real(c_.residual_scale);
  if (!post_norm && rs == Real(1)) {  // dx * 1 is dx: no [M, D] copy at the step's peak
    dout.clear();
    return dx;
  }
  dout.resize(M * D);
  for (int64_t i = 0; i < M * D; ++i) dout[i] = dx[i] * rs;
  if (!post_norm) return dout.data();
  std::vector<Real> d(M * D, Real(0));
  NormRows(M, [&](int64_t i) {
    kernels::RmsNormRowBackward(pre.data() + i * D, post_norm, c_.norm_offset, c_.norm_eps, D,
                                dout.data() + i * D, d.data() + i * D);
  });
  dout.swap(d);
  return dout.data();
}

template <class Real>
void Graph<Real>::FfnNorm(int l, const Real* x_mid, int64_t n, std::vector<Real>& xn) {
  const int64_t D = c_.dim;
  const float* w = w_.layers[l].ffn_norm;
  xn.resize(n * D);
  NormRows(n, [&](int64_t i) {
    kernels::RmsNormRow(x_mid + i * D, w, c_.norm_offset, c_.norm_eps, D, xn.data() + i * D);
  });
}

template <class Real>
void Graph<Real>::FfnRows(int l, const Real* xn2, int64_t n, std::vector<Real>& g,
                          std::vector<Real>& u, std::vector<Real>& h, std::vector<Real>* lu,
                          Real* d) {
  const int64_t F = c_.ffn_dim;
  const LayerWeights& L = w_.layers[l];
  g.resize(n * F);
  u.resize(n * F);
  h.resize(n * F);
  const bool fused_ffn = !L.w_gate.valid();  // Phi3: w_up is [2F, D], gate rows first
  if (fused_ffn) {
    std::vector<Real> gu(n * 2 * F);
    {
      PhaseTimer timer(Phase(&StepProfile::products_s));
      Probe(ProbeSite::kProductX, xn2, n * L.w_up.k);
      FrozenProduct(L.w_up, xn2, n, gu.data(), pool_, Bf16(kFrozenForward));
    }
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(gu.data() + i * 2 * F, F, g.data() + i * F);
      std::copy_n(gu.data() + i * 2 * F + F, F, u.data() + i * F);
    }
  }
  Linear(l, Target::kGate, L.w_gate, xn2, n, g.data(), lu[int(Target::kGate)]);
  Linear(l, Target::kUp, fused_ffn ? Matrix() : L.w_up, xn2, n, u.data(), lu[int(Target::kUp)]);
  ForRows(n, [&](int64_t i) {
    kernels::GatedForward(c_.act, g.data() + i * F, u.data() + i * F, F, h.data() + i * F);
  });
  if (d) {
    Linear(l, Target::kDown, L.w_down, h.data(), n, d, lu[int(Target::kDown)]);
  } else {  // the backward's recompute needs only down's LoRA input, not its product
    LoraInput(l, Target::kDown, h.data(), n, lu[int(Target::kDown)]);
  }
}

template <class Real>
void Graph<Real>::FfnBackwardRows(int l, const Real* xn2, int64_t n, const std::vector<Real>& g,
                                  const std::vector<Real>& u, const std::vector<Real>& h,
                                  const std::vector<Real>* lu, const Real* dd, Real* dxn,
                                  LoraParams<Real>& grad) {
  const int64_t F = c_.ffn_dim;
  const LayerWeights& L = w_.layers[l];
  std::vector<Real> dh(n * F, Real(0));
  LinearBackward(l, Target::kDown, L.w_down, h.data(), lu[int(Target::kDown)].data(), dd, n,
                 dh.data(), grad);
  // du overwrites dh (each element of dh is spent by its own du and dg).
  std::vector<Real> dg(n * F);
  std::vector<Real>& du = dh;
  ForRows(n, [&](int64_t i) {
    kernels::GatedBackward(c_.act, g.data() + i * F, u.data() + i * F, dh.data() + i * F, F,
                           dg.data() + i * F, du.data() + i * F);
  });
  LinearBackward(l, Target::kGate, L.w_gate, xn2, lu[int(Target::kGate)].data(), dg.data(), n, dxn,
                 grad);
  const bool fused_ffn = !L.w_gate.valid();
  if (!fused_ffn) std::vector<Real>().swap(dg);  // up's backward runs without it
  LinearBackward(l, Target::kUp, fused_ffn ? Matrix() : L.w_up, xn2, lu[int(Target::kUp)].data(),
                 du.data(), n, dxn, grad);
  if (fused_ffn) {
    std::vector<Real> dgu(n * 2 * F);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(dg.data() + i * F, F, dgu.data() + i * 2 * F);
      std::copy_n(du.data() + i * F, F, dgu.data() + i * 2 * F + F);
    }
    PhaseTimer timer(Phase(&StepProfile::products_s));
    Probe(ProbeSite::kProductTDy, dgu.data(), n * 2 * F);
    FrozenProductT(L.w_up, dgu.data(), n, dxn, pool_, Bf16(kFrozenBackward));
  }
}

template <class Real>
void Graph<Real>::Layer(int l, const PackedBatch& b, std::vector<Real>& xv, LayerSaved& s,
                        bool keep_saved, bool output) {
  const int64_t M = b.size(), D = c_.dim, Q = c_.q_dim(), KV = c_.kv_dim();
  const int64_t Dh = c_.head_dim;
  const LayerWeights& L = w_.layers[l];
  LUMEN_CHECK(int64_t(xv.size()) == M * D);
  Real* x = xv.data();
  // Without a post-FFN norm the backward reads nothing past the FFN's inputs.
  const bool partial = !output && keep_saved && !L.post_ffn_norm;
  const float off = c_.norm_offset, eps = c_.norm_eps;
  if (keep_saved) s.x_in.assign(x, x + M * D);
  s.xn1.resize(M * D);
  NormRows(M, [&](int64_t i) {
    kernels::RmsNormRow(x + i * D, L.attn_norm, off, eps, D, s.xn1.data() + i * D);
  });
  s.q.resize(M * Q);
  s.k.resize(M * KV);
  s.v.resize(M * KV);
  const Matrix none;
  if (L.wqkv.valid()) {  // Phi3: one [(H + 2 Hkv) Dh, D] product, split into q, k, v
    const int64_t QKV = Q + 2 * KV;
    std::vector<Real> qkv(M * QKV);
    {
      PhaseTimer timer(Phase(&StepProfile::products_s));
      Probe(ProbeSite::kProductX, s.xn1.data(), M * D);
      FrozenProduct(L.wqkv, s.xn1.data(), M, qkv.data(), pool_, Bf16(kFrozenForward));
    }
    for (int64_t i = 0; i < M; ++i) {
      std::copy_n(qkv.data() + i * QKV, Q, s.q.data() + i * Q);
      std::copy_n(qkv.data() + i * QKV + Q, KV, s.k.data() + i * KV);
      std::copy_n(qkv.data() + i * QKV + Q + KV, KV, s.v.data() + i * KV);
    }
  }
  Linear(l, Target::kQ, L.wq, s.xn1.data(), M, s.q.data(), s.lora_u[int(Target::kQ)]);
  Linear(l, Target::kK, L.wk, s.xn1.data(), M, s.k.data(), s.lora_u[int(Target::kK)]);
  Linear(l, Target::kV, L.wv, s.xn1.data(), M, s.v.data(), s.lora_u[int(Target::kV)]);
  // The backward recomputes xn1 from x_in (one norm per row, bit-identical)
  // rather than keeping [M, D] through the layer's whole backward.
  Release(s.xn1);
  auto add_bias = [&](std::vector<Real>& y, const float* bias, int64_t N) {
    if (!bias) return;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t n = 0; n < N; ++n) y[i * N + n] += Real(bias[n]);
  };
  add_bias(s.q, L.bq, Q);
  add_bias(s.k, L.bk, KV);
  add_bias(s.v, L.bv, KV);
  if (L.q_norm) {
    s.q_pre = s.q;
    s.k_pre = s.k;
    NormRows(M, [&](int64_t i) {
      for (int h = 0; h < c_.n_heads; ++h) {
        Real* qh = s.q.data() + i * Q + h * Dh;
        kernels::RmsNormRow(qh, L.q_norm, off, eps, Dh, qh);
      }
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        Real* kh = s.k.data() + i * KV + h * Dh;
        kernels::RmsNormRow(kh, L.k_norm, off, eps, Dh, kh);
      }
    });
  }
  const kernels::RopeTable& rope = Rope(l);
  ForRows(M, [&](int64_t i) {
    kernels::RopeRotate(s.q.data() + i * Q, c_.n_heads, c_.head_dim, c_.rope_dim, rope, b.pos[i],
                        c_.rope_style, 1);
    kernels::RopeRotate(s.k.data() + i * KV, c_.n_kv_heads, c_.head_dim, c_.rope_dim, rope,
                        b.pos[i], c_.rope_style, 1);
  });
  s.att.resize(M * Q);
  s.lse.resize(M * c_.n_heads);
  const kernels::TrainAttentionShape shape{
      c_.n_heads,    c_.n_kv_heads,   c_.head_dim,
      c_.attn_scale, c_.attn_softcap, c_.layer_sliding[l] ? c_.sliding_window : 0};
  if constexpr (std::is_same_v<Real, float>) {  // training: the fast route
    PhaseTimer timer(Phase(&StepProfile::attention_s));
    kernels::AttentionTrainForwardFast(shape, s.q.data(), s.k.data(), s.v.data(), b.pos.data(),
                                       b.visible.data(), M, s.att.data(), s.lse.data(), pool_);
  } else {  // the FD oracle: the scalar template
    auto attend = [&](int64_t h0, int64_t h1, int) {
      kernels::AttentionTrainForward(shape, s.q.data(), s.k.data(), s.v.data(), b.pos.data(),
                                     b.visible.data(), M, s.att.data(), s.lse.data(), int(h0),
                                     int(h1));
    };
    if (pool_)
      pool_->ParallelFor(c_.n_kv_heads, attend);
    else
      attend(0, c_.n_kv_heads, 0);
  }

  std::vector<Real> o(M * D);
  Linear(l, Target::kO, L.wo, s.att.data(), M, o.data(), s.lora_u[int(Target::kO)]);
  add_bias(o, L.bo, D);
  if (!keep_saved) Release(s.att, s.q, s.k, s.v, s.lse, s.q_pre, s.k_pre);
  AddBlockOutput(L.post_attn_norm, o, s.o_pre, x);
  const std::vector<int64_t> chunks = MlpChunks(M);
  std::vector<Real> xn2;
  if (partial) {  // x_mid is x; the FFN is saved (unchunked) or recomputed (chunked)
    Release(o);
    s.x_mid = std::move(xv);
    xv.clear();
    if (chunks.size() == 2) {
      FfnNorm(l, s.x_mid.data(), M, xn2);
      FfnRows(l, xn2.data(), M, s.g, s.u, s.h, s.lora_u, nullptr);
    }
    return;
  }
  if (keep_saved) s.x_mid.assign(x, x + M * D);
  std::vector<Real>& d = o;  // reuse [M, D]
  if (chunks.size() == 2) {
    FfnNorm(l, x, M, xn2);
    FfnRows(l, xn2.data(), M, s.g, s.u, s.h, s.lora_u, d.data());
  } else {  // --mlp-chunk: [T, D] and [T, F] intermediates only; the backward recomputes them
    std::vector<Real> g, u, h, lu[kNumTargets];
    for (size_t c = 0; c + 1 < chunks.size(); ++c) {
      const int64_t t0 = chunks[c], n = chunks[c + 1] - t0;
      row0_ = t0;
      FfnNorm(l, x + t0 * D, n, xn2);
      FfnRows(l, xn2.data(), n, g, u, h, lu, d.data() + t0 * D);
    }
    row0_ = 0;
    s.g.clear();
    s.u.clear();
    s.h.clear();
    for (Target t : {Target::kGate, Target::kUp, Target::kDown}) s.lora_u[int(t)].clear();
  }
  Release(xn2);
  if (!keep_saved) Release(s.g, s.u, s.h, s.o_pre);
  AddBlockOutput(L.post_ffn_norm, d, s.d_pre, x);
  if (!keep_saved) Release(s.d_pre);
}

template <class Real>
void Graph<Real>::Embed(const PackedBatch& b, std::vector<Real>& x) const {
  const int64_t M = b.size(), D = c_.dim;
  x.assign(M * D, Real(0));
  std::vector<float> row(D);
  for (int64_t i = 0; i < M; ++i) {
    kernels::DequantizeMatrixRow(w_.tok_embd, b.tokens[i], row.data());
    for (int64_t k = 0; k < D; ++k) x[i * D + k] = Real(row[k]) * Real(embed_scale_);
  }
}

template <class Real>
const std::vector<Real>& Graph<Real>::Forward(const PackedBatch& b, const LoraParams<Real>* params,
                                              DropoutKey key, bool keep) {
  params_ = params;
  lora_scale_ = params && layout_ ? layout_->cfg.Scale() : 0.0f;
  key_ = key;
  keep_ = keep;
  Embed(b, hidden_);
  const bool segmented = keep && segment_ > 0;
  if (segmented) {
    saved_.clear();
    boundaries_.resize((c_.n_layers + segment_ - 1) / segment_);
  } else if (keep) {
    saved_.resize(c_.n_layers);
  }
  for (int l = 0; l < c_.n_layers; ++l) {
    if (segmented && l > 0 && l % segment_ == 0)  // the first is the embedding, recomputed
      boundaries_[l / segment_].assign(hidden_.begin(), hidden_.end());
    Layer(l, b, hidden_, keep && !segmented ? saved_[l] : scratch_, keep && !segmented);
  }
  if (segmented) scratch_ = LayerSaved();  // the backward recomputes into saved_
  return hidden_;
}

template <class Real>
void Graph<Real>::LayerBackward(int l, const PackedBatch& b, LayerSaved& s, Real* dx,
                                LoraParams<Real>& grad) {
  const int64_t M = b.size(), D = c_.dim, Q = c_.q_dim(), KV = c_.kv_dim();
  const int64_t Dh = c_.head_dim;
  const LayerWeights& L = w_.layers[l];
  const float off = c_.norm_offset, eps = c_.norm_eps;
  const bool need_dx = l > layout_->first_layer;  // nothing below the lowest adapted layer learns

  // FFN: x_out = x_mid + rs * post_norm(down(act(gate(xn2)) * up(xn2)))
  std::vector<Real> dd;
  const Real* ddp = BlockOutputBackward(L.post_ffn_norm, s.d_pre, dx, M, dd);
  // The FFN norm's backward of rows [t0, t0 + n) into dx; every row is its
  // own, so chunks may run it as they finish (ddp's later rows are unread).
  auto ffn_norm_backward = [&](int64_t t0, int64_t n, const Real* dxn_rows) {
    NormRows(n, [&](int64_t i) {
      kernels::RmsNormRowBackward(s.x_mid.data() + (t0 + i) * D, L.ffn_norm, off, eps, D,
                                  dxn_rows + i * D, dx + (t0 + i) * D);
    });
  };
  std::vector<Real> dxn, xn2;
  const std::vector<int64_t> chunks = MlpChunks(M);
  if (chunks.size() == 2) {
    FfnNorm(l, s.x_mid.data(), M, xn2);
    dxn.assign(M * D, Real(0));
    FfnBackwardRows(l, xn2.data(), M, s.g, s.u, s.h, s.lora_u, ddp, dxn.data(), grad);
    Release(s.g, s.u, s.h, xn2);
    ffn_norm_backward(0, M, dxn.data());
  } else {  // recompute each chunk's norm and intermediates, then backpropagate through it
    std::vector<Real> g, u, h, lu[kNumTargets];
    for (size_t c = 0; c + 1 < chunks.size(); ++c) {
      const int64_t t0 = chunks[c], n = chunks[c + 1] - t0;
      row0_ = t0;
      FfnNorm(l, s.x_mid.data() + t0 * D, n, xn2);  // one chunk's rows, not [M, D]
      FfnRows(l, xn2.data(), n, g, u, h, lu, nullptr);
      dxn.assign(n * D, Real(0));
      FfnBackwardRows(l, xn2.data(), n, g, u, h, lu, ddp + t0 * D, dxn.data(), grad);
      ffn_norm_backward(t0, n, dxn.data());
    }
    row0_ = 0;
  }
  // Each saved tensor is released once the backward has passed its last use,
  // so the layer's working set shrinks as the backward moves down it.
  Release(dxn, xn2, s.d_pre, s.x_mid, s.lora_u[int(Target::kGate)], s.lora_u[int(Target::kUp)],
          s.lora_u[int(Target::kDown)]);

  // Attention: x_mid = x_in + rs * post_norm(o(attn(rope(q), rope(k), v)))
  std::vector<Real>& dob = dd;
  const Real* dobp = BlockOutputBackward(L.post_attn_norm, s.o_pre, dx, M, dob);
  std::vector<Real> datt(M * Q, Real(0));
  LinearBackward(l, Target::kO, L.wo, s.att.data(), s.lora_u[int(Target::kO)].data(), dobp, M,
                 datt.data(), grad);
  Release(dob, s.o_pre, s.lora_u[int(Target::kO)]);
  std::vector<Real> dq(M * Q, Real(0)), dk(M * KV, Real(0)), dv(M * KV, Real(0));
  const kernels::TrainAttentionShape shape{
      c_.n_heads,    c_.n_kv_heads,   c_.head_dim,
      c_.attn_scale, c_.attn_softcap, c_.layer_sliding[l] ? c_.sliding_window : 0};
  if constexpr (std::is_same_v<Real, float>) {
    PhaseTimer timer(Phase(&StepProfile::attention_s));
    kernels::AttentionTrainBackwardFast(shape, s.q.data(), s.k.data(), s.v.data(), b.pos.data(),
                                        b.visible.data(), M, s.att.data(), s.lse.data(),
                                        datt.data(), dq.data(), dk.data(), dv.data(), pool_);
  } else {
    auto attend = [&](int64_t h0, int64_t h1, int) {
      kernels::AttentionTrainBackward(shape, s.q.data(), s.k.data(), s.v.data(), b.pos.data(),
                                      b.visible.data(), M, s.att.data(), s.lse.data(), datt.data(),
                                      dq.data(), dk.data(), dv.data(), int(h0), int(h1));
    };
    if (pool_)
      pool_->ParallelFor(c_.n_kv_heads, attend);
    else
      attend(0, c_.n_kv_heads, 0);
  }
  Release(datt, s.att, s.q, s.k, s.v, s.lse);
  const kernels::RopeTable& rope = Rope(l);
  ForRows(M, [&](int64_t i) {
    kernels::RopeRotate(dq.data() + i * Q, c_.n_heads, c_.head_dim, c_.rope_dim, rope, b.pos[i],
                        c_.rope_style, -1);
    kernels::RopeRotate(dk.data() + i * KV, c_.n_kv_heads, c_.head_dim, c_.rope_dim, rope, b.pos[i],
                        c_.rope_style, -1);
  });
  if (L.q_norm) {
    std::vector<Real> dq_pre(M * Q, Real(0)), dk_pre(M * KV, Real(0));
    NormRows(M, [&](int64_t i) {
      for (int h = 0; h < c_.n_heads; ++h) {
        const int64_t o = i * Q + h * Dh;
        kernels::RmsNormRowBackward(s.q_pre.data() + o, L.q_norm, off, eps, Dh, dq.data() + o,
                                    dq_pre.data() + o);
      }
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        const int64_t o = i * KV + h * Dh;
        kernels::RmsNormRowBackward(s.k_pre.data() + o, L.k_norm, off, eps, Dh, dk.data() + o,
                                    dk_pre.data() + o);
      }
    });
    dq.swap(dq_pre);
    dk.swap(dk_pre);
  }
  dxn.assign(M * D, Real(0));
  s.xn1.resize(M * D);
  NormRows(M, [&](int64_t i) {
    kernels::RmsNormRow(s.x_in.data() + i * D, L.attn_norm, off, eps, D, s.xn1.data() + i * D);
  });
  LinearBackward(l, Target::kQ, L.wq, s.xn1.data(), s.lora_u[int(Target::kQ)].data(), dq.data(), M,
                 dxn.data(), grad);
  LinearBackward(l, Target::kK, L.wk, s.xn1.data(), s.lora_u[int(Target::kK)].data(), dk.data(), M,
                 dxn.data(), grad);
  LinearBackward(l, Target::kV, L.wv, s.xn1.data(), s.lora_u[int(Target::kV)].data(), dv.data(), M,
                 dxn.data(), grad);
  Release(s.xn1, s.lora_u[int(Target::kQ)], s.lora_u[int(Target::kK)], s.lora_u[int(Target::kV)]);
  if (L.wqkv.valid()) {
    const int64_t QKV = Q + 2 * KV;
    std::vector<Real> dqkv(M * QKV);
    for (int64_t i = 0; i < M; ++i) {
      std::copy_n(dq.data() + i * Q, Q, dqkv.data() + i * QKV);
      std::copy_n(dk.data() + i * KV, KV, dqkv.data() + i * QKV + Q);
      std::copy_n(dv.data() + i * KV, KV, dqkv.data() + i * QKV + Q + KV);
    }
    PhaseTimer timer(Phase(&StepProfile::products_s));
    Probe(ProbeSite::kProductTDy, dqkv.data(), M * QKV);
    FrozenProductT(L.wqkv, dqkv.data(), M, dxn.data(), pool_, Bf16(kFrozenBackward));
  }
  if (!need_dx) return;
  NormRows(M, [&](int64_t i) {
    kernels::RmsNormRowBackward(s.x_in.data() + i * D, L.attn_norm, off, eps, D, dxn.data() + i * D,
                                dx + i * D);
  });
}

template <class Real>
void Graph<Real>::Backward(const PackedBatch& b, const LoraParams<Real>& params,
                           std::vector<Real> dx, LoraParams<Real>& grad) {
  LUMEN_CHECK(keep_ && layout_ && params_ == &params);
  LUMEN_CHECK(int64_t(dx.size()) == b.size() * c_.dim);
  std::vector<Real>().swap(hidden_);
  if (segment_ == 0) {
    for (int l = c_.n_layers - 1; l >= layout_->first_layer; --l) {
      LayerBackward(l, b, saved_[l], dx.data(), grad);
      saved_[l] = LayerSaved();
    }
    return;
  }
  saved_.resize(segment_);
  for (int sg = int(boundaries_.size()) - 1; sg >= 0; --sg) {
    const int l0 = sg * segment_, l1 = std::min(l0 + segment_, c_.n_layers);
    if (l1 <= layout_->first_layer) break;
    {  // the boundary is spent once its segment is recomputed
      std::vector<Real> x = std::move(boundaries_[sg]);
      if (sg == 0) Embed(b, x);
      for (int l = l0; l < l1; ++l)
        Layer(l, b, x, saved_[l - l0], /*keep_saved=*/true, /*output=*/l + 1 < l1);
    }
    for (int l = l1 - 1; l >= std::max(l0, layout_->first_layer); --l) {
      LayerBackward(l, b, saved_[l - l0], dx.data(), grad);
      saved_[l - l0] = LayerSaved();
    }
  }
  saved_.clear();
  boundaries_.clear();
}

template class Graph<float>;
template class Graph<double>;

}  // namespace lumen::train
