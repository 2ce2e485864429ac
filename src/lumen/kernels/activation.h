// Elementwise activations of the gated FFN and soft-capping.
//
// GatedActivation is the vectorized kernel (Highway, runtime dispatch). Both
// activations are computed as x * sigmoid(z) with one exp: SiLU has z = x, and
// GELU-tanh has z = 2 sqrt(2/pi) (x + 0.044715 x^3) because 1 + tanh(y) =
// 2 sigmoid(2y) (no cancellation where tanh -> -1). Every target gives the
// bits of GatedRef (the vecmath contract: Exp is ExpRef's polynomial, products
// kept apart from adds); GatedRef is within a few ulp of the textbook
// formulas Silu / GeluTanh (std::exp, std::tanh), which the test checks.
#pragma once

#include <cmath>
#include <cstdint>

#include "lumen/kernels/vecmath_ref.h"

namespace lumen::kernels {

enum class Activation { kSilu, kGeluTanh };

// Textbook definitions (the accuracy reference).
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float GeluTanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(kC * (x + 0.044715f * x * x * x)));
}

// act(g) * u exactly as every SIMD target computes it.
inline float GatedRef(Activation act, float g, float u) {
  float z = g;
  if (act == Activation::kGeluTanh) {
    const float x3 = ref::Mul(ref::Mul(g, g), g);
    z = ref::Mul(1.5957691216057308f, g + ref::Mul(0.044715f, x3));  // 2 sqrt(2/pi)
  }
  return ref::Mul(g / (1.0f + ref::ExpRef(-z)), u);
}

// gate[i] = act(gate[i]) * up[i] for i < n (GatedRef's bits).
void GatedActivation(Activation act, float* gate, const float* up, int64_t n);

// x = cap * tanh(x / cap); cap <= 0 disables.
inline void SoftCap(float* x, int64_t n, float cap) {
  if (cap <= 0) return;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace lumen::kernels
