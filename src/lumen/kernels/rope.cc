#include "lumen/kernels/rope.h"
#include "lumen/core/route.h"

#include <algorithm>
#include <cmath>

namespace lumen::kernels {

LUMEN_ROUTE(rope_table, {.node = "rope",
                         .name = "table",
                         .tier = Tier::kL2,
                         .oracle = "HF transformers' rotary embeddings (per-family goldens) and "
                                   "llama.cpp's llama3 frequencies",
                         .bound = "the family goldens' logit bound",
                         .tests = "RopeFreqs.LlamaCppStyleGgufMatchesLlama3Golden;ConfigFromHf."
                                  "YarnAttentionFactorFromMscale;Families/FamilyGolden.*",
                         .priority = 10});

RopeTable MakeRopeTable(int rope_dim, double theta, const RopeScaling& s, int64_t max_pos,
                        int64_t seq_len) {
  RopeTable t;
  const int half = rope_dim / 2;
  double base = theta;
  using T = RopeScaling::Type;
  if (s.type == T::kDynamic && seq_len > max_pos && s.factor > 0) {
    // NTK-aware: grow the base so the longest wavelength covers seq_len.
    base = theta * std::pow(s.factor * double(seq_len) / double(max_pos) - (s.factor - 1.0),
                            double(rope_dim) / double(rope_dim - 2));
  }
  t.inv_freq.resize(half);
  for (int i = 0; i < half; ++i) t.inv_freq[i] = 1.0 / std::pow(base, 2.0 * i / rope_dim);

  if (s.type == T::kLinear) {
    for (auto& f : t.inv_freq) f /= s.factor;
  } else if (s.type == T::kLlama3) {
    const double old_ctx = double(s.original_max_pos);
    const double low_wl = old_ctx / s.low_freq_factor;
    const double high_wl = old_ctx / s.high_freq_factor;
    for (auto& f : t.inv_freq) {
      const double wl = 2.0 * M_PI / f;
      if (wl < high_wl) continue;
      if (wl > low_wl) {
        f /= s.factor;
      } else {
        const double smooth =
            (old_ctx / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  } else if (s.type == T::kYarn) {
    const double orig = double(s.original_max_pos > 0 ? s.original_max_pos : max_pos);
    auto correction_dim = [&](double rot) {
      return rope_dim * std::log(orig / (rot * 2.0 * M_PI)) / (2.0 * std::log(theta));
    };
    double low = std::floor(correction_dim(s.beta_fast));
    double high = std::ceil(correction_dim(s.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, double(rope_dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrapolation_factor = 1.0 - ramp;
      const double f = t.inv_freq[i];
      t.inv_freq[i] = f / s.factor * (1.0 - extrapolation_factor) + f * extrapolation_factor;
    }
    t.mscale =
        float(s.attention_factor > 0 ? s.attention_factor
                                     : (s.factor <= 1 ? 1.0 : 0.1 * std::log(s.factor) + 1.0));
  }
  return t;
}

void ApplyRope(float* x, int n_heads, int head_dim, int rope_dim, const RopeTable& t, int64_t pos,
               RopeStyle style) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = double(pos) * t.inv_freq[i];
    const float c = float(std::cos(a)) * t.mscale, s = float(std::sin(a)) * t.mscale;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + int64_t(h) * head_dim;
      const int i0 = style == RopeStyle::kInterleaved ? 2 * i : i;
      const int i1 = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
      const float a0 = v[i0], a1 = v[i1];
      v[i0] = a0 * c - a1 * s;
      v[i1] = a0 * s + a1 * c;
    }
  }
}

}  // namespace lumen::kernels
