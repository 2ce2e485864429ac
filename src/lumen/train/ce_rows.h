// The per-row softmax work of the cross-entropy heads (head.cc, fused_head.cc)
// over a span of logits: the running logsumexp and the coefficients
// -g softmax + g onehot. Float rows use the vectorized exp and sums of
// kernels/vecmath.h (every vocabulary element passes through here twice per
// step, so a scalar std::exp per element was a visible share of the head);
// double rows (the finite-difference oracle) keep std::exp in a plain loop.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "lumen/kernels/vecmath.h"

namespace lumen::train {

// (mx, sum) <- the running max and sum of exp(z - mx) over the logits seen so
// far, extended by z [n] (mx = -inf, sum = 0 before the first span).
template <class Real>
void LseUpdate(const Real* z, int64_t n, Real& mx, Real& sum) {
  if constexpr (std::is_same_v<Real, float>) {
    const float m = std::max(mx, kernels::MaxF32(z, size_t(n)));
    const double s = kernels::ExpShiftSum(z, size_t(n), m, nullptr, nullptr);
    sum = float(double(sum) * std::exp(double(mx) - double(m)) + s);
    mx = m;
  } else {
    const Real m = std::max(mx, *std::max_element(z, z + n));
    Real s = sum * std::exp(mx - m);
    for (int64_t v = 0; v < n; ++v) s += std::exp(z[v] - m);
    mx = m;
    sum = s;
  }
}

// co[v] = (-g exp(z[v] - lse) + (v == t ? g : 0)) * (cap > 0 ? 1 - (z[v] / cap)^2 : 1)
// for v in [0, n): the logits' cotangent given the log-prob's cotangent g, with
// the soft-cap's backward (z are the capped logits). t outside [0, n): no
// target in this span. co may be z. e: scratch of n elements (float rows).
// Returns max |co|.
template <class Real>
Real CeCoefficients(const Real* z, int64_t n, Real g, Real lse, int64_t t, float cap, Real* co,
                    Real* e) {
  if constexpr (std::is_same_v<Real, float>) {
    kernels::ExpShiftSum(z, size_t(n), lse, e, nullptr);
  } else {
    for (int64_t v = 0; v < n; ++v) e[v] = std::exp(z[v] - lse);
  }
  Real cmax = 0;
  for (int64_t v = 0; v < n; ++v) {
    Real c = -g * e[v];
    if (v == t) c += g;
    if (cap > 0) {
      const Real tc = z[v] / Real(cap);
      c *= Real(1) - tc * tc;
    }
    co[v] = c;
    cmax = std::max(cmax, std::abs(c));
  }
  return cmax;
}

}  // namespace lumen::train
