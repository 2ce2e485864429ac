// Element-wise and per-row ops of the training forward with their backward
// beside them (llm.c style), as scalar templates over Real: float is the
// training route, double the finite-difference oracle (train/graph.h runs the
// same code at both precisions). Derivations:
//   RMSNorm  y = x r (w + o), r = (mean x^2 + eps)^-1/2:
//            dx = r (w+o) dy - x r^3 / K * sum_j (w_j+o) dy_j x_j
//   RoPE     a rotation per pair; its backward is the rotation by -theta
//            (mscale multiplies both, so the transpose keeps it).
//   gated    y = act(g) u: du = act(g) dy, dg = act'(g) u dy with
//            silu' = s (1 + g (1 - s)), s = sigmoid(g);
//            gelu_tanh' = 0.5 (1 + t) + 0.5 g (1 - t^2) c (1 + 3 a g^2),
//            t = tanh(c (g + a g^3)), c = sqrt(2/pi), a = 0.044715.
//   softcap  y = cap tanh(x / cap): dx = (1 - (y / cap)^2) dy.
#pragma once

#include <cmath>
#include <cstdint>

#include "lumen/kernels/activation.h"
#include "lumen/kernels/rope.h"

namespace lumen::kernels {

// y may alias x. w: f32 weights (frozen).
template <class Real>
void RmsNormRow(const Real* x, const float* w, float offset, float eps, int64_t K, Real* y) {
  double ss = 0;
  for (int64_t i = 0; i < K; ++i) ss += double(x[i]) * double(x[i]);
  const Real r = Real(1.0 / std::sqrt(ss / double(K) + double(eps)));
  for (int64_t i = 0; i < K; ++i) y[i] = x[i] * r * (Real(w[i]) + Real(offset));
}

// Adds the input gradient to dx (x is the forward's input).
template <class Real>
void RmsNormRowBackward(const Real* x, const float* w, float offset, float eps, int64_t K,
                        const Real* dy, Real* dx) {
  double ss = 0, dot = 0;
  for (int64_t i = 0; i < K; ++i) {
    ss += double(x[i]) * double(x[i]);
    dot += (double(w[i]) + double(offset)) * double(dy[i]) * double(x[i]);
  }
  const double r = 1.0 / std::sqrt(ss / double(K) + double(eps));
  const double c = dot * r * r * r / double(K);
  for (int64_t i = 0; i < K; ++i)
    dx[i] += Real(r * (double(w[i]) + double(offset)) * double(dy[i]) - double(x[i]) * c);
}

// Rotates n_heads heads at `pos` by +theta (sign = 1, the forward) or -theta
// (sign = -1, the backward of the forward's rotation).
template <class Real>
void RopeRotate(Real* x, int n_heads, int head_dim, int rope_dim, const RopeTable& t, int64_t pos,
                RopeStyle style, int sign) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = double(pos) * t.inv_freq[i];
    const Real c = Real(std::cos(a)) * Real(t.mscale);
    const Real s = Real(sign) * Real(std::sin(a)) * Real(t.mscale);
    for (int h = 0; h < n_heads; ++h) {
      Real* v = x + int64_t(h) * head_dim;
      const int i0 = style == RopeStyle::kInterleaved ? 2 * i : i;
      const int i1 = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
      const Real a0 = v[i0], a1 = v[i1];
      v[i0] = a0 * c - a1 * s;
      v[i1] = a0 * s + a1 * c;
    }
  }
}

template <class Real>
Real GatedValue(Activation act, Real g) {
  if (act == Activation::kSilu) return g / (Real(1) + std::exp(-g));
  constexpr Real kC = Real(0.7978845608028654);
  return Real(0.5) * g * (Real(1) + std::tanh(kC * (g + Real(0.044715) * g * g * g)));
}

template <class Real>
Real GatedDerivative(Activation act, Real g) {
  if (act == Activation::kSilu) {
    const Real s = Real(1) / (Real(1) + std::exp(-g));
    return s * (Real(1) + g * (Real(1) - s));
  }
  constexpr Real kC = Real(0.7978845608028654), kA = Real(0.044715);
  const Real t = std::tanh(kC * (g + kA * g * g * g));
  return Real(0.5) * (Real(1) + t) +
         Real(0.5) * g * (Real(1) - t * t) * kC * (Real(1) + Real(3) * kA * g * g);
}

// h[i] = act(g[i]) * u[i].
template <class Real>
void GatedForward(Activation act, const Real* g, const Real* u, int64_t n, Real* h) {
  for (int64_t i = 0; i < n; ++i) h[i] = GatedValue(act, g[i]) * u[i];
}

// dg, du overwritten from dh and the forward inputs g, u.
template <class Real>
void GatedBackward(Activation act, const Real* g, const Real* u, const Real* dh, int64_t n,
                   Real* dg, Real* du) {
  for (int64_t i = 0; i < n; ++i) {  // du may alias dh: dh[i] is read once, first
    const Real d = dh[i];
    du[i] = GatedValue(act, g[i]) * d;
    dg[i] = GatedDerivative(act, g[i]) * u[i] * d;
  }
}

// In place: x = cap tanh(x / cap).
template <class Real>
void SoftCapForward(Real* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = Real(cap) * std::tanh(x[i] / Real(cap));
}

// dx from dy and the capped output y (dy may alias dx).
template <class Real>
void SoftCapBackward(const Real* y, const Real* dy, int64_t n, float cap, Real* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const Real t = y[i] / Real(cap);
    dx[i] = (Real(1) - t * t) * dy[i];
  }
}

}  // namespace lumen::kernels
