// The training forward and backward of every supported dense family over a
// PackedBatch, with LoRA on the chosen targets and every base weight frozen
// (any storage type: products through W use kernels::MatMul and, backward,
// kernels::MatMulT, which decode W on the fly; on the f32 route a target's
// LoRA term rides in those products' epilogue, kernels::MatMulLowRank and
// MatMulTLowRank, see set_lora_epilogue; with set_bf16 the bf16-operand
// routes of train/compute.h).
//
// Real = float is the training route; Real = double is the finite-difference
// oracle (frozen rows decoded to f32, arithmetic in double): the same code at
// both precisions, so an FD check in double covers what trains.
//
// Forward(batch) returns the final residual stream [M, D] (before the final
// norm: the head, train/head.h, owns that); Backward(dhidden) accumulates the
// LoRA gradients into `grad` (same layout as the parameters). The forward
// keeps per layer what the backward needs (LayerSaved); LoRA dropout masks
// are a hash of (seed, step, layer, target, token, column), so a recomputed
// forward is bit-identical.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/rope.h"
#include "lumen/model/config.h"
#include "lumen/model/weights.h"
#include "lumen/train/batch.h"
#include "lumen/train/compute.h"
#include "lumen/train/lora.h"
#include "lumen/train/range_probe.h"
#include "lumen/train/step_profile.h"

namespace lumen::train {

// Identifies a step's dropout masks.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t step = 0;
};

template <class Real>
class Graph {
 public:
  // lora may be null (base model only, e.g. reference log-probs).
  Graph(const model::ModelConfig& c, const model::Weights& w, const LoraLayout* layout,
        ThreadPool* pool);

  // params: null or scale 0 runs the base model. keep: save activations for
  // Backward. Returns hidden [M, D].
  const std::vector<Real>& Forward(const PackedBatch& b, const LoraParams<Real>* params,
                                   DropoutKey key, bool keep);
  // dhidden [M, D] -> grad += d loss / d params. Needs a Forward with keep;
  // releases the Forward's hidden (the head is done with it) and every saved
  // activation as soon as the backward has passed it, so the peak holds one
  // layer's working set. The vector form takes dhidden's storage as its
  // running gradient instead of a copy.
  void Backward(const PackedBatch& b, const LoraParams<Real>& params, std::vector<Real> dhidden,
                LoraParams<Real>& grad);
  void Backward(const PackedBatch& b, const LoraParams<Real>& params, const Real* dhidden,
                LoraParams<Real>& grad) {
    Backward(b, params, std::vector<Real>(dhidden, dhidden + b.size() * c_.dim), grad);
  }

  // Bytes held by the saved activations of the last Forward (for reports).
  size_t saved_bytes() const;

  // Segmented backward (--segment N): a keeping Forward saves only the
  // residual entering every N-th layer; Backward recomputes one segment of N
  // layers from its boundary and backpropagates through it, so one segment's
  // activations live at a time. Recomputation is the same code on the same
  // inputs (dropout masks are hashes), so gradients are bit-identical (L1).
  // 0: keep every layer's activations.
  void set_segment(int n) { segment_ = n; }
  // Sequence-chunked MLP (--mlp-chunk T): the FFN runs T tokens at a time and
  // keeps no [M, F] intermediates; the backward recomputes each chunk's. Per
  // token the arithmetic is the same (L1 activations and log-probs); LoRA
  // gradients of gate/up/down sum over tokens in chunks (L2). 0: off.
  // T below 8 is raised to 8 (see MlpChunks).
  void set_mlp_chunk(int64_t t) { mlp_chunk_ = t > 0 ? std::max<int64_t>(t, 8) : 0; }
  // Phase timers (attention, products, norms) add to p's seconds; null: off.
  void set_profile(StepProfile* p) { profile_ = p; }
  // The products that take bf16 operands (compute.h: a mask of ProductKind,
  // kFrozenForward, kFrozenBackward, kLoraProducts); 0, the default: all f32.
  // Real = double ignores it.
  void set_bf16(uint32_t kinds) { bf16_ = kinds; }
  // The fused LoRA epilogue (kernels/matmul.h MatMulLowRank, MatMulTLowRank):
  // on, the default, the f32 route adds each target's rank-r term inside the
  // frozen product's output tiles, forward and backward; off, it adds it in a
  // second pass (the unfused order, for tests and measurements). Targets
  // without a frozen product of their own (Phi3's fused q/k/v, gate/up), the
  // bf16 routes and Real = double always take the second pass.
  void set_lora_epilogue(bool on) { lora_epilogue_ = on; }
  // Records the operands of every product (range_probe.h); null: off.
  void set_probe(RangeProbe* p) { probe_ = p; }
  // Adds the useful FLOPs of one Forward and Backward of b (step_profile.h):
  // frozen and LoRA products forward and dX backward, attention's two
  // forward and four backward products over the visible pairs.
  void AddStepFlops(const PackedBatch& b, StepProfile& p) const;

 private:
  struct LayerSaved {
    std::vector<Real> x_in, xn1, q_pre, k_pre, q, k, v, att, lse, o_pre, x_mid, g, u, h, d_pre;
    std::vector<Real> lora_u[kNumTargets];  // A x per target [M, r]
  };
  // x [M, D] = the scaled token embeddings of b.
  void Embed(const PackedBatch& b, std::vector<Real>& x) const;
  // keep_saved = false: a forward whose backward will not read s (no
  // gradient, or segmented: the backward recomputes the layer), so s holds
  // only the working buffers, each freed after its last use.
  // Updates x [M, D] in place to the layer's output. With output = false
  // (a segment's top layer recomputed for its backward, keep_saved) no one
  // reads that output: the layer stops where the backward's needs end (the
  // FFN's saved set; with --mlp-chunk, which recomputes the FFN in the
  // backward, right after attention) and x's buffer becomes s.x_mid (x is
  // left empty). Families with a post-FFN norm need the down product and run
  // whole. Neither norm's output is kept: the backward recomputes xn1 from
  // x_in and xn2 from x_mid (per MLP chunk), bit-identical.
  void Layer(int l, const PackedBatch& b, std::vector<Real>& x, LayerSaved& s, bool keep_saved,
             bool output = true);
  void LayerBackward(int l, const PackedBatch& b, LayerSaved& s, Real* dx, LoraParams<Real>& grad);
  void AddBlockOutput(const float* post_norm, std::vector<Real>& out, std::vector<Real>& pre,
                      Real* x);
  // The cotangent of a block's output before the residual scale and post
  // norm: in dout, or dx itself when there is neither (no copy; dout cleared).
  const Real* BlockOutputBackward(const float* post_norm, const std::vector<Real>& pre,
                                  const Real* dx, int64_t M, std::vector<Real>& dout);
  // The dropout multipliers of a target's [M, K] input (0 or 1 / (1 - p)).
  std::vector<Real> DropMask(int l, Target t, int64_t M, int64_t K);
  // u [M, r] = A drop(x) for the target's LoRA; null (u cleared) when none.
  const LoraSlot* LoraInput(int l, Target t, const Real* x, int64_t M, std::vector<Real>& u);
  // y [M, N] = x W^T + s B (A drop(x)); saves A drop(x) in u.
  void Linear(int l, Target t, const model::Matrix& W, const Real* x, int64_t M, Real* y,
              std::vector<Real>& u);
  // dx [M, K] += dy W + s (dy B) A (dropout-masked); grads of A and B.
  void LinearBackward(int l, Target t, const model::Matrix& W, const Real* x, const Real* u,
                      const Real* dy, int64_t M, Real* dx, LoraParams<Real>& grad);
  // Its f32 LoRA part; fused: also dx += dy W (the frozen product not yet done).
  void LinearBackwardF32(const LoraSlot& slot, const model::Matrix& W, const Real* x, const Real* u,
                         const Real* dy, int64_t M, Real* dx, LoraParams<Real>& grad,
                         std::vector<Real> mask, bool fused);
  // True when a target's f32 LoRA term goes in its frozen product's epilogue.
  bool FusedLora(bool has_product, bool frozen_bf16) const {
    return std::is_same_v<Real, float> && lora_epilogue_ && has_product && !frozen_bf16 &&
           layout_ && !LoraBf16(layout_->cfg.rank);
  }
  // xn [n, D] = the FFN norm of x_mid's rows [n, D] (resized).
  void FfnNorm(int l, const Real* x_mid, int64_t n, std::vector<Real>& xn);
  // The FFN of n rows: g, u, h [n, F] (resized), A x per target in lu[], d [n, D]
  // (d null: skip the down product, as the backward's recompute does).
  void FfnRows(int l, const Real* xn2, int64_t n, std::vector<Real>& g, std::vector<Real>& u,
               std::vector<Real>& h, std::vector<Real>* lu, Real* d);
  // dxn [n, D] += the FFN's backward from dd [n, D].
  void FfnBackwardRows(int l, const Real* xn2, int64_t n, const std::vector<Real>& g,
                       const std::vector<Real>& u, const std::vector<Real>& h,
                       const std::vector<Real>* lu, const Real* dd, Real* dxn,
                       LoraParams<Real>& grad);
  std::vector<int64_t> MlpChunks(int64_t M) const;
  const kernels::RopeTable& Rope(int l) const;
  double* Phase(double StepProfile::*field) { return profile_ ? &(profile_->*field) : nullptr; }
  bool Bf16(uint32_t kind) const { return std::is_same_v<Real, float> && (bf16_ & kind) != 0; }
  void Probe(ProbeSite site, const Real* v, int64_t n) {
    if constexpr (std::is_same_v<Real, float>)
      if (probe_) probe_->Record(site, v, n);
  }
  // True when a LoRA product with this reduction length takes bf16 operands
  // (compute.h's rule).
  bool LoraBf16(int64_t reduction) const {
    return Bf16(kLoraProducts) && reduction >= kLoraBf16MinReduction;
  }
  // LoRA's bf16 products, P [N, K] dense: y [M, N] = x [M, K] P^T, and
  // dx [M, K] = dy [M, N] P (both overwritten). Real = float only.
  void LoraProductBf16(const Real* P, int64_t N, int64_t K, const Real* x, int64_t M, Real* y);
  void LoraProductTBf16(const Real* P, int64_t N, int64_t K, const Real* dy, int64_t M, Real* dx);
  template <class Fn>
  void ForRows(int64_t M, Fn&& fn);
  template <class Fn>
  void NormRows(int64_t M, Fn&& fn);  // ForRows, timed as norms

  const model::ModelConfig& c_;
  const model::Weights& w_;
  const LoraLayout* layout_;
  ThreadPool* pool_;
  const LoraParams<Real>* params_ = nullptr;
  float lora_scale_ = 0.0f;
  DropoutKey key_;
  bool keep_ = false;
  kernels::RopeTable rope_global_, rope_local_;
  float embed_scale_;
  std::vector<LayerSaved> saved_;
  int segment_ = 0;
  int64_t mlp_chunk_ = 0;
  StepProfile* profile_ = nullptr;
  uint32_t bf16_ = 0;
  bool lora_epilogue_ = true;
  RangeProbe* probe_ = nullptr;
  int64_t row0_ = 0;  // first packed row of the rows a Linear sees (dropout keys)
  // [segments][M, D] residual entering each; the first stays empty (the
  // embedding is recomputed from the tokens).
  std::vector<std::vector<Real>> boundaries_;
  LayerSaved scratch_;  // the layer's buffers when nothing is kept
  std::vector<Real> hidden_;
};

extern template class Graph<float>;
extern template class Graph<double>;

}  // namespace lumen::train
