// HLG tone-curve sampling: the piecewise map g applied to z = l - mu, where l
// are log-probabilities and mu the pivot (docs/design/sampling.md):
//
//   g(z) = -m*w - m*bt*ln(1 + (-z - w)/bt)   z < -w   (toe)
//   g(z) =  m*z                              |z| <= w (mids)
//   g(z) =  m*w + m*bh*ln(1 + (z - w)/bh)    z > w    (shoulder)
//
// The sampler never evaluates g directly: it uses g(z) = m*z + HlgOffset(z),
// and m*z = m*l - m*mu, where the constant m*mu cancels in the softmax. So the
// score of a token is m*l + HlgOffset(z), and HlgOffset is exactly 0.0 in the
// mids and everywhere when the roll-off is off. That makes "rolloff off, m =
// 1/T" the same floating-point computation as plain temperature T (see
// Score() in sampler.h), which is the bit-exact degeneracy gate.
#pragma once

#include <cmath>

#include "lumen/sample/config.h"

namespace lumen::sample {

// g(z) - m*z; <= 0 above the mids, >= 0 below, 0 inside (and when !rolloff).
// Written in the "u - b*log1p(u/b)" form so it is accurate near the knees.
inline double HlgOffset(double z, double m, const HlgConfig& h) {
  if (!h.rolloff) return 0.0;
  if (z > h.width) {
    const double u = z - h.width;
    return -m * (u - h.shoulder * std::log1p(u / h.shoulder));
  }
  if (z < -h.width) {
    const double u = -z - h.width;
    return m * (u - h.toe * std::log1p(u / h.toe));
  }
  return 0.0;
}

// g(z) itself, straight from the definition (tests, plots, the curve designer).
inline double HlgTone(double z, double m, const HlgConfig& h) {
  if (!h.rolloff) return m * z;
  if (z < -h.width) return -m * h.width - m * h.toe * std::log1p((-z - h.width) / h.toe);
  if (z > h.width) return m * h.width + m * h.shoulder * std::log1p((z - h.width) / h.shoulder);
  return m * z;
}

}  // namespace lumen::sample
