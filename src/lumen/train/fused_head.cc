#include "lumen/train/fused_head.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "lumen/core/route.h"
#include "lumen/kernels/matrix.h"
#include "lumen/kernels/train_ops.h"
#include "lumen/kernels/vecmath.h"
#include "lumen/train/ce_rows.h"
#include "lumen/train/frozen.h"
#include "lumen/train/pool_rows.h"

namespace lumen::train {

LUMEN_ROUTE(head_fused,
            {.node = "head.ce",
             .name = "fused-chunked",
             .tier = Tier::kL2,
             .oracle = "the plain head (f32) and finite differences (double)",
             .bound = "log-probs and dh within the relative L2 bound of fused_head_test.cc",
             .tests = "Models/FusedHeadTest.MatchesPlainHeadInF32/*;Models/"
                      "FusedHeadTest.BackwardMatchesFiniteDifferencesInDouble/*",
             .when = "train.fused_ce=on",
             .priority = 10});
LUMEN_ROUTE(head_fused_skip,
            {.node = "head.ce",
             .name = "fused-skip-eps",
             .tier = Tier::kL3,
             .oracle = "none: skipped chunks change dh; measured against the exact head",
             .bound = "cosine and relative error of dh, teacher-forced on stories260K",
             .tests = "CeSkip.MeasuredTeacherForcedOnStories260K",
             .measure = "docs/experiments/training-memory.md",
             .when = "train.fused_ce=on train.ce_skip=on",
             .priority = 20});

template <class Real>
void FusedHead<Real>::NormRows(int64_t r0, int64_t n, Real* xn) const {
  const int64_t D = c_.dim;
  for (int64_t r = 0; r < n; ++r) {
    kernels::RmsNormRow(hidden_ + rows_[r0 + r] * D, w_.output_norm, c_.norm_offset, c_.norm_eps, D,
                        xn + r * D);
    if (c_.logit_scale != 1.0f)
      for (int64_t k = 0; k < D; ++k) xn[r * D + k] *= Real(c_.logit_scale);
  }
}

template <class Real>
void FusedHead<Real>::ChunkLogits(const Real* xn, int64_t n, int64_t v0, int64_t vn,
                                  Real* z) const {
  FrozenProduct(w_.output.RowSlice(v0, v0 + vn), xn, n, z, pool_, this->bf16_);
  if (c_.final_softcap > 0) kernels::SoftCapForward(z, n * vn, c_.final_softcap);
}

template <class Real>
void FusedHead<Real>::Forward(const Real* hidden, const PackedBatch& b, std::vector<Real>& logp,
                              bool grad) {
  hidden_ = hidden;
  M_ = b.size();
  ScoredRows(b, rows_, targets_);
  const int64_t D = c_.dim, V = c_.vocab_size, R = int64_t(rows_.size());
  const int64_t RB = o_.row_block, VC = o_.vocab_chunk, ce = std::min(VC, V);
  const Real inf = std::numeric_limits<Real>::infinity();
  const float cap = c_.final_softcap;
  // One pass: the backward's product made here (skip_eps keeps the
  // recomputing backward, which it needs to skip chunks).
  const bool onepass = grad && o_.skip_eps <= 0;
  lse_.assign(R, Real(0));
  logp.assign(M_, Real(0));
  dxn_.assign(onepass ? R * D : 0, Real(0));
  dxn_.shrink_to_fit();
  if (onepass) skipped_ = visited_ = 0;
  const int threads = pool_ ? pool_->size() : 1;
  std::vector<Real> xn(std::min(RB, R) * D), z(std::min(RB, R) * ce);
  std::vector<Real> e(onepass && cap > 0 ? threads * ce : 0);
  std::vector<float> wt(onepass ? threads * D : 0);
  // Per row: the running max, the sum of exp(z - mx) without the target's
  // term, and the target's logit.
  std::vector<Real> mx, rest, tgt;
  for (int64_t r0 = 0; r0 < R; r0 += RB) {
    const int64_t n = std::min(RB, R - r0);
    Real* u = onepass ? dxn_.data() + r0 * D : nullptr;
    NormRows(r0, n, xn.data());
    this->Probe(ProbeSite::kHeadXn, xn.data(), n * D);
    mx.assign(n, -inf);
    rest.assign(n, Real(0));
    tgt.assign(n, -inf);
    for (int64_t v0 = 0; v0 < V; v0 += VC) {
      const int64_t vn = std::min(VC, V - v0);
      ChunkLogits(xn.data(), n, v0, vn, z.data());
      RowsOnPool(pool_, n, [&](int64_t r, int tid) {
        // One pass: the chunk's weights e overwrite its logits in place (the
        // soft-cap's derivative reads each capped logit first).
        Real* zr = z.data() + r * vn;
        const int64_t t = targets_[r0 + r] - v0;
        const bool here = t >= 0 && t < vn;
        Real m = mx[r];
        if constexpr (std::is_same_v<Real, float>) {
          m = std::max(m, kernels::MaxF32(zr, size_t(vn)));
        } else {
          for (int64_t v = 0; v < vn; ++v) m = std::max(m, zr[v]);
        }
        if (here) {
          tgt[r] = zr[t];
          zr[t] = -inf;  // the target's term stays out of rest and u (exp(-inf) = 0)
        }
        // The exps: not kept without one pass; in place without a soft-cap.
        Real* er = !onepass ? nullptr : cap > 0 ? e.data() + tid * ce : zr;
        double s = 0;
        if constexpr (std::is_same_v<Real, float>) {
          s = kernels::ExpShiftSum(zr, size_t(vn), m, er, nullptr);
        } else {
          for (int64_t v = 0; v < vn; ++v) {
            const Real x = std::exp(zr[v] - m);
            s += x;
            if (er) er[v] = x;
          }
        }
        const Real scale = std::exp(mx[r] - m);  // 0 before the first chunk
        rest[r] = Real(double(rest[r]) * double(scale) + s);
        mx[r] = m;
        if (!onepass) return;
        if (cap > 0) {
          for (int64_t v = 0; v < vn; ++v) {
            const Real tc = zr[v] / Real(cap);
            zr[v] = er[v] * (Real(1) - tc * tc);
          }
          if (here) zr[t] = 0;  // (not 0 x -inf)
        }
        if (scale != Real(1))
          for (int64_t k = 0; k < D; ++k) u[r * D + k] *= scale;
      });
      if (!onepass) continue;
      ++visited_;
      this->Probe(ProbeSite::kHeadCoeff, z.data(), n * vn);
      FrozenProductT(w_.output.RowSlice(v0, v0 + vn), z.data(), n, u, pool_, this->bf16_);
    }
    RowsOnPool(pool_, n, [&](int64_t r, int tid) {
      const Real s = rest[r] + std::exp(tgt[r] - mx[r]);
      lse_[r0 + r] = mx[r] + std::log(s);
      logp[rows_[r0 + r]] = tgt[r] - lse_[r0 + r];
      if (!onepass) return;
      Real ct = rest[r] / s;  // 1 - p_t, without the cancellation
      if (cap > 0) {
        const Real tc = tgt[r] / Real(cap);
        ct *= Real(1) - tc * tc;
      }
      float* w = wt.data() + tid * D;
      kernels::DequantizeMatrixRow(w_.output, targets_[r0 + r], w);
      Real* ur = u + r * D;
      for (int64_t k = 0; k < D; ++k) ur[k] = ct * Real(w[k]) - ur[k] / s;
    });
  }
}

template <class Real>
void FusedHead<Real>::Backward(const Real* dlogp, std::vector<Real>& dhidden) {
  if (dxn_.empty()) return BackwardRecomputing(dlogp, dhidden);
  const int64_t D = c_.dim, R = int64_t(rows_.size());
  dhidden.assign(M_ * D, Real(0));
  RowsOnPool(pool_, R, [&](int64_t r, int) {
    Real* dn = dxn_.data() + r * D;
    const Real g = dlogp[rows_[r]] * Real(c_.logit_scale);
    for (int64_t k = 0; k < D; ++k) dn[k] *= g;
    kernels::RmsNormRowBackward(hidden_ + rows_[r] * D, w_.output_norm, c_.norm_offset, c_.norm_eps,
                                D, dn, dhidden.data() + rows_[r] * D);
  });
  dxn_.clear();  // the layers' backward runs next: not held across it
  dxn_.shrink_to_fit();
}

template <class Real>
void FusedHead<Real>::BackwardRecomputing(const Real* dlogp, std::vector<Real>& dhidden) {
  const int64_t D = c_.dim, V = c_.vocab_size, R = int64_t(rows_.size());
  dhidden.assign(M_ * D, Real(0));
  skipped_ = visited_ = 0;
  const int64_t RB = o_.row_block, VC = o_.vocab_chunk;
  std::vector<Real> xn(std::min(RB, R) * D), dxn(std::min(RB, R) * D);
  std::vector<Real> z(std::min(RB, R) * std::min(VC, V));
  const int threads = pool_ ? pool_->size() : 1;
  const int64_t ce = std::min(VC, V);  // one chunk's row of exps per thread
  std::vector<Real> e(threads * ce), cmax(threads);
  for (int64_t r0 = 0; r0 < R; r0 += RB) {
    const int64_t n = std::min(RB, R - r0);
    NormRows(r0, n, xn.data());
    std::fill(dxn.begin(), dxn.begin() + n * D, Real(0));
    for (int64_t v0 = 0; v0 < V; v0 += VC) {
      const int64_t vn = std::min(VC, V - v0);
      ChunkLogits(xn.data(), n, v0, vn, z.data());
      std::fill(cmax.begin(), cmax.end(), Real(0));
      RowsOnPool(pool_, n, [&](int64_t r, int tid) {
        // coeff overwrites the logits in place (the soft-cap's backward reads
        // each capped logit before its coefficient replaces it).
        Real* zr = z.data() + r * vn;
        cmax[tid] = std::max(cmax[tid], CeCoefficients(zr, vn, dlogp[rows_[r0 + r]], lse_[r0 + r],
                                                       targets_[r0 + r] - v0, c_.final_softcap, zr,
                                                       e.data() + tid * ce));
      });
      ++visited_;
      if (o_.skip_eps > 0 && *std::max_element(cmax.begin(), cmax.end()) < Real(o_.skip_eps)) {
        ++skipped_;
        continue;
      }
      this->Probe(ProbeSite::kHeadCoeff, z.data(), n * vn);
      FrozenProductT(w_.output.RowSlice(v0, v0 + vn), z.data(), n, dxn.data(), pool_, this->bf16_);
    }
    for (int64_t r = 0; r < n; ++r) {
      Real* dn = dxn.data() + r * D;
      if (c_.logit_scale != 1.0f)
        for (int64_t k = 0; k < D; ++k) dn[k] *= Real(c_.logit_scale);
      kernels::RmsNormRowBackward(hidden_ + rows_[r0 + r] * D, w_.output_norm, c_.norm_offset,
                                  c_.norm_eps, D, dn, dhidden.data() + rows_[r0 + r] * D);
    }
  }
}

template class FusedHead<float>;
template class FusedHead<double>;

}  // namespace lumen::train
