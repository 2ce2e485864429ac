// The LM head as a unit of its own: hidden [M, D] -> per-token log-prob of
// each token's target (final norm, logit scale, W_out, final soft-cap,
// log-softmax), and back: d loss / d logp [M] -> d loss / d hidden [M, D].
// Objectives only see log-probs, so the fused linear cross-entropy head (which
// never holds [M, V]) replaces this one without touching them.
//
// PlainHead keeps the logits of the scored rows ([R, V], R = tokens with a
// target) between Forward and Backward.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "lumen/core/thread_pool.h"
#include "lumen/model/config.h"
#include "lumen/model/weights.h"
#include "lumen/train/batch.h"
#include "lumen/train/range_probe.h"

namespace lumen::train {

// The interface every head implements (plain, fused linear cross-entropy).
template <class Real>
class Head {
 public:
  virtual ~Head() = default;
  // logp [M] (0 where the token has no target). grad: a Backward follows
  // (a head may then do part of the backward's work in this pass); without
  // it Backward still works, at whatever a head's recomputation costs.
  virtual void Forward(const Real* hidden, const PackedBatch& b, std::vector<Real>& logp,
                       bool grad) = 0;
  // dlogp [M] -> dhidden [M, D] (overwritten; zero rows where no target).
  virtual void Backward(const Real* dlogp, std::vector<Real>& dhidden) = 0;
  // Bytes the head keeps between Forward and Backward.
  virtual size_t saved_bytes() const = 0;
  // bf16: the logit and dh products take bf16 operands (compute.h,
  // kHeadChunks; Real = double ignores it). probe: records the normed hiddens
  // and the coefficients entering the products (range_probe.h); null: off.
  void set_compute(bool bf16, RangeProbe* probe) {
    bf16_ = bf16;
    probe_ = probe;
  }

 protected:
  void Probe(ProbeSite site, const Real* v, int64_t n) {
    if constexpr (std::is_same_v<Real, float>)
      if (probe_) probe_->Record(site, v, n);
  }
  bool bf16_ = false;
  RangeProbe* probe_ = nullptr;
};

// The scored rows of a batch (tokens with a target) and their targets.
inline void ScoredRows(const PackedBatch& b, std::vector<int64_t>& rows,
                       std::vector<int32_t>& targets) {
  rows.clear();
  targets.clear();
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.targets[i] >= 0) {
      rows.push_back(i);
      targets.push_back(b.targets[i]);
    }
}

template <class Real>
class PlainHead final : public Head<Real> {
 public:
  PlainHead(const model::ModelConfig& c, const model::Weights& w, ThreadPool* pool)
      : c_(c), w_(w), pool_(pool) {}
  void Forward(const Real* hidden, const PackedBatch& b, std::vector<Real>& logp,
               bool grad) override;
  void Backward(const Real* dlogp, std::vector<Real>& dhidden) override;
  size_t saved_bytes() const override {
    return (logits_.size() + xn_.size() + h_.size()) * sizeof(Real);
  }

 private:
  const model::ModelConfig& c_;
  const model::Weights& w_;
  ThreadPool* pool_;
  int64_t M_ = 0;
  std::vector<int64_t> rows_;     // [R] packed index of each scored row
  std::vector<int32_t> targets_;  // [R]
  std::vector<Real> h_;           // [R, D] hidden of scored rows
  std::vector<Real> xn_;          // [R, D] normed (and scaled) hidden
  std::vector<Real> logits_;      // [R, V] after the soft-cap
  std::vector<Real> lse_;         // [R]
};

extern template class PlainHead<float>;
extern template class PlainHead<double>;

}  // namespace lumen::train
