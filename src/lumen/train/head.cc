#include "lumen/train/head.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lumen/core/route.h"
#include "lumen/kernels/train_ops.h"
#include "lumen/train/ce_rows.h"
#include "lumen/train/frozen.h"
#include "lumen/train/pool_rows.h"

namespace lumen::train {

LUMEN_ROUTE(head_plain, {.node = "head.ce",
                         .name = "plain",
                         .tier = Tier::kL2,
                         .oracle = "finite differences in double; torch float64",
                         .bound = "the GradientCheck and GoldenTrain bounds",
                         .tests = "Families/GradientCheck.EveryObjectiveMatchesFiniteDifferences/"
                                  "*;Golden/GoldenTrain.FloatRouteMatchesTorchFloat64/*",
                         .priority = 0});

template <class Real>
void PlainHead<Real>::Forward(const Real* hidden, const PackedBatch& b, std::vector<Real>& logp,
                              bool /*grad: the logits are kept either way*/) {
  const int64_t D = c_.dim, V = c_.vocab_size;
  M_ = b.size();
  ScoredRows(b, rows_, targets_);
  const int64_t R = int64_t(rows_.size());
  h_.resize(R * D);
  xn_.resize(R * D);
  for (int64_t r = 0; r < R; ++r) {
    std::copy(hidden + rows_[r] * D, hidden + (rows_[r] + 1) * D, h_.begin() + r * D);
    kernels::RmsNormRow(h_.data() + r * D, w_.output_norm, c_.norm_offset, c_.norm_eps, D,
                        xn_.data() + r * D);
    if (c_.logit_scale != 1.0f)
      for (int64_t k = 0; k < D; ++k) xn_[r * D + k] *= Real(c_.logit_scale);
  }
  logits_.resize(R * V);
  lse_.resize(R);
  logp.assign(M_, Real(0));
  if (R == 0) return;
  this->Probe(ProbeSite::kHeadXn, xn_.data(), R * D);
  FrozenProduct(w_.output, xn_.data(), R, logits_.data(), pool_, this->bf16_);
  if (c_.final_softcap > 0) kernels::SoftCapForward(logits_.data(), R * V, c_.final_softcap);
  RowsOnPool(pool_, R, [&](int64_t r, int) {
    const Real* z = logits_.data() + r * V;
    Real mx = -std::numeric_limits<Real>::infinity(), sum = 0;
    LseUpdate(z, V, mx, sum);
    lse_[r] = mx + std::log(sum);
    logp[rows_[r]] = z[targets_[r]] - lse_[r];
  });
}

template <class Real>
void PlainHead<Real>::Backward(const Real* dlogp, std::vector<Real>& dhidden) {
  const int64_t D = c_.dim, V = c_.vocab_size, R = int64_t(rows_.size());
  dhidden.assign(M_ * D, Real(0));
  if (R == 0) return;
  // d logp / d z_v = onehot - softmax, through the soft-cap's backward
  std::vector<Real> dz(R * V);
  const int threads = pool_ ? pool_->size() : 1;
  std::vector<Real> e(threads * V);
  RowsOnPool(pool_, R, [&](int64_t r, int tid) {
    CeCoefficients(logits_.data() + r * V, V, dlogp[rows_[r]], lse_[r], targets_[r],
                   c_.final_softcap, dz.data() + r * V, e.data() + tid * V);
  });
  std::vector<Real> dxn(R * D, Real(0));
  this->Probe(ProbeSite::kHeadCoeff, dz.data(), R * V);
  FrozenProductT(w_.output, dz.data(), R, dxn.data(), pool_, this->bf16_);
  for (int64_t r = 0; r < R; ++r) {
    Real* dn = dxn.data() + r * D;
    if (c_.logit_scale != 1.0f)
      for (int64_t k = 0; k < D; ++k) dn[k] *= Real(c_.logit_scale);
    kernels::RmsNormRowBackward(h_.data() + r * D, w_.output_norm, c_.norm_offset, c_.norm_eps, D,
                                dn, dhidden.data() + rows_[r] * D);
  }
}

template class PlainHead<float>;
template class PlainHead<double>;

}  // namespace lumen::train
