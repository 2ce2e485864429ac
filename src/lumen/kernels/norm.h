// RMSNorm over rows: y = x / sqrt(mean(x^2) + eps) * (w + offset).
// offset is 0 for Llama-style weights and 1 for Gemma's (1 + w) convention.
// Forward and backward live together (llm.c style); backward derivation:
//   r = 1/sqrt(mean(x^2)+eps), y_i = x_i r g_i
//   dx_i = r (g_i dy_i) - x_i r^3 / K * sum_j (g_j dy_j x_j)
#pragma once

#include <cmath>
#include <cstdint>

namespace lumen::kernels {

inline void RmsNormForward(const float* x, const float* w, float offset, float eps, int64_t K,
                           float* y) {
  double ss = 0;
  for (int64_t i = 0; i < K; ++i) ss += double(x[i]) * x[i];
  const float r = float(1.0 / std::sqrt(ss / double(K) + eps));
  for (int64_t i = 0; i < K; ++i) y[i] = x[i] * r * (w[i] + offset);
}

// Adds the input gradient to dx.
inline void RmsNormBackward(const float* x, const float* w, float offset, float eps, int64_t K,
                            const float* dy, float* dx) {
  double ss = 0, dot = 0;
  for (int64_t i = 0; i < K; ++i) {
    ss += double(x[i]) * x[i];
    dot += double(w[i] + offset) * dy[i] * x[i];
  }
  const double r = 1.0 / std::sqrt(ss / double(K) + eps);
  const double c = dot * r * r * r / double(K);
  for (int64_t i = 0; i < K; ++i) dx[i] += float(r * (w[i] + offset) * dy[i] - x[i] * c);
}

}  // namespace lumen::kernels
