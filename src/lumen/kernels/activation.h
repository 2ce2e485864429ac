// Elementwise activations of the gated FFN and soft-capping.
#pragma once

#include <cmath>
#include <cstdint>

namespace lumen::kernels {

enum class Activation { kSilu, kGeluTanh };

inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float GeluTanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(kC * (x + 0.044715f * x * x * x)));
}

// gate[i] = act(gate[i]) * up[i]
inline void GatedActivation(Activation act, float* gate, const float* up, int64_t n) {
  if (act == Activation::kSilu) {
    for (int64_t i = 0; i < n; ++i) gate[i] = Silu(gate[i]) * up[i];
  } else {
    for (int64_t i = 0; i < n; ++i) gate[i] = GeluTanh(gate[i]) * up[i];
  }
}

// x = cap * tanh(x / cap); cap <= 0 disables.
inline void SoftCap(float* x, int64_t n, float cap) {
  if (cap <= 0) return;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace lumen::kernels
