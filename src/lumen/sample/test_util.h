// Helpers shared by the sample/ tests (header-only; not part of the library).
#pragma once

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "lumen/sample/sampler.h"

namespace lumen::sample::testing {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Plain softmax in double: an oracle independent of the sampler's code path.
inline std::vector<double> SoftmaxRef(const std::vector<double>& x) {
  double m = -std::numeric_limits<double>::infinity();
  for (double v : x) m = std::max(m, v);
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += (p[i] = std::isinf(x[i]) ? 0.0 : std::exp(x[i] - m));
  for (double& v : p) v /= z;
  return p;
}

// Logits whose softmax is `probs` (zero probability -> -inf).
inline std::vector<float> LogitsFor(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double p : probs) x.push_back(p > 0 ? static_cast<float>(std::log(p)) : kNegInf);
  return x;
}

inline std::vector<float> Dist(const SamplerConfig& c, const std::vector<float>& logits,
                               const std::vector<int32_t>& history = {}) {
  Sampler s(c);
  std::vector<float> p;
  s.Distribution(logits, history, p);
  return p;
}

// Random logits: normal with a random scale, some exact ties, some -inf.
inline std::vector<float> RandomLogits(std::mt19937_64& gen, size_t v, bool ties = true,
                                       bool neg_inf = true) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale_d(0.1f, 8.0f);
  const float scale = scale_d(gen);
  std::vector<float> x(v);
  for (float& f : x) f = nd(gen) * scale + 3.0f;
  std::uniform_int_distribution<size_t> pick(0, v - 1);
  if (ties && v > 2) {
    for (int i = 0; i < 3; ++i) x[pick(gen)] = x[pick(gen)];
  }
  if (neg_inf && v > 3) {
    for (int i = 0; i < 2; ++i) x[pick(gen)] = kNegInf;
  }
  return x;
}

}  // namespace lumen::sample::testing
