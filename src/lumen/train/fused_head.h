// The fused linear cross-entropy head: the same contract as PlainHead (head.h)
// without ever holding the [M, V] logits.
//
// Forward, per block of scored rows: normalize the hidden rows, then for each
// vocabulary chunk compute the chunk's logits h W_chunk^T (W decoded chunk by
// chunk from any storage), soft-cap them, and fold them into a running max and
// sum per row (online logsumexp; the target's logit picked up when it falls in
// the chunk and its term summed apart, last). Saves one lse per row and a
// pointer to the caller's hidden.
//
// With grad (a Backward follows), the same pass also makes the backward's
// product: d logp / d xn = c'_t W_t - sum_v p_v c'_v W_v (p the softmax, c'
// the soft-cap's derivative, t the target) is accumulated chunk by chunk as
// u += e W_chunk with e = exp(z - running max) c' (the target's own term left
// out), u rescaled with the max as the sum is, so that at the end
// d logp / d xn = (s_t' / s) c'_t W_t - u / s (s: the whole sum, s_t': the
// sum without the target; no difference of nearly equal vectors where p_t is
// near 1). Backward is then g times that row and the norm's backward: the
// logits are computed once per step, not twice. Extra memory: lse [R], that
// [R, D] until Backward, and one [row_block, vocab_chunk] scratch.
//
// Without grad (evaluation, the reference model's sums) Forward keeps only
// lse, and a Backward after it recomputes each chunk's logits, forms coeff =
// g (onehot - e^(z - lse)) from the saved lse, and accumulates dxn += coeff
// W_chunk; then the norm's backward.
//
// skip_eps > 0 (tier L3, --ce-skip-eps): Forward keeps only lse, and in the
// recomputing Backward a chunk whose largest |coeff| in the block is below eps
// skips its dxn product (the recomputation still runs).
#pragma once

#include <cstdint>
#include <vector>

#include "lumen/train/head.h"

namespace lumen::train {

struct FusedHeadOptions {
  int64_t vocab_chunk = 8192;
  int64_t row_block = 128;
  float skip_eps = 0.0f;
};

template <class Real>
class FusedHead final : public Head<Real> {
 public:
  FusedHead(const model::ModelConfig& c, const model::Weights& w, ThreadPool* pool,
            FusedHeadOptions o = {})
      : c_(c), w_(w), pool_(pool), o_(o) {}
  // hidden must stay valid until Backward.
  void Forward(const Real* hidden, const PackedBatch& b, std::vector<Real>& logp,
               bool grad) override;
  void Backward(const Real* dlogp, std::vector<Real>& dhidden) override;
  size_t saved_bytes() const override {
    return (lse_.size() + dxn_.size()) * sizeof(Real) +
           rows_.size() * (sizeof(int64_t) + sizeof(int32_t)) +
           size_t(o_.row_block) * o_.vocab_chunk * sizeof(Real);
  }
  // Chunks whose dxn product ran (visited: in the last one-pass Forward or
  // recomputing Backward) and were skipped (skip_eps).
  int64_t skipped_chunks() const { return skipped_; }
  int64_t visited_chunks() const { return visited_; }

 private:
  // xn [n, D] for scored rows [r0, r0 + n).
  void NormRows(int64_t r0, int64_t n, Real* xn) const;
  // z [n, vn] = soft-capped logits of vocab rows [v0, v0 + vn) for xn [n, D].
  void ChunkLogits(const Real* xn, int64_t n, int64_t v0, int64_t vn, Real* z) const;
  // The backward from the saved lse alone: every chunk's logits recomputed.
  void BackwardRecomputing(const Real* dlogp, std::vector<Real>& dhidden);

  const model::ModelConfig& c_;
  const model::Weights& w_;
  ThreadPool* pool_;
  FusedHeadOptions o_;
  const Real* hidden_ = nullptr;
  int64_t M_ = 0;
  std::vector<int64_t> rows_;
  std::vector<int32_t> targets_;
  std::vector<Real> lse_;
  std::vector<Real> dxn_;  // [R, D] d logp / d xn (one-pass Forward; empty otherwise)
  int64_t skipped_ = 0, visited_ = 0;
};

extern template class FusedHead<float>;
extern template class FusedHead<double>;

}  // namespace lumen::train
